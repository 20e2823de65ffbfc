package mainnode_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/store"
)

// TestResidencyIsBitIdenticalToLocalAndLoadsLess: with -residency on every
// loading policy still gives local mode's tokens and logits bit for bit,
// with room for every expert and with room for a few (the workers then
// evict the coldest); the experts left resident serve later requests, so
// the swarm loads fewer experts than the same run cacheless, and no
// worker ever exceeds its budget.
func TestResidencyIsBitIdenticalToLocalAndLoadsLess(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(20, 41, 3, local.Config.VocabSize)
	const steps = 12
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	st, err := store.Open(f.Store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eb, _ := st.ExpertBytes(st.Layers()[0], 0)
	st.Close()
	budgets := map[string]int64{"roomy": 64 << 20, "tight": 5*int64(eb) + 64<<10}
	var migrations atomic.Int64 // over every run: some runs must have moved experts while decoding
	t.Cleanup(func() {
		if !t.Failed() && migrations.Load() == 0 {
			t.Error("no run migrated an expert: placement changes were never exercised")
		}
	})

	for _, policy := range []mainnode.Prefetch{mainnode.Reactive, mainnode.OracleNext, mainnode.Random, mainnode.Shadow} {
		for _, name := range []string{"roomy", "tight"} {
			t.Run(fmt.Sprintf("%s/%s", policy, name), func(t *testing.T) {
				loads := map[bool]int64{}
				for _, residency := range []bool{false, true} {
					opt := mainnode.Options{Prefetch: policy, Residency: residency, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}
					var sh *shadowSpec
					if policy == mainnode.Shadow {
						sh = &shadowSpec{quant: kernels.F16}
					}
					sw := dialSwarmWithBudget(t, f, 4, budgets[name], opt, sh)
					if residency {
						sw.RebalanceEvery(2) // placements change while it decodes
					}
					got := generate(t, mainModel, sw, prompt, steps)
					if d := diffGenerations(got, want); d != "" {
						t.Fatalf("residency %v: swarm differs from local: %s", residency, d)
					}
					var hits int64
					for i, m := range sw.WorkerStats(context.Background(), 5e9) {
						if m == nil || m.DevicePeak > m.DeviceBudget {
							t.Fatalf("worker %d: %+v", i, m)
						}
						loads[residency] += m.Loads
						hits += m.ResidentHits
					}
					if residency != (hits > 0) {
						t.Errorf("residency %v: %d requests served by resident experts", residency, hits)
					}
					st := sw.Stats()
					if residency && (st.Residency == nil || st.Residency.Rebalances == 0) {
						t.Fatalf("residency figures %+v: the placement was never looked at", st.Residency)
					}
					if residency {
						migrations.Add(st.Residency.Migrations)
					}
					dec := mainnode.Total(st.Decode)
					t.Logf("residency %v: %d worker loads, %d resident hits; decode %d results, %d loaded, %d misses; %+v", residency, loads[residency], hits, dec.Results, dec.Loads, dec.Misses, st.Residency)
				}
				if loads[true] >= loads[false] {
					t.Errorf("%d loads with residency, %d without: residency saved nothing", loads[true], loads[false])
				}
			})
		}
	}
}
