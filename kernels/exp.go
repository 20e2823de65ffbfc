package kernels

import "math"

// Exp constants; see the package doc for the definition they implement.
const (
	expOverflow  = 88.8   // exp(x) > MaxFloat32 for every float32 x above
	expUnderflow = -104.0 // exp(x) < 2^-150 (rounds to +0) for every x below

	expLog2e = 1.44269504088896338700e+00 // log2(e), nearest float64
	// ln(2) = expLn2Hi + expLn2Lo (Cody-Waite): expLn2Hi has 21 trailing zero
	// bits, so k*expLn2Hi is exact for |k| < 2^21.
	expLn2Hi = 6.93147180369123816490e-01 // 0x3FE62E42FEE00000
	expLn2Lo = 1.90821492927058770002e-10 // 0x3DEA39EF35793C76

	// Taylor coefficients 1/j!, each the nearest float64.
	expC2 = 1.0 / 2
	expC3 = 1.0 / 6
	expC4 = 1.0 / 24
	expC5 = 1.0 / 120
	expC6 = 1.0 / 720
	expC7 = 1.0 / 5040
	expC8 = 1.0 / 40320
	expC9 = 1.0 / 362880
)

// Exp returns e**x, within 1 ulp of the correctly rounded result, with the
// same bits on every architecture: it is portable float64 arithmetic (IEEE
// add and multiply, never fused) rounded once to float32, the definition
// in the package doc. Exp(+Inf) = +Inf, Exp(-Inf) = 0, Exp(NaN) = NaN;
// overflow gives +Inf and results in the float32 subnormal range are
// rounded correctly (not flushed).
func Exp(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > expOverflow:
		return float32(math.Inf(1))
	case x < expUnderflow:
		return 0
	}
	d := float64(x)
	k := math.RoundToEven(float64(d * expLog2e))
	r := (d - float64(k*expLn2Hi)) - float64(k*expLn2Lo)
	p := expC9
	p = expC8 + float64(p*r)
	p = expC7 + float64(p*r)
	p = expC6 + float64(p*r)
	p = expC5 + float64(p*r)
	p = expC4 + float64(p*r)
	p = expC3 + float64(p*r)
	p = expC2 + float64(p*r)
	p = 1 + float64(p*r)
	p = 1 + float64(p*r)
	// 2^k is a normal float64 for k in [-150, 129]: the product is exact,
	// and the conversion is the only rounding to float32.
	scale := math.Float64frombits(uint64(int64(k)+1023) << 52)
	return float32(p * scale)
}

// SiLU returns x / (1 + Exp(-x)), each operation rounded to float32. For
// x below about -88.7, Exp(-x) overflows and the result is -0.
func SiLU(x float32) float32 {
	return x / (1 + Exp(-x))
}

// SwiGLU computes out[i] = float32(SiLU(gate[i]) * up[i]), the Mixtral
// expert activation. out may alias gate or up; it panics if the lengths
// differ. A long one is split over the thread team (each element is
// computed alone, so the split changes nothing).
func SwiGLU(out, gate, up []float32) {
	if len(gate) != len(out) || len(up) != len(out) {
		panic("kernels.SwiGLU: length mismatch")
	}
	n, p := len(out), cur()
	if chunks := ParallelChunks(n, n*p.expWork); chunks > 1 {
		ParallelFor(chunks, n, func(_, i0, i1 int) { p.siluMul(out[i0:i1], gate[i0:i1], up[i0:i1]) })
		return
	}
	p.siluMul(out, gate, up)
}

// expWorkGo is what an element of SwiGLU costs in Go, in ParallelChunks'
// unit (multiply-adds), as the team sees it worth splitting: an element
// takes ~15 ns in Go (212 us for 14336 on the Zen 4 VM), so a SwiGLU
// splits from 2048 elements, ~30 us of work, many times a region's cost
// (expWorkAsm puts the assembly's split at about as much work).
const expWorkGo = 32

// swiGLU is SwiGLU on the calling goroutine, in Go.
func swiGLU(out, gate, up []float32) {
	for i, g := range gate[:len(out)] {
		out[i] = SiLU(g) * up[i]
	}
}

// ClampedSwiGLU is gpt-oss's expert activation on interleaved pairs: for
// i < len(out), with g = gateUp[2i] and u = gateUp[2i+1] (the rows of
// gate_up_proj alternate gate and up),
//
//	g' = min(g, limit), u' = max(min(u, limit), -limit)
//	out[i] = float32(u'+1) * float32(g' / float32(1 + Exp(-float32(alpha*g'))))
//
// (a NaN stays NaN through the clamps, as torch's clamp keeps it). out may
// alias the start of gateUp: element i is written after pair i is read,
// in ascending order. It panics unless len(gateUp) == 2*len(out).
func ClampedSwiGLU(out, gateUp []float32, limit, alpha float32) {
	if len(gateUp) != 2*len(out) {
		panic("kernels.ClampedSwiGLU: length mismatch")
	}
	cur().clampedSwiGLU(out, gateUp, limit, alpha)
}

// clampedSwiGLUGo is ClampedSwiGLU in Go.
func clampedSwiGLUGo(out, gateUp []float32, limit, alpha float32) {
	for i := range out {
		g, u := min(gateUp[2*i], limit), max(min(gateUp[2*i+1], limit), -limit)
		glu := g / (1 + Exp(-(alpha * g)))
		out[i] = (u + 1) * glu
	}
}
