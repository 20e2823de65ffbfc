package mainnode_test

import (
	"context"
	"github.com/odmoe/odmoe/passloop"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
)

// TestGptOssSlidingLayersDropRowsOnTheSwarmToo: gpt-oss-tiny over ten
// windows (its sliding layers' caches drop rows on the main node and on
// the shadow, whose KV alignment sends the dropped rows as zeros), on a
// swarm driven by an fp16 shadow aligned every step, gives local mode's
// tokens and logits bit for bit.
func TestGptOssSlidingLayersDropRowsOnTheSwarmToo(t *testing.T) {
	f, err := inproc.Generate(context.Background(), t.TempDir(), "gpt-oss-tiny", 21, 4)
	if err != nil {
		t.Fatal(err)
	}
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(50, 29, 3, local.Config.VocabSize)
	const steps = 30
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.F16})
	got := generate(t, mainModel, sw, prompt, steps)
	if d := diffGenerations(got, want); d != "" {
		t.Fatalf("on the swarm: %s", d)
	}
	if st, ok := sw.ShadowStats(10e9); !ok || st.Recall < 0.9 {
		t.Fatalf("the shadow's recall %.4f (ok %v): its windowed cache lost what it reads", st.Recall, ok)
	}
}

// batched runs prompts at once through b, each with its sampler.
func batched(t *testing.T, b *passloop.Batcher, prompts [][]int, steps int, samplers []*model.Sampler) [2]generation {
	t.Helper()
	var got [2]generation
	var errs [2]error
	var wg sync.WaitGroup
	joined := b.StartTogether(len(prompts)) // both in the first pass, whatever the machine's load
	for i, p := range prompts {
		wg.Go(func() {
			got[i].tokens, _, errs[i] = b.Generate(context.Background(), p, model.GenerateOptions{MaxTokens: steps, Sampler: samplers[i],
				OnToken: func(step, id int, logits []float32) error {
					got[i].logits = append(got[i].logits, append([]float32(nil), logits...))
					return nil
				}})
		})
		<-joined
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	return got
}
