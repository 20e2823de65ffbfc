package serve

import (
	"encoding/json"
	"fmt"
	"github.com/odmoe/odmoe/model"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// samplingExtras reads the fields that shape sampling beyond
// temperature, top_p, top_k and seed, onto j's sampler: the penalties,
// logit_bias and logprobs (chat: a boolean and top_logprobs; completions:
// the number of alternatives, as the legacy API has it).
func (s *Server) samplingExtras(f *samplingFields, chat bool, j *job) error {
	var presence, frequency float64
	for _, p := range []struct {
		name string
		v    *float64
		to   *float64
	}{{"frequency_penalty", f.FrequencyPenalty, &frequency}, {"presence_penalty", f.PresencePenalty, &presence}} {
		if p.v == nil {
			continue
		}
		if *p.v < -2 || *p.v > 2 || math.IsNaN(*p.v) {
			return badRequest(p.name, "%s must be between -2 and 2, got %v", p.name, *p.v)
		}
		*p.to = *p.v
	}
	j.sampler.WithPenalties(presence, frequency)
	if len(f.LogitBias) > 0 {
		bias := make(map[int]float64, len(f.LogitBias))
		for k, v := range f.LogitBias {
			id, err := strconv.Atoi(k)
			if err != nil || id < 0 || id >= s.cfg.Tokenizer.VocabSize() {
				return badRequest("logit_bias", "logit_bias: %q is not a token id of the vocabulary of %d", k, s.cfg.Tokenizer.VocabSize())
			}
			if v < -100 || v > 100 || math.IsNaN(v) {
				return badRequest("logit_bias", "logit_bias: the bias of token %d must be between -100 and 100, got %v", id, v)
			}
			bias[id] = v
		}
		j.sampler.WithBias(bias)
	}
	raw := string(f.Logprobs)
	if chat {
		switch raw {
		case "", "null", "false":
		case "true":
			j.logprobs = true
		default:
			return badRequest("logprobs", "logprobs must be true or false, got %s", raw)
		}
		if f.TopLogprobs != nil {
			switch n := *f.TopLogprobs; {
			case n < 0 || n > 20:
				return badRequest("top_logprobs", "top_logprobs must be between 0 and 20, got %d", n)
			case n > 0 && !j.logprobs:
				return badRequest("top_logprobs", "top_logprobs requires logprobs: true")
			default:
				j.topLogprobs = n
			}
		}
	} else {
		if f.TopLogprobs != nil {
			return badRequest("top_logprobs", "top_logprobs is a chat field: completions take logprobs, the number of alternatives")
		}
		if raw != "" && raw != "null" {
			var n int
			if err := json.Unmarshal(f.Logprobs, &n); err != nil || n < 0 || n > 5 {
				return badRequest("logprobs", "logprobs must be an integer between 0 and 5, got %s", raw)
			}
			j.logprobs, j.topLogprobs = true, n
		}
	}
	if j.logprobs {
		j.sampler.WithLogprobs(j.topLogprobs)
	}
	return s.llamaSamplers(f, j)
}

// llamaSamplers reads llama-server's min_p, repeat_penalty and
// repeat_last_n (64 by default, as there; -1: the context, up to
// model.MaxRepeatN; 0: none).
func (s *Server) llamaSamplers(f *samplingFields, j *job) error {
	if f.MinP != nil {
		if p := *f.MinP; !(p >= 0 && p <= 1) {
			return badRequest("min_p", "min_p must be between 0 and 1, got %v", p)
		}
		j.sampler.WithMinP(*f.MinP)
	}
	n := 64
	if f.RepeatLastN != nil {
		switch n = *f.RepeatLastN; {
		case n == -1:
			n = min(s.cfg.Context, model.MaxRepeatN)
		case n < 0 || n > model.MaxRepeatN:
			return badRequest("repeat_last_n", "repeat_last_n must be -1 (the context), 0 (none) or up to %d, got %d", model.MaxRepeatN, n)
		}
	}
	if f.RepeatPenalty != nil {
		if p := *f.RepeatPenalty; !(p > 0 && p <= 10) {
			return badRequest("repeat_penalty", "repeat_penalty must be above 0 and at most 10 (1: none), got %v", p)
		}
		j.sampler.WithRepeatPenalty(*f.RepeatPenalty, n, j.prompt)
	}
	return nil
}

// chatLogprobsOf is choices in chat's shape.
func (s *Server) chatLogprobsOf(choices []model.Choice) *chatLogprobs {
	lp := &chatLogprobs{Content: make([]tokenLogprob, 0, len(choices))}
	for _, c := range choices {
		e := tokenLogprob{topLogprob: s.tokenLogprob(c.ID, c.Logprob), TopLogprobs: []topLogprob{}}
		for _, t := range c.Top {
			e.TopLogprobs = append(e.TopLogprobs, s.tokenLogprob(t.ID, t.Logprob))
		}
		lp.Content = append(lp.Content, e)
	}
	return lp
}

// completionLogprobsOf is choices in the legacy completions shape;
// offset is where the first token's text starts in the answer's text
// (in bytes), end where the next one's will.
func (s *Server) completionLogprobsOf(choices []model.Choice, offset int) (lp *completionLogprobs, end int) {
	lp = &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	for _, c := range choices {
		e := s.tokenLogprob(c.ID, c.Logprob)
		lp.Tokens = append(lp.Tokens, e.Token)
		lp.TokenLogprobs = append(lp.TokenLogprobs, e.Logprob)
		lp.TextOffset = append(lp.TextOffset, offset)
		offset += len(e.Bytes)
		top := map[string]float64{}
		for _, t := range c.Top {
			if tok := s.tokenLogprob(t.ID, t.Logprob); !hasKey(top, tok.Token) {
				top[tok.Token] = tok.Logprob
			}
		}
		lp.TopLogprobs = append(lp.TopLogprobs, top)
	}
	return lp, offset
}

func hasKey(m map[string]float64, k string) bool {
	_, ok := m[k]
	return ok
}

// tokenLogprob is one token's entry: its text (a special token's
// vocabulary string; bytes that are not whole UTF-8 characters written
// "bytes:\\xe2\\x80", as OpenAI writes them), its bytes (none for a
// special token), and a log-probability JSON can carry.
func (s *Server) tokenLogprob(id int, logprob float64) topLogprob {
	e := topLogprob{Logprob: logprob}
	if !(logprob > -9999) { // -Inf, and NaN from a NaN logit
		e.Logprob = -9999
	}
	b := s.cfg.Tokenizer.TokenBytes(id)
	if b == nil {
		e.Token = s.cfg.Tokenizer.TokenString(id)
		return e
	}
	e.Token = string(b)
	if !utf8.Valid(b) {
		var w strings.Builder
		w.WriteString("bytes:")
		for _, c := range b {
			fmt.Fprintf(&w, "\\x%02x", c)
		}
		e.Token = w.String()
	}
	e.Bytes = make([]int, len(b))
	for i, c := range b {
		e.Bytes[i] = int(c)
	}
	return e
}
