//go:build amd64 || arm64

package kernels

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// The glue between the exported kernels and the generated assembly
// (simd_<arch>.go declares it). The assembly handles whole 16-element
// blocks; a row's tail (cols%16 elements) is added here to the lanes the
// assembly returns, exactly as the definition's step 3 does, and folded
// with fold16. The elementwise kernels leave their last n%16 elements to
// Go; elementwise arithmetic is the same whichever code runs it.

// isa identifies one instruction set's kernels (isaAVX2, isaAVX512,
// isaNEON); simd_<arch>.go maps it to its assembly.
type isa uint8

// newSIMDPath returns the path that runs on k's assembly.
func newSIMDPath(name string, k isa) *path {
	p := &path{name: name}
	p.matVecF32 = func(out, w, x []float32) { rowsSIMD(k, F32, out, w, x, widenF32) }
	p.matVecBF16 = func(out []float32, w []uint16, x []float32) { rowsSIMD(k, BF16, out, w, x, BF16ToF32) }
	p.matVecF16 = func(out []float32, w []uint16, x []float32) { rowsSIMD(k, F16, out, w, x, F16ToF32) }
	p.matVecQ8 = func(out []float32, w []byte, x []float32) { rowsQuantSIMD(k, Q8, out, w, x) }
	p.matVecNF4 = func(out []float32, w []byte, x []float32) { rowsQuantSIMD(k, NF4, out, w, x) }
	p.matVecMXFP4 = func(out []float32, codes, scales []byte, x []float32) { rowsMXFP4SIMD(k, out, codes, scales, x) }
	p.matVecF8 = func(out []float32, codes, scales []byte, x []float32, r0 int) {
		rowsF8SIMD(k, out, codes, scales, x, r0)
	}
	p.matVecBF16P = func(out []float32, data []byte, table *[packedTableBytes]byte, x []float32) {
		rowsBF16PSIMD(k, out, data, table, x)
	}
	p.packedNative = packedAsm(k)
	p.unpackBF16P = func(dst []float32, src []byte, table *[packedTableBytes]byte) { widenBlocksSIMD(k, dst, src, table) }
	p.dotF32 = func(a, b []float32) float32 { return dotF32SIMD(k, a, b) }
	p.sum = func(x []float32) float32 { return sumSIMD(k, x) }
	p.matMulRows = func(out []float32, w Matrix, x []float32, n, r0, r1 int) {
		matMulSIMD(k, &p.rowKernels, out, w, x, n, r0, r1)
	}
	p.matMulRoute = func(dt DType, cols, n int) string { return name + ": " + matMulWay(k, dt, cols, n) }
	p.dotRows = func(out, x, w []float32, stride int) { dotRowsSIMD(k, out, x, w, stride) }
	p.axpyRows = func(dst, a, x []float32, stride int) { axpyRowsSIMD(k, dst, a, x, stride) }
	p.axpy = func(dst []float32, a float32, x []float32) { axpySIMD(k, dst, a, x) }
	p.add = func(dst, x []float32) { addSIMD(k, dst, x) }
	p.scaleMul = func(out, x, weight []float32, r float32) { scaleMulSIMD(k, out, x, weight, r) }
	p.expShift = func(x []float32, m float32) { expShiftSIMD(k, x, m) }
	p.siluMul = func(out, gate, up []float32) { siluMulSIMD(k, out, gate, up) }
	p.expWork = expWorkAsm
	p.clampedSwiGLU = func(out, gateUp []float32, limit, alpha float32) { clampedSwiGLUSIMD(k, out, gateUp, limit, alpha) }
	return p
}

func widenF32(f float32) float32 { return f }

// tailRows is how many rows' lanes the tail case keeps (on the stack) at
// a time.
const tailRows = 16

// rowsSIMD computes out[r] = Dot(row r of w, x) for every r < len(out);
// w holds len(out) rows of len(x) elements of dt, widen widens one.
func rowsSIMD[E float32 | uint16](k isa, dt DType, out []float32, w []E, x []float32, widen func(E) float32) {
	rows, cols := len(out), len(x)
	if rows == 0 {
		return
	}
	w = w[:rows*cols]
	wp, xp := unsafe.Pointer(unsafe.SliceData(w)), unsafe.SliceData(x)
	stride := cols * dt.Size()
	n16 := cols &^ 15
	if n16 == cols {
		rowsAsm(k, dt, &out[0], wp, xp, rows, n16, stride, false)
		return
	}
	var lanes [tailRows * 16]float32
	for r0 := 0; r0 < rows; r0 += tailRows {
		nr := min(tailRows, rows-r0)
		rowsAsm(k, dt, &lanes[0], unsafe.Add(wp, r0*stride), xp, nr, n16, stride, true)
		for r := range nr {
			acc := (*[16]float32)(lanes[16*r : 16*r+16])
			row := w[(r0+r)*cols : (r0+r+1)*cols]
			for j := n16; j < cols; j++ {
				acc[j-n16] += float32(widen(row[j]) * x[j])
			}
			out[r0+r] = fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
				acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
		}
	}
}

func sumSIMD(k isa, x []float32) float32 {
	var acc [16]float32
	n16 := len(x) &^ 15
	if n16 > 0 {
		sumLanesAsm(k, &acc[0], &x[0], n16)
	}
	for j := n16; j < len(x); j++ {
		acc[j-n16] += x[j]
	}
	return fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
		acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
}

func axpySIMD(k isa, dst []float32, a float32, x []float32) {
	x = x[:len(dst)]
	n16 := len(dst) &^ 15
	if n16 > 0 {
		axpyAsm(k, &dst[0], a, &x[0], n16)
	}
	for i := n16; i < len(dst); i++ {
		dst[i] += float32(a * x[i])
	}
}

// dotRowsSIMD is Attend's scores: the rows are a MatVec's whose rows lie
// stride floats apart.
func dotRowsSIMD(k isa, out, x, w []float32, stride int) {
	cols := len(x)
	if cols%16 != 0 { // a head of an odd width: one row at a time
		for j := range out {
			out[j] = dotF32SIMD(k, x, w[j*stride:j*stride+cols])
		}
		return
	}
	w = w[:(len(out)-1)*stride+cols]
	rowsAsm(k, F32, &out[0], unsafe.Pointer(unsafe.SliceData(w)), unsafe.SliceData(x), len(out), cols, 4*stride, false)
}

func dotF32SIMD(k isa, a, b []float32) float32 {
	var out [1]float32
	rowsSIMD(k, F32, out[:], a[:len(b)], b, widenF32)
	return out[0]
}

// axpyRowsSIMD is Attend's weighted sum: every row's Axpy, in order.
func axpyRowsSIMD(k isa, dst, a, x []float32, stride int) {
	n := len(dst)
	x = x[:(len(a)-1)*stride+n]
	if n16 := n &^ 15; n16 > 0 {
		axpyRowsAsm(k, &dst[0], &a[0], &x[0], len(a), n16, 4*stride)
	}
	for i := n &^ 15; i < n; i++ {
		for j, aj := range a {
			dst[i] += float32(aj * x[j*stride+i])
		}
	}
}

func addSIMD(k isa, dst, x []float32) {
	x = x[:len(dst)]
	n16 := len(dst) &^ 15
	if n16 > 0 {
		addAsm(k, &dst[0], &x[0], n16)
	}
	for i := n16; i < len(dst); i++ {
		dst[i] += x[i]
	}
}

func scaleMulSIMD(k isa, out, x, weight []float32, r float32) {
	x, weight = x[:len(out)], weight[:len(out)]
	n16 := len(out) &^ 15
	if n16 > 0 {
		scaleMulAsm(k, &out[0], &x[0], &weight[0], r, n16)
	}
	for i := n16; i < len(out); i++ {
		out[i] = weight[i] * float32(x[i]*r)
	}
}

func expShiftSIMD(k isa, x []float32, m float32) {
	n := len(x) &^ (expStep - 1)
	if n > 0 {
		expShiftAsm(k, &x[0], m, n)
	}
	expShiftGo(x[n:], m)
}

func siluMulSIMD(k isa, out, gate, up []float32) {
	gate, up = gate[:len(out)], up[:len(out)]
	n := len(out) &^ (expStep - 1)
	if n > 0 {
		siluMulAsm(k, &out[0], &gate[0], &up[0], n)
	}
	swiGLU(out[n:], gate[n:], up[n:])
}

func clampedSwiGLUSIMD(k isa, out, gateUp []float32, limit, alpha float32) {
	n := len(out) &^ (expStep - 1)
	if n > 0 {
		clampedSwiGLUAsm(k, &out[0], &gateUp[0], limit, alpha, n)
	}
	clampedSwiGLUGo(out[n:], gateUp[2*n:], limit, alpha)
}

// mmTileBytes bounds the float32 weights of one MatMul tile: rows widened
// once, then applied to every vector while they stay in L2.
const mmTileBytes = 256 << 10

// mmScratch holds the widened weight tiles of BF16, F16, Q8 and NF4 MatMuls.
var mmScratch = sync.Pool{New: func() any { return new([]float32) }}

// mmWay is one of matMulSIMD's ways to apply a matrix to a batch.
type mmWay int

const (
	mmByVector    mmWay = iota // the row kernel once per vector
	mmInRegisters              // mmDirectAsm: the weights widened in registers, 2-4 vectors at once
	mmTile                     // a tile widened to float32 scratch, mmShape's register tiles
)

// mmWayOf is the way matMulSIMD on k applies a matrix of dt with cols
// columns to n vectors.
func mmWayOf(k isa, dt DType, cols, n int) mmWay {
	_, mt := mmShape(k)
	switch {
	case dt == BF16P && n >= 3 && n <= 4 && mmDirect(k, dt):
		return mmInRegisters // its kernels take 3 or 4 vectors (mmBF16PSIMD)
	case cols == 0 || cols%16 != 0 || n < mt:
		return mmByVector
	case n <= mmDirectMax(k) && mmDirect(k, dt):
		return mmInRegisters
	}
	return mmTile
}

// matMulWay says mmWayOf's way in words.
func matMulWay(k isa, dt DType, cols, n int) string {
	switch mmWayOf(k, dt, cols, n) {
	case mmByVector:
		return "the row kernel once per vector"
	case mmInRegisters:
		return fmt.Sprintf("%v widened in registers, 2-4 vectors at once", dt)
	}
	mr, mt := mmShape(k)
	return fmt.Sprintf("%v widened to a float32 tile, %dx%d register tiles", dt, mr, mt)
}

// matMulSIMD computes rows [r0, r1) of w for all n vectors of x. Rows are
// taken a tile at a time: a BF16, F16, Q8 or NF4 tile is widened or
// dequantized (exactly) into float32 scratch once, and the micro-kernel applies it to mmShape's
// vectors at a time with one accumulator set per (row, vector) in
// registers. Every output element is still the Dot definition, so the
// result equals MatVec per vector bit for bit.
func matMulSIMD(k isa, p *rowKernels, out []float32, w Matrix, x []float32, n, r0, r1 int) {
	rows, cols := w.Rows, w.Cols
	mr, mt := mmShape(k)
	switch mmWayOf(k, w.DType, cols, n) {
	case mmByVector:
		matMulRowsByVector(p, out, w, x, n, r0, r1)
		return
	case mmInRegisters:
		matMulDirect(k, p, out, w, x, n, r0, r1)
		return
	}
	tile := max(mr, mmTileBytes/(cols*4)/mr*mr)
	rowBytes := w.DType.RowBytes(cols)
	var scratch []float32
	if w.DType != F32 {
		sp := mmScratch.Get().(*[]float32)
		defer mmScratch.Put(sp)
		if need := min(tile, r1-r0) * cols; cap(*sp) < need {
			*sp = make([]float32, need)
		}
		scratch = (*sp)[:cap(*sp)]
	}
	for b0 := r0; b0 < r1; b0 += tile {
		b1 := min(b0+tile, r1)
		nr := b1 - b0
		src := w.Data[b0*rowBytes : b1*rowBytes]
		var wf []float32
		switch w.DType {
		case F32:
			wf = f32View(src)
		case BF16, F16:
			wf = scratch[:nr*cols]
			widenAsm(k, w.DType, &wf[0], &u16View(src)[0], nr*cols)
		case BF16P:
			wf = scratch[:nr*cols]
			unpackRows(wf, w, b0, nr, p.unpackBF16P)
		case F8E4M3:
			wf = scratch[:nr*cols]
			for r := range nr {
				dequantF8Asm(k, wf[r*cols:(r+1)*cols], src[r*rowBytes:(r+1)*rowBytes], w.Scales, b0+r)
			}
		case MXFP4:
			wf = scratch[:nr*cols]
			sb := MXFP4.ScaleBytes(cols)
			for r := range nr {
				dequantMXFP4Asm(k, wf[r*cols:(r+1)*cols], src[r*rowBytes:(r+1)*rowBytes], w.Scales[(b0+r)*sb:(b0+r+1)*sb])
			}
		default:
			wf = scratch[:nr*cols]
			dequantRows(k, w.DType, wf, src, nr, cols)
		}
		whole := nr / mr * mr
		t := 0
		for ; t+mt <= n; t += mt {
			if whole > 0 {
				mmAsm(k, &out[t*rows+b0], rows*4, &wf[0], cols*4, whole, &x[t*cols], cols*4, cols)
			}
			for v := t; v < t+mt && whole < nr; v++ {
				rowsAsm(k, F32, &out[v*rows+b0+whole], unsafe.Pointer(&wf[whole*cols]), &x[v*cols], nr-whole, cols, cols*4, false)
			}
		}
		for ; t < n; t++ {
			rowsAsm(k, F32, &out[t*rows+b0], unsafe.Pointer(&wf[0]), &x[t*cols], nr, cols, cols*4, false)
		}
	}
}

// mmDirectVectors is the most vectors an AVX2 MatMul applies with
// mmDirectAsm (decode batches); more (prefill) widen or dequantize a tile
// once and reuse it. go test -bench MatMul, BF16, 2 threads: direct
// 1.2-2.5x faster at 2-4 vectors, even at 32, 10-15% slower at 128 on two
// shapes of three; Q8 direct 1.2-1.5x faster at 8 and 16. AVX-512's tile
// (4 rows x 4 vectors of 16 lanes) is the better from 5 vectors
// (mmDirectMax).
const mmDirectVectors = 16

// matMulDirect is matMulSIMD for weights that k's micro-kernels read as
// they are (mmDirect: BF16 widened, Q8 dequantized in registers, 2 to 4
// vectors a row), so no float32 copy is stored. A tile of rows
// (mmTileBytes of them, so it stays in L2) goes to every 4 vectors in
// turn, then to the 2 or 3 left over at once, or to the one left over
// through the row kernels, as MatVec streams it. Measured on small's
// shapes (docs/BENCHMARKS.md): BF16 2 and 3 vectors at once 0.9-1.3x one
// at a time, which was up to 2x the 2x2 register tile that read two rows
// at a time without prefetching; Q8 2 to 4 vectors 1.5-1.9x a dequantized
// tile under the 2x2 tile, since a Q8 product is bound by dequantizing,
// now done once a weight for up to 4 vectors. Every output element is
// MatVec's.
func matMulDirect(k isa, p *rowKernels, out []float32, w Matrix, x []float32, n, r0, r1 int) {
	rows, cols := w.Rows, w.Cols
	rowBytes := w.DType.RowBytes(cols)
	tile := max(1, mmTileBytes/rowBytes)
	for b0 := r0; b0 < r1; b0 += tile {
		b1 := min(b0+tile, r1)
		for t := 0; t < n; {
			v := min(4, n-t)
			switch {
			case v == 1:
				matVecRows(p, out[t*rows+b0:t*rows+b1], w, x[t*cols:(t+1)*cols], b0, b1)
			case w.DType == BF16P:
				mmBF16PSIMD(v, &out[t*rows+b0], rows*4, unsafe.Pointer(&w.Data[b0*rowBytes]), rowBytes, b1-b0, &x[t*cols], cols*4, cols, packedTable(w.Scales))
				for i := t; i < t+v; i++ {
					fixExceptionRows(p, out[i*rows+b0:i*rows+b1], w, x[i*cols:(i+1)*cols], b0)
				}
			default:
				mmDirectAsm(k, w.DType, v, &out[t*rows+b0], rows*4, unsafe.Pointer(&w.Data[b0*rowBytes]), rowBytes, b1-b0, &x[t*cols], cols*4, cols)
			}
			t += v
		}
	}
}

// dequantTileRows is how many rows of a format dequantized row by row
// rowsDequantSIMD dequantizes at a time: a tile that stays in L1 while
// the float32 row kernel reads it.
const dequantTileRows = 4

// rowsMXFP4SIMD is the MXFP4 row kernel of the assembly paths.
func rowsMXFP4SIMD(k isa, out []float32, codes, scales []byte, x []float32) {
	cb, sb := len(x)/2, len(x)/mxfp4Block
	rowsDequantSIMD(k, out, x, func(dst []float32, i int) {
		dequantMXFP4Asm(k, dst, codes[i*cb:(i+1)*cb], scales[i*sb:(i+1)*sb])
	})
}

// rowsF8SIMD is the F8E4M3 row kernel of the assembly paths: out's rows
// are the matrix's from r0 on.
func rowsF8SIMD(k isa, out []float32, codes, scales []byte, x []float32, r0 int) {
	cols := len(x)
	rowsDequantSIMD(k, out, x, func(dst []float32, i int) {
		dequantF8Asm(k, dst, codes[i*cols:(i+1)*cols], scales, r0+i)
	})
}

// rowsDequantSIMD computes out[i] = Dot(row i, x) for a format read row
// by row through dequant(dst, i), which writes row i's weights exactly
// (as the format's definition gives them, up to the sign of a zero): a
// few rows at a time into float32 scratch, then the float32 row kernel,
// whose arithmetic on those weights is the definition's.
func rowsDequantSIMD(k isa, out, x []float32, dequant func(dst []float32, i int)) {
	rows, cols := len(out), len(x)
	if rows == 0 {
		return
	}
	if cols == 0 {
		for r := range out {
			out[r] = 0
		}
		return
	}
	sp := mmScratch.Get().(*[]float32)
	defer mmScratch.Put(sp)
	if need := dequantTileRows * cols; cap(*sp) < need {
		*sp = make([]float32, need)
	}
	buf := (*sp)[:dequantTileRows*cols]
	for i0 := 0; i0 < rows; i0 += dequantTileRows {
		nr := min(dequantTileRows, rows-i0)
		for r := range nr {
			dequant(buf[r*cols:(r+1)*cols], i0+r)
		}
		rowsSIMD(k, F32, out[i0:i0+nr], buf[:nr*cols], x, widenF32)
	}
}

// dequantMXFP4Asm writes the len(dst) weights of one MXFP4 row (its
// codes and scales) into dst with the architecture's kernel
// (mxfp4Blocks). Code 8 comes out +0 where dequantMXFP4Row gives -0,
// which no Dot can tell apart (kernels/doc.go).
func dequantMXFP4Asm(_ isa, dst []float32, codes, scales []byte) {
	if nb := len(dst) / mxfp4Block; nb > 0 {
		mxfp4Blocks(&dst[0], &codes[:16*nb][0], &scales[:nb][0], nb)
	}
}

// dequantF8Asm writes the len(dst) weights of row r of an F8E4M3 matrix
// (codes: the row's bytes; scales: the whole Matrix.Scales) into dst,
// sixteen at a time with the architecture's kernel (f8Blocks), the last
// len(dst)%16 in Go.
func dequantF8Asm(_ isa, dst []float32, codes, scales []byte, r int) {
	sc := f8Scales(scales, r/f8Block, len(dst))
	n16 := len(dst) &^ 15
	for _, s := range sc {
		if !(math.Abs(float64(s)) < 0x1p119) {
			n16 = 0 // 256 x s would overflow, or s is NaN: all in Go
		}
	}
	if n16 > 0 {
		f8Blocks(&dst[0], &codes[:n16][0], &sc[0], n16)
	}
	for c := n16; c < len(dst); c++ {
		dst[c] = e4m3[codes[c]] * sc[c/f8Block]
	}
}
