//go:build !race

// These two matrices of every family took 146 s under the race detector
// (a local race run of this package beside the root package's, 2 vCPU),
// 10 s without it alone; it watches nothing the rest of the package's
// swarm tests do not: the same swarm, batcher and shadow code on the
// tiny preset, under -race there (TestSwarmIsBitIdenticalToLocal,
// TestBatchedRequestsOnTheSwarmAreEachLocalModesAlone,
// TestDraftingIsBitIdenticalToLocal). make test runs them without it.

package mainnode_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/passloop"
)

// TestEveryFamilyOnTheSwarmIsBitIdenticalToLocal: each model family's
// tiny preset, on a swarm of workers (reactive, oracle-next) and driven by
// an fp16, int8 or nf4 shadow, gives local mode's tokens and logits bit
// for bit, with top-k above the group size (a worker runs several experts
// of a layer). The shadow's recall (eq. 3) is logged for each family and
// quantization and must be well above chance (top-k / experts).
func TestEveryFamilyOnTheSwarmIsBitIdenticalToLocal(t *testing.T) {
	for _, preset := range []string{"qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny", "gpt-oss-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny-fp8"} {
		t.Run(preset, func(t *testing.T) {
			f, err := inproc.Generate(context.Background(), t.TempDir(), preset, 21, 4)
			if err != nil {
				t.Fatal(err)
			}
			local, mainModel := loadModels(t, f)
			prompt := testPrompt(20, 29, 3, local.Config.VocabSize)
			const steps = 8
			want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
			for _, c := range []struct {
				policy mainnode.Prefetch
				shadow *shadowSpec
			}{
				{mainnode.Reactive, nil},
				{mainnode.OracleNext, nil},
				{mainnode.Shadow, &shadowSpec{quant: kernels.F16}},
				{mainnode.Shadow, &shadowSpec{quant: kernels.Q8}},
				{mainnode.Shadow, &shadowSpec{quant: kernels.NF4}},
			} {
				name := fmt.Sprint(c.policy)
				if c.shadow != nil {
					name += "/" + c.shadow.quant.String()
				}
				t.Run(name, func(t *testing.T) {
					sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: c.policy, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, c.shadow)
					got := generate(t, mainModel, sw, prompt, steps)
					if d := diffGenerations(got, want); d != "" {
						t.Fatalf("%s on the swarm (%s) differs from local: %s", preset, c.policy, d)
					}
					if c.shadow != nil {
						st, ok := sw.ShadowStats(10e9)
						chance := float64(local.Config.TopK) / float64(local.Config.NumExperts)
						if !ok || st.Recall < 2*chance {
							t.Fatalf("%s %s shadow: recall %.4f (ok %v), not above twice chance (%.2f)", preset, c.shadow.quant, st.Recall, ok, 2*chance)
						}
						t.Logf("%s %s shadow: recall %.4f", preset, c.shadow.quant, st.Recall)
					}
				})
			}
		})
	}
}

// TestEverySeededSampledRequestIsTheSameEverywhere: in every family, two
// requests sampled with their own seeds (temperature, top_p, penalties,
// a bias) give the same tokens and logits in local mode alone, in local
// mode batched together, and on a swarm loading reactively, by
// oracle-next and driven by an int8 shadow, alone and batched: the draw
// for a position depends on the seed, the position and the logits, which
// are bit-identical everywhere. With the shadow drafting (-draft 4) too,
// and then greedy requests as well, alone and batched.
func TestEverySeededSampledRequestIsTheSameEverywhere(t *testing.T) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny", "gpt-oss-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny-fp8"} {
		t.Run(preset, func(t *testing.T) {
			f, err := inproc.Generate(context.Background(), t.TempDir(), preset, 23, 4)
			if err != nil {
				t.Fatal(err)
			}
			local, mainModel := loadModels(t, f)
			prompts := [][]int{testPrompt(9, 31, 3, local.Config.VocabSize), testPrompt(14, 17, 5, local.Config.VocabSize)}
			samplers := func() []*model.Sampler {
				return []*model.Sampler{model.NewSampler(0.9, 0.95, 501).WithPenalties(0.2, 0.1), model.NewSampler(1.2, 1, 502).WithBias(map[int]float64{1: 3})}
			}
			const steps = 10
			var want [2]generation
			for i, s := range samplers() {
				want[i] = generateWith(t, local, model.NewResidentExperts(local), prompts[i], steps, s)
			}
			check := func(what string, got [2]generation) {
				t.Helper()
				for i := range got {
					if d := diffGenerations(got[i], want[i]); d != "" {
						t.Fatalf("%s: request %d differs from local mode alone: %s", what, i, d)
					}
				}
			}
			var widest atomic.Int64 // the most rows a local pass carried: batched, they shared passes
			lb := passloop.New(local, model.NewResidentExperts(local), passloop.Hooks{BeforePass: func(_ context.Context, _ model.Step, rows []passloop.Row) error {
				if n := int64(len(rows)); n > widest.Load() {
					widest.Store(n)
				}
				return nil
			}})
			check("local mode batched", batched(t, lb, prompts, steps, samplers()))
			lb.Close()
			if widest.Load() < 2 {
				t.Fatalf("the two requests never shared a pass in local mode (at most %d rows a pass)", widest.Load())
			}
			for _, c := range []struct {
				policy mainnode.Prefetch
				shadow *shadowSpec
				draft  mainnode.Drafting
			}{{mainnode.Reactive, nil, mainnode.Drafting{}}, {mainnode.OracleNext, nil, mainnode.Drafting{}}, {mainnode.Shadow, &shadowSpec{quant: kernels.Q8}, mainnode.Drafting{}},
				{mainnode.Shadow, &shadowSpec{quant: kernels.Q8}, mainnode.Drafting{K: 4}}} {
				name := fmt.Sprintf("%s, -draft %v", c.policy, c.draft)
				sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: c.policy, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}, Draft: c.draft}, c.shadow)
				var alone [2]generation
				drafted := 0
				for i, s := range samplers() {
					var st model.GenerateStats
					alone[i], st = generateDrafted(t, sw, mainModel, prompts[i], steps, s)
					drafted += st.Drafted
				}
				check(name+" alone", alone)
				b := sw.Batcher(mainModel)
				check(name+" batched", batched(t, b, prompts, steps, samplers()))
				b.Close()
				if c.draft.K == 0 {
					continue
				}
				// drafting: greedy requests too, alone and batched
				for i, p := range prompts {
					want := generate(t, local, model.NewResidentExperts(local), p, steps)
					got, st := generateDrafted(t, sw, mainModel, p, steps, nil)
					if d := diffGenerations(got, want); d != "" {
						t.Fatalf("%s: greedy request %d alone differs from local mode: %s", name, i, d)
					}
					drafted += st.Drafted
				}
				// (on a loaded machine the shadow's guesses may come too late
				// for a sampled request's passes; over all four some came)
				if drafted == 0 {
					t.Fatalf("%s: no pass checked a guess", name)
				}
				var wantGreedy [2]generation
				for i, p := range prompts {
					wantGreedy[i] = generate(t, local, model.NewResidentExperts(local), p, steps)
				}
				b = sw.Batcher(mainModel)
				got := batched(t, b, prompts, steps, []*model.Sampler{nil, nil})
				b.Close()
				for i := range got {
					if d := diffGenerations(got[i], wantGreedy[i]); d != "" {
						t.Fatalf("%s: greedy request %d batched differs from local mode: %s", name, i, d)
					}
				}
			}
		})
	}
}
