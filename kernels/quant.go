package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
)

// Quantized weights (Q8, NF4) for the shadow node: lossy copies of a
// model that stream fewer bytes per token. Every row is self-contained
// (its scales first, then its codes), so rows split over goroutines as
// the float dtypes' do. The package doc defines the layouts and the
// arithmetic exactly.

const (
	q8Group  = 32 // Q8 weights per float32 scale
	nf4Block = 64 // NF4 weights per float32 absmax
)

// nf4Codes are the 16 NormalFloat4 values of QLoRA (Dettmers et al.,
// 2023, appendix E), as float32: the table bitsandbytes dequantizes with.
var nf4Codes = [16]float32{
	-1.0,
	-0.6961928009986877,
	-0.5250730514526367,
	-0.39491748809814453,
	-0.28444138169288635,
	-0.18477343022823334,
	-0.09105003625154495,
	0.0,
	0.07958029955625534,
	0.16093020141124725,
	0.24611230194568634,
	0.33791524171829224,
	0.44070982933044434,
	0.5626170039176941,
	0.7229568362236023,
	1.0,
}

// nf4Mid[i] is the midpoint of codes i and i+1, exact in float64.
var nf4Mid = func() (m [15]float64) {
	for i := range m {
		m[i] = (float64(nf4Codes[i]) + float64(nf4Codes[i+1])) / 2
	}
	return m
}()

// nf4Index returns the index of the code nearest to v, ties to the lower
// index: the number of midpoints below v (a binary search of nf4Mid).
func nf4Index(v float64) byte {
	q := 0
	if v > nf4Mid[7] {
		q = 8
	}
	if v > nf4Mid[q+3] {
		q += 4
	}
	if v > nf4Mid[q+1] {
		q += 2
	}
	if v > nf4Mid[q] {
		q++
	}
	return byte(q)
}

// Quantize returns m (F32, F16 or BF16) converted to dt: F16 (each weight
// rounded to nearest, ties to even), Q8 or NF4 (as the package doc
// defines them). It refuses NaN and infinite weights and, for F16, finite
// weights beyond its range. Rows are converted on Threads() goroutines;
// the result does not depend on their number, nor on the architecture.
func Quantize(dt DType, m Matrix) (Matrix, error) { return QuantizeInto(nil, dt, m) }

// QuantizeInto is Quantize writing into dst[:n], n =
// m.Rows*dt.RowBytes(m.Cols), instead of a new buffer (a nil dst
// allocates one). Every byte of dst[:n] is written; len(dst) < n is an
// error.
func QuantizeInto(dst []byte, dt DType, m Matrix) (Matrix, error) {
	if err := m.Validate(); err != nil {
		return Matrix{}, fmt.Errorf("kernels.Quantize: %w", err)
	}
	switch m.DType {
	case F32, F16, BF16, MXFP4, F8E4M3, BF16P:
	default:
		return Matrix{}, fmt.Errorf("kernels.Quantize: source %v: want F32, F16, BF16, BF16P, MXFP4 or F8E4M3", m.DType)
	}
	switch dt {
	case F16, Q8, NF4:
	default:
		return Matrix{}, fmt.Errorf("kernels.Quantize: target %v: want F16, Q8 or NF4", dt)
	}
	rows, cols := m.Rows, m.Cols
	rowBytes := dt.RowBytes(cols)
	if rowBytes > 0 && rows > math.MaxInt/rowBytes {
		return Matrix{}, fmt.Errorf("kernels.Quantize: %dx%d %v overflows int", rows, cols, dt)
	}
	size := rows * rowBytes
	switch {
	case dst == nil:
		dst = make([]byte, size)
	case len(dst) < size:
		return Matrix{}, fmt.Errorf("kernels.Quantize: %dx%d %v needs %d bytes, dst has %d", rows, cols, dt, size, len(dst))
	}
	out := Matrix{DType: dt, Rows: rows, Cols: cols, Data: dst[:size]}

	// The error reported is the one of the lowest bad row, whatever the
	// split over goroutines.
	var (
		mu     sync.Mutex
		badRow = rows
		badErr error
	)
	srcBytes := m.DType.RowBytes(cols)
	work := func(_, r0, r1 int) {
		w := make([]float32, cols)
		for r := r0; r < r1; r++ {
			if m.DType == BF16P {
				unpackRows(w, m, r, 1, widenBlocksGo) // RowToFloat32 would validate m again
			} else if m.DType.HasScales() {
				RowToFloat32(w, m, r)
			} else {
				ToFloat32(w, m.Data[r*srcBytes:(r+1)*srcBytes], m.DType)
			}
			row := out.Data[r*rowBytes : (r+1)*rowBytes]
			var c int
			switch dt {
			case F16:
				c = quantizeF16Row(row, w)
			case Q8:
				c = quantizeQ8Row(row, w)
			case NF4:
				c = quantizeNF4Row(row, w)
			}
			if c < 0 {
				continue
			}
			mu.Lock()
			if r < badRow {
				badRow = r
				what := "is not finite"
				if dt == F16 && !math.IsInf(float64(w[c]), 0) && !math.IsNaN(float64(w[c])) {
					what = "overflows F16"
				}
				badErr = fmt.Errorf("kernels.Quantize: %dx%d %v to %v: row %d column %d: weight %g %s",
					rows, cols, m.DType, dt, r, c, w[c], what)
			}
			mu.Unlock()
			return // the rest of this range cannot hold a lower bad row
		}
	}
	if parts := partsFor(rows, rows*cols); parts <= 1 {
		work(0, 0, rows)
	} else {
		parallelRows(parts, rows, work)
	}
	if badErr != nil {
		return Matrix{}, badErr
	}
	return out, nil
}

// finite reports whether v is neither NaN nor infinite.
func finite(v float32) bool { return v-v == 0 }

// quantizeF16Row writes w rounded to F16 into row and returns -1, or the
// column of the first weight that is not finite or overflows F16.
func quantizeF16Row(row []byte, w []float32) int {
	row = row[:2*len(w)]
	for i, v := range w {
		h := F32ToF16(v)
		if h&0x7c00 == 0x7c00 {
			return i
		}
		binary.LittleEndian.PutUint16(row[2*i:], h)
	}
	return -1
}

// absMax returns the largest |v| of blk, or the index of the first weight
// that is not finite (ok false).
func absMax(blk []float32) (amax float32, bad int, ok bool) {
	var most uint32 // |v|'s bits: ordered as the values are, for finite ones
	for i, v := range blk {
		b := math.Float32bits(v) &^ (1 << 31)
		if b >= 0x7f800000 { // Inf or NaN
			return 0, i, false
		}
		most = max(most, b)
	}
	return math.Float32frombits(most), 0, true
}

// quantizeQ8Row writes the Q8 form of w into row (RowBytes(len(w)) bytes):
// per group of 32, scale = absmax/127 (a float32 division) and q =
// RoundToEven(w/scale) (a float64 division) clamped to [-127, 127]; q = 0
// where scale is 0. It returns -1, or the column of the first weight that
// is not finite.
func quantizeQ8Row(row []byte, w []float32) int {
	n := len(w)
	ng := ceilDiv(n, q8Group)
	codes := row[4*ng : 4*ng+n]
	for g := range ng {
		lo := g * q8Group
		blk := w[lo:min(lo+q8Group, n)]
		amax, bad, ok := absMax(blk)
		if !ok {
			return lo + bad
		}
		scale := amax / 127
		binary.LittleEndian.PutUint32(row[4*g:], math.Float32bits(scale))
		out := codes[lo : lo+len(blk)]
		if scale == 0 {
			clear(out)
			continue
		}
		s := float64(scale)
		for i, v := range blk {
			q := math.RoundToEven(float64(v) / s)
			if q > 127 { // (comparisons: min and max of floats check for NaN, which w/scale is not)
				q = 127
			} else if q < -127 {
				q = -127
			}
			out[i] = byte(int8(q))
		}
	}
	return -1
}

// quantizeNF4Row writes the NF4 form of w into row (RowBytes(len(w))
// bytes): per block of 64, absmax = max |w|, and q = the index of the code
// nearest to w/absmax (a float64 division; ties to the lower index; code 7,
// 0.0, where absmax is 0), two per byte, the even column in the low
// nibble; an odd row's last high nibble is 0. It returns -1, or the
// column of the first weight that is not finite.
func quantizeNF4Row(row []byte, w []float32) int {
	n := len(w)
	nb := ceilDiv(n, nf4Block)
	codes := row[4*nb : 4*nb+ceilDiv(n, 2)]
	clear(codes)
	for b := range nb {
		lo := b * nf4Block
		blk := w[lo:min(lo+nf4Block, n)]
		amax, bad, ok := absMax(blk)
		if !ok {
			return lo + bad
		}
		binary.LittleEndian.PutUint32(row[4*b:], math.Float32bits(amax))
		for i, v := range blk {
			q := byte(7)
			if amax != 0 {
				q = nf4Index(float64(v) / float64(amax))
			}
			j := lo + i
			codes[j/2] |= q << (4 * (j % 2))
		}
	}
	return -1
}

// RowToFloat32 writes row r of m, widened or dequantized exactly as MatVec
// sees it, into dst (len(dst) == m.Cols): F32/F16/BF16 as ToFloat32, Q8 as
// float32(q)*scale, NF4 as code[q]*absmax (float32 products). It panics if
// m is invalid, r out of range or len(dst) != m.Cols.
func RowToFloat32(dst []float32, m Matrix, r int) {
	if err := m.Validate(); err != nil {
		panic(fmt.Sprintf("kernels.RowToFloat32: %v", err))
	}
	if r < 0 || r >= m.Rows || len(dst) != m.Cols {
		panic(fmt.Sprintf("kernels.RowToFloat32: row %d of %dx%d into %d floats", r, m.Rows, m.Cols, len(dst)))
	}
	rb := m.DType.RowBytes(m.Cols)
	row := m.Data[r*rb : (r+1)*rb]
	switch m.DType {
	case Q8:
		dequantQ8Row(dst, row)
	case NF4:
		dequantNF4Row(dst, row)
	case MXFP4:
		sb := MXFP4.ScaleBytes(m.Cols)
		dequantMXFP4Row(dst, row, m.Scales[r*sb:(r+1)*sb])
	case F8E4M3:
		dequantF8Row(dst, row, m.Scales, r)
	case BF16P:
		unpackRows(dst, m, r, 1, widenBlocksGo)
	default:
		ToFloat32(dst, row, m.DType)
	}
}

func f32le(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

// dequantQ8Row writes the len(dst) weights of the Q8 row into dst.
func dequantQ8Row(dst []float32, row []byte) {
	n := len(dst)
	ng := ceilDiv(n, q8Group)
	codes := row[4*ng : 4*ng+n]
	for g := range ng {
		sc := f32le(row[4*g:])
		lo := g * q8Group
		for i := lo; i < min(lo+q8Group, n); i++ {
			dst[i] = float32(int8(codes[i])) * sc
		}
	}
}

// dequantNF4Row writes the len(dst) weights of the NF4 row into dst.
func dequantNF4Row(dst []float32, row []byte) {
	n := len(dst)
	nb := ceilDiv(n, nf4Block)
	codes := row[4*nb : 4*nb+ceilDiv(n, 2)]
	for b := range nb {
		am := f32le(row[4*b:])
		lo := b * nf4Block
		for i := lo; i < min(lo+nf4Block, n); i++ {
			dst[i] = nf4Codes[codes[i/2]>>(4*(i%2))&15] * am
		}
	}
}
