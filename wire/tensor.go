//lint:file-ignore U1000 the _msgpack fields carry msgpack's as_array struct tag

package wire

import (
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// DType is the element type of a Tensor. Values are part of the protocol.
type DType uint8

// The element types a Tensor can carry; all little-endian.
const (
	DTypeNone DType = 0 // only in an empty Tensor (no shape, no data)
	F32       DType = 1
	F16       DType = 2
	BF16      DType = 3
	I32       DType = 4
	I8        DType = 5
	U8        DType = 6
)

// Size returns the bytes per element, 0 for DTypeNone or an unknown value.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
	case I8, U8:
		return 1
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case DTypeNone:
		return "none"
	case F32:
		return "F32"
	case F16:
		return "F16"
	case BF16:
		return "BF16"
	case I32:
		return "I32"
	case I8:
		return "I8"
	case U8:
		return "U8"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// maxDims bounds a Tensor's rank.
const maxDims = 8

// Tensor is a dense, row-major array as raw little-endian bytes: the
// receiver gets exactly the bits the sender had (DESIGN.md: lossless).
// Data must hold prod(Shape)*DType.Size() bytes; a Tensor that does not is
// refused on receipt (ErrBadTensor). The zero Tensor means "absent".
type Tensor struct {
	_msgpack struct{} `msgpack:",as_array"`
	DType    DType
	Shape    []int
	Data     []byte
}

// Float32Tensor wraps v as an F32 tensor of the given shape (default:
// one dimension of len(v)). On little-endian hosts it shares v's memory,
// so v must not change until the message is sent.
func Float32Tensor(v []float32, shape ...int) Tensor {
	if len(shape) == 0 {
		shape = []int{len(v)}
	}
	return Tensor{DType: F32, Shape: shape, Data: f32Bytes(v)}
}

// SetFloat32s makes t the [rows, cols] F32 tensor of v, as Float32Tensor
// does, reusing t's shape slice: a message reused for every send
// allocates nothing.
func (t *Tensor) SetFloat32s(v []float32, rows, cols int) {
	t.DType = F32
	t.Shape = append(t.Shape[:0], rows, cols)
	t.Data = f32Bytes(v)
}

// Float32s returns the elements of an F32 tensor. On little-endian hosts
// it shares t.Data's memory.
func (t Tensor) Float32s() ([]float32, error) {
	if t.DType != F32 {
		return nil, fmt.Errorf("wire: tensor is %v, not F32", t.DType)
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return bytesF32(t.Data), nil
}

// Elems returns the number of elements prod(Shape), or -1 if a dimension
// is negative or the product overflows.
func (t Tensor) Elems() int {
	n := 1
	for _, d := range t.Shape {
		if d < 0 || (d > 0 && n > math.MaxInt/d) {
			return -1
		}
		n *= d
	}
	return n
}

// Validate reports whether Data holds exactly the bytes DType and Shape
// call for. The zero Tensor is valid.
func (t Tensor) Validate() error {
	if t.DType == DTypeNone && len(t.Shape) == 0 && len(t.Data) == 0 {
		return nil
	}
	size := t.DType.Size()
	if size == 0 {
		return connErrorf(CodeBadTensor, nil, "unknown dtype %d", uint8(t.DType))
	}
	if len(t.Shape) == 0 || len(t.Shape) > maxDims {
		return connErrorf(CodeBadTensor, nil, "rank %d (want 1..%d)", len(t.Shape), maxDims)
	}
	n := t.Elems()
	if n < 0 || n > math.MaxInt/size {
		return connErrorf(CodeBadTensor, nil, "shape %v is negative or too large", t.Shape)
	}
	if n*size != len(t.Data) {
		return connErrorf(CodeBadTensor, nil, "%v %v needs %d bytes, has %d", t.DType, t.Shape, n*size, len(t.Data))
	}
	return nil
}

// EncodeMsgpack writes t as the array [dtype, shape, data].
func (t Tensor) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := enc.EncodeUint8(uint8(t.DType)); err != nil {
		return err
	}
	if err := enc.EncodeArrayLen(len(t.Shape)); err != nil {
		return err
	}
	for _, d := range t.Shape {
		if err := enc.EncodeInt(int64(d)); err != nil {
			return err
		}
	}
	if t.Data == nil {
		return enc.EncodeNil()
	}
	return enc.EncodeBytes(t.Data)
}

// DecodeMsgpack reads what EncodeMsgpack wrote; Data may share the
// frame's memory (see decodeBytes).
func (t *Tensor) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n == -1 {
		*t = Tensor{}
		return nil
	}
	if n != 3 {
		return fmt.Errorf("tensor as an array of %d, want 3", n)
	}
	dtype, err := dec.DecodeUint8()
	if err != nil {
		return err
	}
	dims, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if dims > maxDims {
		return connErrorf(CodeBadTensor, nil, "rank %d (want 1..%d)", dims, maxDims)
	}
	var shape []int
	if dims >= 0 {
		shape = make([]int, dims)
	}
	for i := range shape {
		if shape[i], err = dec.DecodeInt(); err != nil {
			return err
		}
	}
	data, err := decodeBytes(dec)
	if err != nil {
		return err
	}
	*t = Tensor{DType: DType(dtype), Shape: shape, Data: data}
	return nil
}
