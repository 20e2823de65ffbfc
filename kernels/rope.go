package kernels

import "math"

// The rotary embedding tables are computed on the main node only, and use
// math.Pow, math.Cos and math.Sin, whose float64 bits may differ between
// architectures (the math package is compiled with fused multiply-add
// where the hardware has it). They are deterministic within one build on
// one architecture, which is all that the main node's attention needs;
// RoPE itself (the rotation) is plain float32 arithmetic and portable.

// RoPEFreqs returns Hugging Face's inv_freq for a head of headDim
// (even) dimensions, computed as PyTorch does in float32:
//
//	inv[i] = 1 / float32(theta^(float32(2i)/float32(headDim)))   for i < headDim/2
//
// with theta rounded to float32 first.
func RoPEFreqs(headDim int, theta float64) []float32 {
	if headDim <= 0 || headDim%2 != 0 {
		panic("kernels.RoPEFreqs: headDim must be even and positive")
	}
	base := float64(float32(theta))
	inv := make([]float32, headDim/2)
	for i := range inv {
		e := float32(2*i) / float32(headDim)
		inv[i] = 1 / float32(math.Pow(base, float64(e)))
	}
	return inv
}

// RoPETable fills cos and sin for position pos: with the angle
// a = float32(pos)*invFreq[i] (a float32 product, as HF computes freqs),
// cos[i] = float32(math.Cos(a)) and sin[i] = float32(math.Sin(a)).
// len(cos) and len(sin) must equal len(invFreq).
func RoPETable(cos, sin []float32, pos int, invFreq []float32) {
	if len(cos) != len(invFreq) || len(sin) != len(invFreq) {
		panic("kernels.RoPETable: length mismatch")
	}
	p := float32(pos)
	for i, f := range invFreq {
		a := float64(p * f)
		cos[i] = float32(math.Cos(a))
		sin[i] = float32(math.Sin(a))
	}
}

// RoPE rotates x in place: x holds nHeads heads of headDim elements, and
// cos, sin (len headDim/2) come from RoPETable. It follows HF's
// rotate_half convention, each product rounded to float32 before the add:
//
//	x1, x2 := x[h+i], x[h+i+half]      (i < half = headDim/2)
//	x[h+i]      = float32(x1*c) - float32(x2*s)
//	x[h+i+half] = float32(x2*c) + float32(x1*s)
func RoPE(x []float32, nHeads, headDim int, cos, sin []float32) {
	half := headDim / 2
	if headDim%2 != 0 || len(x) != nHeads*headDim || len(cos) != half || len(sin) != half {
		panic("kernels.RoPE: length mismatch")
	}
	for h := 0; h < len(x); h += headDim {
		lo := x[h : h+half]
		hi := x[h+half : h+headDim]
		hi = hi[:len(lo)]
		for i, c := range cos[:len(lo)] {
			s := sin[i]
			x1, x2 := lo[i], hi[i]
			lo[i] = float32(x1*c) - float32(x2*s)
			hi[i] = float32(x2*c) + float32(x1*s)
		}
	}
}
