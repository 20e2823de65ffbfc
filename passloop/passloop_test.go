package passloop_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/passloop"
)

// TestRequestsSharingPassesGetWhatEachGetsAlone: three requests that
// join one pass loop together (one greedy, two drawing with their own
// seeds, prompts of other lengths) each get the tokens model.Generate
// gives that request alone, in one process, and every logit they were
// drawn from, bit for bit.
func TestRequestsSharingPassesGetWhatEachGetsAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := synth.Generate(dir, synth.Options{Preset: "tiny", Seed: 11}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompts := [][]int{{1, 5, 9, 2}, {3, 3, 7, 8, 1, 4, 6, 2, 9}, {12}}
	samplers := func() []*model.Sampler {
		return []*model.Sampler{model.NewSampler(0, 0, 0), model.NewSampler(0.8, 0.95, 7), model.NewSampler(1, 1, 8)}
	}
	type gen struct {
		tokens []int
		logits [][]float32
	}
	record := func(g *gen) func(step, id int, logits []float32) error {
		return func(_, _ int, logits []float32) error {
			g.logits = append(g.logits, slices.Clone(logits))
			return nil
		}
	}
	const n = 12
	alone := make([]gen, len(prompts))
	for i, p := range prompts {
		s := model.NewSession(m, model.NewResidentExperts(m), len(p)+n)
		toks, _, err := model.Generate(context.Background(), s, p, model.GenerateOptions{MaxTokens: n, Sampler: samplers()[i], OnToken: record(&alone[i])})
		if err != nil {
			t.Fatal(err)
		}
		alone[i].tokens = toks
	}
	b := passloop.New(m, model.NewResidentExperts(m), passloop.Hooks{})
	defer b.Close()
	b.StartTogether(len(prompts))
	together := make([]gen, len(prompts))
	var wg sync.WaitGroup
	s := samplers()
	for i, p := range prompts {
		wg.Go(func() {
			toks, _, err := b.Generate(context.Background(), p, model.GenerateOptions{MaxTokens: n, Sampler: s[i], OnToken: record(&together[i])})
			if err != nil {
				t.Error(err)
			}
			together[i].tokens = toks
		})
	}
	wg.Wait()
	for i := range prompts {
		if !slices.Equal(alone[i].tokens, together[i].tokens) || len(alone[i].logits) != len(together[i].logits) {
			t.Fatalf("request %d: alone %v, together %v", i, alone[i].tokens, together[i].tokens)
		}
		for step := range alone[i].logits {
			if !slices.Equal(alone[i].logits[step], together[i].logits[step]) {
				t.Fatalf("request %d step %d: the logits differ", i, step)
			}
		}
	}
}
