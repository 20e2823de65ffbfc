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
	// MXFP4 is the OCP Microscaling FP4 format as gpt-oss ships its
	// experts: E2M1 codes, two a byte (the lower nibble first), in Data,
	// and one E8M0 scale byte per 32 along a row in Matrix.Scales.
	MXFP4
	// F8E4M3 is FP8 (E4M3FN) with one float32 scale per 128x128 block, as
	// DeepSeek-V3 ships its weights: codes in Data, one a byte, and the
	// block scales (weight_scale_inv) in Matrix.Scales.
	F8E4M3
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
// absmax values then ceil(cols/2) bytes of 4-bit codes; for MXFP4 the
// cols/2 bytes of codes in Data (its scales are apart: ScaleBytes). It is
// 0 for an unknown DType.
func (d DType) RowBytes(cols int) int {
	switch d {
	case Q8:
		return 4*ceilDiv(cols, q8Group) + cols
	case NF4:
		return 4*ceilDiv(cols, nf4Block) + ceilDiv(cols, 2)
	case MXFP4:
		return ceilDiv(cols, 2)
	case F8E4M3:
		return cols
	case BF16P:
		return ceilDiv(cols, packedBlock) * packedBlockBytes
	}
	return cols * d.Size()
}

// ScaleBytes returns the bytes of one row's scales that a dtype keeps in
// Matrix.Scales rather than in its rows: cols/32 for MXFP4, 0 for the
// others (F8E4M3's scales are per block of rows: ScalesBytes).
func (d DType) ScaleBytes(cols int) int {
	if d == MXFP4 {
		return ceilDiv(cols, mxfp4Block)
	}
	return 0
}

// HasScales reports whether d keeps scales apart from its codes, in
// Matrix.Scales: MXFP4, F8E4M3, and BF16P its code table and exception
// rows (of a size ScalesBytes cannot give: len(Matrix.Scales)).
func (d DType) HasScales() bool { return d == MXFP4 || d == F8E4M3 || d == BF16P }

// ScalesBytes returns the size of Matrix.Scales for a rows x cols matrix
// of d: rows*ScaleBytes(cols) for MXFP4, a float32 per 128x128 block for
// F8E4M3, 0 for the others.
func ScalesBytes(d DType, rows, cols int) int {
	if d == F8E4M3 {
		return 4 * ceilDiv(rows, f8Block) * ceilDiv(cols, f8Block)
	}
	return rows * d.ScaleBytes(cols)
}

// known reports whether d is one of the dtypes above.
func (d DType) known() bool { return d <= BF16P }

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
	case MXFP4:
		return "MXFP4"
	case F8E4M3:
		return "F8E4M3"
	case BF16P:
		return "BF16P"
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
// tensor that kernels reads in place and never writes. Scales holds Rows
// rows of DType.ScaleBytes(Cols) bytes for a dtype whose checkpoint keeps
// its scales in a tensor of their own (MXFP4), and is empty for the others.
type Matrix struct {
	DType      DType
	Rows, Cols int
	Data       []byte
	Scales     []byte
}

// Bytes is the size of the matrix's stored form: Data and Scales.
func (m Matrix) Bytes() int { return len(m.Data) + len(m.Scales) }

// Validate reports whether Data holds exactly Rows rows of
// DType.RowBytes(Cols) bytes and Scales Rows rows of DType.ScaleBytes(Cols),
// and an MXFP4 row whole blocks of 32.
func (m Matrix) Validate() error {
	switch {
	case !m.DType.known():
		return fmt.Errorf("kernels: matrix %dx%d has unknown dtype %v", m.Rows, m.Cols, m.DType)
	case m.Rows < 0 || m.Cols < 0:
		return fmt.Errorf("kernels: matrix shape %dx%d is negative", m.Rows, m.Cols)
	case m.Cols > math.MaxInt/4 || m.Cols > 0 && m.Rows > math.MaxInt/m.DType.RowBytes(m.Cols):
		return fmt.Errorf("kernels: matrix shape %dx%d %v overflows int", m.Rows, m.Cols, m.DType)
	case m.DType == BF16P && m.Cols%packedBlock != 0:
		return fmt.Errorf("kernels: BF16P matrix of %d columns; its rows are blocks of %d", m.Cols, packedBlock)
	case m.DType == MXFP4 && m.Cols%mxfp4Block != 0:
		return fmt.Errorf("kernels: MXFP4 matrix of %d columns; its rows are blocks of %d", m.Cols, mxfp4Block)
	}
	if want := m.Rows * m.DType.RowBytes(m.Cols); len(m.Data) != want {
		return fmt.Errorf("kernels: %dx%d %v matrix needs %d bytes, has %d", m.Rows, m.Cols, m.DType, want, len(m.Data))
	}
	if m.DType == BF16P {
		return validPackedScales(m)
	}
	if want := ScalesBytes(m.DType, m.Rows, m.Cols); len(m.Scales) != want {
		return fmt.Errorf("kernels: %dx%d %v matrix needs %d bytes of scales, has %d", m.Rows, m.Cols, m.DType, want, len(m.Scales))
	}
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
