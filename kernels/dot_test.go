package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

var dotSizes = []int{0, 1, 15, 16, 17, 31, 33, 100, 1000, 4099}

// TestDotEqualsLaneDefinition pins Dot to the 16-lane definition: order
// sensitive inputs, and special values (±0, subnormal products, overflow,
// Inf, NaN) in the tail and in full blocks.
func TestDotEqualsLaneDefinition(t *testing.T) { forEachPath(t, testDotEqualsLaneDefinition) }

func testDotEqualsLaneDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	specials := []float32{0, float32(math.Copysign(0, -1)), 1e-30, -1e-30, 1e30, -1e30, 3e38,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1.4e-45}
	gens := map[string]func(n int) ([]float32, []float32){
		"normal":     func(n int) ([]float32, []float32) { return randVec(rng, n), randVec(rng, n) },
		"wide range": func(n int) ([]float32, []float32) { return wideRangeVec(rng, n), wideRangeVec(rng, n) },
		"specials": func(n int) ([]float32, []float32) {
			w, x := wideRangeVec(rng, n), wideRangeVec(rng, n)
			for i := range w {
				if rng.IntN(4) == 0 {
					w[i] = specials[rng.IntN(len(specials))]
				}
				if rng.IntN(8) == 0 {
					x[i] = specials[rng.IntN(len(specials))]
				}
			}
			return w, x
		},
	}
	for name, gen := range gens {
		for _, n := range dotSizes {
			for range 20 {
				w, x := gen(n)
				if got, want := Dot(w, x), specDot(w, x); !sameBits(got, want) {
					t.Fatalf("%s n=%d: Dot = %v (%#08x), definition = %v (%#08x)", name, n, got, math.Float32bits(got), want, math.Float32bits(want))
				}
			}
		}
	}
}

// TestDotRoundsProductsBeforeAdding catches a fused multiply-add: with
// a = 1+2^-12, a*a = 1+2^-11+2^-24 rounds to 1+2^-11 (tie to even), so the
// lane sum -(1+2^-11) + float32(a*a) is exactly 0; an FMA would give 2^-24.
func TestDotRoundsProductsBeforeAdding(t *testing.T) {
	forEachPath(t, testDotRoundsProductsBeforeAdding)
}

func testDotRoundsProductsBeforeAdding(t *testing.T) {
	a := float32(1 + 1.0/(1<<12))
	for _, n := range []int{17, 32, 40} {
		w := make([]float32, n)
		x := make([]float32, n)
		w[0], x[0] = -(1 + 1.0/(1<<11)), 1
		w[16], x[16] = a, a
		if got := Dot(w, x); got != 0 {
			t.Errorf("n=%d: Dot = %g, want exactly 0 (product fused into the add?)", n, got)
		}
		m := Matrix{DType: F32, Rows: 1, Cols: n, Data: encode(F32, w)}
		out := []float32{1}
		MatVec(out, m, x)
		if out[0] != 0 {
			t.Errorf("n=%d: MatVec = %g, want exactly 0", n, out[0])
		}
	}
}

// TestDotTailTouchesOnlyItsLanes: a lane never becomes -0, so an all -0
// product row gives +0, and the tail leaves untouched lanes alone.
func TestDotTailTouchesOnlyItsLanes(t *testing.T) { forEachPath(t, testDotTailTouchesOnlyItsLanes) }

func testDotTailTouchesOnlyItsLanes(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	for _, n := range []int{1, 5, 16, 21} {
		w := make([]float32, n)
		x := make([]float32, n)
		for i := range w {
			w[i], x[i] = negZero, 1
		}
		if got := Dot(w, x); math.Float32bits(got) != 0 {
			t.Errorf("n=%d: Dot of -0 products = %#08x, want +0", n, math.Float32bits(got))
		}
	}
}

func TestDotWithinFloat64ErrorBound(t *testing.T) { forEachPath(t, testDotWithinFloat64ErrorBound) }

func testDotWithinFloat64ErrorBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range dotSizes {
		for range 20 {
			w, x := randVec(rng, n), randVec(rng, n)
			ref, absSum := refDot(w, x)
			got := float64(Dot(w, x))
			if err, bound := math.Abs(got-ref), dotErrBound(n, absSum); err > bound {
				t.Fatalf("n=%d: |Dot - exact| = %g > bound %g", n, err, bound)
			}
		}
	}
}

func TestSumEqualsDotWithOnes(t *testing.T) { forEachPath(t, testSumEqualsDotWithOnes) }

func testSumEqualsDotWithOnes(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range dotSizes {
		x := wideRangeVec(rng, n)
		ones := make([]float32, n)
		for i := range ones {
			ones[i] = 1
		}
		if got, want := Sum(x), specDot(ones, x); !sameBits(got, want) {
			t.Fatalf("n=%d: Sum = %v, definition = %v", n, got, want)
		}
	}
}

func TestDotPanicsOnLengthMismatch(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	Dot(make([]float32, 3), make([]float32, 4))
}
