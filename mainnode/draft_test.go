package mainnode_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/passloop"
	"github.com/odmoe/odmoe/wire"
)

// TestDraftingIsBitIdenticalToLocal: with the shadow drafting (each pass
// checking up to K of its guesses, or as many as the policy chooses),
// greedy and seeded-sampled requests, alone and two at once, get local
// mode's tokens and logits bit for bit, and the guesses save passes: some
// are kept.
func TestDraftingIsBitIdenticalToLocal(t *testing.T) {
	if passloop.MaxDraft != wire.MaxGuesses {
		t.Fatalf("passloop.MaxDraft %d, wire.MaxGuesses %d: guesses the wire refuses", passloop.MaxDraft, wire.MaxGuesses)
	}
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompts := [][]int{testPrompt(12, 53, 7, local.Config.VocabSize), testPrompt(9, 31, 3, local.Config.VocabSize)}
	const steps = 24
	samplers := map[string]func(i int) *model.Sampler{
		"greedy":  func(int) *model.Sampler { return nil },
		"sampled": func(i int) *model.Sampler { return model.NewSampler(0.7, 0.95, uint64(100+i)) },
	}
	for _, kind := range []string{"greedy", "sampled"} {
		var want []generation
		for i, p := range prompts {
			want = append(want, generateWith(t, local, model.NewResidentExperts(local), p, steps, samplers[kind](i)))
		}
		for _, c := range []struct {
			d      string
			quant  kernels.DType
			period int // the alignment's (token and KV)
			ahead  int // the shadow's passes ahead (0: its default)
		}{{"3", kernels.F16, 1, 0}, {"8", kernels.NF4, 1, 0}, {"auto", kernels.NF4, 1, 0}, {"auto", kernels.NF4, 4, 0}, {"4", kernels.F16, 1, 2}} {
			d := c.d
			drafting, err := mainnode.ParseDraft(d)
			if err != nil {
				t.Fatal(err)
			}
			t.Run(fmt.Sprintf("%s/draft-%s/%v/align%d/ahead%d", kind, d, c.quant, c.period, c.ahead), func(t *testing.T) {
				sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: c.period, KVPeriod: c.period}, Draft: drafting},
					&shadowSpec{quant: c.quant, passesAhead: c.ahead})
				var kept, drafted int
				// alone, then both at once
				for i, p := range prompts {
					got, st := generateDrafted(t, sw, mainModel, p, steps, samplers[kind](i))
					if diff := diffGenerations(got, want[i]); diff != "" {
						t.Fatalf("request %d alone, drafting %s, differs from local mode: %s", i, d, diff)
					}
					kept, drafted = kept+st.Accepted, drafted+st.Drafted
				}
				var wg sync.WaitGroup
				got := make([]generation, len(prompts))
				stats := make([]model.GenerateStats, len(prompts))
				b := sw.Batcher(mainModel)
				defer b.Close()
				for i, p := range prompts {
					wg.Go(func() { got[i], stats[i] = generateOn(t, b, p, steps, samplers[kind](i)) })
				}
				wg.Wait()
				for i := range prompts {
					if diff := diffGenerations(got[i], want[i]); diff != "" {
						t.Fatalf("request %d batched, drafting %s, differs from local mode: %s", i, d, diff)
					}
					kept, drafted = kept+stats[i].Accepted, drafted+stats[i].Drafted
				}
				st, _ := sw.ShadowStats(10e9)
				dec := mainnode.Total(sw.Stats().Decode)
				t.Logf("%d of %d guesses kept; the shadow: recall %.3f, %d met, %d rewound, %d withdrawn, off path %d; decode misses %d of %d loads, reactive passes %d",
					kept, drafted, st.Recall, st.Agreed, st.Rewound, st.Withdrawn, st.OffPath, dec.Misses, dec.Loads, sw.Stats().Faults.ReactivePasses)
				if kept == 0 {
					t.Fatalf("no guess kept of %d checked: drafting saved no pass", drafted)
				}
			})
		}
	}
}

// generateDrafted runs prompt alone on sw (a batch of one) and returns
// its generation and stats.
func generateDrafted(t *testing.T, sw *mainnode.Swarm, m *model.Model, prompt []int, n int, sampler *model.Sampler) (generation, model.GenerateStats) {
	t.Helper()
	b := sw.Batcher(m)
	defer b.Close()
	b.ChunkPrompts(0)
	return generateOn(t, b, prompt, n, sampler)
}

// generateOn runs prompt on b, choosing with sampler (nil: greedy).
func generateOn(t *testing.T, b *passloop.Batcher, prompt []int, n int, sampler *model.Sampler) (generation, model.GenerateStats) {
	var g generation
	ids, st, err := b.Generate(context.Background(), prompt, model.GenerateOptions{Sampler: sampler, MaxTokens: n,
		OnToken: func(step, id int, logits []float32) error {
			g.logits = append(g.logits, append([]float32(nil), logits...))
			return nil
		}})
	if err != nil {
		t.Error(err)
	}
	g.tokens = ids
	return g, st
}
