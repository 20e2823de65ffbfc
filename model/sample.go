package model

import (
	"math"
	"math/rand/v2"
	"sort"
)

// Sampler picks the next token from logits: greedy (argmax, lowest id on
// ties) at temperature 0, otherwise softmax(logits/T) restricted to the
// smallest set of tokens whose probability reaches topP (nucleus
// sampling), drawn from a seeded generator so runs repeat. A top-k cut
// (WithTopK) comes before the nucleus cut, as in Hugging Face's warpers.
type Sampler struct {
	temperature, topP float64
	topK              int
	rng               *rand.Rand
	idx               []int
	probs             []float64
}

// NewSampler returns a sampler; temperature 0 means greedy, topP outside
// (0, 1) means no nucleus cut.
func NewSampler(temperature, topP float64, seed uint64) *Sampler {
	return &Sampler{temperature: temperature, topP: topP, rng: rand.New(rand.NewPCG(seed, 0x6f646d6f65))}
}

// WithTopK restricts sampling to the k most likely tokens (k <= 0: no
// cut) and returns s.
func (s *Sampler) WithTopK(k int) *Sampler {
	s.topK = k
	return s
}

// Sample returns the chosen token id.
func (s *Sampler) Sample(logits []float32) int {
	if s.temperature <= 0 {
		return Argmax(logits)
	}
	if cap(s.probs) < len(logits) {
		s.probs, s.idx = make([]float64, len(logits)), make([]int, len(logits))
	}
	probs, idx := s.probs[:len(logits)], s.idx[:len(logits)]
	mx := float64(logits[Argmax(logits)])
	var sum float64
	for i, l := range logits {
		probs[i] = math.Exp((float64(l) - mx) / s.temperature)
		sum += probs[i]
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return probs[idx[a]] > probs[idx[b]] })
	keep := len(idx)
	if s.topK > 0 && s.topK < keep {
		keep, sum = s.topK, 0
		for _, id := range idx[:keep] {
			sum += probs[id]
		}
	}
	if s.topP > 0 && s.topP < 1 {
		var acc float64
		for i, id := range idx[:keep] {
			acc += probs[id] / sum
			if acc >= s.topP {
				keep = i + 1
				break
			}
		}
	}
	var kept float64
	for _, id := range idx[:keep] {
		kept += probs[id]
	}
	r := s.rng.Float64() * kept
	for _, id := range idx[:keep] {
		r -= probs[id]
		if r < 0 {
			return id
		}
	}
	return idx[keep-1]
}

// Argmax returns the index of the largest value, the lowest on ties; NaNs
// never win.
func Argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] || (v[best] != v[best] && x == x) {
			best = i
		}
	}
	return best
}
