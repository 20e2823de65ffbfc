package sched

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// The initial placement of a heterogeneous swarm, as the main node asks
// for it: uniform heat (topK/experts rows per expert per pass, one
// Tick), loads paid back over any horizon, no bound on moves. Workers
// 0..fast-1 load twice as fast as the others; compute is the same.
const (
	initialExpertBytes = 9437184 // 9 MiB
	initialTopK        = 8
	initialExperts     = 128
	initialFastLoad    = 4e9 // bytes/s
	initialSlowLoad    = 2e9
	initialCompute     = initialExpertBytes / 10e9 // reading the expert once at 10 GB/s
)

func initialSwarm(tb testing.TB, workers, fast int, layers []int, fastCache, slowCache int64) (*Placement, *Heat, []Capacity, RebalanceOptions) {
	tb.Helper()
	p, err := NewPlacement(workers, layers, initialExperts)
	if err != nil {
		tb.Fatal(err)
	}
	h, err := NewHeat(layers, initialExperts, math.Inf(1))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range layers {
		for e := range initialExperts {
			h.Observe(l, e, float64(initialTopK)/initialExperts)
		}
	}
	h.Tick()
	caps := make([]Capacity, workers)
	for w := range caps {
		caps[w] = Capacity{CacheBytes: slowCache, LoadBytesSec: initialSlowLoad}
		if w < fast {
			caps[w] = Capacity{CacheBytes: fastCache, LoadBytesSec: initialFastLoad}
		}
	}
	return p, h, caps, RebalanceOptions{ComputeSeconds: initialCompute, HorizonIters: math.Inf(1)}
}

// uniformTime is a worker's seconds on a layer of which it owns n experts,
// all equally hot (rate rows per pass) and of size bytes, when no
// other layer competes for its cache: the model of Cost worked by hand.
func uniformTime(n int, c Capacity, rate, computeSeconds float64, bytes int64) float64 {
	resident := min(int64(n), c.CacheBytes/bytes)
	return float64(n)*rate*computeSeconds + float64(int64(n)-resident)*min(rate, 1)*float64(bytes)/c.LoadBytesSec
}

// bestUniformMax is the lowest possible maximum of uniformTime over a
// layer of experts experts, fast workers of capacity fc and slow ones of
// sc: a group's maximum is lowest with its experts spread evenly, so try
// every split between the groups.
func bestUniformMax(experts, fast, slow int, fc, sc Capacity, rate, computeSeconds float64, bytes int64) float64 {
	ceilDiv := func(a, b int) int { return (a + b - 1) / b }
	best := math.Inf(1)
	for n := 0; n <= experts; n++ {
		best = min(best, max(uniformTime(ceilDiv(n, fast), fc, rate, computeSeconds, bytes),
			uniformTime(ceilDiv(experts-n, slow), sc, rate, computeSeconds, bytes)))
	}
	return best
}

// TestRebalanceGivesTiedSlowWorkersExpertsToFastOnes: under uniform heat
// the four slow workers tie at the maximum, so no single move lowers Cost;
// moves that keep it and lower busy time hand experts to the fast workers
// until the maximum falls, down to the best split there is.
func TestRebalanceGivesTiedSlowWorkersExpertsToFastOnes(t *testing.T) {
	const L = initialExpertBytes
	cases := []struct {
		name                 string
		fastCache, slowCache int64
	}{
		{"37 MiB and 9 MiB caches: 4 experts and 1 resident", 37 << 20, 9 << 20},
		{"3 experts and none resident", 3 * L, 0},
		{"fast caches hold all a fast worker could own", 128 * L, 0},
	}
	for _, c := range cases {
		p, h, caps, opt := initialSwarm(t, 8, 4, []int{0}, c.fastCache, c.slowCache)
		rate := float64(initialTopK) / initialExperts
		maxBefore := 0.0
		for w := range 8 {
			maxBefore = max(maxBefore, uniformTime(len(p.Owned(w, 0)), caps[w], rate, opt.ComputeSeconds, L))
		}
		moves := Rebalance(p, h, caps, bytesEach(L), opt)
		q, lowered := checkMoves(t, p, h, caps, bytesEach(L), opt, moves)
		if lowered == len(moves) {
			t.Errorf("%s: all %d moves lowered Cost: the tie was not there to break", c.name, len(moves))
		}

		owned, maxAfter := make([]int, 8), 0.0
		for w := range owned {
			owned[w] = len(q.Owned(w, 0))
			maxAfter = max(maxAfter, uniformTime(owned[w], caps[w], rate, opt.ComputeSeconds, L))
		}
		fast, slow := owned[0]+owned[1]+owned[2]+owned[3], owned[4]+owned[5]+owned[6]+owned[7]
		if min(owned[0], owned[1], owned[2], owned[3]) <= max(owned[4], owned[5], owned[6], owned[7]) {
			t.Errorf("%s: owned per worker %v: want every fast worker (0-3) above every slow one", c.name, owned)
		}
		if cost := Cost(q, h, caps, bytesEach(L), opt); math.Abs(cost-maxAfter) > 1e-12*maxAfter {
			t.Errorf("%s: Cost %v, but the hand-worked maximum is %v", c.name, cost, maxAfter)
		}
		best := bestUniformMax(initialExperts, 4, 4, caps[0], caps[4], rate, opt.ComputeSeconds, L)
		switch {
		case !(maxAfter < maxBefore):
			t.Errorf("%s: layer maximum %v before the moves, %v after", c.name, maxBefore, maxAfter)
		case maxAfter > best*(1+1e-12):
			t.Errorf("%s: layer maximum %v after %d moves (owned %v); the best split gives %v", c.name, maxAfter, len(moves), owned, best)
		}
		t.Logf("%s: %d moves (%d lowered Cost): fast workers own %d, slow %d (%v); maximum %.4g -> %.4g ms",
			c.name, len(moves), lowered, fast, slow, owned, maxBefore*1e3, maxAfter*1e3)
	}
}

// TestRebalanceTieMoveStopsShortOfTheMaximum: a move at equal Cost may not
// bring its receiver up to the maximum, where rounding could raise Cost.
// Loads are free; w2 computes twice as fast. w0 and w1 tie at the maximum
// (2 experts each), w2 has half that; one expert of w0 to w2 keeps Cost
// and saves busy time, after which the next one (of w1) would bring w2
// exactly to the maximum.
func TestRebalanceTieMoveStopsShortOfTheMaximum(t *testing.T) {
	p, _ := NewPlacement(3, []int{0}, 6)
	h := heatOf(t, []int{0}, 6, func(int, int) float64 { return 0.5 })
	caps := []Capacity{{ComputeScale: 1}, {ComputeScale: 1}, {ComputeScale: 2}}
	opt := RebalanceOptions{ComputeSeconds: 1e-3, HorizonIters: 1e9}
	moves := Rebalance(p, h, caps, bytesEach(1e6), opt)
	want := []Move{{Layer: 0, Expert: 0, From: 0, To: 2, Gain: 0.5 * 1e-3 / 2}}
	if len(moves) != 1 || moves[0].Layer != 0 || moves[0].Expert != 0 || moves[0].From != 0 || moves[0].To != 2 ||
		math.Abs(moves[0].Gain-want[0].Gain) > 1e-15 {
		t.Fatalf("moves %+v, want %+v", moves, want)
	}
	checkMoves(t, p, h, caps, bytesEach(1e6), opt, moves)
}

func TestRebalanceBreaksTiesDeterministicallyAndBounded(t *testing.T) {
	p, h, caps, opt := initialSwarm(t, 8, 4, seq(6), 37<<20, 9<<20)
	a := Rebalance(p, h, caps, bytesEach(initialExpertBytes), opt)
	b := Rebalance(p.Clone(), h, caps, bytesEach(initialExpertBytes), opt)
	if len(a) < 20 || !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs: %d and %d moves (want the same, at least 20)", len(a), len(b))
	}
	checkMoves(t, p, h, caps, bytesEach(initialExpertBytes), opt, a)
	for _, limit := range []int{1, 5, len(a) - 1, len(a), len(a) + 5} {
		opt.MaxMoves = limit
		got := Rebalance(p, h, caps, bytesEach(initialExpertBytes), opt)
		if want := a[:min(limit, len(a))]; !reflect.DeepEqual(got, want) {
			t.Errorf("MaxMoves %d: %d moves, want the first %d of the unbounded run", limit, len(got), len(want))
		}
	}
}

// TestRebalanceMovesEveryLayerOfATiedSwarm: with many layers the workers'
// caches are shared by all of them, so no hand-worked reference; the
// layer maxima still must not rise, and the fast workers end with more.
func TestRebalanceMovesEveryLayerOfATiedSwarm(t *testing.T) {
	layers := seq(12)
	p, h, caps, opt := initialSwarm(t, 8, 4, layers, 37<<20, 9<<20)
	bytes := bytesEach(initialExpertBytes)
	moves := Rebalance(p, h, caps, bytes, opt)
	q, _ := checkMoves(t, p, h, caps, bytes, opt, moves)
	before, after := newCostModel(p, h, caps, bytes, opt), newCostModel(q, h, caps, bytes, opt)
	for r, l := range layers {
		if after.layerMax[r] > before.layerMax[r] {
			t.Errorf("layer %d: maximum %v before the moves, %v after", l, before.layerMax[r], after.layerMax[r])
		}
		fast := 0
		for w := range 4 {
			fast += len(q.Owned(w, l))
		}
		if fast <= initialExperts/2 {
			t.Errorf("layer %d: fast workers own %d of %d experts after %d moves", l, fast, initialExperts, len(moves))
		}
	}
	if !(after.total() < before.total()) {
		t.Errorf("Cost %v before %d moves, %v after", before.total(), len(moves), after.total())
	}
	t.Logf("%d moves: Cost %.4g -> %.4g s, busy time %.4g -> %.4g s", len(moves), before.total(), after.total(), before.busy(), after.busy())
}

// TestSlowestOtherMatchesAScan checks the three slowest workers kept per
// layer, which delta prices a move with, against a scan of the others,
// with ties (times drawn from few values) and fewer than three workers.
func TestSlowestOtherMatchesAScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, workers := range []int{1, 2, 3, 4, 16} {
		m := &costModel{workers: workers, layerNums: seq(50), t: make([]float64, 50*workers),
			layerMax: make([]float64, 50), top: make([]ranked, 3*50)}
		for i := range m.t {
			m.t[i] = float64(rng.IntN(4)) * 0.25
		}
		m.refreshMax()
		for r := range 50 {
			row := m.t[r*workers : (r+1)*workers]
			if want := slices.Max(row); m.layerMax[r] != want {
				t.Fatalf("%d workers, row %v: maximum %v, want %v", workers, row, m.layerMax[r], want)
			}
			for w1 := range workers {
				for w2 := range workers {
					want := 0.0
					for w, v := range row {
						if w != w1 && w != w2 {
							want = max(want, v)
						}
					}
					if got := m.slowestOther(r, w1, w2); got != want {
						t.Fatalf("%d workers, row %v: slowest but %d and %d: %v, want %v", workers, row, w1, w2, got, want)
					}
				}
			}
		}
	}
}

// BenchmarkRebalanceInitial is the main node's first placement of a
// 48-layer, 128-expert model over 16 workers, half of them twice as fast
// at loading, under uniform heat: every layer tied at first.
func BenchmarkRebalanceInitial(b *testing.B) {
	p, h, caps, opt := initialSwarm(b, 16, 8, seq(48), 40*initialExpertBytes, 8*initialExpertBytes)
	var moves []Move
	for b.Loop() {
		moves = Rebalance(p, h, caps, bytesEach(initialExpertBytes), opt)
	}
	b.ReportMetric(float64(len(moves)), "moves")
}
