package passloop_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/passloop"
)

// requests are prompts generated n tokens each, with samplers made anew
// for each run (a sampler keeps its state), the i-th stopped by its
// client at step stopAt[i] (nil or -1: never).
type requests struct {
	prompts  [][]int
	samplers func() []*model.Sampler
	n        int
	stopAt   []int
}

// gen is what one request got: its tokens, every logit they were drawn
// from, its figures.
type gen struct {
	tokens []int
	logits [][]float32
	st     model.GenerateStats
}

var errStopped = errors.New("stopped by the client")

// options are request i's options, its OnToken recording into g.
func (rq requests) options(i int, s *model.Sampler, g *gen) model.GenerateOptions {
	stopAt := -1
	if rq.stopAt != nil {
		stopAt = rq.stopAt[i]
	}
	return model.GenerateOptions{MaxTokens: rq.n, Sampler: s, OnToken: func(step, _ int, logits []float32) error {
		g.logits = append(g.logits, slices.Clone(logits))
		if step == stopAt {
			return errStopped
		}
		return nil
	}}
}

// alone runs each request by model.Generate, one session each: the
// reference.
func (rq requests) alone(t *testing.T, m *model.Model) []gen {
	t.Helper()
	out := make([]gen, len(rq.prompts))
	s := rq.samplers()
	for i, p := range rq.prompts {
		sess := model.NewSession(m, model.NewResidentExperts(m), len(p)+rq.n)
		toks, st, err := model.Generate(context.Background(), sess, p, rq.options(i, s[i], &out[i]))
		if err != nil && !errors.Is(err, errStopped) {
			t.Fatal(err)
		}
		out[i].tokens, out[i].st = toks, st
	}
	return out
}

// together runs the requests at once on b, their first pass shared.
func (rq requests) together(t *testing.T, b *passloop.Batcher) []gen {
	t.Helper()
	b.StartTogether(len(rq.prompts))
	out := make([]gen, len(rq.prompts))
	s := rq.samplers()
	var wg sync.WaitGroup
	for i, p := range rq.prompts {
		wg.Go(func() {
			toks, st, err := b.Generate(context.Background(), p, rq.options(i, s[i], &out[i]))
			if err != nil && !errors.Is(err, errStopped) {
				t.Error(err)
			}
			out[i].tokens, out[i].st = toks, st
		})
	}
	wg.Wait()
	return out
}

// sameAsAlone fails t unless every request got the tokens, and every
// logit, it got alone.
func sameAsAlone(t *testing.T, alone, got []gen) {
	t.Helper()
	for i := range alone {
		if !slices.Equal(alone[i].tokens, got[i].tokens) || len(alone[i].logits) != len(got[i].logits) {
			t.Fatalf("request %d: alone %v, in the pass loop %v", i, alone[i].tokens, got[i].tokens)
		}
		for step := range alone[i].logits {
			if !slices.Equal(alone[i].logits[step], got[i].logits[step]) {
				t.Fatalf("request %d step %d: the logits differ", i, step)
			}
		}
	}
}

// load generates preset with seed and loads it.
func load(t *testing.T, preset string, seed uint64) *model.Model {
	t.Helper()
	dir := filepath.Join(t.TempDir(), preset)
	if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestRequestsSharingPassesGetWhatEachGetsAlone: three requests that
// join one pass loop together (one greedy, two drawing with their own
// seeds, prompts of other lengths) each get the tokens model.Generate
// gives that request alone, in one process, and every logit they were
// drawn from, bit for bit.
func TestRequestsSharingPassesGetWhatEachGetsAlone(t *testing.T) {
	m := load(t, "tiny", 11)
	rq := requests{prompts: [][]int{{1, 5, 9, 2}, {3, 3, 7, 8, 1, 4, 6, 2, 9}, {12}}, n: 12,
		samplers: func() []*model.Sampler {
			return []*model.Sampler{model.NewSampler(0, 0, 0), model.NewSampler(0.8, 0.95, 7), model.NewSampler(1, 1, 8)}
		}}
	alone := rq.alone(t, m)
	b := passloop.New(m, model.NewResidentExperts(m), passloop.Hooks{})
	defer b.Close()
	together := rq.together(t, b)
	sameAsAlone(t, alone, together)
	for i := range alone {
		for way, g := range map[string]gen{"alone": alone[i], "in the pass loop": together[i]} {
			checkPassTimes(t, fmt.Sprintf("request %d %s", i, way), g.st)
		}
	}
}

// checkPassTimes fails t unless st has a positive time for each decode
// pass (a token each but the first) and they add up to no more than the
// decode's time.
func checkPassTimes(t *testing.T, what string, st model.GenerateStats) {
	t.Helper()
	var sum time.Duration
	for _, d := range st.PassTimes {
		if d <= 0 {
			t.Errorf("%s: a decode pass took %v", what, d)
		}
		sum += d
	}
	if len(st.PassTimes) != st.GeneratedTokens-1 || sum > st.Decode {
		t.Errorf("%s: %d pass times adding up to %v for %d tokens decoded in %v: want one a token but the first, within the decode's time", what, len(st.PassTimes), sum, st.GeneratedTokens, st.Decode)
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

func checkGuesses(t *testing.T, preset string) {
	m := load(t, preset, 21)
	// distinct prompt lengths: the drafter knows a request by its own
	prompts := [][]int{{1, 5, 9, 2}, {3, 3, 7, 8, 1, 4, 6, 2, 9}, {12}, {4, 4, 2, 19, 7, 1}}
	rq := requests{prompts: prompts,
		n: 30, // past gpt-oss-tiny's window of 8, whose rows a take-back must still hold
		samplers: func() []*model.Sampler {
			return []*model.Sampler{model.NewSampler(0, 0, 0), model.NewSampler(0.8, 0.95, 7),
				model.NewSampler(1, 1, 8).WithPenalties(0.5, 0.3).WithRepeatPenalty(1.2, 16, prompts[2]),
				model.NewSampler(0.7, 1, 9).WithLogprobs(3).WithMinP(0.05)}
		},
		stopAt: []int{-1, -1, -1, 17}}
	alone := rq.alone(t, m)
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
	together := rq.together(t, b)
	sameAsAlone(t, alone, together)
	var drafted, accepted int
	for _, g := range together {
		drafted, accepted = drafted+g.st.Drafted, accepted+g.st.Accepted
	}
	if accepted == 0 || accepted == drafted {
		t.Fatalf("%d of %d guesses kept: the test checks no kept guess, or no taken-back one", accepted, drafted)
	}
	t.Logf("%d of %d guesses kept", accepted, drafted)
}
