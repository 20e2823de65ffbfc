package mainnode_test

import (
	"context"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/inproc"
	"github.com/odmoe/odmoe/kernels"
	mainnode "github.com/odmoe/odmoe/main"
	"github.com/odmoe/odmoe/model"
)

// batchedGenerations runs prompts on g at once, n tokens each (EOS
// ignored). Every request holds its first token until all have one, so
// their decode passes overlap in the batch.
func batchedGenerations(t *testing.T, g interface {
	Generate(context.Context, []int, model.GenerateOptions) ([]int, model.GenerateStats, error)
}, prompts [][]int, n int) []generation {
	t.Helper()
	out := make([]generation, len(prompts))
	var all sync.WaitGroup
	all.Add(len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() {
			ids, _, err := g.Generate(context.Background(), p, model.GenerateOptions{MaxTokens: n,
				OnToken: func(step, id int, logits []float32) error {
					out[i].logits = append(out[i].logits, append([]float32(nil), logits...))
					if step == 0 {
						all.Done()
						all.Wait()
					}
					return nil
				}})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			out[i].tokens = ids
		})
	}
	wg.Wait()
	return out
}

// eachFamily runs test on each family's tiny preset, generated with seed
// for a swarm of 4 workers, with the whole model and the main node's part
// of it.
func eachFamily(t *testing.T, seed uint64, test func(t *testing.T, preset string, f inproc.Files, local, mainModel *model.Model)) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny"} {
		t.Run(preset, func(t *testing.T) {
			f, err := inproc.Generate(context.Background(), t.TempDir(), preset, seed, 4)
			if err != nil {
				t.Fatal(err)
			}
			local, mainModel := loadModels(t, f)
			test(t, preset, f, local, mainModel)
		})
	}
}

func decodeLoads(st *mainnode.Stats) (loads int64) {
	for _, l := range st.Decode {
		loads += l.Loads
	}
	return loads
}

// TestBatchedRequestsOnTheSwarmAreEachLocalModesAlone: four requests
// decoding together in one batch on the swarm (reactive loading, top-k
// above the group size) each get local mode's tokens and logits alone,
// bit for bit, for every family; and the batch loads fewer experts than
// the same requests one after another, since a layer's expert loads once
// for every sequence that routed to it. With an int8 shadow running the
// same batches, the tokens are the same and its predictions of the
// batches' routing score a recall well above chance.
func TestBatchedRequestsOnTheSwarmAreEachLocalModesAlone(t *testing.T) {
	eachFamily(t, 13, func(t *testing.T, preset string, f inproc.Files, local, mainModel *model.Model) {
		const n = 8
		var prompts [][]int
		for i := range 4 {
			prompts = append(prompts, testPrompt(3+2*i, 11+i, 7+i, local.Config.VocabSize))
		}
		want := make([]generation, len(prompts))
		for i, p := range prompts {
			want[i] = generate(t, local, model.NewResidentExperts(local), p, n)
		}

		sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Reactive}, nil)
		b := sw.Batcher(mainModel)
		got := batchedGenerations(t, b, prompts, n)
		b.Close()
		for i := range prompts {
			if d := diffGenerations(got[i], want[i]); d != "" {
				t.Fatalf("request %d batched on the swarm differs from local mode alone: %s", i, d)
			}
		}
		together := decodeLoads(sw.Stats())

		sw = dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Reactive}, nil)
		b = sw.Batcher(mainModel)
		for i, p := range prompts {
			g := batchedGenerations(t, b, [][]int{p}, n)
			if d := diffGenerations(g[0], want[i]); d != "" {
				t.Fatalf("request %d alone in the batch differs from local mode: %s", i, d)
			}
		}
		b.Close()
		alone := decodeLoads(sw.Stats())
		t.Logf("%s: decode expert loads %d batched, %d one request after another", preset, together, alone)
		if together >= alone {
			t.Fatalf("batched decode loaded %d experts, one after another %d: batching shared no load", together, alone)
		}

		sw = dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.Q8})
		b = sw.Batcher(mainModel)
		got = batchedGenerations(t, b, prompts, n)
		for i := range prompts {
			if d := diffGenerations(got[i], want[i]); d != "" {
				t.Fatalf("request %d batched with a shadow differs from local mode alone: %s", i, d)
			}
		}
		st, ok := sw.ShadowStats(10e9)
		b.Close()
		chance := float64(local.Config.TopK) / float64(local.Config.NumExperts)
		t.Logf("%s: the shadow's recall over batched passes %.4f", preset, st.BatchRecall)
		if !ok || st.BatchRecall < 2*chance {
			t.Fatalf("the shadow's recall over batched passes %.4f (ok %v), not above twice chance %.2f", st.BatchRecall, ok, 2*chance)
		}
	})
}

// TestLocalBatcherIsLocalModeAlone: the local batcher (what -role local
// -http serves) gives every request what model.Generate gives it alone.
func TestLocalBatcherIsLocalModeAlone(t *testing.T) {
	f := newSwarmFixture(t, 1)
	local, _ := loadModels(t, f)
	var prompts [][]int
	for i := range 3 {
		prompts = append(prompts, testPrompt(4+i, 5+i, 3+i, local.Config.VocabSize))
	}
	b := mainnode.NewLocalBatcher(local)
	defer b.Close()
	got := batchedGenerations(t, b, prompts, 10)
	for i, p := range prompts {
		if d := diffGenerations(got[i], generate(t, local, model.NewResidentExperts(local), p, 10)); d != "" {
			t.Fatalf("request %d: %s", i, d)
		}
	}
}
