package draft

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

const ms = time.Millisecond

// TestChooseScenarios: what the policy answers on the swarms the issue
// names, with costs of their size.
func TestChooseScenarios(t *testing.T) {
	// tiny on loopback with 0.5 ms each way (a LAN): four layers, each a
	// round trip of two hops and the experts' compute
	lan := Costs{Layers: 4, RoundTrip: 1100 * time.Microsecond, Rest: 300 * time.Microsecond, Row: 60 * time.Microsecond}
	hostCached := lan
	hostCached.RowLoads, hostCached.Load = 1, 150*time.Microsecond // a few of a row's experts come from host memory, late
	cacheless := lan
	// every expert of a guessed row (top-2 of 8, four layers) is mostly
	// its own and comes from the store, decompressed, while the pass waits
	cacheless.RowLoads, cacheless.Load = 6, 2*ms
	for _, c := range []struct {
		name     string
		accept   float64
		costs    Costs
		most     int
		lo, hi   int
		minSpeed float64 // the chosen k's tokens a second over one row's
	}{
		{"LAN round trips, host caches, greedy: guess several", 0.85, hostCached, 8, 3, 8, 1.5},
		{"LAN round trips, sampled at 0.7: still several", 0.7, hostCached, 8, 2, 8, 1.3},
		{"loads dominate (no cache): none", 0.85, cacheless, 8, 0, 0, 1},
		{"guesses rarely kept: none", 0.03, hostCached, 8, 0, 0, 1},
		{"every guess kept, rows free: the most allowed", 1, Costs{Layers: 4, RoundTrip: ms}, 5, 5, 5, 6},
		{"nothing allowed", 0.9, hostCached, 0, 0, 0, 1},
		{"a pass costs nothing measured yet: none", 0.9, Costs{}, 8, 0, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := Choose(c.accept, c.costs, c.most)
			if k < c.lo || k > c.hi {
				t.Fatalf("Choose = %d, want %d..%d", k, c.lo, c.hi)
			}
			if k > 0 {
				speed := Expected(c.accept, k) / c.costs.Pass(k).Seconds() * c.costs.Pass(0).Seconds()
				if speed < c.minSpeed {
					t.Fatalf("k = %d gives %.2fx one row's tokens a second, want %.2fx", k, speed, c.minSpeed)
				}
				t.Logf("k = %d: %.2f tokens a pass, %.2fx", k, Expected(c.accept, k), speed)
			}
		})
	}
}

// TestExpectedIsTheMeanOfDraws: Expected against a pass drawn guess by
// guess, each kept with its chance until the first that is not.
func TestExpectedIsTheMeanOfDraws(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, accept := range []float64{0, 0.3, 0.7, 0.95, 1} {
		for _, k := range []int{0, 1, 3, 8} {
			const passes = 200000
			tokens := 0
			for range passes {
				tokens++ // the pass's own sample
				for range k {
					if rng.Float64() >= accept {
						break
					}
					tokens++
				}
			}
			mean := float64(tokens) / passes
			if got := Expected(accept, k); math.Abs(got-mean) > 0.01*mean {
				t.Errorf("accept %v, k %d: Expected %.4f, drawn %.4f", accept, k, got, mean)
			}
		}
	}
}

// TestChooseIsTheFastest: over many costs and rates, Choose's answer
// gives at least the tokens a second of every other k (checking none by
// Gain), by brute force over each.
func TestChooseIsTheFastest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		c := Costs{Layers: 1 + rng.IntN(60), RoundTrip: time.Duration(rng.Float64() * float64(3*ms)),
			Rest: time.Duration(rng.Float64() * float64(10*ms)), Row: time.Duration(rng.Float64() * float64(2*ms)),
			RowLoads: rng.Float64() * 20, Load: time.Duration(rng.Float64() * float64(5*ms))}
		accept, most := rng.Float64(), rng.IntN(9)
		k := Choose(accept, c, most)
		rate := func(k int) float64 { return Expected(accept, k) / c.Pass(k).Seconds() }
		if k < 0 || k > most {
			t.Fatalf("Choose = %d outside 0..%d", k, most)
		}
		for j := 0; j <= most; j++ {
			if rate(j) > rate(k)*(1+1e-9) && (k != 0 || rate(j) >= Gain*rate(0)) {
				t.Fatalf("%+v, accept %.3f: Choose = %d (%.1f tokens/s) but %d gives %.1f", c, accept, k, rate(k), j, rate(j))
			}
		}
		if k > 0 && rate(k) < Gain*rate(0) {
			t.Fatalf("%+v, accept %.3f: Choose = %d beats none by %.3f, under Gain", c, accept, k, rate(k)/rate(0))
		}
	}
}

// TestAcceptanceRate: a sequence with no record takes the prior; its
// record outweighs the prior as it grows.
func TestAcceptanceRate(t *testing.T) {
	if r := (Acceptance{}).Rate(0.6); r != 0.6 {
		t.Fatalf("no record: %v, want the prior 0.6", r)
	}
	if r := (Acceptance{Kept: 96, Missed: 0}).Rate(0); r < 0.95 {
		t.Fatalf("96 kept, none missed, prior 0: %v, want above 0.95", r)
	}
	if r := (Acceptance{Kept: 3, Missed: 1}).Rate(0.5); math.Abs(r-5.0/8) > 1e-12 {
		t.Fatalf("3 kept, 1 missed, prior 0.5: %v, want 5/8", r)
	}
}
