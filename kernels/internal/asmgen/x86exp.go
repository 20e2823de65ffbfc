package main

import (
	"fmt"
	"math"
)

// Exp's constants (kernels/exp.go), as the file-local table expconsts<>:
// each float64 eight times (64 bytes, a zmm or, its first half, a ymm),
// then each float32 eight times (32 bytes).
var (
	expF64 = []struct {
		name string
		v    float64
	}{
		{"log2e", 1.44269504088896338700e+00},
		{"ln2hi", 6.93147180369123816490e-01},
		{"ln2lo", 1.90821492927058770002e-10},
		{"c9", 1.0 / 362880}, {"c8", 1.0 / 40320}, {"c7", 1.0 / 5040}, {"c6", 1.0 / 720},
		{"c5", 1.0 / 120}, {"c4", 1.0 / 24}, {"c3", 1.0 / 6}, {"c2", 1.0 / 2},
		{"one", 1},
		// k + 1.5*2^52 holds the integer k in its low mantissa bits
		{"magic", 0x1.8p52},
	}
	expF32 = []struct {
		name string
		v    uint32
	}{
		{"over", math.Float32bits(88.8)},  // Exp(x) = +Inf above (expOverflow as a float32)
		{"under", math.Float32bits(-104)}, // Exp(x) = 0 below (expUnderflow)
		{"inf", math.Float32bits(float32(math.Inf(1)))},
		{"sign", 0x80000000},
		{"onef", math.Float32bits(1)},
	}
)

// expOff returns the byte offset of constant name in expconsts<>.
func expOff(name string) int {
	for i, c := range expF64 {
		if c.name == name {
			return 64 * i
		}
	}
	for i, c := range expF32 {
		if c.name == name {
			return 64*len(expF64) + 32*i
		}
	}
	panic("asmgen: no Exp constant " + name)
}

// expData emits expconsts<> and the int64 1023 eight times (exp1023<>).
func expData(a *asm) {
	off := 0
	for _, c := range expF64 {
		for range 8 {
			fmt.Fprintf(&a.b, "DATA expconsts<>+%d(SB)/8, $0x%016x\n", off, math.Float64bits(c.v))
			off += 8
		}
	}
	for _, c := range expF32 {
		for range 8 {
			fmt.Fprintf(&a.b, "DATA expconsts<>+%d(SB)/4, $0x%08x\n", off, c.v)
			off += 4
		}
	}
	fmt.Fprintf(&a.b, "GLOBL expconsts<>(SB), RODATA|NOPTR, $%d\n", off)
	for i := range 8 {
		fmt.Fprintf(&a.b, "DATA exp1023<>+%d(SB)/8, $1023\n", 8*i)
	}
	a.b.WriteString("GLOBL exp1023<>(SB), RODATA|NOPTR, $64\n")
}

// The vector Exp keeps step float32 lanes: 8 on AVX-512 (their float64s
// in a zmm), 4 on AVX2 (in a ymm). fv names the float32 vectors (Y or
// X), dv the float64 ones (Z or Y).
func (k x86) expStep() int { return 4 * (3 - k.parts) } // 8, 4
func (k x86) fv(i int) string {
	if k.parts == 1 {
		return fmt.Sprintf("Y%d", i)
	}
	return fmt.Sprintf("X%d", i)
}
func (k x86) dv(i int) string {
	if k.parts == 1 {
		return fmt.Sprintf("Z%d", i)
	}
	return fmt.Sprintf("Y%d", i)
}

// c names constant name as an operand: a register the AVX-512 set-up
// loaded it into (expLoop), else its place in memory (a ymm's worth).
func (k x86) c(name string) string {
	if k.parts == 1 {
		for i, c := range expF64 {
			if c.name == name {
				return fmt.Sprintf("Z%d", 16+i)
			}
		}
	}
	return fmt.Sprintf("expconsts<>+%d(SB)", expOff(name))
}

// expLoop emits an exponential kernel's set-up, what exp needs (the
// float64 constants in Z16-Z28 and 1023 in Z29 on AVX-512, the AVX2 path
// reading them from memory; fv(8) zero), then its loop over CX elements,
// expStep a turn.
func (k x86) expLoop(a *asm, turn func()) {
	if k.parts == 1 {
		for i, c := range expF64 {
			a.i("VMOVUPD expconsts<>+%d(SB), Z%d", expOff(c.name), 16+i)
		}
		a.i("VMOVDQU64 exp1023<>(SB), Z29")
	}
	a.i("VXORPS %s, %s, %s", k.fv(8), k.fv(8), k.fv(8))
	k.loop(a, k.expStep(), turn)
}

// signAndOne loads the float32 sign mask into fv(9) and 1 into fv(12).
func (k x86) signAndOne(a *asm) {
	a.i("VMOVUPS expconsts<>+%d(SB), %s", expOff("sign"), k.fv(9))
	a.i("VMOVUPS expconsts<>+%d(SB), %s", expOff("onef"), k.fv(12))
}

// exp emits Exp of the float32 lanes of fv(v) into fv(dst), bit for bit
// kernels.Exp: widened to float64, k = RoundToEven(d*log2e), r = (d -
// k*ln2hi) - k*ln2lo, the Horner polynomial (each product rounded before
// its add), times 2^k built in the exponent bits, rounded once to
// float32; then +Inf above 88.8, 0 below -104 and the input itself where
// it is NaN. Uses float64 registers 1-5 and float32 register 6 (fv(8)
// must hold zero); v and dst are below 16.
func (k x86) exp(a *asm, v, dst int) {
	d, t, r, p, s := k.dv(1), k.dv(2), k.dv(3), k.dv(4), k.dv(5)
	a.i("VCVTPS2PD %s, %s", k.fv(v), d)
	a.i("VMULPD %s, %s, %s", k.c("log2e"), d, t)
	if k.parts == 1 {
		a.i("VRNDSCALEPD $0, %s, %s", t, t) // round to nearest, ties to even
	} else {
		a.i("VROUNDPD $0, %s, %s", t, t)
	}
	a.i("VMULPD %s, %s, %s", k.c("ln2hi"), t, r)
	a.i("VSUBPD %s, %s, %s", r, d, r) // d - k*hi
	a.i("VMULPD %s, %s, %s", k.c("ln2lo"), t, s)
	a.i("VSUBPD %s, %s, %s", s, r, r) // - k*lo
	if k.parts == 1 {
		a.i("VMOVAPD %s, %s", k.c("c9"), p)
	} else {
		a.i("VMOVUPD %s, %s", k.c("c9"), p)
	}
	for _, c := range []string{"c8", "c7", "c6", "c5", "c4", "c3", "c2", "one", "one"} {
		a.i("VMULPD %s, %s, %s", r, p, p)
		a.i("VADDPD %s, %s, %s", k.c(c), p, p)
	}
	// 2^k: k + 1.5*2^52 has k in its low bits; +1023, shifted to the
	// exponent (the magic's own bits shift out)
	a.i("VADDPD %s, %s, %s", k.c("magic"), t, s)
	if k.parts == 1 {
		a.i("VPADDQ Z29, %s, %s", s, s)
	} else {
		a.i("VPADDQ exp1023<>(SB), %s, %s", s, s)
	}
	a.i("VPSLLQ $52, %s, %s", s, s)
	a.i("VMULPD %s, %s, %s", s, p, p)
	if k.parts == 1 {
		a.i("VCVTPD2PS %s, %s", p, k.fv(dst))
	} else {
		a.i("VCVTPD2PSY %s, %s", p, k.fv(dst))
	}
	// the cases kernels.Exp returns before its polynomial
	m := k.fv(6)
	a.i("VCMPPS $0x1e, expconsts<>+%d(SB), %s, %s", expOff("over"), k.fv(v), m) // v > 88.8 (ordered)
	a.i("VBLENDVPS %s, expconsts<>+%d(SB), %s, %s", m, expOff("inf"), k.fv(dst), k.fv(dst))
	a.i("VCMPPS $0x11, expconsts<>+%d(SB), %s, %s", expOff("under"), k.fv(v), m) // v < -104 (ordered)
	a.i("VBLENDVPS %s, %s, %s, %s", m, k.fv(8), k.fv(dst), k.fv(dst))
	a.i("VCMPPS $3, %s, %s, %s", k.fv(v), k.fv(v), m) // v is NaN
	a.i("VBLENDVPS %s, %s, %s, %s", m, k.fv(v), k.fv(dst), k.fv(dst))
}

// expShift emits expShift<ISA>(x *float32, m float32, n int): x[i] =
// Exp(x[i] - m) (the float32 difference) for i < n, a multiple of
// expStep: Softmax's exponentials.
func (k x86) expShift(a *asm) {
	name := "expShift" + k.name
	a.comment("func %s(x *float32, m float32, n int)", name)
	a.text(name, 24)
	a.i("MOVQ x+0(FP), DI")
	a.i("VBROADCASTSS m+8(FP), %s", k.fv(9))
	a.i("MOVQ n+16(FP), CX")
	k.expLoop(a, func() {
		a.i("VMOVUPS (DI)(AX*4), %s", k.fv(0))
		a.i("VSUBPS %s, %s, %s", k.fv(9), k.fv(0), k.fv(0))
		k.exp(a, 0, 10)
		a.i("VMOVUPS %s, (DI)(AX*4)", k.fv(10))
	})
}

// siluMul emits siluMul<ISA>(out, gate, up *float32, n int): out[i] =
// float32(gate[i] / float32(1 + Exp(-gate[i]))) * up[i] for i < n, a
// multiple of expStep: SwiGLU. out may be gate or up.
func (k x86) siluMul(a *asm) {
	name := "siluMul" + k.name
	a.comment("func %s(out, gate, up *float32, n int)", name)
	a.text(name, 32)
	a.i("MOVQ out+0(FP), DI")
	a.i("MOVQ gate+8(FP), SI")
	a.i("MOVQ up+16(FP), DX")
	a.i("MOVQ n+24(FP), CX")
	k.signAndOne(a)
	k.expLoop(a, func() {
		a.i("VMOVUPS (SI)(AX*4), %s", k.fv(11))              // g
		a.i("VXORPS %s, %s, %s", k.fv(9), k.fv(11), k.fv(0)) // -g
		k.exp(a, 0, 10)
		a.i("VADDPS %s, %s, %s", k.fv(12), k.fv(10), k.fv(10)) // 1 + Exp(-g)
		a.i("VDIVPS %s, %s, %s", k.fv(10), k.fv(11), k.fv(10)) // g / that
		a.i("VMULPS (DX)(AX*4), %s, %s", k.fv(10), k.fv(10))   // * up
		a.i("VMOVUPS %s, (DI)(AX*4)", k.fv(10))
	})
}

// clampedSwiGLU emits clampedSwiGLU<ISA>(out, gateUp *float32, limit,
// alpha float32, n int), gpt-oss's activation on n pairs (a multiple of
// expStep; g = gateUp[2i], u = gateUp[2i+1]): out[i] = (u' + 1) * (g' /
// (1 + Exp(-(alpha*g')))) with g' = min(g, limit), u' = max(min(u,
// limit), -limit), each clamp as Go compiles min and max (two MINSS and
// an OR, max through the sign flips), so a NaN stays a NaN and -0 and +0
// order as Go orders them. out may be gateUp: a block's outputs land on
// pairs already read.
func (k x86) clampedSwiGLU(a *asm) {
	name := "clampedSwiGLU" + k.name
	a.comment("func %s(out, gateUp *float32, limit, alpha float32, n int)", name)
	a.text(name, 32)
	a.i("MOVQ out+0(FP), DI")
	a.i("MOVQ gateUp+8(FP), SI")
	a.i("VBROADCASTSS limit+16(FP), %s", k.fv(13))
	a.i("VBROADCASTSS alpha+20(FP), %s", k.fv(14))
	a.i("MOVQ n+24(FP), CX")
	k.signAndOne(a)
	half := 4 * k.expStep() // bytes of half a block's pairs
	// min(x, limit): a = x < limit ? x : limit; b = a < x ? a : x; a | b
	clampMin := func(x int) {
		a.i("VMINPS %s, %s, %s", k.fv(13), k.fv(x), k.fv(6))
		a.i("VMINPS %s, %s, %s", k.fv(x), k.fv(6), k.fv(7))
		a.i("VORPS %s, %s, %s", k.fv(6), k.fv(7), k.fv(x))
	}
	k.expLoop(a, func() {
		a.i("VMOVUPS (SI)(AX*8), %s", k.fv(10))
		a.i("VMOVUPS %d(SI)(AX*8), %s", half, k.fv(11))
		// even elements (g) and odd (u), in the same order: on AVX-512 the
		// 128-bit lanes interleave them, put right after
		a.i("VSHUFPS $0x88, %s, %s, %s", k.fv(11), k.fv(10), k.fv(15))
		a.i("VSHUFPS $0xdd, %s, %s, %s", k.fv(11), k.fv(10), k.fv(10))
		clampMin(15) // g'
		clampMin(10) // min(u, limit)
		// max(y, -limit) = -min(-y, limit), as Go compiles it
		a.i("VXORPS %s, %s, %s", k.fv(9), k.fv(10), k.fv(10))
		clampMin(10)
		a.i("VXORPS %s, %s, %s", k.fv(9), k.fv(10), k.fv(11)) // u'
		a.i("VMULPS %s, %s, %s", k.fv(14), k.fv(15), k.fv(0)) // alpha*g'
		a.i("VXORPS %s, %s, %s", k.fv(9), k.fv(0), k.fv(0))   // -(alpha*g')
		k.exp(a, 0, 10)
		a.i("VADDPS %s, %s, %s", k.fv(12), k.fv(10), k.fv(10)) // 1 + Exp
		a.i("VDIVPS %s, %s, %s", k.fv(10), k.fv(15), k.fv(10)) // g' / that
		a.i("VADDPS %s, %s, %s", k.fv(12), k.fv(11), k.fv(11)) // u' + 1
		a.i("VMULPS %s, %s, %s", k.fv(10), k.fv(11), k.fv(10)) // (u'+1) * glu
		if k.parts == 1 {
			a.i("VPERMPD $0xd8, %s, %s", k.fv(10), k.fv(10)) // pairs 0-1, 4-5, 2-3, 6-7 back in order
		}
		a.i("VMOVUPS %s, (DI)(AX*4)", k.fv(10))
	})
}
