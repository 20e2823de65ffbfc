package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func TestExpEdgeCases(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct {
		name string
		in   float32
		want float32 // compared bit for bit; NaN means any NaN
	}{
		{"NaN", float32(math.NaN()), float32(math.NaN())},
		{"+Inf", inf, inf},
		{"-Inf", -inf, 0},
		{"+0", 0, 1},
		{"-0", float32(math.Copysign(0, -1)), 1},
		{"one", 1, float32(math.E)},
		{"largest finite result", 88.72283, math.Float32frombits(0x7f7fff84)},
		{"first overflow", 88.72284, inf},
		{"just above cutoff", 88.80001, inf},
		{"smallest normal result", -87.33654, math.Float32frombits(0x00800026)},
		{"largest subnormal result", -87.33655, math.Float32frombits(0x007fffe6)},
		{"subnormal result", -100, float32(math.Exp(-100))},
		{"smallest subnormal result", -103.27893, math.Float32frombits(1)},
		{"last nonzero result", -103.972, math.Float32frombits(1)},
		{"rounds to zero", -103.973, 0},
		{"below cutoff", -104.5, 0},
		{"-max float32", -math.MaxFloat32, 0},
		{"max float32", math.MaxFloat32, inf},
	}
	for _, tc := range cases {
		if got := Exp(tc.in); !sameBits(got, tc.want) {
			t.Errorf("%s: Exp(%g) = %g (%#08x), want %g (%#08x)", tc.name, tc.in, got, math.Float32bits(got), tc.want, math.Float32bits(tc.want))
		}
	}
}

// TestExpWithinOneUlp: Exp is within 1 ulp of float32(math.Exp(float64(x)))
// (the reference is itself within 0.5 ulp + a float64 ulp of exact) over
// a stride through every float32 bit pattern and random inputs in the
// interesting range, subnormal results included. The float64 polynomial
// error (< 1e-11 relative) makes almost every result correctly rounded:
// at least 99.9% must equal the reference exactly.
func TestExpWithinOneUlp(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	var n, exact int
	var worst int64
	check := func(x float32) {
		got, want := Exp(x), float32(math.Exp(float64(x)))
		d := ulpDiff(got, want)
		if d > 1 {
			t.Fatalf("Exp(%g) = %g, reference %g: %d ulp apart", x, got, want, d)
		}
		n++
		if d == 0 {
			exact++
		}
		worst = max(worst, d)
	}
	for b := uint64(0); b < 1<<32; b += 4093 {
		check(math.Float32frombits(uint32(b)))
	}
	for range 300000 {
		check(float32(rng.Float64()*200 - 108))
	}
	for range 100000 {
		check(float32(rng.Float64()*2 - 1))
	}
	t.Logf("%d inputs, %d exact, worst %d ulp", n, exact, worst)
	if float64(exact) < 0.999*float64(n) {
		t.Fatalf("only %d of %d results correctly rounded", exact, n)
	}
}

func TestExpIsMonotonic(t *testing.T) {
	prev := Exp(-105)
	for x := float32(-105); x < 90; x += 0.0123 {
		e := Exp(x)
		if e < prev {
			t.Fatalf("Exp(%g) = %g < Exp(previous) = %g", x, e, prev)
		}
		prev = e
	}
}

// TestSiLUWithinFloat64Bound: Exp (<= 1.5 ulp of exact, at most 2^-22.4
// relative), the add and the division (2^-24 each) give < 2^-21 relative
// error; where Exp(-x) overflows (x < -88.7) SiLU returns -0 while the
// exact value is below 3e-37, hence the absolute slack.
func TestSiLUWithinFloat64Bound(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	xs := []float32{0, 1, -1, 20, -20, 88, -88, -88.7, -89, -100, 100, float32(math.Inf(1))}
	for range 100000 {
		xs = append(xs, float32(rng.Float64()*240-120))
	}
	for _, x := range xs {
		got := float64(SiLU(x))
		xd := float64(x)
		ref := xd / (1 + math.Exp(-xd))
		if err := math.Abs(got - ref); err > math.Ldexp(math.Abs(ref), -21)+1e-36 {
			t.Fatalf("SiLU(%g) = %g, float64 %g", x, got, ref)
		}
	}
	if s := SiLU(float32(math.NaN())); !isNaN32(s) {
		t.Errorf("SiLU(NaN) = %g", s)
	}
}

// TestSwiGLUIsSiLUTimesUp: every element is SiLU(gate)*up, near the
// float64 formula, in place too, on every path; at one thread and at
// three, where a long one (32768) is split over the team.
func TestSwiGLUIsSiLUTimesUp(t *testing.T) {
	for _, threads := range []int{1, 3} {
		t.Run(fmt.Sprintf("threads=%d", threads), func(t *testing.T) {
			prev := SetThreads(threads)
			defer SetThreads(prev)
			forEachPath(t, func(t *testing.T) {
				if split := ParallelChunks(32768, 32768*cur().expWork) > 1; split != (threads > 1) {
					t.Fatalf("at %d threads a SwiGLU of 32768 splits: %v", threads, split)
				}
				swiGLUIsSiLUTimesUp(t)
			})
		})
	}
}

func swiGLUIsSiLUTimesUp(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 36))
	for _, n := range []int{0, 1, 17, 1000, 32768} {
		gate, up := randVec(rng, n), randVec(rng, n)
		out := make([]float32, n)
		SwiGLU(out, gate, up)
		for i := range out {
			if want := float32(SiLU(gate[i]) * up[i]); !sameBits(out[i], want) {
				t.Fatalf("n=%d i=%d: SwiGLU = %v, want %v", n, i, out[i], want)
			}
			ref := float64(gate[i]) / (1 + math.Exp(-float64(gate[i]))) * float64(up[i])
			if math.Abs(float64(out[i])-ref) > math.Ldexp(math.Abs(ref), -20)+1e-36 {
				t.Fatalf("n=%d i=%d: SwiGLU = %v, float64 %v", n, i, out[i], ref)
			}
		}
		// In place over gate gives the same bits.
		g2 := append([]float32(nil), gate...)
		SwiGLU(g2, g2, up)
		for i := range out {
			if !sameBits(g2[i], out[i]) {
				t.Fatalf("aliased SwiGLU differs at %d", i)
			}
		}
	}
}

// TestClampedSwiGLUFollowsGptOss checks gpt-oss's activation against its
// HF formula in float64 (gate clamped above, up on both sides,
// glu = gate * sigmoid(alpha*gate), (up + 1) * glu), with inputs well past
// the limit so that both clamps act, and in place over its input.
func TestClampedSwiGLUFollowsGptOss(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 38))
	const limit, alpha = 7, 1.702
	for _, n := range []int{0, 1, 17, 1000} {
		gu := make([]float32, 2*n)
		for i := range gu {
			gu[i] = float32(rng.Float64()*30 - 15)
		}
		out := make([]float32, n)
		ClampedSwiGLU(out, gu, limit, alpha)
		clamped := 0
		for i := range out {
			g, u := float64(gu[2*i]), float64(gu[2*i+1])
			if g > limit || math.Abs(u) > limit {
				clamped++
			}
			g, u = math.Min(g, limit), math.Max(math.Min(u, limit), -limit)
			// alpha as float32 (torch multiplies a float32 tensor by the
			// Python float so); rounding alpha*g to float32 costs up to
			// |alpha*g| * 2^-24 of relative error in the exponential
			a := float64(float32(alpha)) * g
			ref := (u + 1) * g / (1 + math.Exp(-a))
			if math.Abs(float64(out[i])-ref) > math.Ldexp(math.Abs(ref), -20)*(1+math.Abs(a))+1e-36 {
				t.Fatalf("n=%d i=%d: ClampedSwiGLU(%v, %v) = %v, float64 %v", n, i, gu[2*i], gu[2*i+1], out[i], ref)
			}
		}
		if n >= 17 && clamped == 0 {
			t.Fatalf("n=%d: no input reached the clamps", n)
		}
		inPlace := append([]float32(nil), gu...)
		ClampedSwiGLU(inPlace[:n], inPlace, limit, alpha)
		for i := range out {
			if !sameBits(inPlace[i], out[i]) {
				t.Fatalf("n=%d: in place differs at %d: %v, want %v", n, i, inPlace[i], out[i])
			}
		}
	}
	nan := float32(math.NaN())
	for _, gu := range [][]float32{{nan, 1}, {1, nan}} {
		out := make([]float32, 1)
		if ClampedSwiGLU(out, gu, limit, alpha); !isNaN32(out[0]) {
			t.Errorf("ClampedSwiGLU(%v) = %v, want NaN (the clamps keep it)", gu, out[0])
		}
	}
}
