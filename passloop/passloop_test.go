package passloop_test

import (
	"context"
	"errors"
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

// TestCheckedGuessesGiveWhatOneTokenAPassGives: on every family, four
// requests share a pass loop that feeds up to three guesses after each
// one's last token (a drafter that knows each request's tokens alone and
// gets one wrong where the position says, or stops early, or guesses a
// token outside the vocabulary); greedy, seeded-sampled, with penalties
// and logprobs, one stopped by its OnToken. Each gets the tokens and
// every logit model.Generate gives it alone, bit for bit, and the guesses
// were both kept and taken back.
func TestCheckedGuessesGiveWhatOneTokenAPassGives(t *testing.T) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny", "gpt-oss-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny-fp8"} {
		t.Run(preset, func(t *testing.T) { checkGuesses(t, preset) })
	}
}

var errStopped = errors.New("stopped by the client")

func checkGuesses(t *testing.T, preset string) {
	dir := filepath.Join(t.TempDir(), preset)
	if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: 21}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// distinct prompt lengths: the drafter knows a request by its own
	prompts := [][]int{{1, 5, 9, 2}, {3, 3, 7, 8, 1, 4, 6, 2, 9}, {12}, {4, 4, 2, 19, 7, 1}}
	const n = 30 // past gpt-oss-tiny's window of 8, whose rows a take-back must still hold
	samplers := func() []*model.Sampler {
		return []*model.Sampler{model.NewSampler(0, 0, 0), model.NewSampler(0.8, 0.95, 7),
			model.NewSampler(1, 1, 8).WithPenalties(0.5, 0.3).WithRepeatPenalty(1.2, 16, prompts[2]),
			model.NewSampler(0.7, 1, 9).WithLogprobs(3).WithMinP(0.05)}
	}
	type gen struct {
		tokens []int
		logits [][]float32
		st     model.GenerateStats
	}
	record := func(g *gen, stopAt int) func(step, id int, logits []float32) error {
		return func(step, _ int, logits []float32) error {
			g.logits = append(g.logits, slices.Clone(logits))
			if step == stopAt {
				return errStopped
			}
			return nil
		}
	}
	stopAt := []int{-1, -1, -1, 17}
	alone := make([]gen, len(prompts))
	for i, p := range prompts {
		s := model.NewSession(m, model.NewResidentExperts(m), len(p)+n)
		toks, _, err := model.Generate(context.Background(), s, p, model.GenerateOptions{MaxTokens: n, Sampler: samplers()[i], OnToken: record(&alone[i], stopAt[i])})
		if err != nil && !errors.Is(err, errStopped) {
			t.Fatal(err)
		}
		alone[i].tokens = toks
	}
	byLen := map[int]int{} // prompt length -> request
	for i, p := range prompts {
		byLen[len(p)] = i
	}
	request := map[uint64]int{} // the loop's sequence -> request, as BeforePass saw it
	hooks := passloop.Hooks{
		BeforePass: func(_ context.Context, _ model.Step, rows []passloop.Row) error {
			for _, r := range rows {
				request[r.Step.Seq] = byLen[r.PromptLen]
				if r.Drafted > 0 && r.Prompt {
					return errors.New("a prompt chunk fed guesses")
				}
			}
			return nil
		},
		Draft: func(seq uint64, pos, last, max int) []int {
			i := request[seq]
			ref := slices.Concat(prompts[i], alone[i].tokens)
			if ref[pos] != last {
				t.Errorf("request %d: asked for guesses after token %d at %d, which is %d", i, last, pos, ref[pos])
			}
			g := slices.Clone(ref[pos+1 : min(pos+1+max, len(ref))])
			switch w := pos % 5; {
			case w < len(g) && w < 3: // one wrong
				g[w] = (g[w] + 1) % m.Config.VocabSize
			case w == 3 && len(g) > 1: // one past the vocabulary: it and what follows are dropped
				g[1] = m.Config.VocabSize
			}
			return g
		},
	}
	b := passloop.New(m, model.NewResidentExperts(m), hooks)
	defer b.Close()
	b.DraftUpTo(3)
	b.StartTogether(len(prompts))
	together := make([]gen, len(prompts))
	var wg sync.WaitGroup
	s := samplers()
	for i, p := range prompts {
		wg.Go(func() {
			toks, st, err := b.Generate(context.Background(), p, model.GenerateOptions{MaxTokens: n, Sampler: s[i], OnToken: record(&together[i], stopAt[i])})
			if err != nil && !errors.Is(err, errStopped) {
				t.Error(err)
			}
			together[i].tokens, together[i].st = toks, st
		})
	}
	wg.Wait()
	var drafted, accepted int
	for i := range prompts {
		if !slices.Equal(alone[i].tokens, together[i].tokens) || len(alone[i].logits) != len(together[i].logits) {
			t.Fatalf("request %d: alone %v, with guesses checked %v", i, alone[i].tokens, together[i].tokens)
		}
		for step := range alone[i].logits {
			if !slices.Equal(alone[i].logits[step], together[i].logits[step]) {
				t.Fatalf("request %d step %d: the logits differ", i, step)
			}
		}
		drafted, accepted = drafted+together[i].st.Drafted, accepted+together[i].st.Accepted
	}
	if accepted == 0 || accepted == drafted {
		t.Fatalf("%d of %d guesses kept: the test checks no kept guess, or no taken-back one", accepted, drafted)
	}
	t.Logf("%d of %d guesses kept", accepted, drafted)
}
