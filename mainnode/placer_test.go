package mainnode

import (
	"testing"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// TestPlacerMovesCollidingHotExpertsApart: when a layer's two hot experts
// share an owner whose budget holds one of them, the placer moves one to
// another worker at its next look (never before), the move applies to the
// current placement, and it is counted.
func TestPlacerMovesCollidingHotExpertsApart(t *testing.T) {
	const eb = 1 << 20
	hellos := make([]wire.Hello, 4)
	for i := range hellos {
		hellos[i] = wire.Hello{DeviceMemBytes: 3 * eb, LoadBytesSec: 1e9} // room for one resident beside two passing through
	}
	pc, err := newPlacer([]int{0}, 8, eb, hellos, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	pc.every = 4
	cur, _ := sched.NewPlacement(4, []int{0}, 8) // e1 and e5 both on w1
	for pass := 1; pass <= 4; pass++ {
		next, moves := pc.pass(cur)
		if pass < 4 && next != nil {
			t.Fatalf("pass %d: moved %v before the look every 4 passes", pass, moves)
		}
		if pass == 4 {
			if next == nil || len(moves) == 0 {
				t.Fatal("the two hot experts on w1 stayed together")
			}
			if next.Owner(0, 1) == next.Owner(0, 5) {
				t.Fatalf("after %v experts 1 and 5 still share w%d", moves, next.Owner(0, 1))
			}
			if got := pc.snapshot(); got.Migrations != int64(len(moves)) || got.Rebalances != 1 || got.Version != next.Version() {
				t.Fatalf("figures %+v after %d moves", got, len(moves))
			}
		}
		pc.observe(0, []model.Route{{Expert: 1}, {Expert: 5}})
		pc.measured(1, &wire.ExpertResult{ComputeTime: time.Millisecond, Loaded: true, LoadTime: time.Millisecond}, 1)
	}
}

// TestPlacerMeasuresLoadsAndCompute: the capacities a rebalance weighs
// come from the results: a worker that computes twice as fast has twice
// the compute scale, a worker's load bandwidth is what its loads took, and
// a worker that has not loaded yet keeps what its Hello said.
func TestPlacerMeasuresLoadsAndCompute(t *testing.T) {
	const eb = 8 << 20
	hellos := []wire.Hello{{DeviceMemBytes: 64 << 20, LoadBytesSec: 4e9}, {DeviceMemBytes: 64 << 20}}
	pc, err := newPlacer([]int{0}, 8, eb, hellos, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	pc.measured(0, &wire.ExpertResult{ComputeTime: 2 * time.Millisecond}, 2)
	pc.measured(1, &wire.ExpertResult{ComputeTime: 2 * time.Millisecond, Loaded: true, LoadTime: 4 * time.Millisecond}, 1)
	opt, caps := pc.options()
	if want := 1.5e-3; opt.ComputeSeconds != want {
		t.Errorf("compute %v s a row, want the mean %v", opt.ComputeSeconds, want)
	}
	if caps[0].ComputeScale <= caps[1].ComputeScale || caps[0].ComputeScale/caps[1].ComputeScale != 2 {
		t.Errorf("compute scales %v and %v, want 2:1", caps[0].ComputeScale, caps[1].ComputeScale)
	}
	if caps[0].LoadBytesSec != 4e9 || caps[1].LoadBytesSec != eb/4e-3 {
		t.Errorf("load bandwidths %v and %v, want the Hello's 4e9 and the measured %v", caps[0].LoadBytesSec, caps[1].LoadBytesSec, eb/4e-3)
	}
	if want := int64(64<<20 - 2*eb); caps[0].CacheBytes != want {
		t.Errorf("cache %d bytes, want %d: the budget less two passing experts", caps[0].CacheBytes, want)
	}
}

// TestLeadPercentilesAreNearestRank checks the percentiles against the
// nearest-rank definition on 1..100 ms, and that the samples are bounded.
func TestLeadPercentilesAreNearestRank(t *testing.T) {
	var st Stats
	if a, b, c := st.LeadPercentiles(); a != 0 || b != 0 || c != 0 {
		t.Fatal("percentiles of nothing")
	}
	var leads []time.Duration
	for i := 100; i >= 1; i-- {
		leads = append(leads, time.Duration(i)*time.Millisecond)
	}
	st.addLeads(leads)
	p5, p50, p95 := st.LeadPercentiles()
	if p5 != 5*time.Millisecond || p50 != 50*time.Millisecond || p95 != 95*time.Millisecond {
		t.Fatalf("p5 %v p50 %v p95 %v, want 5, 50, 95 ms", p5, p50, p95)
	}
	for range maxLeadSamples / 100 {
		st.addLeads(leads)
	}
	if len(st.Leads) != maxLeadSamples {
		t.Fatalf("%d samples kept, bound %d", len(st.Leads), maxLeadSamples)
	}
}
