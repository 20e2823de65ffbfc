package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

var vecSizes = []int{1, 8, 15, 16, 17, 100, 1000, 4096}

// TestRMSNormWithinFloat64Bound: the sum of squares has relative error at
// most gamma(ceil(n/16)+5) (all terms positive), the division by n and the
// eps add u each, the square root halves the error and adds u, 1/s, x*r
// and the weight multiply u each: under (ceil(n/16)+16)*u relative.
func TestRMSNormWithinFloat64Bound(t *testing.T) { forEachPath(t, testRMSNormWithinFloat64Bound) }

func testRMSNormWithinFloat64Bound(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for _, n := range vecSizes {
		for _, eps := range []float32{1e-5, 1e-6, 0} {
			x, w := randVec(rng, n), randVec(rng, n)
			out := make([]float32, n)
			RMSNorm(out, x, w, eps)
			var ss float64
			for _, v := range x {
				ss += float64(v) * float64(v)
			}
			r := 1 / math.Sqrt(ss/float64(n)+float64(eps))
			bound := float64((n+15)/16+16) * u
			for i := range out {
				ref := float64(w[i]) * float64(x[i]) * r
				if err := math.Abs(float64(out[i]) - ref); err > bound*math.Abs(ref) {
					t.Fatalf("n=%d eps=%g i=%d: RMSNorm = %g, float64 %g (rel err %g > %g)", n, eps, i, out[i], ref, err/math.Abs(ref), bound)
				}
			}
			// The definition, bit for bit, and in place over x.
			rr := 1 / float32(math.Sqrt(float64(specDot(x, x)/float32(n)+eps)))
			for i := range out {
				if want := w[i] * float32(x[i]*rr); !sameBits(out[i], want) {
					t.Fatalf("n=%d i=%d: RMSNorm = %v, definition %v", n, i, out[i], want)
				}
			}
			RMSNorm(x, x, w, eps)
			for i := range out {
				if !sameBits(x[i], out[i]) {
					t.Fatalf("n=%d: in-place RMSNorm differs at %d", n, i)
				}
			}
		}
	}
}

// TestSoftmaxWithinFloat64Bound: x_i - m costs u*|x_i - m| relative in e_i,
// Exp 1.5 ulp (< 3u), the 16-lane sum gamma(ceil(n/16)+4) plus the terms'
// own error, the division u.
func TestSoftmaxWithinFloat64Bound(t *testing.T) { forEachPath(t, testSoftmaxWithinFloat64Bound) }

func testSoftmaxWithinFloat64Bound(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	for _, n := range vecSizes {
		for _, scale := range []float64{1, 10} {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * scale)
			}
			if n > 4 {
				x[n/2] = float32(math.Inf(-1)) // a masked position
			}
			orig := append([]float32(nil), x...)
			Softmax(x)

			m := math.Inf(-1)
			for _, v := range orig {
				m = max(m, float64(v))
			}
			ref := make([]float64, n)
			var sum, spread float64
			for i, v := range orig {
				ref[i] = math.Exp(float64(v) - m)
				sum += ref[i]
				if !math.IsInf(float64(v), 0) {
					spread = max(spread, m-float64(v))
				}
			}
			var total float64
			bound := (2*spread + 8 + float64((n+15)/16+5)) * u
			for i := range x {
				ref[i] /= sum
				total += float64(x[i])
				if err := math.Abs(float64(x[i]) - ref[i]); err > bound*ref[i] {
					t.Fatalf("n=%d scale=%g i=%d: Softmax = %g, float64 %g (rel err %g > %g)", n, scale, i, x[i], ref[i], err/ref[i], bound)
				}
			}
			if math.Abs(total-1) > bound {
				t.Fatalf("n=%d: outputs sum to %v", n, total)
			}
			// The definition, bit for bit.
			e := make([]float32, n)
			for i, v := range orig {
				e[i] = Exp(v - float32(m))
			}
			ones := make([]float32, n)
			for i := range ones {
				ones[i] = 1
			}
			s := specDot(ones, e)
			for i := range x {
				if want := e[i] / s; !sameBits(x[i], want) {
					t.Fatalf("n=%d i=%d: Softmax = %v, definition %v", n, i, x[i], want)
				}
			}
		}
	}
}

func TestSoftmaxSpecialInputs(t *testing.T) { forEachPath(t, testSoftmaxSpecialInputs) }

func testSoftmaxSpecialInputs(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	Softmax(nil) // no panic
	cases := []struct {
		name string
		in   []float32
		want []float32
	}{
		{"single", []float32{5}, []float32{1}},
		{"equal", []float32{2, 2, 2, 2}, []float32{0.25, 0.25, 0.25, 0.25}},
		{"masked", []float32{0, -inf, 0}, []float32{0.5, 0, 0.5}},
		{"all masked is NaN as in PyTorch", []float32{-inf, -inf}, []float32{nan, nan}},
		{"NaN spreads", []float32{1, nan, 2}, []float32{nan, nan, nan}},
		{"NaN first spreads", []float32{nan, 1, 2}, []float32{nan, nan, nan}},
		{"huge logits", []float32{3e38, 3e38}, []float32{0.5, 0.5}},
	}
	for _, tc := range cases {
		x := append([]float32(nil), tc.in...)
		Softmax(x)
		for i := range x {
			if !sameBits(x[i], tc.want[i]) {
				t.Errorf("%s: Softmax(%v) = %v, want %v", tc.name, tc.in, x, tc.want)
				break
			}
		}
	}
}
