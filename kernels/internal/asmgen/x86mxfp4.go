package main

import (
	"fmt"
	"math"
)

// The MXFP4 dequantization of kernels/mxfp4.go in AVX2 (the AVX-512 path
// calls it too): a block of 32 weights is 16 code bytes, weight 2j the
// low nibble of byte j and 2j+1 its high nibble, and one E8M0 scale byte
// s. Per block: the nibbles split (VPAND, VPSRLW) and interleaved into
// element order (VPUNPCKLBW, VPUNPCKHBW), looked up as int8 values
// 2*e2m1 (VPSHUFB), widened (VPMOVSXBD) and converted (VCVTDQ2PS: exact)
// and multiplied by 2^(s-128) (VMULPS: exact, as the product is
// 2*e2m1[q] * 2^(s-128) = e2m1[q] * 2^(s-127), at most two significant
// bits, a float32 or past its range where the definition is ±Inf too).
// Code 8 (-0) comes out +0: a weight of either zero gives the same bits
// in every Dot (a lane is never -0, kernels/doc.go), which the kernels'
// MXFP4 tests check against the float32 weights.

// mxfp4Data emits the kernel's constants: the int8 table mxfp4lut<>, the
// nibble mask mxfp4mask<> and the 256 scales 2^(s-128) mxfp4scale<>.
func mxfp4Data(a *asm) {
	a.comment("MXFP4: 2*e2m1 as int8, the nibble mask, 2^(s-128) for every scale byte s.")
	lut := [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
	for i, v := range lut {
		fmt.Fprintf(&a.b, "DATA mxfp4lut<>+%d(SB)/1, $%d\n", i, uint8(v))
	}
	a.b.WriteString("GLOBL mxfp4lut<>(SB), RODATA|NOPTR, $16\n")
	for i := range 2 {
		fmt.Fprintf(&a.b, "DATA mxfp4mask<>+%d(SB)/8, $0x0f0f0f0f0f0f0f0f\n", 8*i)
	}
	a.b.WriteString("GLOBL mxfp4mask<>(SB), RODATA|NOPTR, $16\n")
	mxfp4ScaleTable(a)
}

// mxfp4ScaleTable emits 2^(s-128) for every scale byte s as the
// file-local mxfp4scale<> (each .s file its own).
func mxfp4ScaleTable(a *asm) {
	for s := range 256 {
		fmt.Fprintf(&a.b, "DATA mxfp4scale<>+%d(SB)/4, $0x%08x\n", 4*s, math.Float32bits(float32(math.Ldexp(1, s-128))))
	}
	a.b.WriteString("GLOBL mxfp4scale<>(SB), RODATA|NOPTR, $1024\n")
}

// dequantMXFP4 emits dequantMXFP4AVX2(dst *float32, codes *byte, scales
// *byte, blocks int): blocks blocks of 32 weights into dst.
func dequantMXFP4(a *asm) {
	name := "dequantMXFP4AVX2"
	a.comment("func %s(dst *float32, codes *byte, scales *byte, blocks int)", name)
	a.text(name, 32)
	a.i("MOVQ dst+0(FP), DI")
	a.i("MOVQ codes+8(FP), SI")
	a.i("MOVQ scales+16(FP), DX")
	a.i("MOVQ blocks+24(FP), CX")
	a.i("TESTQ CX, CX")
	a.i("JEQ done")
	a.i("LEAQ mxfp4scale<>(SB), R8")
	a.i("VMOVDQU mxfp4lut<>(SB), X15")
	a.i("VMOVDQU mxfp4mask<>(SB), X14")
	a.label("loop")
	a.i("MOVBLZX (DX), AX")
	a.i("VBROADCASTSS (R8)(AX*4), Y13")
	a.i("VMOVDQU (SI), X0")
	a.i("VPSRLW $4, X0, X1")
	a.i("VPAND X14, X0, X0")
	a.i("VPAND X14, X1, X1")
	a.i("VPUNPCKLBW X1, X0, X2") // elements 0..15
	a.i("VPUNPCKHBW X1, X0, X3") // elements 16..31
	a.i("VPSHUFB X2, X15, X2")
	a.i("VPSHUFB X3, X15, X3")
	a.i("VPMOVSXBD X2, Y4")
	a.i("VPSRLDQ $8, X2, X2")
	a.i("VPMOVSXBD X2, Y5")
	a.i("VPMOVSXBD X3, Y6")
	a.i("VPSRLDQ $8, X3, X3")
	a.i("VPMOVSXBD X3, Y7")
	for r := 4; r < 8; r++ {
		a.i("VCVTDQ2PS Y%d, Y%d", r, r)
		a.i("VMULPS Y13, Y%d, Y%d", r, r)
		a.i("VMOVUPS Y%d, %d(DI)", r, 32*(r-4))
	}
	a.i("ADDQ $16, SI")
	a.i("INCQ DX")
	a.i("ADDQ $128, DI")
	a.i("DECQ CX")
	a.i("JNZ loop")
	a.label("done")
	a.i("VZEROUPPER")
	a.i("RET")
}

// The F8E4M3 dequantization of kernels/fp8.go in AVX2 and F16C (the
// AVX-512 path calls it too), 16 weights at a time: each code byte b
// widened to a word (VPMOVZXBW) and rebuilt as the binary16 whose bits
// are b's sign at bit 15 and b's exponent and mantissa at bits 13..7:
// that half is the E4M3 value times 2^-8 (normal codes: exponent e of
// bias 15 instead of 7; subnormal codes: a half subnormal m * 2^-17),
// code 0x7f set to a half NaN (exponent 31); converted exactly to float32
// (VCVTPH2PS) and multiplied by 256 times the block's scale (VMULPS: 256
// x scale is exact, so the one rounding is the definition's
// float32(e4m3 * scale)).

// f8Data emits the kernel's constants as words: the magnitude mask
// 0x3f80, the sign bit 0x8000, the code mask 0x7f and the NaN bits
// 0x7e00; and 256 as a float32.
func f8Data(a *asm) {
	a.comment("F8E4M3: word masks and 256.")
	for _, c := range []struct {
		name string
		v    uint16
	}{{"f8mag", 0x3f80}, {"f8sign", 0x8000}, {"f8code", 0x7f}, {"f8nan", 0x7e00}} {
		fmt.Fprintf(&a.b, "DATA %s<>+0(SB)/2, $0x%04x\n", c.name, c.v)
		fmt.Fprintf(&a.b, "GLOBL %s<>(SB), RODATA|NOPTR, $2\n", c.name)
	}
	fmt.Fprintf(&a.b, "DATA f8pow<>+0(SB)/4, $0x%08x\n", math.Float32bits(256))
	a.b.WriteString("GLOBL f8pow<>(SB), RODATA|NOPTR, $4\n")
}

// dequantF8 emits dequantF8AVX2(dst *float32, codes *byte, scales
// *float32, n16 int): the first n16 weights (a multiple of 16) of one
// row, weight i scaled by scales[i/128].
func dequantF8(a *asm) {
	name := "dequantF8AVX2"
	a.comment("func %s(dst *float32, codes *byte, scales *float32, n16 int)", name)
	a.text(name, 32)
	a.i("MOVQ dst+0(FP), DI")
	a.i("MOVQ codes+8(FP), SI")
	a.i("MOVQ scales+16(FP), DX")
	a.i("MOVQ n16+24(FP), CX")
	a.i("TESTQ CX, CX")
	a.i("JEQ done")
	a.i("VPBROADCASTW f8mag<>(SB), Y15")
	a.i("VPBROADCASTW f8sign<>(SB), Y14")
	a.i("VPBROADCASTW f8code<>(SB), Y13")
	a.i("VPBROADCASTW f8nan<>(SB), Y12")
	a.i("VBROADCASTSS f8pow<>(SB), Y11")
	a.i("XORQ AX, AX")
	a.label("loop")
	a.i("MOVQ AX, BX")
	a.i("SHRQ $7, BX")
	a.i("VBROADCASTSS (DX)(BX*4), Y10")
	a.i("VMULPS Y11, Y10, Y10") // 256 x the block's scale: exact
	a.i("VPMOVZXBW (SI)(AX*1), Y0")
	a.i("VPSLLW $7, Y0, Y1")
	a.i("VPAND Y15, Y1, Y1") // exponent and mantissa at 13..7
	a.i("VPSLLW $8, Y0, Y2")
	a.i("VPAND Y14, Y2, Y2") // the sign
	a.i("VPOR Y2, Y1, Y1")
	a.i("VPAND Y13, Y0, Y0")
	a.i("VPCMPEQW Y13, Y0, Y0") // code 0x7f or 0xff: NaN
	a.i("VPAND Y12, Y0, Y0")
	a.i("VPOR Y0, Y1, Y1")
	a.i("VCVTPH2PS X1, Y2")
	a.i("VEXTRACTI128 $1, Y1, X1")
	a.i("VCVTPH2PS X1, Y3")
	a.i("VMULPS Y10, Y2, Y2")
	a.i("VMULPS Y10, Y3, Y3")
	a.i("VMOVUPS Y2, (DI)(AX*4)")
	a.i("VMOVUPS Y3, 32(DI)(AX*4)")
	a.i("ADDQ $16, AX")
	a.i("CMPQ AX, CX")
	a.i("JLT loop")
	a.label("done")
	a.i("VZEROUPPER")
	a.i("RET")
}
