package model

import (
	"context"
	"fmt"
	"time"

	"github.com/odmoe/odmoe/internal/quantile"
)

// GenerateStats summarises one generation.
type GenerateStats struct {
	PromptTokens int
	// CachedTokens are the prompt's leading tokens whose KV rows were
	// reused from an earlier sequence (a prefix cache), not computed.
	CachedTokens    int
	GeneratedTokens int
	Prefill         time.Duration // prompt forward pass, up to the first logits
	Decode          time.Duration // every later forward pass
	StoppedAtEOS    bool
	// FinishReason is why generation stopped, in OpenAI's words: "stop"
	// (an EOS token) or "length" (MaxTokens generated, or the model's
	// context full: ContextFull).
	FinishReason string
	ContextFull  bool
	// Experts is, for a sequence decoded on a swarm, its rows' share of
	// the decode figures (zero in one process).
	Experts ExpertFigures
	// Drafted and Accepted count, where a pass loop checked guessed
	// tokens (drafting), the guesses its passes fed after the sequence's
	// last token and those its own samples agreed with: each accepted
	// guess is a token that took no pass of its own.
	Drafted, Accepted int
	// PassTimes are the decode passes' times, each from the end of the
	// pass before (the prompt's, for the first) to its own end: a token's
	// time where no guess was kept.
	PassTimes []time.Duration
}

// ExpertFigures are one sequence's share of a swarm's decode figures,
// counted over its own rows of every decode pass: the experts they were
// routed to and how many of those the shadow had predicted for the pass
// (OD-MoE eq. 3 over this sequence's tokens), and the routed experts that
// were loaded on demand while its row waited (misses): late (predicted,
// the hint too late) or wrong (not predicted); Misses counts them all,
// passes without a prediction included. Steps are its decode steps;
// AlignToken and AlignKV the periods (in decode steps) at which it was
// re-aligned with the shadow for the most of them (0: never).
type ExpertFigures struct {
	Steps                           int64
	Routed, Predicted               int64
	Misses, MissesLate, MissesWrong int64
	AlignToken, AlignKV             int
}

// PassSpread is how steady a run's decode passes ran: their number, the
// 10th, 50th and 90th percentiles of their times (ms, nearest rank) and
// P90 over P10.
type PassSpread struct {
	Passes int     `json:"passes"`
	P10    float64 `json:"p10"`
	P50    float64 `json:"p50"`
	P90    float64 `json:"p90"`
	Spread float64 `json:"p90_over_p10"`
}

// SpreadOf is the spread of passes' times (GenerateStats.PassTimes); nil
// for none.
func SpreadOf(passes []time.Duration) *PassSpread {
	if len(passes) == 0 {
		return nil
	}
	q := quantile.Of(passes, 0.10, 0.50, 0.90)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	s := &PassSpread{Passes: len(passes), P10: ms(q[0]), P50: ms(q[1]), P90: ms(q[2])}
	if q[0] > 0 {
		s.Spread = float64(q[2]) / float64(q[0])
	}
	return s
}

// Recall is Predicted over Routed, 0 when nothing was scored.
func (f ExpertFigures) Recall() float64 {
	if f.Routed == 0 {
		return 0
	}
	return float64(f.Predicted) / float64(f.Routed)
}

// PrefillTokensPerSec is prompt tokens per second of prefill.
func (s GenerateStats) PrefillTokensPerSec() float64 {
	return rate(s.PromptTokens, s.Prefill)
}

// DecodeTokensPerSec is forward passes per second after the prompt (each
// yields one generated token).
func (s GenerateStats) DecodeTokensPerSec() float64 {
	return rate(s.GeneratedTokens-1, s.Decode)
}

func rate(n int, d time.Duration) float64 {
	if n <= 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// GenerateOptions control Generate.
type GenerateOptions struct {
	MaxTokens int      // tokens to generate
	Sampler   *Sampler // nil: greedy
	StopAtEOS bool     // stop after generating an EOS id of the config
	// OnToken, if set, sees every generated token with the logits it was
	// sampled from: step 0 is the logits after the prompt, step i those
	// after the i-th generated token. logits is reused after it returns.
	OnToken func(step, id int, logits []float32) error
}

// Generate runs the prompt through s, then samples up to opt.MaxTokens
// tokens, feeding each back; it stops early at an EOS (StopAtEOS) or when
// the model's context (max_position_embeddings) is full. It returns the
// generated ids. It is the reference: one sequence alone, in one
// process, no pass loop; every node runs the main node's pass loop
// (passloop.Batcher), whose every sequence must get these tokens and
// logits bit for bit.
func Generate(ctx context.Context, s *Session, prompt []int, opt GenerateOptions) ([]int, GenerateStats, error) {
	st := GenerateStats{PromptTokens: len(prompt), FinishReason: "length"}
	if len(prompt) == 0 {
		return nil, st, fmt.Errorf("model: empty prompt")
	}
	if limit := s.m.Config.MaxPositions; s.Len()+len(prompt) > limit {
		return nil, st, fmt.Errorf("model: a prompt of %d tokens after %d does not fit the context of %d (max_position_embeddings, or -context)", len(prompt), s.Len(), limit)
	}
	sampler := opt.Sampler
	if sampler == nil {
		sampler = NewSampler(0, 0, 0)
	}
	var out []int
	t0 := time.Now()
	logits, err := s.Forward(ctx, prompt)
	st.Prefill = time.Since(t0)
	if err != nil {
		return nil, st, err
	}
	t1 := time.Now()
	last := t1
	for step := 0; step < opt.MaxTokens; step++ {
		if step > 0 {
			if s.Len() >= s.m.Config.MaxPositions {
				st.ContextFull = true
				break
			}
			if logits, err = s.Forward(ctx, out[len(out)-1:]); err != nil {
				return out, st, err
			}
			now := time.Now()
			st.PassTimes = append(st.PassTimes, now.Sub(last))
			last = now
		}
		id, err := sampler.Sample(logits)
		if err != nil {
			return out, st, err
		}
		out = append(out, id)
		st.GeneratedTokens = len(out)
		if opt.OnToken != nil {
			if err := opt.OnToken(step, id, logits); err != nil {
				return out, st, err
			}
		}
		if opt.StopAtEOS && s.m.Config.IsEOS(id) {
			st.StoppedAtEOS, st.FinishReason = true, "stop"
			break
		}
	}
	st.Decode = time.Since(t1)
	return out, st, nil
}
