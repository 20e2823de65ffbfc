package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestRoPEFreqsMatchHF: inv_freq[i] = 1/theta^(2i/d). Against the float64
// formula with the float32 exponent e = float32(2i)/float32(d) (as PyTorch
// rounds it) the error is pow and the division, < 2^-22 relative; against
// the exact exponent, e's rounding adds up to ln(theta)*e*u.
func TestRoPEFreqsMatchHF(t *testing.T) {
	for _, tc := range []struct {
		headDim int
		theta   float64
	}{{128, 1e6}, {128, 10000}, {64, 500000}, {2, 10000}} {
		inv := RoPEFreqs(tc.headDim, tc.theta)
		if len(inv) != tc.headDim/2 || inv[0] != 1 {
			t.Fatalf("%+v: len %d, inv[0] = %v", tc, len(inv), inv[0])
		}
		for i, got := range inv {
			e32 := float64(float32(2*i) / float32(tc.headDim))
			ref32 := 1 / math.Pow(tc.theta, e32)
			if err := math.Abs(float64(got) - ref32); err > math.Ldexp(ref32, -22) {
				t.Fatalf("%+v i=%d: %g, float64 %g", tc, i, got, ref32)
			}
			e := float64(2*i) / float64(tc.headDim)
			ref := 1 / math.Pow(tc.theta, e)
			if err := math.Abs(float64(got) - ref); err > ref*(math.Log(tc.theta)*e*u+math.Ldexp(1, -22)) {
				t.Fatalf("%+v i=%d: %g, exact %g", tc, i, got, ref)
			}
		}
	}
}

// TestRoPETableWithinAngleBound: the float32 angle pos*inv carries an
// absolute error <= u*angle, so |cos - exact| <= u*angle + u (final rounding).
func TestRoPETableWithinAngleBound(t *testing.T) {
	inv := RoPEFreqs(128, 1e6)
	cos, sin := make([]float32, 64), make([]float32, 64)
	for _, pos := range []int{0, 1, 2, 17, 1000, 4095, 32767, 131071} {
		RoPETable(cos, sin, pos, inv)
		for i, f := range inv {
			a := float64(pos) * float64(f)
			bound := u*a + u
			if err := math.Abs(float64(cos[i]) - math.Cos(a)); err > bound {
				t.Fatalf("pos=%d i=%d: cos = %v, float64 %v", pos, i, cos[i], math.Cos(a))
			}
			if err := math.Abs(float64(sin[i]) - math.Sin(a)); err > bound {
				t.Fatalf("pos=%d i=%d: sin = %v, float64 %v", pos, i, sin[i], math.Sin(a))
			}
		}
	}
}

// TestRoPEMatchesRotateHalf: per output, two rounded products and one add:
// |error| <= 3u(|x1 c| + |x2 s|) against float64 rotate_half on the same
// cos/sin values; the definition itself holds bit for bit.
func TestRoPEMatchesRotateHalf(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	for _, tc := range []struct{ nHeads, headDim int }{{1, 2}, {4, 64}, {32, 128}, {8, 128}} {
		half := tc.headDim / 2
		inv := RoPEFreqs(tc.headDim, 1e6)
		cos, sin := make([]float32, half), make([]float32, half)
		RoPETable(cos, sin, 1+rng.IntN(5000), inv)
		x := randVec(rng, tc.nHeads*tc.headDim)
		orig := append([]float32(nil), x...)
		RoPE(x, tc.nHeads, tc.headDim, cos, sin)
		for h := 0; h < len(x); h += tc.headDim {
			for i := range half {
				x1, x2 := orig[h+i], orig[h+i+half]
				c, s := cos[i], sin[i]
				ref1 := float64(x1)*float64(c) - float64(x2)*float64(s)
				ref2 := float64(x2)*float64(c) + float64(x1)*float64(s)
				b1 := 3 * u * (math.Abs(float64(x1)*float64(c)) + math.Abs(float64(x2)*float64(s)))
				b2 := 3 * u * (math.Abs(float64(x2)*float64(c)) + math.Abs(float64(x1)*float64(s)))
				if math.Abs(float64(x[h+i])-ref1) > b1 || math.Abs(float64(x[h+i+half])-ref2) > b2 {
					t.Fatalf("%+v head %d i=%d: got %v,%v float64 %v,%v", tc, h/tc.headDim, i, x[h+i], x[h+i+half], ref1, ref2)
				}
				if w1, w2 := float32(x1*c)-float32(x2*s), float32(x2*c)+float32(x1*s); !sameBits(x[h+i], w1) || !sameBits(x[h+i+half], w2) {
					t.Fatalf("%+v head %d i=%d: got %v,%v definition %v,%v", tc, h/tc.headDim, i, x[h+i], x[h+i+half], w1, w2)
				}
			}
		}
	}
}

func TestRoPEPanicsOnBadShape(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	RoPE(make([]float32, 10), 2, 4, make([]float32, 2), make([]float32, 2))
}
