package main

import "fmt"

// NEON: the 16 lanes of a row live in four q registers, lanes 4j..4j+3 in
// the j-th. The Go assembler has no vector FADD, FMUL, FCVTL or scalar
// FADDP, so those are emitted as WORDs with the instruction in a comment.

// fadd emits FADD Vd.4S, Vn.4S, Vm.4S (d = n + m, rounded; never fused).
func fadd(a *asm, d, n, m int) {
	a.i("WORD $0x%08x // FADD V%d.4S, V%d.4S, V%d.4S", 0x4E20D400|m<<16|n<<5|d, d, n, m)
}

// fmul emits FMUL Vd.4S, Vn.4S, Vm.4S (d = n * m, rounded).
func fmul(a *asm, d, n, m int) {
	a.i("WORD $0x%08x // FMUL V%d.4S, V%d.4S, V%d.4S", 0x6E20DC00|m<<16|n<<5|d, d, n, m)
}

// fcvtl emits FCVTL (hi false: halves 0-3) or FCVTL2 (hi true: halves 4-7)
// Vd.4S, Vn.4H/8H: exact F16 -> float32.
func fcvtl(a *asm, d, n int, hi bool) {
	if hi {
		a.i("WORD $0x%08x // FCVTL2 V%d.4S, V%d.8H", 0x4E217800|n<<5|d, d, n)
	} else {
		a.i("WORD $0x%08x // FCVTL V%d.4S, V%d.4H", 0x0E217800|n<<5|d, d, n)
	}
}

// faddp emits FADDP Sd, Vn.2S: lane 0 + lane 1 of Vn.
func faddp(a *asm, d, n int) {
	a.i("WORD $0x%08x // FADDP S%d, V%d.2S", 0x7E30D800|n<<5|d, d, n)
}

func vlist(first, n int, arr string) string {
	s := "["
	for i := range n {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("V%d.%s", first+i, arr)
	}
	return s + "]"
}

// neonFold folds the lanes in V<acc>..V<acc+3> pairwise (l += l+8, l +=
// l+4, l += l+2, l += l+1); the result is S<acc>. tmp is a scratch vector.
func neonFold(a *asm, acc, tmp int) {
	fadd(a, acc, acc, acc+2)     // lanes 0-3 += 8-11
	fadd(a, acc+1, acc+1, acc+3) // lanes 4-7 += 12-15
	fadd(a, acc, acc, acc+1)     // lanes 0-3 += 4-7
	a.i("VEXT $8, V%d.B16, V%d.B16, V%d.B16", acc, acc, tmp)
	fadd(a, acc, acc, tmp) // lanes 0-1 += 2-3
	faddp(a, acc, acc)     // lane 0 + lane 1
}

// neonLoadW loads the 16-element block of weights at *base (post-
// incremented) into V<dst>..V<dst+3> as float32; V31 must be zero.
func neonLoadW(a *asm, d dtype, base string, dst int) {
	switch d {
	case f32:
		a.i("VLD1.P 64(%s), %s", base, vlist(dst, 4, "S4"))
	case bf16:
		// ZIP1/ZIP2 with zero halves: each 32-bit lane gets bits<<16, the
		// exact float32 value.
		a.i("VLD1.P 32(%s), [V28.H8, V29.H8]", base)
		a.i("VZIP1 V28.H8, V31.H8, V%d.H8", dst)
		a.i("VZIP2 V28.H8, V31.H8, V%d.H8", dst+1)
		a.i("VZIP1 V29.H8, V31.H8, V%d.H8", dst+2)
		a.i("VZIP2 V29.H8, V31.H8, V%d.H8", dst+3)
	case f16:
		a.i("VLD1.P 32(%s), [V28.H8, V29.H8]", base)
		fcvtl(a, dst, 28, false)
		fcvtl(a, dst+1, 28, true)
		fcvtl(a, dst+2, 29, false)
		fcvtl(a, dst+3, 29, true)
	}
}

func neonZero(a *asm, first, n int) {
	for i := first; i < first+n; i++ {
		a.i("VEOR V%d.B16, V%d.B16, V%d.B16", i, i, i)
	}
}

func neonAll(a *asm) {
	for _, d := range []dtype{f32, bf16, f16} {
		neonRows(a, d)
	}
	neonQuantRows(a, true)
	neonQuantRows(a, false)
	neonQuantDequant(a, true)
	neonQuantDequant(a, false)
	neonMM(a)
	neonWiden(a, bf16)
	neonWiden(a, f16)
	neonSumLanes(a)
	neonAxpy(a)
	neonAdd(a)
	neonScaleMul(a)
	neonDequantMXFP4(a)
	neonDequantF8(a)
	a.comment("MXFP4: 2^(s-128) for every scale byte s.")
	mxfp4ScaleTable(a)
}

// neonRows: see x86.rows (four rows i, i+q, i+2q, i+3q per group, then
// the rows%4 last ones). Registers: acc of row r V4r..V4r+3 (V0-V15), x
// V16-V19, widened w V20-V23, products V24-V27, raw 16-bit w V28-V29, zero
// V31; R1 the group's first row, R4-R7 its four rows, R14 = q*stride,
// R15 the distance between the four rows' outputs, R16/R17/R19 their
// addresses.
func neonRows(a *asm, d dtype) {
	name := "rows" + string(d) + "NEON"
	a.comment("func %s(out *float32, w unsafe.Pointer, x *float32, rows, n16, stride int, lanes bool)", name)
	a.text(name, 49)
	a.i("MOVD out+0(FP), R0")
	a.i("MOVD w+8(FP), R1")
	a.i("MOVD x+16(FP), R2")
	a.i("MOVD rows+24(FP), R3")
	a.i("MOVD n16+32(FP), R9")
	a.i("MOVD stride+40(FP), R10")
	a.i("MOVBU lanes+48(FP), R11")
	a.i("LSR $4, R9, R9")
	neonZero(a, 31, 1)
	a.i("LSR $2, R3, R13")
	a.i("MUL R10, R13, R14")
	a.i("LSL $2, R13, R15")
	a.i("CBZ R11, setup")
	a.i("LSL $4, R15, R15")
	a.label("setup")
	group := func(nrows int, outs []string, sfx string) {
		bases := []string{"R4", "R5", "R6", "R7"}[:nrows]
		a.i("MOVD R1, R4")
		for r := 1; r < nrows; r++ {
			a.i("ADD R14, %s, %s", bases[r-1], bases[r])
		}
		a.i("MOVD R2, R8")
		neonZero(a, 0, 4*nrows)
		a.i("MOVD R9, R12")
		a.i("CBZ R12, fold%s", sfx)
		a.label("loop" + sfx)
		a.i("VLD1.P 64(R8), %s", vlist(16, 4, "S4"))
		for r, base := range bases {
			neonLoadW(a, d, base, 20)
			for q := range 4 {
				fmul(a, 24+q, 20+q, 16+q)
			}
			for q := range 4 {
				fadd(a, 4*r+q, 4*r+q, 24+q)
			}
		}
		a.i("SUBS $1, R12, R12")
		a.i("BNE loop%s", sfx)
		a.label("fold" + sfx)
		if nrows == 4 {
			a.i("ADD R15, R0, R16")
			a.i("ADD R15, R16, R17")
			a.i("ADD R15, R17, R19")
		}
		a.i("CBNZ R11, lanes%s", sfx)
		for r := range nrows {
			neonFold(a, 4*r, 24)
			a.i("FMOVS F%d, (%s)", 4*r, outs[r])
		}
		a.i("ADD $4, R0")
		a.i("B next%s", sfx)
		a.label("lanes" + sfx)
		for r := range nrows {
			a.i("VST1 %s, (%s)", vlist(4*r, 4, "S4"), outs[r])
		}
		a.i("ADD $64, R0")
		a.label("next" + sfx)
		a.i("ADD R10, R1, R1")
	}
	a.label("group4")
	a.i("CBZ R13, rest")
	group(4, []string{"R0", "R16", "R17", "R19"}, "4")
	a.i("SUB $1, R13, R13")
	a.i("B group4")
	// The rows%4 last rows start where the fourth stream ended; their
	// outputs after the fourth quarter's.
	a.label("rest")
	a.i("ADD R14, R1, R1")
	a.i("ADD R14<<1, R1, R1")
	a.i("ADD R15, R0, R0")
	a.i("ADD R15<<1, R0, R0")
	a.i("AND $3, R3, R3")
	a.label("single")
	a.i("CBZ R3, done")
	group(1, []string{"R0"}, "1")
	a.i("SUB $1, R3, R3")
	a.i("B single")
	a.label("done")
	a.i("RET")
}

// neonMM: see x86.mm; 2 rows x 2 vectors. acc[r][t] V(8r+4t)..+3 (V0-V15),
// x0 V16-V19, x1 V20-V23, w V24-V27, products V28-V31.
func neonMM(a *asm) {
	name := "mmNEON"
	a.comment("func %s(out *float32, outStride int, w *float32, wStride, rows int, x *float32, xStride, n16 int)", name)
	a.comment("2 rows x 2 vectors per register tile.")
	a.text(name, 64)
	a.i("MOVD out+0(FP), R0")
	a.i("MOVD outStride+8(FP), R1")
	a.i("MOVD w+16(FP), R2")
	a.i("MOVD wStride+24(FP), R3")
	a.i("MOVD rows+32(FP), R4")
	a.i("MOVD x+40(FP), R5")
	a.i("MOVD xStride+48(FP), R6")
	a.i("MOVD n16+56(FP), R7")
	a.i("LSR $4, R7, R7")
	a.i("ADD R6, R5, R13")
	a.label("group")
	a.i("CMP $2, R4")
	a.i("BLT done")
	a.i("MOVD R2, R10")
	a.i("ADD R3, R2, R11")
	a.i("MOVD R5, R8")
	a.i("MOVD R13, R9")
	neonZero(a, 0, 16)
	a.i("MOVD R7, R12")
	a.i("CBZ R12, fold")
	a.label("loop")
	a.i("VLD1.P 64(R8), %s", vlist(16, 4, "S4"))
	a.i("VLD1.P 64(R9), %s", vlist(20, 4, "S4"))
	for r, wp := range []string{"R10", "R11"} {
		a.i("VLD1.P 64(%s), %s", wp, vlist(24, 4, "S4"))
		for t := range 2 {
			for q := range 4 {
				fmul(a, 28+q, 24+q, 16+4*t+q)
			}
			for q := range 4 {
				acc := 8*r + 4*t + q
				fadd(a, acc, acc, 28+q)
			}
		}
	}
	a.i("SUBS $1, R12, R12")
	a.i("BNE loop")
	a.label("fold")
	a.i("ADD R1, R0, R14")
	for r := range 2 {
		for t, out := range []string{"R0", "R14"} {
			acc := 8*r + 4*t
			neonFold(a, acc, 28)
			a.i("FMOVS F%d, %d(%s)", acc, 4*r, out)
		}
	}
	a.i("ADD $8, R0")
	a.i("ADD R3<<1, R2, R2")
	a.i("SUB $2, R4, R4")
	a.i("B group")
	a.label("done")
	a.i("RET")
}

func neonWiden(a *asm, d dtype) {
	name := "widen" + string(d) + "NEON"
	a.comment("func %s(dst *float32, src *uint16, n int)", name)
	a.text(name, 24)
	a.i("MOVD dst+0(FP), R0")
	a.i("MOVD src+8(FP), R1")
	a.i("MOVD n+16(FP), R2")
	a.i("LSR $4, R2, R2")
	a.i("CBZ R2, done")
	neonZero(a, 31, 1)
	a.label("loop")
	neonLoadW(a, d, "R1", 0)
	a.i("VST1.P %s, 64(R0)", vlist(0, 4, "S4"))
	a.i("SUBS $1, R2, R2")
	a.i("BNE loop")
	a.label("done")
	a.i("RET")
}

func neonSumLanes(a *asm) {
	name := "sumLanesNEON"
	a.comment("func %s(acc *float32, x *float32, n16 int)", name)
	a.text(name, 24)
	a.i("MOVD acc+0(FP), R0")
	a.i("MOVD x+8(FP), R1")
	a.i("MOVD n16+16(FP), R2")
	a.i("LSR $4, R2, R2")
	neonZero(a, 0, 4)
	a.i("CBZ R2, done")
	a.label("loop")
	a.i("VLD1.P 64(R1), %s", vlist(4, 4, "S4"))
	for q := range 4 {
		fadd(a, q, q, 4+q)
	}
	a.i("SUBS $1, R2, R2")
	a.i("BNE loop")
	a.label("done")
	a.i("VST1 %s, (R0)", vlist(0, 4, "S4"))
	a.i("RET")
}

// neonElementwise emits a loop over n (a multiple of 16) in R3.
func neonElementwise(a *asm, body func()) {
	a.i("LSR $4, R3, R3")
	a.i("CBZ R3, done")
	a.label("loop")
	body()
	a.i("SUBS $1, R3, R3")
	a.i("BNE loop")
	a.label("done")
	a.i("RET")
}

func neonAxpy(a *asm) {
	name := "axpyNEON"
	a.comment("func %s(dst *float32, a float32, x *float32, n int)", name)
	a.text(name, 32)
	a.i("MOVD dst+0(FP), R0")
	a.i("FMOVS a+8(FP), F30")
	a.i("VDUP V30.S[0], V30.S4")
	a.i("MOVD x+16(FP), R2")
	a.i("MOVD n+24(FP), R3")
	neonElementwise(a, func() {
		a.i("VLD1.P 64(R2), %s", vlist(0, 4, "S4"))
		a.i("VLD1 (R0), %s", vlist(4, 4, "S4"))
		for q := range 4 {
			fmul(a, 8+q, q, 30)
		}
		for q := range 4 {
			fadd(a, 4+q, 4+q, 8+q)
		}
		a.i("VST1.P %s, 64(R0)", vlist(4, 4, "S4"))
	})
}

func neonAdd(a *asm) {
	name := "addNEON"
	a.comment("func %s(dst, x *float32, n int)", name)
	a.text(name, 24)
	a.i("MOVD dst+0(FP), R0")
	a.i("MOVD x+8(FP), R2")
	a.i("MOVD n+16(FP), R3")
	neonElementwise(a, func() {
		a.i("VLD1.P 64(R2), %s", vlist(0, 4, "S4"))
		a.i("VLD1 (R0), %s", vlist(4, 4, "S4"))
		for q := range 4 {
			fadd(a, 4+q, 4+q, q)
		}
		a.i("VST1.P %s, 64(R0)", vlist(4, 4, "S4"))
	})
}

func neonScaleMul(a *asm) {
	name := "scaleMulNEON"
	a.comment("func %s(out, x, weight *float32, r float32, n int)", name)
	a.text(name, 40)
	a.i("MOVD out+0(FP), R0")
	a.i("MOVD x+8(FP), R1")
	a.i("MOVD weight+16(FP), R2")
	a.i("FMOVS r+24(FP), F30")
	a.i("VDUP V30.S[0], V30.S4")
	a.i("MOVD n+32(FP), R3")
	neonElementwise(a, func() {
		a.i("VLD1.P 64(R1), %s", vlist(0, 4, "S4"))
		a.i("VLD1.P 64(R2), %s", vlist(8, 4, "S4"))
		for q := range 4 {
			fmul(a, 4+q, q, 30)
		}
		for q := range 4 {
			fmul(a, 4+q, 8+q, 4+q)
		}
		a.i("VST1.P %s, 64(R0)", vlist(4, 4, "S4"))
	})
}
