package main

import "math"

// The NEON dequantizations of MXFP4 and F8E4M3 (x86mxfp4.go has the
// arithmetic): the same values, so every path reads the same weights.

// uxtl emits UXTL Vd.8H, Vn.8B (hi false) or UXTL2 Vd.8H, Vn.16B: bytes
// zero-extended to halfwords.
func uxtl(a *asm, d, n int, hi bool) {
	op, name := uint32(0x2F08A400), "UXTL"
	if hi {
		op |= 1 << 30
		name = "UXTL2"
	}
	a.i("WORD $0x%08x // %s V%d.8H, V%d.%s", op|uint32(n)<<5|uint32(d), name, d, n, map[bool]string{false: "8B", true: "16B"}[hi])
}

// vmovqHalves emits a 128-bit constant of eight equal halfwords.
func vmovqHalves(a *asm, d int, h uint16) {
	w := uint32(h) | uint32(h)<<16
	vmovq(a, d, [4]uint32{w, w, w, w})
}

// neonDequantMXFP4 emits dequantMXFP4NEON(dst *float32, codes *byte,
// scales *byte, blocks int): per block the nibbles split (AND, USHR),
// interleaved into element order (ZIP1, ZIP2), looked up as int8 2*e2m1
// (TBL), widened (SXTL) and converted (SCVTF: exact), and multiplied by
// 2^(s-128) (FMUL: exact).
func neonDequantMXFP4(a *asm) {
	name := "dequantMXFP4NEON"
	a.comment("func %s(dst *float32, codes *byte, scales *byte, blocks int)", name)
	a.text(name, 32)
	a.i("MOVD dst+0(FP), R0")
	a.i("MOVD codes+8(FP), R1")
	a.i("MOVD scales+16(FP), R2")
	a.i("MOVD blocks+24(FP), R3")
	a.i("CBZ R3, done")
	a.i("MOVD $mxfp4scale<>(SB), R8")
	lut := [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
	var b [16]byte
	for i, v := range lut {
		b[i] = byte(v)
	}
	vmovqBytes(a, 30, b)
	var mask [16]byte
	for i := range mask {
		mask[i] = 0x0f
	}
	vmovqBytes(a, 29, mask)
	a.label("loop")
	a.i("MOVBU.P 1(R2), R9")
	a.i("MOVWU (R8)(R9<<2), R10")
	a.i("FMOVS R10, F28")
	a.i("VLD1.P 16(R1), [V0.B16]")
	a.i("VUSHR $4, V0.B16, V2.B16")
	a.i("VAND V29.B16, V0.B16, V1.B16")
	a.i("VZIP1 V2.B16, V1.B16, V3.B16") // elements 0..15
	a.i("VZIP2 V2.B16, V1.B16, V4.B16") // elements 16..31
	a.i("VTBL V3.B16, [V30.B16], V3.B16")
	a.i("VTBL V4.B16, [V30.B16], V4.B16")
	sxtl(a, 16, 3, true, false)
	sxtl(a, 17, 3, true, true)
	sxtl(a, 18, 4, true, false)
	sxtl(a, 19, 4, true, true)
	for i := range 4 {
		sxtl(a, 20+2*i, 16+i, false, false)
		sxtl(a, 21+2*i, 16+i, false, true)
	}
	for r := 20; r < 28; r++ {
		scvtf(a, r, r)
		fmulElem(a, r, r, 28)
	}
	a.i("VST1.P %s, 64(R0)", vlist(20, 4, "S4"))
	a.i("VST1.P %s, 64(R0)", vlist(24, 4, "S4"))
	a.i("SUBS $1, R3, R3")
	a.i("BNE loop")
	a.label("done")
	a.i("RET")
}

// neonDequantF8 emits dequantF8NEON(dst *float32, codes *byte, scales
// *float32, n16 int): 16 codes at a time rebuilt as halves (the
// magnitude bits << 7, the sign at bit 15, code 0x7f a NaN), converted
// exactly (FCVTL) and multiplied by 256 times the block's scale.
func neonDequantF8(a *asm) {
	name := "dequantF8NEON"
	a.comment("func %s(dst *float32, codes *byte, scales *float32, n16 int)", name)
	a.text(name, 32)
	a.i("MOVD dst+0(FP), R0")
	a.i("MOVD codes+8(FP), R1")
	a.i("MOVD scales+16(FP), R2")
	a.i("MOVD n16+24(FP), R3")
	a.i("CBZ R3, done")
	vmovqHalves(a, 29, 0x3f80)
	vmovqHalves(a, 30, 0x8000)
	vmovqHalves(a, 31, 0x007f)
	vmovqHalves(a, 26, 0x7e00)
	a.i("MOVW $0x%08x, R6", math.Float32bits(256))
	a.i("FMOVS R6, F25")
	a.i("MOVD $0, R4")
	a.label("loop")
	a.i("LSR $7, R4, R5")
	a.i("MOVWU (R2)(R5<<2), R6")
	a.i("FMOVS R6, F28")
	a.i("FMULS F25, F28, F28") // 256 x the block's scale: exact
	a.i("VLD1.P 16(R1), [V0.B16]")
	uxtl(a, 1, 0, false)
	uxtl(a, 2, 0, true)
	for h := 1; h <= 2; h++ {
		a.i("VSHL $7, V%d.H8, V3.H8", h)
		a.i("VAND V29.B16, V3.B16, V3.B16")
		a.i("VSHL $8, V%d.H8, V4.H8", h)
		a.i("VAND V30.B16, V4.B16, V4.B16")
		a.i("VORR V4.B16, V3.B16, V3.B16")
		a.i("VAND V31.B16, V%d.B16, V5.B16", h)
		a.i("VCMEQ V31.H8, V5.H8, V5.H8")
		a.i("VAND V26.B16, V5.B16, V5.B16")
		a.i("VORR V5.B16, V3.B16, V3.B16")
		fcvtl(a, 6, 3, false)
		fcvtl(a, 7, 3, true)
		fmulElem(a, 6, 6, 28)
		fmulElem(a, 7, 7, 28)
		a.i("VST1.P %s, 32(R0)", vlist(6, 2, "S4"))
	}
	a.i("ADD $16, R4")
	a.i("CMP R3, R4")
	a.i("BLT loop")
	a.label("done")
	a.i("RET")
}
