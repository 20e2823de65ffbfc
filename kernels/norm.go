package kernels

import "math"

// RMSNorm computes Hugging Face's MixtralRMSNorm in float32:
//
//	ms  = Dot(x, x) / float32(n)
//	r   = 1 / sqrt(ms + eps)   (sqrt correctly rounded, then a float32 division)
//	out = weight[i] * float32(x[i]*r)
//
// out may alias x. It panics if the lengths differ.
func RMSNorm(out, x, weight []float32, eps float32) {
	if len(x) != len(out) || len(weight) != len(out) {
		panic("kernels.RMSNorm: length mismatch")
	}
	p := cur()
	ms := p.dotF32(x, x) / float32(len(x))
	// A float64 square root rounded to float32 is the correctly rounded
	// float32 square root (sqrtss, fsqrt), so this is portable.
	r := 1 / float32(math.Sqrt(float64(ms+eps)))
	p.scaleMul(out, x, weight, r)
}

// expShiftGo is Softmax's exponentials: x[i] = Exp(x[i] - m).
func expShiftGo(x []float32, m float32) {
	for i, v := range x {
		x[i] = Exp(v - m)
	}
}

// scaleMulGo is RMSNorm's last step: out[i] = weight[i] * float32(x[i]*r).
func scaleMulGo(out, x, weight []float32, r float32) {
	x, weight = x[:len(out)], weight[:len(out)]
	for i, v := range x {
		out[i] = weight[i] * float32(v*r)
	}
}

// Softmax replaces x by its softmax, in place:
//
//	m   = max(x)           (the first NaN-free maximum; any NaN makes all NaN)
//	e_i = Exp(x_i - m)
//	s   = Sum(e)           (the 16-lane definition of Dot)
//	x_i = e_i / s          (a division, not a multiply by 1/s)
//
// An empty x is left alone; an x that is all -Inf becomes all NaN, as in
// PyTorch.
func Softmax(x []float32) { SoftmaxSink(x, float32(math.Inf(-1))) }

// SoftmaxSink is Softmax over x and the logit sink, whose share is
// dropped: x_i = exp(x_i) / (sum_j exp(x_j) + exp(sink)), as the package
// doc defines it (gpt-oss's attention sinks). With sink = -Inf it is
// Softmax.
func SoftmaxSink(x []float32, sink float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	sinks := !math.IsInf(float64(sink), -1)
	if sinks && sink > m {
		m = sink
	}
	cur().expShift(x, m)
	s := Sum(x)
	if sinks {
		s += Exp(sink - m)
	}
	for i, v := range x {
		x[i] = v / s
	}
}
