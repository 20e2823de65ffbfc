package kernels

import (
	"fmt"
	"math"
)

// DType is the element type a weight tensor is stored in.
type DType uint8

// The stored dtypes odmoe computes with. Their String spelling is the
// safetensors one.
const (
	F32  DType = iota // IEEE binary32
	F16               // IEEE binary16
	BF16              // bfloat16: the top half of a binary32
)

// Size returns the bytes per element, 0 for an unknown DType.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}

// String returns the safetensors spelling: "F32", "F16" or "BF16".
func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case BF16:
		return "BF16"
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
// Rows*Cols little-endian elements, typically a memory-mapped safetensors
// tensor that kernels reads in place and never writes.
type Matrix struct {
	DType      DType
	Rows, Cols int
	Data       []byte
}

// Validate reports whether Data holds exactly Rows*Cols elements of DType.
func (m Matrix) Validate() error {
	size := m.DType.Size()
	switch {
	case size == 0:
		return fmt.Errorf("kernels: matrix %dx%d has unknown dtype %v", m.Rows, m.Cols, m.DType)
	case m.Rows < 0 || m.Cols < 0:
		return fmt.Errorf("kernels: matrix shape %dx%d is negative", m.Rows, m.Cols)
	case m.Cols > 0 && m.Rows > math.MaxInt/m.Cols/size:
		return fmt.Errorf("kernels: matrix shape %dx%d %v overflows int", m.Rows, m.Cols, m.DType)
	}
	if want := m.Rows * m.Cols * size; len(m.Data) != want {
		return fmt.Errorf("kernels: %dx%d %v matrix needs %d bytes, has %d", m.Rows, m.Cols, m.DType, want, len(m.Data))
	}
	return nil
}
