package main

import "math"

// The NEON Q8 and NF4 row kernels (see x86quant.go for the layouts and
// the arithmetic). One row at a time: the per-row NF4 table takes four
// registers, too many to keep four rows' tables next to their lanes.

// sxtl emits SXTL Vd.8H, Vn.8B (from8, hi false), SXTL2 Vd.8H, Vn.16B,
// SXTL Vd.4S, Vn.4H or SXTL2 Vd.4S, Vn.8H: exact sign extension.
func sxtl(a *asm, d, n int, from8, hi bool) {
	op, arr := uint32(0x0F10A400), "4S"
	src := map[bool]string{false: "4H", true: "8H"}[hi]
	if from8 {
		op, arr = 0x0F08A400, "8H"
		src = map[bool]string{false: "8B", true: "16B"}[hi]
	}
	name := "SXTL"
	if hi {
		op |= 1 << 30
		name = "SXTL2"
	}
	a.i("WORD $0x%08x // %s V%d.%s, V%d.%s", op|uint32(n)<<5|uint32(d), name, d, arr, n, src)
}

// scvtf emits SCVTF Vd.4S, Vn.4S: int32 to float32 (exact below 2^24).
func scvtf(a *asm, d, n int) {
	a.i("WORD $0x%08x // SCVTF V%d.4S, V%d.4S", 0x4E21D800|n<<5|d, d, n)
}

// fmulElem emits FMUL Vd.4S, Vn.4S, Vm.S[0]: every lane times lane 0 of
// Vm, rounded (the same multiply as a vector FMUL by a broadcast).
func fmulElem(a *asm, d, n, m int) {
	a.i("WORD $0x%08x // FMUL V%d.4S, V%d.4S, V%d.S[0]", 0x4F809000|m<<16|n<<5|d, d, n, m)
}

// ushl emits USHL Vd.16B, Vn.16B, Vm.16B: each byte shifted left by the
// signed byte of Vm (right where negative).
func ushl(a *asm, d, n, m int) {
	a.i("WORD $0x%08x // USHL V%d.16B, V%d.16B, V%d.16B", 0x6E204400|m<<16|n<<5|d, d, n, m)
}

// vmovq emits a 128-bit constant of four 32-bit words (w[0] lowest).
func vmovq(a *asm, d int, w [4]uint32) {
	a.i("VMOVQ $0x%08x%08x, $0x%08x%08x, V%d", w[1], w[0], w[3], w[2], d)
}

// vmovqBytes emits a 128-bit constant of 16 bytes (b[0] lowest).
func vmovqBytes(a *asm, d int, b [16]byte) {
	var w [4]uint32
	for i, v := range b {
		w[i/4] |= uint32(v) << (8 * (i % 4))
	}
	vmovq(a, d, w)
}

// neonQuantRows emits rows<Q8|NF4>NEON(out *float32, w unsafe.Pointer, x
// *float32, rows, n16, stride, sb int, lanes bool), one row at a time.
//
// Registers: R0 out, R1 the row, R2 x, R3 rows left, R9 n16, R10 stride,
// R11 lanes, R12 sb; per row R4 its codes, R5 its scales, R8 x, R13 the
// whole groups (Q8: 32 elements, NF4: 64) left, R14 the blocks after them.
// Lanes V0-V3, x V16-V19, weights V20-V23 (Q8) or V4-V7 (NF4).
//
// Q8: V28 the codes, V29-V30 their halves widened, the scale in S27.
//
// NF4: the row's table V20-V23 (code[k] * absmax, 64 bytes that TBL
// indexes), the NF4 values V24-V27, the absmax in S29, the codes in V28.
// The 8 code bytes of a block are loaded into both halves of V28; AND and
// USHL make byte j (< 8) 4*code(2j) and byte 8+j 4*code(2j+1). So lane L
// of the block (register L/4, lane L%4) holds element 2L for L < 8 and
// 2(L-8)+1 above: LD2 loads x in that order, TBL replicates each byte
// over its float's four bytes (V8-V11) and adds their offsets 0-3 (V12),
// and the lanes are zipped back in order before the fold. Each lane still
// sums its elements in order with the same operations.
func neonQuantRows(a *asm, q8 bool) {
	d := "NF4"
	if q8 {
		d = "Q8"
	}
	name := "rows" + d + "NEON"
	a.comment("func %s(out *float32, w unsafe.Pointer, x *float32, rows, n16, stride, sb int, lanes bool)", name)
	a.text(name, 57)
	a.i("MOVD out+0(FP), R0")
	a.i("MOVD w+8(FP), R1")
	a.i("MOVD x+16(FP), R2")
	a.i("MOVD rows+24(FP), R3")
	a.i("MOVD n16+32(FP), R9")
	a.i("MOVD stride+40(FP), R10")
	a.i("MOVD sb+48(FP), R12")
	a.i("MOVBU lanes+56(FP), R11")
	groupShift, groupBlocks := 5, 2
	if !q8 {
		groupShift, groupBlocks = 6, 4
		neonNF4Constants(a)
	}
	block := func() {
		if q8 {
			a.i("VLD1.P 64(R8), %s", vlist(16, 4, "S4"))
			neonQ8Load(a)
			for q := range 4 {
				fmul(a, 20+q, 20+q, 16+q)
			}
			for q := range 4 {
				fadd(a, q, q, 20+q)
			}
			return
		}
		// x in lane order: V16 (x0 x2 x4 x6), V18 (x8..x14), V17 (x1..x7), V19 (x9..x15).
		a.i("VLD2.P 32(R8), [V16.S4, V17.S4]")
		a.i("VLD2.P 32(R8), [V18.S4, V19.S4]")
		neonNF4Load(a)
		for q, x := range []int{16, 18, 17, 19} {
			fmul(a, 4+q, 4+q, x)
		}
		for q := range 4 {
			fadd(a, q, q, 4+q)
		}
	}
	scale := func(post bool) { neonQuantScale(a, q8, post) }
	a.label("row")
	a.i("CBZ R3, done")
	a.i("ADD R12, R1, R4")
	a.i("MOVD R1, R5")
	a.i("MOVD R2, R8")
	neonZero(a, 0, 4)
	a.i("LSR $%d, R9, R13", groupShift)
	a.i("LSR $4, R9, R14")
	a.i("AND $%d, R14, R14", groupBlocks-1)
	a.i("CBZ R13, rest")
	a.label("group")
	scale(true)
	for range groupBlocks {
		block()
	}
	a.i("SUBS $1, R13, R13")
	a.i("BNE group")
	a.label("rest")
	a.i("CBZ R14, fold")
	scale(false)
	a.label("blocks")
	block()
	a.i("SUBS $1, R14, R14")
	a.i("BNE blocks")
	a.label("fold")
	acc, tmp := 0, 24
	if !q8 {
		acc, tmp = 4, 30
		a.i("VZIP1 V2.S4, V0.S4, V4.S4")
		a.i("VZIP2 V2.S4, V0.S4, V5.S4")
		a.i("VZIP1 V3.S4, V1.S4, V6.S4")
		a.i("VZIP2 V3.S4, V1.S4, V7.S4")
	}
	a.i("CBNZ R11, lanes")
	neonFold(a, acc, tmp)
	a.i("FMOVS F%d, (R0)", acc)
	a.i("ADD $4, R0")
	a.i("B next")
	a.label("lanes")
	a.i("VST1 %s, (R0)", vlist(acc, 4, "S4"))
	a.i("ADD $64, R0")
	a.label("next")
	a.i("ADD R10, R1, R1")
	a.i("SUB $1, R3, R3")
	a.i("B row")
	a.label("done")
	a.i("RET")
}

// neonNF4Constants loads the NF4 values (V24-V27), the TBL patterns that
// replicate a byte over a float's four (V8-V11), the byte offsets 0-3
// (V12), and the nibble mask (V13) and shifts (V14) of neonNF4Load.
func neonNF4Constants(a *asm) {
	for k := range 4 {
		var w [4]uint32
		for j := range 4 {
			w[j] = math.Float32bits(nf4Codes[4*k+j])
		}
		vmovq(a, 24+k, w)
	}
	for k := range 4 {
		var b [16]byte
		for i := range b {
			b[i] = byte(4*k + i/4)
		}
		vmovqBytes(a, 8+k, b)
	}
	var off, mask, shift [16]byte
	for i := range 16 {
		off[i] = byte(i % 4)
		mask[i], shift[i] = 0x0F, 2
		if i >= 8 {
			mask[i], shift[i] = 0xF0, 0xFE // -2: right by 2
		}
	}
	vmovqBytes(a, 12, off)
	vmovqBytes(a, 13, mask)
	vmovqBytes(a, 14, shift)
}

// neonQ8Load dequantizes the 16 codes at R4 (post-incremented) with the
// scale in S27 into V20-V23.
func neonQ8Load(a *asm) {
	a.i("VLD1.P 16(R4), [V28.B16]")
	sxtl(a, 29, 28, true, false)
	sxtl(a, 30, 28, true, true)
	sxtl(a, 20, 29, false, false)
	sxtl(a, 21, 29, false, true)
	sxtl(a, 22, 30, false, false)
	sxtl(a, 23, 30, false, true)
	for q := range 4 {
		scvtf(a, 20+q, 20+q)
	}
	for q := range 4 {
		fmulElem(a, 20+q, 20+q, 27)
	}
}

// neonNF4Load looks up the 16 codes at R4 (8 bytes, post-incremented) in
// the table V20-V23 into V4-V7, in the permuted lane order of
// neonQuantRows.
func neonNF4Load(a *asm) {
	a.i("VLD1R.P 8(R4), [V28.D2]")
	a.i("VAND V13.B16, V28.B16, V28.B16")
	ushl(a, 28, 28, 14)
	for q := range 4 {
		a.i("VTBL V%d.B16, [V28.B16], V%d.B16", 8+q, 4+q)
	}
	for q := range 4 {
		a.i("VADD V12.B16, V%d.B16, V%d.B16", 4+q, 4+q)
	}
	for q := range 4 {
		a.i("VTBL V%d.B16, [V20.B16, V21.B16, V22.B16, V23.B16], V%d.B16", 4+q, 4+q)
	}
}

// neonQuantScale loads the next scale (post-incrementing R5 if post) and,
// for NF4, makes the table V20-V23.
func neonQuantScale(a *asm, q8, post bool) {
	reg := 27
	if !q8 {
		reg = 29
	}
	if post {
		a.i("FMOVS.P 4(R5), F%d", reg)
	} else {
		a.i("FMOVS (R5), F%d", reg)
	}
	if !q8 {
		for q := range 4 {
			fmulElem(a, 20+q, 24+q, 29)
		}
	}
}

// neonQuantDequant emits dequant<Q8|NF4>NEON(dst *float32, w
// unsafe.Pointer, rows, n16, stride, sb int): see x86.quantDequant.
func neonQuantDequant(a *asm, q8 bool) {
	d := "NF4"
	if q8 {
		d = "Q8"
	}
	name := "dequant" + d + "NEON"
	a.comment("func %s(dst *float32, w unsafe.Pointer, rows, n16, stride, sb int)", name)
	a.text(name, 48)
	a.i("MOVD dst+0(FP), R0")
	a.i("MOVD w+8(FP), R1")
	a.i("MOVD rows+16(FP), R3")
	a.i("MOVD n16+24(FP), R9")
	a.i("MOVD stride+32(FP), R10")
	a.i("MOVD sb+40(FP), R12")
	groupShift, groupBlocks := 5, 2
	if !q8 {
		groupShift, groupBlocks = 6, 4
		neonNF4Constants(a)
	}
	block := func() {
		if q8 {
			neonQ8Load(a)
			a.i("VST1.P %s, 64(R0)", vlist(20, 4, "S4"))
			return
		}
		neonNF4Load(a)
		a.i("VZIP1 V6.S4, V4.S4, V16.S4")
		a.i("VZIP2 V6.S4, V4.S4, V17.S4")
		a.i("VZIP1 V7.S4, V5.S4, V18.S4")
		a.i("VZIP2 V7.S4, V5.S4, V19.S4")
		a.i("VST1.P %s, 64(R0)", vlist(16, 4, "S4"))
	}
	a.label("row")
	a.i("CBZ R3, done")
	a.i("ADD R12, R1, R4")
	a.i("MOVD R1, R5")
	a.i("LSR $%d, R9, R13", groupShift)
	a.i("LSR $4, R9, R14")
	a.i("AND $%d, R14, R14", groupBlocks-1)
	a.i("CBZ R13, rest")
	a.label("group")
	neonQuantScale(a, q8, true)
	for range groupBlocks {
		block()
	}
	a.i("SUBS $1, R13, R13")
	a.i("BNE group")
	a.label("rest")
	a.i("CBZ R14, next")
	neonQuantScale(a, q8, false)
	a.label("blocks")
	block()
	a.i("SUBS $1, R14, R14")
	a.i("BNE blocks")
	a.label("next")
	a.i("ADD R10, R1, R1")
	a.i("SUB $1, R3, R3")
	a.i("B row")
	a.label("done")
	a.i("RET")
}
