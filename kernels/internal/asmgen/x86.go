package main

import "fmt"

// x86 describes one amd64 vector ISA: AVX2 holds the 16 lanes in two ymm
// registers (lanes 0-7 and 8-15), AVX-512 in one zmm register.
type x86 struct {
	name  string // symbol suffix: AVX2, AVX512
	parts int    // registers per 16 lanes
	width int    // float32 lanes per register
	v     string // register prefix: Y or Z
	zero  string // instruction that zeroes a register: xor with itself
}

var (
	avx2   = x86{name: "AVX2", parts: 2, width: 8, v: "Y", zero: "VXORPS"}
	avx512 = x86{name: "AVX512", parts: 1, width: 16, v: "Z", zero: "VPXORD"}
)

func (k x86) r(i int) string { return fmt.Sprintf("%s%d", k.v, i) }

func (k x86) all(a *asm) {
	for _, d := range []dtype{f32, bf16, f16} {
		k.rows(a, d)
	}
	k.quantRows(a, true)
	k.quantRows(a, false)
	k.quantDequant(a, true)
	k.quantDequant(a, false)
	nf4Data(a)
	if k.parts == 1 {
		nf4Perm512Data(a)
	} else {
		nf4Shift256Data(a)
	}
	k.mm(a)
	for _, t := range []int{2, 3, 4} {
		k.mmBF16(a, t)
	}
	if k.parts == 2 {
		for _, t := range []int{2, 3, 4} {
			k.mmQ8(a, t)
		}
	}
	if k.parts == 1 {
		packedAVX512(a) // BF16P: AVX-512 with VBMI only
	}
	k.widen(a, bf16)
	k.widen(a, f16)
	k.sumLanes(a)
	k.axpy(a)
	if k.parts == 2 {
		axpyRowsAVX2(a) // the AVX-512 path calls it too
		dequantMXFP4(a) // so do these
		mxfp4Data(a)
		dequantF8(a)
		f8Data(a)
	}
	k.add(a)
	k.scaleMul(a)
	expData(a)
	k.expShift(a)
	k.siluMul(a)
	k.clampedSwiGLU(a)
}

// loadW widens part p of the 16-element block of weights at element
// index AX of the row at base into register dst (F32: a plain load).
func (k x86) loadW(a *asm, d dtype, base string, p int, dst string) {
	off := p * k.width * d.size()
	switch d {
	case f32:
		a.i("VMOVUPS %d(%s)(AX*4), %s", off, base, dst)
	case bf16:
		// BF16 -> float32 is exact: the 16 bits become the top half.
		a.i("VPMOVZXWD %d(%s)(AX*2), %s", off, base, dst)
		a.i("VPSLLD $16, %s, %s", dst, dst)
	case f16:
		// F16C/AVX-512F conversion: exact (subnormals, Inf; NaN stays NaN).
		a.i("VCVTPH2PS %d(%s)(AX*2), %s", off, base, dst)
	}
}

// fold folds the 16 lanes held in accumulator set acc (acc[0] lanes 0-7
// and acc[1] lanes 8-15 for AVX2, acc[0] all 16 for AVX-512) pairwise:
// lane l += lane l+8, then l+4, then l+2, then l+1. The result is left in
// the low lane of X<acc[0]>; tmp is a scratch register number < 16.
func (k x86) fold(a *asm, acc []int, tmp int) {
	lo := acc[0]
	if k.parts == 2 {
		a.i("VADDPS Y%d, Y%d, Y%d", acc[1], lo, lo) // l += l+8
	} else {
		a.i("VEXTRACTF64X4 $1, Z%d, Y%d", lo, tmp)
		a.i("VADDPS Y%d, Y%d, Y%d", tmp, lo, lo) // l += l+8
	}
	a.i("VEXTRACTF128 $1, Y%d, X%d", lo, tmp)
	a.i("VADDPS X%d, X%d, X%d", tmp, lo, lo) // l += l+4
	a.i("VPERMILPS $0x0E, X%d, X%d", lo, tmp)
	a.i("VADDPS X%d, X%d, X%d", tmp, lo, lo) // l += l+2
	a.i("VMOVSHDUP X%d, X%d", lo, tmp)
	a.i("VADDSS X%d, X%d, X%d", tmp, lo, lo) // l += l+1
}

// The BF16 and F16 row kernels ask for no weights ahead of their loads:
// their four row streams are long and sequential, and the hardware
// prefetchers follow them. PREFETCHNTA 512 elements ahead gained 3-5% of
// BF16 GB/s on the Zen 5 VM of docs/BENCHMARKS.md, but on a Zen 4 VM
// (2026-11-29) it cost local decode on small 8% at one thread (54.3
// against 58.6 tok/s, medians of four interleaved rounds; 61.1 against
// 65.6 at two), and every distance tried there (1 and 4 KiB, NTA and T0)
// streamed slower than none.

// mmPrefetchElems is how far ahead of its loads mmBF16 asks for the
// weights: its one stream of rows is read at a quarter of a row kernel's
// pace a vector, and without the hint it fell short of the L2-resident
// speed. 1024 elements measured 1.1-1.4x no prefetch on small's shapes
// (1024 to 32000 rows of 1024 or 3584, 4 vectors, 1 and 2 threads,
// weights streamed from DRAM, means of three rounds); 256 to 4096
// (NTA or T0) all gained, 1024 and 2048 NTA the most (each best in one of
// two experiments).
const mmPrefetchElems = 1024

// rows emits rows<D><ISA>(out *float32, w unsafe.Pointer, x *float32,
// rows, n16, stride int, lanes bool): for each of rows rows (row r at w +
// r*stride bytes) it accumulates n16 elements (a multiple of 16) into the
// 16 lanes and stores either the folded result to out[r] (lanes false) or
// the 16 lanes to out[16r:16r+16] (lanes true).
//
// Four rows at a time share each load of x, and they are rows i, i+q,
// i+2q and i+3q (q = rows/4) rather than four neighbours: memory is then
// read as four long sequential streams, which the hardware prefetchers
// follow, instead of four streams of one row each. The rows%4 last rows
// are computed one at a time. Each row's arithmetic is the definition's
// whatever the order of rows.
func (k x86) rows(a *asm, d dtype) {
	name := "rows" + string(d) + k.name
	a.comment("func %s(out *float32, w unsafe.Pointer, x *float32, rows, n16, stride int, lanes bool)", name)
	a.text(name, 49)
	a.i("MOVQ out+0(FP), DI")
	a.i("MOVQ w+8(FP), SI")
	a.i("MOVQ x+16(FP), DX")
	a.i("MOVQ rows+24(FP), CX")
	a.i("MOVQ n16+32(FP), R9")
	a.i("MOVQ stride+40(FP), BX")
	a.i("MOVBLZX lanes+48(FP), R10")
	// R15 = q, the number of 4-row groups; R8 = q*stride, the distance
	// between a group's rows; R11 = the distance between their outputs.
	a.i("MOVQ CX, R15")
	a.i("SHRQ $2, R15")
	a.i("MOVQ R15, R8")
	a.i("IMULQ BX, R8")
	a.i("MOVQ R15, R11")
	a.i("SHLQ $2, R11")
	a.i("TESTQ R10, R10")
	a.i("JEQ setup")
	a.i("SHLQ $4, R11")
	a.label("setup")
	a.i("LEAQ (SI)(R8*1), R12")
	a.i("LEAQ (SI)(R8*2), R13")
	a.i("LEAQ (R12)(R8*2), R14")
	// Registers: accumulators of row r are k.r(r*parts+p); x parts and
	// temporaries follow.
	xreg, tmps := 16, []int{4, 5, 6, 7} // AVX-512: acc Z0-Z3, x Z16
	foldTmp := 8
	if k.parts == 2 {
		xreg, tmps = 8, []int{10, 11, 12, 13, 14} // AVX2: acc Y0-Y7, x Y8-Y9
		foldTmp = 15
	}
	block := func(bases []string) {
		for p := range k.parts {
			a.i("VMOVUPS %d(DX)(AX*4), %s", p*k.width*4, k.r(xreg+p))
		}
		n := 0
		for r, base := range bases {
			for p := range k.parts {
				t := k.r(tmps[n%len(tmps)])
				n++
				acc := k.r(r*k.parts + p)
				if d == f32 {
					a.i("VMULPS %d(%s)(AX*4), %s, %s", p*k.width*4, base, k.r(xreg+p), t)
				} else {
					k.loadW(a, d, base, p, t)
					a.i("VMULPS %s, %s, %s", k.r(xreg+p), t, t)
				}
				a.i("VADDPS %s, %s, %s", t, acc, acc)
			}
		}
	}
	// group computes nrows rows at bases; their outputs are outs (byte
	// addresses relative to DI), computed after the loop when AX is free.
	group := func(nrows int, bases, outs []string, sfx string) {
		for i := range nrows * k.parts {
			a.i("%s %s, %s, %s", k.zero, k.r(i), k.r(i), k.r(i))
		}
		a.i("XORQ AX, AX")
		a.i("TESTQ R9, R9")
		a.i("JEQ fold%s", sfx)
		a.label("loop" + sfx)
		block(bases)
		a.i("ADDQ $16, AX")
		a.i("CMPQ AX, R9")
		a.i("JLT loop%s", sfx)
		a.label("fold" + sfx)
		if nrows == 4 {
			a.i("LEAQ (R11)(R11*2), AX")
		}
		a.i("TESTQ R10, R10")
		a.i("JNE lanes%s", sfx)
		for r := range nrows {
			acc := []int{r * k.parts, r*k.parts + 1}
			k.fold(a, acc, foldTmp)
			a.i("VMOVSS X%d, %s", acc[0], outs[r])
		}
		a.i("ADDQ $4, DI")
		a.i("JMP next%s", sfx)
		a.label("lanes" + sfx)
		for r := range nrows {
			for p := range k.parts {
				a.i("VMOVUPS %s, %d%s", k.r(r*k.parts+p), 4*k.width*p, outs[r])
			}
		}
		a.i("ADDQ $64, DI")
		a.label("next" + sfx)
	}
	quarterRows(a, "CX", false,
		func() {
			group(4, []string{"SI", "R12", "R13", "R14"}, []string{"(DI)", "(DI)(R11*1)", "(DI)(R11*2)", "(DI)(AX*1)"}, "4")
		},
		func() { group(1, []string{"SI"}, []string{"(DI)"}, "1") })
}

// quarterRows emits a row kernel's driver over its four quarters: R15
// groups of a row from each quarter (four, then SI, R12, R13 and R14 each
// a row on, BX bytes), then the rows%4 last rows one at a time (one, then
// SI a row on), which start where the fourth quarter ended and write
// after its outputs. count is the last rows' counter: CX holding rows,
// or, reload set, a register loaded with rows from the frame.
func quarterRows(a *asm, count string, reload bool, four, one func()) {
	a.label("group4")
	a.i("TESTQ R15, R15")
	a.i("JEQ rest")
	four()
	for _, r := range []string{"SI", "R12", "R13", "R14"} {
		a.i("ADDQ BX, %s", r)
	}
	a.i("DECQ R15")
	a.i("JMP group4")
	a.label("rest")
	a.i("MOVQ R14, SI")
	a.i("LEAQ (R11)(R11*2), AX")
	a.i("ADDQ AX, DI")
	if reload {
		a.i("MOVQ rows+24(FP), %s", count)
	}
	a.i("ANDQ $3, %s", count)
	a.label("single")
	a.i("TESTQ %s, %s", count, count)
	a.i("JEQ done")
	one()
	a.i("ADDQ BX, SI")
	a.i("DECQ %s", count)
	a.i("JMP single")
	a.label("done")
	a.i("VZEROUPPER")
	a.i("RET")
}

// mm emits mm<ISA>(out *float32, outStride int, w *float32, wStride, rows
// int, x *float32, xStride, n16 int), the MatMul micro-kernel on float32
// weights: for each group of R rows (rows is a multiple of R) and the T
// vectors at x, x+xStride, ... it stores out[t*outStride + r] (strides in
// bytes) = Dot(row r, vector t) over n16 elements (a multiple of 16).
// AVX-512 runs R=4 rows by T=4 vectors (16 zmm accumulators), AVX2 R=2
// by T=2 (8 ymm accumulators); each accumulator follows the definition.
func (k x86) mm(a *asm) {
	name := "mm" + k.name
	R, T := 4, 4
	if k.parts == 2 {
		R, T = 2, 2
	}
	a.comment("func %s(out *float32, outStride int, w *float32, wStride, rows int, x *float32, xStride, n16 int)", name)
	a.comment("%d rows x %d vectors per register tile.", R, T)
	a.text(name, 64)
	mmArgs(a)
	a.i("SHLQ $2, SI")
	xp := []string{"R8", "R9", "R10", "R11"}[:T]
	wp := []string{"R12", "R13", "R14", "R15"}[:R]
	for t := 1; t < T; t++ {
		a.i("LEAQ (%s)(AX*1), %s", xp[t-1], xp[t])
	}
	// AVX-512: x Z0-Z3, w Z4-Z7, temporaries Z8-Z15, acc[r][t] Z16+4r+t.
	// AVX2: acc[r][t] part p Y(4r+2t+p), w[r] part p Y(8+2r+p), x part p
	// Y12+p (one vector at a time), temporaries Y14-Y15.
	acc := func(r, t, p int) int {
		if k.parts == 2 {
			return 4*r + 2*t + p
		}
		return 16 + 4*r + t
	}
	a.label("group")
	a.i("CMPQ CX, $%d", R)
	a.i("JLT done")
	for r := 1; r < R; r++ {
		if r == 1 {
			a.i("LEAQ (R12)(DX*1), R13")
		} else {
			a.i("LEAQ (%s)(DX*1), %s", wp[r-1], wp[r])
		}
	}
	for r := range R {
		for t := range T {
			for p := range k.parts {
				n := acc(r, t, p)
				a.i("%s %s, %s, %s", k.zero, k.r(n), k.r(n), k.r(n))
			}
		}
	}
	a.i("XORQ AX, AX")
	a.i("TESTQ SI, SI")
	a.i("JEQ fold")
	a.label("loop")
	if k.parts == 1 {
		for t := range T {
			a.i("VMOVUPS (%s)(AX*1), Z%d", xp[t], t)
		}
		for r := range R {
			a.i("VMOVUPS (%s)(AX*1), Z%d", wp[r], 4+r)
		}
		for r := range R {
			for t := range T {
				tmp := 8 + (r*T+t)%8
				a.i("VMULPS Z%d, Z%d, Z%d", t, 4+r, tmp)
				a.i("VADDPS Z%d, Z%d, Z%d", tmp, acc(r, t, 0), acc(r, t, 0))
			}
		}
	} else {
		for r := range R {
			for p := range 2 {
				a.i("VMOVUPS %d(%s)(AX*1), Y%d", 32*p, wp[r], 8+2*r+p)
			}
		}
		n := 0
		for t := range T {
			for p := range 2 {
				a.i("VMOVUPS %d(%s)(AX*1), Y%d", 32*p, xp[t], 12+p)
			}
			for r := range R {
				for p := range 2 {
					tmp := 14 + n%2
					n++
					a.i("VMULPS Y%d, Y%d, Y%d", 12+p, 8+2*r+p, tmp)
					a.i("VADDPS Y%d, Y%d, Y%d", tmp, acc(r, t, p), acc(r, t, p))
				}
			}
		}
	}
	a.i("ADDQ $64, AX")
	a.i("CMPQ AX, SI")
	a.i("JLT loop")
	a.label("fold")
	outAddr := []string{"(DI)", "(DI)(BX*1)", "(DI)(BX*2)", "(DI)(AX*1)"}
	if T > 3 {
		a.i("LEAQ (BX)(BX*2), AX")
	}
	for r := range R {
		for t := range T {
			if k.parts == 1 {
				a.i("VMOVAPS Z%d, Z0", acc(r, t, 0))
				k.fold(a, []int{0}, 8)
				a.i("VMOVSS X0, %d%s", 4*r, outAddr[t])
			} else {
				k.fold(a, []int{acc(r, t, 0), acc(r, t, 1)}, 15)
				a.i("VMOVSS X%d, %d%s", acc(r, t, 0), 4*r, outAddr[t])
			}
		}
	}
	a.i("ADDQ $%d, DI", 4*R)
	a.i("LEAQ (%s)(DX*%d), R12", "R12", R)
	a.i("SUBQ $%d, CX", R)
	a.i("JMP group")
	a.label("done")
	a.i("VZEROUPPER")
	a.i("RET")
}

// mmArgs loads the arguments every MatMul micro-kernel takes, (out
// *float32, outStride int, w, wStride, rows int, x *float32, xStride,
// n16 int): out DI, outStride BX, w R12, wStride DX, rows CX, x R8,
// xStride AX, n16 SI.
func mmArgs(a *asm) {
	for _, arg := range []string{"out+0(FP), DI", "outStride+8(FP), BX", "w+16(FP), R12", "wStride+24(FP), DX",
		"rows+32(FP), CX", "x+40(FP), R8", "xStride+48(FP), AX", "n16+56(FP), SI"} {
		a.i("MOVQ %s", arg)
	}
}

// mmBF16 emits mmBF16x<T><ISA>(out *float32, outStride int, w *uint16,
// wStride, rows int, x *float32, xStride, n16 int), T 2 to 4: for each
// row (any count) and the T vectors at x, x+xStride, ...,
// out[t*outStride + r] = Dot(row r, vector t), BF16 weights widened in
// registers once for all T vectors. acc[t] part p is register
// parts*t+p, w part p 8+p, x part p 10+p, temporaries 12-15 (Y on AVX2,
// Z on AVX-512, whose one register holds all 16 lanes); each accumulator
// follows the definition, as mm's, so the bits are those of mm on the
// widened rows. A MatMul so reads its weights once from memory and never
// stores a widened copy.
func (k x86) mmBF16(a *asm, T int) {
	name := fmt.Sprintf("mmBF16x%d%s", T, k.name)
	a.comment("func %s(out *float32, outStride int, w *uint16, wStride, rows int, x *float32, xStride, n16 int)", name)
	a.comment("1 row x %d vectors per register tile, BF16 weights widened in registers.", T)
	k.mmOneRow(a, name, T, 64, nil, func(xp []string) {
		a.i("PREFETCHNTA %d(R12)(AX*2)", mmPrefetchElems*bf16.size())
		for p := range k.parts {
			k.loadW(a, bf16, "R12", p, k.r(8+p))
		}
		n := 0
		for t := range T {
			for p := range k.parts {
				a.i("VMOVUPS %d(%s)(AX*4), %s", 4*k.width*p, xp[t], k.r(10+p))
				tmp := 12 + n%4
				n++
				a.i("VMULPS %s, %s, %s", k.r(10+p), k.r(8+p), k.r(tmp))
				a.i("VADDPS %s, %s, %s", k.r(tmp), k.r(k.parts*t+p), k.r(k.parts*t+p))
			}
		}
	})
}

// mmOneRow emits the skeleton of a 1-row x T-vector MatMul micro-kernel
// (mmBF16, mmQ8) taking mmArgs (argBytes of them): the vectors' pointers
// in R8-R11, for each row its T accumulators zeroed (registers parts*t to
// parts*t+parts-1: Y(2t), Y(2t+1) on AVX2, Z(t) on AVX-512), rowSetup (if
// any), then block(xp) for each 16 elements at AX, then each folded to
// out[t*outStride + r] (3*outStride in R13). block must leave AX, BX, CX,
// DX, SI, DI, R8-R13 as it found them.
func (k x86) mmOneRow(a *asm, name string, T, argBytes int, rowSetup func(), block func(xp []string)) {
	a.text(name, argBytes)
	mmArgs(a)
	xp := []string{"R8", "R9", "R10", "R11"}[:T]
	for t := 1; t < T; t++ {
		a.i("LEAQ (%s)(AX*1), %s", xp[t-1], xp[t])
	}
	if T > 3 {
		a.i("LEAQ (BX)(BX*2), R13") // 3 * outStride
	}
	sfx := fmt.Sprintf("x%d", T)
	a.label("row" + sfx)
	a.i("TESTQ CX, CX")
	a.i("JEQ done" + sfx)
	for n := range k.parts * T {
		a.i("%s %s, %s, %s", k.zero, k.r(n), k.r(n), k.r(n))
	}
	if rowSetup != nil {
		rowSetup()
	}
	a.i("XORQ AX, AX")
	a.i("TESTQ SI, SI")
	a.i("JEQ fold" + sfx)
	a.label("loop" + sfx)
	block(xp)
	a.i("ADDQ $16, AX")
	a.i("CMPQ AX, SI")
	a.i("JLT loop" + sfx)
	a.label("fold" + sfx)
	outAddr := []string{"(DI)", "(DI)(BX*1)", "(DI)(BX*2)", "(DI)(R13*1)"}
	for t := range T {
		acc := []int{k.parts * t}
		if k.parts == 2 {
			acc = append(acc, 2*t+1)
		}
		k.fold(a, acc, 15)
		a.i("VMOVSS X%d, %s", k.parts*t, outAddr[t])
	}
	a.i("ADDQ $4, DI")
	a.i("ADDQ DX, R12")
	a.i("DECQ CX")
	a.i("JMP row" + sfx)
	a.label("done" + sfx)
	a.i("VZEROUPPER")
	a.i("RET")
}

// widen emits widen<D><ISA>(dst *float32, src *uint16, n int): dst[i] =
// the exact float32 value of src[i], n a multiple of 16.
func (k x86) widen(a *asm, d dtype) {
	name := "widen" + string(d) + k.name
	a.comment("func %s(dst *float32, src *uint16, n int)", name)
	a.text(name, 24)
	a.i("MOVQ dst+0(FP), DI")
	a.i("MOVQ src+8(FP), SI")
	a.i("MOVQ n+16(FP), CX")
	a.i("XORQ AX, AX")
	a.i("TESTQ CX, CX")
	a.i("JEQ done")
	a.label("loop")
	for p := range k.parts {
		k.loadW(a, d, "SI", p, k.r(p))
	}
	for p := range k.parts {
		a.i("VMOVUPS %s, %d(DI)(AX*4)", k.r(p), 4*k.width*p)
	}
	a.i("ADDQ $16, AX")
	a.i("CMPQ AX, CX")
	a.i("JLT loop")
	a.label("done")
	a.i("VZEROUPPER")
	a.i("RET")
}

// sumLanes emits sumLanes<ISA>(acc *float32, x *float32, n16 int): the 16
// lanes of Sum over n16 elements (a multiple of 16), unfolded, into acc.
func (k x86) sumLanes(a *asm) {
	name := "sumLanes" + k.name
	a.comment("func %s(acc *float32, x *float32, n16 int)", name)
	a.text(name, 24)
	a.i("MOVQ acc+0(FP), DI")
	a.i("MOVQ x+8(FP), SI")
	a.i("MOVQ n16+16(FP), CX")
	for p := range k.parts {
		a.i("%s %s, %s, %s", k.zero, k.r(p), k.r(p), k.r(p))
	}
	a.i("XORQ AX, AX")
	a.i("TESTQ CX, CX")
	a.i("JEQ done")
	a.label("loop")
	for p := range k.parts {
		a.i("VADDPS %d(SI)(AX*4), %s, %s", 4*k.width*p, k.r(p), k.r(p))
	}
	a.i("ADDQ $16, AX")
	a.i("CMPQ AX, CX")
	a.i("JLT loop")
	a.label("done")
	for p := range k.parts {
		a.i("VMOVUPS %s, %d(DI)", k.r(p), 4*k.width*p)
	}
	a.i("VZEROUPPER")
	a.i("RET")
}

// elementwise emits the loop of an elementwise kernel over n elements (a
// multiple of 16), index AX; body emits the work for part p at byte
// offset off.
func (k x86) elementwise(a *asm, body func(p, off int)) {
	k.loop(a, 16, func() {
		for p := range k.parts {
			body(p, 4*k.width*p)
		}
	})
}

// loop emits a kernel's loop over CX elements (a multiple of step), index
// AX, turn emitting a turn's work, and its return.
func (k x86) loop(a *asm, step int, turn func()) {
	a.i("XORQ AX, AX")
	a.i("TESTQ CX, CX")
	a.i("JEQ done")
	a.label("loop")
	turn()
	a.i("ADDQ $%d, AX", step)
	a.i("CMPQ AX, CX")
	a.i("JLT loop")
	a.label("done")
	a.i("VZEROUPPER")
	a.i("RET")
}

// axpy emits axpy<ISA>(dst *float32, a float32, x *float32, n int):
// dst[i] = dst[i] + float32(a*x[i]), unfused.
func (k x86) axpy(a *asm) {
	name := "axpy" + k.name
	a.comment("func %s(dst *float32, a float32, x *float32, n int)", name)
	a.text(name, 32)
	a.i("MOVQ dst+0(FP), DI")
	a.i("VBROADCASTSS a+8(FP), %s", k.r(15))
	a.i("MOVQ x+16(FP), SI")
	a.i("MOVQ n+24(FP), CX")
	k.elementwise(a, func(p, off int) {
		t := k.r(p)
		a.i("VMULPS %d(SI)(AX*4), %s, %s", off, k.r(15), t)
		a.i("VADDPS %d(DI)(AX*4), %s, %s", off, t, t)
		a.i("VMOVUPS %s, %d(DI)(AX*4)", t, off)
	})
}

// add emits add<ISA>(dst, x *float32, n int): dst[i] += x[i].
func (k x86) add(a *asm) {
	name := "add" + k.name
	a.comment("func %s(dst, x *float32, n int)", name)
	a.text(name, 24)
	a.i("MOVQ dst+0(FP), DI")
	a.i("MOVQ x+8(FP), SI")
	a.i("MOVQ n+16(FP), CX")
	k.elementwise(a, func(p, off int) {
		t := k.r(p)
		a.i("VMOVUPS %d(DI)(AX*4), %s", off, t)
		a.i("VADDPS %d(SI)(AX*4), %s, %s", off, t, t)
		a.i("VMOVUPS %s, %d(DI)(AX*4)", t, off)
	})
}

// scaleMul emits scaleMul<ISA>(out, x, weight *float32, r float32, n
// int): out[i] = weight[i] * float32(x[i]*r), RMSNorm's last step.
func (k x86) scaleMul(a *asm) {
	name := "scaleMul" + k.name
	a.comment("func %s(out, x, weight *float32, r float32, n int)", name)
	a.text(name, 40)
	a.i("MOVQ out+0(FP), DI")
	a.i("MOVQ x+8(FP), SI")
	a.i("MOVQ weight+16(FP), DX")
	a.i("VBROADCASTSS r+24(FP), %s", k.r(15))
	a.i("MOVQ n+32(FP), CX")
	k.elementwise(a, func(p, off int) {
		t := k.r(p)
		a.i("VMULPS %d(SI)(AX*4), %s, %s", off, k.r(15), t)
		a.i("VMULPS %d(DX)(AX*4), %s, %s", off, t, t)
		a.i("VMOVUPS %s, %d(DI)(AX*4)", t, off)
	})
}

// axpyRowsAVX2 emits axpyRowsAVX2(dst, a, x *float32, rows, n16, stride
// int), kernels.Attend's weighted sum of value rows (the comment it emits
// says what it computes): blocks of 32 elements of dst in Y0-Y3 over all
// rows, then a block of 16 in Y0-Y1. The AVX-512 path calls it too.
func axpyRowsAVX2(a *asm) {
	a.b.WriteString(`
// func axpyRowsAVX2(dst, a, x *float32, rows, n16, stride int)
// dst[i] += a[j]*x[j*stride+i] (stride in bytes) for i < n16 (a multiple
// of 16) and j = 0, 1, ..., rows-1 in order: Axpy's arithmetic (the
// product rounded, VMULPS, then added, VADDPS) a row at a time, with each
// block of 32 (then 16) elements of dst held in registers over all rows.
`)
	a.text("axpyRowsAVX2", 48)
	a.i("MOVQ dst+0(FP), DI")
	a.i("MOVQ a+8(FP), SI")
	a.i("MOVQ x+16(FP), DX")
	a.i("MOVQ rows+24(FP), CX")
	a.i("MOVQ n16+32(FP), R9")
	a.i("MOVQ stride+40(FP), BX")
	a.i("SHLQ $2, R9") // bytes
	a.i("XORQ R8, R8") // byte offset of the block
	for _, regs := range []int{4, 2} {
		elems, bytes := 8*regs, 32*regs
		a.label(fmt.Sprintf("block%d", elems))
		if regs == 4 { // as many blocks of 32 as fit
			a.i("MOVQ R9, AX")
			a.i("SUBQ R8, AX")
			a.i("CMPQ AX, $%d", bytes)
			a.i("JLT block16")
		} else { // at most one block of 16 is left
			a.i("CMPQ AX, $%d", bytes)
			a.i("JLT done")
		}
		for r := range regs {
			a.i("VMOVUPS %d(DI)(R8*1), Y%d", 32*r, r)
		}
		a.i("LEAQ (DX)(R8*1), R10")
		a.i("XORQ R11, R11")
		a.i("TESTQ CX, CX")
		a.i("JEQ store%d", elems)
		a.label(fmt.Sprintf("row%d", elems))
		a.i("VBROADCASTSS (SI)(R11*4), Y8")
		for r := range regs {
			a.i("VMULPS %d(R10), Y8, Y%d", 32*r, 4+r)
			a.i("VADDPS Y%d, Y%d, Y%d", 4+r, r, r)
		}
		a.i("ADDQ BX, R10")
		a.i("INCQ R11")
		a.i("CMPQ R11, CX")
		a.i("JLT row%d", elems)
		a.label(fmt.Sprintf("store%d", elems))
		for r := range regs {
			a.i("VMOVUPS Y%d, %d(DI)(R8*1)", r, 32*r)
		}
		if regs == 4 {
			a.i("ADDQ $%d, R8", bytes)
			a.i("JMP block32")
		}
	}
	a.label("done")
	a.i("VZEROUPPER")
	a.i("RET")
}
