package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Sampler picks the next token from logits: greedy (argmax, lowest id on
// ties) at temperature 0, otherwise softmax(logits/T) restricted to the
// smallest set of tokens whose probability reaches topP (nucleus
// sampling), drawn from a seeded generator so runs repeat. A top-k cut
// (WithTopK) comes before the nucleus cut, as in Hugging Face's warpers.
//
// Before any of that the logits may be processed, in this order, as
// OpenAI defines its request fields: penalties (WithPenalties), biases
// (WithBias), and a constraint (WithConstraint) that rules tokens out.
// WithLogprobs keeps the chosen token's log-probability and the most
// likely alternatives, from the processed logits at temperature 1. A
// sampler that processes nothing draws exactly as it always has: the
// same seed gives the same tokens.
//
// A Sampler is one sequence's: it counts the tokens it has chosen.
type Sampler struct {
	temperature, topP float64
	topK              int
	rng               *rand.Rand
	idx               []int // the heap of draw's order
	sorted            []int
	probs             []float64

	presence, frequency float64
	bias                map[int]float64
	counts              map[int]int // tokens chosen so far (penalties)
	constraint          Constraint
	topLogprobs         int // alternatives kept; -1: no logprobs
	z                   []float64
	last                Choice
}

// A Constraint limits which tokens may come next: a grammar the output
// must follow.
type Constraint interface {
	// Allowed returns the ids that may come next as a bitset over the
	// vocabulary (bit id%64 of word id/64), or an error when none can.
	Allowed() ([]uint64, error)
	// Accept moves the constraint past id, one of those allowed.
	Accept(id int) error
}

// TokenLogprob is one token's log-probability.
type TokenLogprob struct {
	ID      int
	Logprob float64
}

// Choice is the token a sampler chose, with its log-probability and the
// most likely alternatives (most likely first), when asked for
// (WithLogprobs).
type Choice struct {
	TokenLogprob
	Top []TokenLogprob
}

// NewSampler returns a sampler; temperature 0 means greedy, topP outside
// (0, 1) means no nucleus cut.
func NewSampler(temperature, topP float64, seed uint64) *Sampler {
	return &Sampler{temperature: temperature, topP: topP, rng: rand.New(rand.NewPCG(seed, 0x6f646d6f65)), topLogprobs: -1}
}

// WithTopK restricts sampling to the k most likely tokens (k <= 0: no
// cut) and returns s.
func (s *Sampler) WithTopK(k int) *Sampler {
	s.topK = k
	return s
}

// WithPenalties subtracts from every token's logit frequency times the
// number of times s has chosen it, and presence once if it has chosen it
// at all (OpenAI's frequency_penalty and presence_penalty: the counts are
// of the generated tokens, not the prompt's).
func (s *Sampler) WithPenalties(presence, frequency float64) *Sampler {
	s.presence, s.frequency = presence, frequency
	if s.counts == nil && (presence != 0 || frequency != 0) {
		s.counts = map[int]int{}
	}
	return s
}

// WithBias adds bias[id] to id's logit (OpenAI's logit_bias).
func (s *Sampler) WithBias(bias map[int]float64) *Sampler {
	s.bias = bias
	return s
}

// WithConstraint lets s choose only the tokens c allows.
func (s *Sampler) WithConstraint(c Constraint) *Sampler {
	s.constraint = c
	return s
}

// WithLogprobs makes s keep each choice's log-probability and its top
// most likely alternatives (top 0: none); Last returns them.
func (s *Sampler) WithLogprobs(top int) *Sampler {
	s.topLogprobs = top
	return s
}

// Last returns the latest choice; its log-probabilities are set only
// with WithLogprobs.
func (s *Sampler) Last() Choice { return s.last }

// processes reports whether s changes the logits or reads their
// distribution before drawing.
func (s *Sampler) processes() bool {
	return s.counts != nil || len(s.bias) > 0 || s.constraint != nil || s.topLogprobs >= 0
}

// errNoToken: a constraint allowed no token.
var errNoToken = errors.New("model: the constraint allows no token of the vocabulary")

// Sample returns the chosen token id. It fails only when a constraint
// does.
func (s *Sampler) Sample(logits []float32) (int, error) {
	if !s.processes() {
		if s.temperature <= 0 {
			id := Argmax(logits)
			s.last = Choice{TokenLogprob: TokenLogprob{ID: id}}
			return id, nil
		}
		z := s.widen(logits)
		id := s.draw(z)
		s.last = Choice{TokenLogprob: TokenLogprob{ID: id}}
		return id, nil
	}
	z := s.widen(logits)
	for id, n := range s.counts {
		if id < len(z) {
			z[id] -= float64(n)*s.frequency + s.presence
		}
	}
	for id, b := range s.bias {
		if id >= 0 && id < len(z) {
			z[id] += b
		}
	}
	if s.constraint != nil {
		allowed, err := s.constraint.Allowed()
		if err != nil {
			return 0, err
		}
		any := false
		for id := range z {
			if w := id >> 6; w >= len(allowed) || allowed[w]&(1<<(id&63)) == 0 {
				z[id] = math.Inf(-1)
			} else {
				any = true
			}
		}
		if !any {
			return 0, errNoToken
		}
	}
	var id int
	if s.temperature <= 0 {
		id = argmax(z)
	} else {
		id = s.draw(z)
	}
	s.last = Choice{TokenLogprob: TokenLogprob{ID: id}}
	if s.topLogprobs >= 0 {
		s.last = logprobs(z, id, s.topLogprobs)
	}
	if s.counts != nil {
		s.counts[id]++
	}
	if s.constraint != nil {
		if err := s.constraint.Accept(id); err != nil {
			return 0, fmt.Errorf("model: the constraint refused the token it allowed: %w", err)
		}
	}
	return id, nil
}

// widen copies logits into s's float64 scratch.
func (s *Sampler) widen(logits []float32) []float64 {
	if cap(s.z) < len(logits) {
		s.z = make([]float64, len(logits))
	}
	z := s.z[:len(logits)]
	for i, l := range logits {
		z[i] = float64(l)
	}
	return z
}

// draw samples from softmax(z/T) after the top-k and nucleus cuts. The
// tokens are taken most likely first (ties: lowest id first) from a
// heap, only as far as the cuts and the draw need: a full sort of a
// 151,936-token vocabulary took 82 ms a token.
func (s *Sampler) draw(z []float64) int {
	if cap(s.probs) < len(z) {
		s.probs, s.idx = make([]float64, len(z)), make([]int, len(z))
	}
	probs := s.probs[:len(z)]
	mx := z[argmax(z)]
	var sum float64
	for i, l := range z {
		probs[i] = math.Exp((l - mx) / s.temperature)
		sum += probs[i]
	}
	h := byProbability{probs: probs, heap: s.idx[:len(z)], sorted: s.sorted[:0]}
	h.init()
	defer func() { s.sorted = h.sorted }()
	keep := len(z)
	cut := false
	if s.topK > 0 && s.topK < keep {
		keep, sum, cut = s.topK, 0, true
		for i := range keep {
			sum += probs[h.at(i)]
		}
	}
	if s.topP > 0 && s.topP < 1 {
		var acc float64
		for i := range keep {
			acc += probs[h.at(i)] / sum
			if acc >= s.topP {
				keep, cut = i+1, true
				break
			}
		}
	}
	kept := sum // no cut: every token, summed in id order
	if cut {
		kept = 0
		for i := range keep {
			kept += probs[h.at(i)]
		}
	}
	r := s.rng.Float64() * kept
	last := h.at(0)
	for i := range keep {
		id := h.at(i)
		if probs[id] == 0 {
			break // ruled out, and so is every token after it
		}
		last = id
		if r -= probs[id]; r < 0 {
			return id
		}
	}
	return last
}

// byProbability hands out token ids most probable first, ties lowest id
// first: sorted is the ids taken so far, heap the rest.
type byProbability struct {
	probs  []float64
	heap   []int
	sorted []int
}

func (h *byProbability) before(a, b int) bool {
	return h.probs[a] > h.probs[b] || h.probs[a] == h.probs[b] && a < b
}

func (h *byProbability) init() {
	for i := range h.heap {
		h.heap[i] = i
	}
	for i := len(h.heap)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// at returns the i-th most probable id, taking ids off the heap up to it.
func (h *byProbability) at(i int) int {
	for len(h.sorted) <= i {
		top := h.heap[0]
		n := len(h.heap) - 1
		h.heap[0] = h.heap[n]
		h.heap = h.heap[:n]
		h.down(0)
		h.sorted = append(h.sorted, top)
	}
	return h.sorted[i]
}

func (h *byProbability) down(i int) {
	n := len(h.heap)
	for {
		best, l, r := i, 2*i+1, 2*i+2
		if l < n && h.before(h.heap[l], h.heap[best]) {
			best = l
		}
		if r < n && h.before(h.heap[r], h.heap[best]) {
			best = r
		}
		if best == i {
			return
		}
		h.heap[i], h.heap[best] = h.heap[best], h.heap[i]
		i = best
	}
}

// logprobs returns id's log-probability under softmax(z) and the top
// most likely tokens' (ruled-out tokens never among them).
func logprobs(z []float64, id, top int) Choice {
	mx := z[argmax(z)]
	var sum float64
	for _, l := range z {
		sum += math.Exp(l - mx)
	}
	lse := mx + math.Log(sum)
	c := Choice{TokenLogprob: TokenLogprob{ID: id, Logprob: z[id] - lse}}
	if top <= 0 {
		return c
	}
	best := make([]TokenLogprob, 0, top+1)
	for i, l := range z {
		if math.IsInf(l, -1) || math.IsNaN(l) || (len(best) == top && l <= best[top-1].Logprob) {
			continue
		}
		at := sort.Search(len(best), func(k int) bool { return best[k].Logprob < l })
		best = append(best, TokenLogprob{})
		copy(best[at+1:], best[at:])
		best[at] = TokenLogprob{ID: i, Logprob: l}
		best = best[:min(len(best), top)]
	}
	for i := range best {
		best[i].Logprob -= lse
	}
	c.Top = best
	return c
}

// Argmax returns the index of the largest value, the lowest on ties; NaNs
// never win.
func Argmax(v []float32) int { return argmax(v) }

func argmax[F float32 | float64](v []F) int {
	best := 0
	for i, x := range v {
		if x > v[best] || (v[best] != v[best] && x == x) {
			best = i
		}
	}
	return best
}
