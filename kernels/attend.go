package kernels

import "math"

// Attend computes one query head's attention over cached positions: with
// k_j = keys[off+j*stride : off+j*stride+len(q)] and v_j the same slice
// of values, for j < len(scores),
//
//	scores[j] = float32(Dot(q, k_j) * scale)
//	Softmax(scores)
//	out = 0, then out += scores[j] * v_j by Axpy for j = 0, 1, ...
//
// bit for bit what those calls give one at a time (the package doc's
// Dot, Softmax and Axpy), on every path, in one pass over the keys and
// one over the values instead of a call a position. len(out) must be
// len(q); the last position's row must lie within keys and values.
func Attend(out, scores, q, keys, values []float32, stride, off int, scale float32) {
	AttendSink(out, scores, q, keys, values, stride, off, scale, float32(math.Inf(-1)))
}

// AttendSink is Attend with a learned attention sink (gpt-oss): the
// scores' softmax is SoftmaxSink(scores, sink), the sink taking its share
// of the weight and contributing no value. With sink = -Inf it is Attend.
func AttendSink(out, scores, q, keys, values []float32, stride, off int, scale, sink float32) {
	n, hd := len(scores), len(q)
	if len(out) != hd {
		panic("kernels.Attend: out and q lengths differ")
	}
	if n == 0 {
		clear(out)
		return
	}
	if end := off + (n-1)*stride + hd; off < 0 || stride < hd || end > len(keys) || end > len(values) {
		panic("kernels.Attend: the positions' rows overrun keys or values")
	}
	p := cur()
	p.dotRows(scores, q, keys[off:], stride)
	for j, s := range scores {
		scores[j] = float32(s * scale)
	}
	SoftmaxSink(scores, sink)
	clear(out)
	p.axpyRows(out, scores, values[off:], stride)
}

// dotRowsGo: out[j] = Dot(x, w[j*stride : j*stride+len(x)]).
func dotRowsGo(out, x, w []float32, stride int) {
	for j := range out {
		out[j] = dotF32Go(x, w[j*stride:j*stride+len(x)])
	}
}

// axpyRowsGo: dst += a[j] * x[j*stride : j*stride+len(dst)], j in order.
func axpyRowsGo(dst, a, x []float32, stride int) {
	for j, aj := range a {
		axpyGo(dst, aj, x[j*stride:j*stride+len(dst)])
	}
}
