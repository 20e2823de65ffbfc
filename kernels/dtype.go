package kernels

import (
	"fmt"
	"math"
)

// DType is the element type a weight tensor is stored in.
type DType uint8

// The stored dtypes odmoe computes with. The float ones are spelled as in
// safetensors; Q8 and NF4 are odmoe's own block-quantized formats (the
// shadow node's lossy weights, see quant.go and the package doc for their
// row layouts).
const (
	F32  DType = iota // IEEE binary32
	F16               // IEEE binary16
	BF16              // bfloat16: the top half of a binary32
	Q8                // int8 weights, one float32 scale per 32 along a row
	NF4               // 4-bit NormalFloat codes, one float32 absmax per 64 along a row
)

// Size returns the bytes per element of a float dtype, 0 for an unknown
// DType and for Q8 and NF4, whose elements share per-block scales: use
// RowBytes for the size of stored rows.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}

// RowBytes returns the bytes of one stored row of cols elements (cols >= 0),
// for every dtype: cols*Size() for the float ones; for Q8 ceil(cols/32)
// float32 scales then cols int8 codes, for NF4 ceil(cols/64) float32
// absmax values then ceil(cols/2) bytes of 4-bit codes. It is 0 for an
// unknown DType.
func (d DType) RowBytes(cols int) int {
	switch d {
	case Q8:
		return 4*ceilDiv(cols, q8Group) + cols
	case NF4:
		return 4*ceilDiv(cols, nf4Block) + ceilDiv(cols, 2)
	}
	return cols * d.Size()
}

// known reports whether d is one of the dtypes above.
func (d DType) known() bool { return d <= NF4 }

// String returns the safetensors spelling ("F32", "F16", "BF16"), or "Q8"
// or "NF4".
func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case BF16:
		return "BF16"
	case Q8:
		return "Q8"
	case NF4:
		return "NF4"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ParseDType parses a safetensors dtype spelling. Only the dtypes kernels
// computes with are accepted; any other value is an error that names it.
func ParseDType(s string) (DType, error) {
	switch s {
	case "F32":
		return F32, nil
	case "F16":
		return F16, nil
	case "BF16":
		return BF16, nil
	}
	return 0, fmt.Errorf("kernels: unsupported dtype %q (want F32, F16 or BF16)", s)
}

// Matrix is a row-major weight matrix in its stored dtype: Data holds
// Rows rows of DType.RowBytes(Cols) little-endian bytes each (for the float
// dtypes, Rows*Cols elements), typically a memory-mapped safetensors
// tensor that kernels reads in place and never writes.
type Matrix struct {
	DType      DType
	Rows, Cols int
	Data       []byte
}

// Validate reports whether Data holds exactly Rows rows of
// DType.RowBytes(Cols) bytes.
func (m Matrix) Validate() error {
	switch {
	case !m.DType.known():
		return fmt.Errorf("kernels: matrix %dx%d has unknown dtype %v", m.Rows, m.Cols, m.DType)
	case m.Rows < 0 || m.Cols < 0:
		return fmt.Errorf("kernels: matrix shape %dx%d is negative", m.Rows, m.Cols)
	case m.Cols > math.MaxInt/4 || m.Cols > 0 && m.Rows > math.MaxInt/m.DType.RowBytes(m.Cols):
		return fmt.Errorf("kernels: matrix shape %dx%d %v overflows int", m.Rows, m.Cols, m.DType)
	}
	if want := m.Rows * m.DType.RowBytes(m.Cols); len(m.Data) != want {
		return fmt.Errorf("kernels: %dx%d %v matrix needs %d bytes, has %d", m.Rows, m.Cols, m.DType, want, len(m.Data))
	}
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
