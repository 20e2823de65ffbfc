package model

import (
	"cmp"
	"errors"
	"fmt"
	"github.com/odmoe/odmoe/internal/splitmix"
	"math"
	"slices"
	"sort"
)

// Sampler picks the next token from logits: greedy (argmax, lowest id on
// ties) at temperature 0, otherwise softmax(logits/T) restricted to the
// smallest set of tokens whose probability reaches topP (nucleus
// sampling). A top-k cut (WithTopK) comes before the nucleus cut, as in
// Hugging Face's warpers.
//
// The draw is Gumbel-max with counter-based noise: the k-th token of a
// sequence is the kept token maximising logit/T + G, where G is Gumbel
// noise worked out from the seed, k and the token's id alone (drawKey).
// So the draw for position k never depends on what was drawn before it
// (a node that joins mid-sequence, or guesses ahead, draws the same),
// runs repeat for a seed, and two nodes whose logits differ a little
// (the shadow's quantized copy and the main node) choose the same token
// with the same seed as often as their distributions allow (Guess).
//
// Before any of that the logits may be processed, in this order, as
// OpenAI defines its request fields: llama.cpp's repeat penalty
// (WithRepeatPenalty), penalties (WithPenalties), biases (WithBias), and
// a constraint (WithConstraint) that rules tokens out. A min-p cut
// (WithMinP) comes with the top-k and nucleus cuts.
// WithLogprobs keeps the chosen token's log-probability and the most
// likely alternatives, from the processed logits at temperature 1. A
// sampler that processes nothing draws exactly as one whose processing
// leaves the logits as they are: the same seed gives the same tokens.
//
// A Sampler is one sequence's: it counts the tokens it has chosen.
type Sampler struct {
	temperature, topP float64
	topK              int
	seed              uint64
	chosen            int   // tokens chosen so far: the next one's k
	idx               []int // the heap of draw's order
	sorted            []int
	ids               []int     // likeliest's, topKCandidates'
	weights           []float64 // topKCandidates' scratch
	probs             []float64

	presence, frequency float64
	bias                map[int]float64
	counts              map[int]int // tokens chosen so far (penalties)
	// minP keeps only the tokens at least minP times as likely as the
	// likeliest (0: all)
	minP float64
	// repeat divides a positive logit, and multiplies a negative one,
	// of each token among the last repeatN of the prompt's tail and the
	// tokens chosen (llama.cpp's repeat_penalty; 0 or 1: none)
	repeat      float64
	repeatN     int
	repeatTail  []int // the prompt's last repeatN tokens
	chosenIDs   []int // the tokens chosen so far, while repeat is set
	window      []int // the repeat penalty's window, Sample's and Guess's scratch
	constraint  Constraint
	topLogprobs int // alternatives kept; -1: no logprobs
	z           []float64
	last        Choice
	guessCounts map[int]int // Guess's scratch
}

// Sampling is what a Sampler chooses by, but its constraint: what another
// node needs to choose as it does (the shadow guessing a sampled
// request's next token).
type Sampling struct {
	Temperature, TopP   float64
	TopK                int
	Seed                uint64
	Presence, Frequency float64
	Bias                map[int]float64
	MinP                float64
	// Repeat, RepeatN and RepeatTail are WithRepeatPenalty's
	Repeat     float64
	RepeatN    int
	RepeatTail []int
	// Constrained says a constraint (a grammar) limits the choices too;
	// Grammar is it written out, when it can say what it is (a
	// grammar.Constraint's Spec), for another node to rebuild.
	Constrained bool
	Grammar     []byte
}

// specified is a constraint that can write itself out (a grammar's spec).
type specified interface{ Spec() ([]byte, error) }

// Plain reports whether p chooses by the logits alone: greedy, nothing
// processed (what a node that knows nothing of the request guesses).
func (p Sampling) Plain() bool {
	return p.Temperature <= 0 && p.Presence == 0 && p.Frequency == 0 && len(p.Bias) == 0 && !p.Constrained && !repeats(p.Repeat)
}

// repeats reports whether a repeat penalty changes anything.
func repeats(penalty float64) bool { return penalty > 0 && penalty != 1 }

// Sampling returns what s chooses by.
func (s *Sampler) Sampling() Sampling {
	p := Sampling{Temperature: s.temperature, TopP: s.topP, TopK: s.topK, Seed: s.seed, Presence: s.presence, Frequency: s.frequency,
		Bias: s.bias, Constrained: s.constraint != nil, MinP: s.minP}
	if repeats(s.repeat) {
		p.Repeat, p.RepeatN, p.RepeatTail = s.repeat, s.repeatN, s.repeatTail
	}
	if sp, ok := s.constraint.(specified); ok {
		p.Grammar, _ = sp.Spec() // none when it cannot say: guessed unconstrained
	}
	return p
}

// NewSamplerOf returns a sampler that chooses by p (without its
// constraint: Guess takes the allowed tokens).
func NewSamplerOf(p Sampling) *Sampler {
	return NewSampler(p.Temperature, p.TopP, p.Seed).WithTopK(p.TopK).WithPenalties(p.Presence, p.Frequency).WithBias(p.Bias).
		WithMinP(p.MinP).WithRepeatPenalty(p.Repeat, p.RepeatN, p.RepeatTail)
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
	return &Sampler{temperature: temperature, topP: topP, seed: seed, topLogprobs: -1}
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

// WithMinP keeps only the tokens at least p times as likely as the
// likeliest, at the sampling temperature (min_p, as Hugging Face and
// vLLM apply it: after the temperature; 0: no cut) and returns s.
func (s *Sampler) WithMinP(p float64) *Sampler {
	s.minP = p
	return s
}

// MaxRepeatN bounds a repeat penalty's window: a Sampling carries the
// prompt's last tokens as far back (the wire's Sampling too).
const MaxRepeatN = 4096

// WithRepeatPenalty penalises the tokens among the last n of the
// sequence, prompt (the last n of prompt are kept) and chosen tokens
// alike, as llama.cpp's repeat_penalty does: a positive logit divided
// by penalty, a negative one multiplied (each such token once, however
// often it appears). penalty 0 or 1 or n 0: none. It returns s.
func (s *Sampler) WithRepeatPenalty(penalty float64, n int, prompt []int) *Sampler {
	if !repeats(penalty) || n <= 0 {
		s.repeat, s.repeatN, s.repeatTail = 0, 0, nil
		return s
	}
	s.repeat, s.repeatN = penalty, n
	s.repeatTail = slices.Clone(prompt[max(len(prompt)-n, 0):])
	return s
}

// windowOf appends to w the last repeatN tokens of the prompt's tail and
// chosen, those chosen so far.
func (s *Sampler) windowOf(w, chosen []int) []int {
	from := max(len(s.repeatTail)+len(chosen)-s.repeatN, 0)
	if from < len(s.repeatTail) {
		w = append(w, s.repeatTail[from:]...)
		from = 0
	} else {
		from -= len(s.repeatTail)
	}
	return append(w, chosen[from:]...)
}

// penaliseRepeats applies the repeat penalty to z for the tokens of
// window, each once.
func (s *Sampler) penaliseRepeats(z []float64, window []int) {
	// each token once: sorted (window is the caller's scratch), not a
	// search of the tokens before it, which for a window of 4,096 was 8
	// million comparisons a token
	slices.Sort(window)
	for _, id := range slices.Compact(window) {
		if id < 0 || id >= len(z) {
			continue
		}
		if z[id] > 0 {
			z[id] /= s.repeat
		} else {
			z[id] *= s.repeat
		}
	}
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
	return s.counts != nil || len(s.bias) > 0 || s.constraint != nil || s.topLogprobs >= 0 || s.repeat != 0
}

// errNoToken: a constraint allowed no token.
var errNoToken = errors.New("model: the constraint allows no token of the vocabulary")

// Sample returns the chosen token id. It fails only when a constraint
// does.
func (s *Sampler) Sample(logits []float32) (int, error) {
	k := uint64(s.chosen)
	s.chosen++
	if !s.processes() {
		if s.temperature <= 0 {
			id := Argmax(logits)
			s.last = Choice{TokenLogprob: TokenLogprob{ID: id}}
			return id, nil
		}
		z := s.widen(logits)
		id := s.draw(z, k)
		s.last = Choice{TokenLogprob: TokenLogprob{ID: id}}
		return id, nil
	}
	var allowed []uint64
	if s.constraint != nil {
		var err error
		if allowed, err = s.constraint.Allowed(); err != nil {
			return 0, err
		}
	}
	z := s.widen(logits)
	var window []int
	if s.repeat != 0 {
		s.window = s.windowOf(s.window[:0], s.chosenIDs)
		window = s.window
	}
	id, ok := s.choose(z, s.counts, window, allowed, k)
	if !ok {
		return 0, errNoToken
	}
	if s.repeat != 0 {
		s.chosenIDs = append(s.chosenIDs, id)
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

// Guess returns the token s chooses from logits after generated, the
// tokens chosen before it (their number is the draw's position, their
// counts the penalties'), among the tokens allowed (a bitset, as
// Constraint.Allowed gives it; nil: any), without moving s: what Sample
// would return there when s's sampling were the request's and generated
// its choices so far. The shadow guesses a sampled request's next token
// with it, from its own logits.
func (s *Sampler) Guess(logits []float32, generated []int, allowed []uint64) int {
	var counts map[int]int
	if s.counts != nil {
		if s.guessCounts == nil {
			s.guessCounts = map[int]int{}
		}
		clear(s.guessCounts)
		for _, id := range generated {
			s.guessCounts[id]++
		}
		counts = s.guessCounts
	}
	var window []int
	if s.repeat != 0 {
		s.window = s.windowOf(s.window[:0], generated)
		window = s.window
	}
	if id, ok := s.choose(s.widen(logits), counts, window, allowed, uint64(len(generated))); ok {
		return id
	}
	return argmax(s.widen(logits)) // nothing allowed: the constraint is not the request's
}

// choose picks the k-th token of the sequence from z, the widened
// logits, processed in place: the repeat penalty of the tokens of window,
// the penalties of the tokens counts has, the biases, and only the
// tokens allowed (nil: any); false when allowed rules out every token.
func (s *Sampler) choose(z []float64, counts map[int]int, window []int, allowed []uint64, k uint64) (int, bool) {
	s.penaliseRepeats(z, window)
	s.penalise(z, counts)
	s.addBias(z)
	if allowed != nil && !mask(z, allowed) {
		return 0, false
	}
	if s.temperature <= 0 {
		return argmax(z), true
	}
	return s.draw(z, k), true
}

// mask rules out of z the tokens allowed does not have; it reports
// whether any is left.
func mask(z []float64, allowed []uint64) bool {
	any := false
	for id := range z {
		if w := id >> 6; w >= len(allowed) || allowed[w]&(1<<(id&63)) == 0 {
			z[id] = math.Inf(-1)
		} else {
			any = true
		}
	}
	return any
}

// penalise subtracts the penalties of the tokens counts has chosen.
func (s *Sampler) penalise(z []float64, counts map[int]int) {
	for id, n := range counts {
		if id >= 0 && id < len(z) {
			z[id] -= float64(n)*s.frequency + s.presence
		}
	}
}

// addBias adds s's logit biases.
func (s *Sampler) addBias(z []float64) {
	for id, b := range s.bias {
		if id >= 0 && id < len(z) {
			z[id] += b
		}
	}
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

// draw samples the k-th token of the sequence from softmax(z/T) after
// the top-k and nucleus cuts, by Gumbel-max: of the kept tokens, the one
// whose weight w = exp((z - max)/T) over an exponential variate E (from
// drawKey) is largest, that is the largest z/T - log E, which is z/T plus
// Gumbel noise. The cuts take tokens most likely first (ties: lowest id
// first) from a heap, only as far as they need: a full sort of a
// 151,936-token vocabulary took 82 ms a token.
func (s *Sampler) draw(z []float64, k uint64) int {
	cutK := s.topK > 0 && s.topK < len(z)
	cutP := s.topP > 0 && s.topP < 1
	if !cutK && !cutP {
		return s.raceAll(z, drawKey(s.seed, k))
	}
	if cap(s.probs) < len(z) {
		s.probs, s.idx = make([]float64, len(z)), make([]int, len(z))
	}
	probs := s.probs[:len(z)]
	mx := z[argmax(z)]
	// a top-k cut needs the weights of the likeliest tokens alone: the
	// rest of probs is not worked out (nor read) unless that fails
	ids, fast := []int(nil), cutK && s.topKCandidates(z, mx, probs)
	if fast {
		ids = s.ids
	} else {
		for i, l := range z {
			probs[i] = math.Exp((l - mx) / s.temperature)
		}
	}
	key := drawKey(s.seed, k)
	sum := 0.0
	if !cutK {
		for _, p := range probs { // in id order, as before the cut
			sum += p
		}
	}
	if !fast {
		ids = s.likeliest(probs, sum, cutK, cutP)
	}
	kept, ok := s.cut(probs, ids, sum)
	if !ok { // the cut reached past the likeliest: take it over every token
		if fast {
			for i, l := range z {
				probs[i] = math.Exp((l - mx) / s.temperature)
			}
		}
		kept, _ = s.cut(probs, nil, sum)
	}
	r := s.newRace()
	for _, id := range kept {
		r.enter(id, probs[id], uniform(key, id))
	}
	return r.winner(z)
}

// race is one draw's Gumbel-max race: of the tokens entered, the one
// whose E/w is the smallest wins (ties: the lowest id), w its weight and
// E = -log U its exponential variate; a token below the min-p cut, or of
// no weight, does not race.
type race struct {
	minP, best float64
	id         int
}

func (s *Sampler) newRace() race { return race{minP: s.minP, best: math.Inf(1), id: -1} }

// enter races token id of weight w and uniform variate u. E = -log U >=
// 1 - U: a token whose bound already loses needs no logarithm (most of a
// large vocabulary, whose weights are small).
func (r *race) enter(id int, w, u float64) {
	if !(w > 0) || w < r.minP || 1-u > r.best*w {
		return
	}
	if e := -math.Log(u) / w; e < r.best || e == r.best && id < r.id {
		r.best, r.id = e, id
	}
}

// winner is the token that won, or, when none raced (every weight zero
// or NaN), the most likely of z.
func (r *race) winner(z []float64) int {
	if r.id < 0 {
		return argmax(z)
	}
	return r.id
}

// raceAll is draw without a cut: every token races. It works out a
// token's weight (a logarithm and an exponential, most of the draw's
// time) only where it could win: the most likely token races first, and
// a token whose weight's bound 2^(int(t log2 e)+2) >= exp(t) already
// loses to it (1 - U > best * bound, with E = -log U >= 1 - U) is passed
// over, as draw's own test would pass it over. So it chooses what racing
// every token in id order chooses, in about a tenth of the time.
func (s *Sampler) raceAll(z []float64, key uint64) int {
	top := argmax(z)
	mx := z[top]
	r := s.newRace()
	weight := func(id int) float64 { return math.Exp((z[id] - mx) / s.temperature) }
	if mx == mx {
		r.enter(top, weight(top), uniform(key, top))
	}
	// x = (z - mx) log2(e) / T <= 0, within far less than 1 of its true
	// value; its integer part rounds up, so 2^(int(x)+2) bounds exp(t)
	perBit := math.Log2E / s.temperature
	for id, l := range z {
		x := (l - mx) * perBit
		if !(x >= -1100) { // NaN, or exp(t) is 0: never wins
			continue
		}
		u := uniform(key, id)
		if 1-u > r.best*pow2(int(x)+2) {
			continue
		}
		r.enter(id, weight(id), u)
	}
	return r.winner(z)
}

// pow2 returns 2^e for e <= 1023, or the smallest normal float64 for e
// below -1022, which is no less.
func pow2(e int) float64 {
	return math.Float64frombits(uint64(max(e, -1022)+1023) << 52)
}

// cut returns the tokens the top-k and nucleus cuts keep, most likely
// first, taken from a heap of ids (nil: every token) in order of probs
// (ties: the lowest id first); sum is every token's weight when there is
// no top-k cut. ids must be the likeliest tokens, every one as likely as
// any left out: when the cut would reach past them, ok is false.
func (s *Sampler) cut(probs []float64, ids []int, sum float64) (kept []int, ok bool) {
	heap := s.idx[:0]
	if ids == nil {
		for i := range probs {
			heap = append(heap, i)
		}
	} else {
		heap = append(heap, ids...)
	}
	h := byProbability{probs: probs, heap: heap, sorted: s.sorted[:0]}
	defer func() { s.sorted = h.sorted }()
	h.init()
	n, keep := len(heap), len(probs)
	if s.topK > 0 && s.topK < len(probs) {
		keep, sum = s.topK, 0
		if keep > n {
			return nil, false
		}
		for i := range keep {
			sum += probs[h.at(i)]
		}
	}
	if s.topP > 0 && s.topP < 1 {
		var acc float64
		cut := false
		for i := range min(keep, n) {
			acc += probs[h.at(i)] / sum
			if acc >= s.topP {
				keep, cut = i+1, true
				break
			}
		}
		if !cut && keep > n {
			return nil, false
		}
	}
	for i := range keep {
		h.at(i)
	}
	return h.sorted[:keep], true
}

// topKCandidates finds, for a top-k cut, the tokens that can be among
// the k likeliest without any weight worked out but theirs: from a
// histogram of the logits' distance below the largest, in powers of two
// of weight, the tokens within one power more than the k-th needs (s.ids,
// their probs set). It reports false, having decided nothing, when a
// logit is NaN or infinite above, when fewer than k tokens are finite,
// or when the k-th candidate's weight does not beat every token left out
// (a tie across the line): the caller then works out every weight.
func (s *Sampler) topKCandidates(z []float64, mx float64, probs []float64) bool {
	if math.IsInf(mx, 0) || mx != mx {
		return false
	}
	perBit := math.Log2E / s.temperature
	var count [64]int
	for _, l := range z {
		if l != l {
			return false
		}
		b := 63 // -Inf, and weights below 2^-62
		if x := (mx - l) * perBit; x < 62 {
			b = int(x)
		}
		count[b]++
	}
	last, n := -1, 0
	for b := range 61 {
		if n += count[b]; n >= s.topK {
			last = b + 1 // one power more: the histogram's x is rounded
			break
		}
	}
	if last < 0 {
		return false
	}
	ids, weights := s.ids[:0], s.weights[:0]
	for id, l := range z {
		if (mx-l)*perBit < float64(last+1) {
			p := math.Exp((l - mx) / s.temperature)
			probs[id] = p
			ids, weights = append(ids, id), append(weights, p)
		}
	}
	s.ids, s.weights = ids, weights
	if len(ids) < s.topK {
		return false
	}
	// every token left out weighs at most 2^-(last+1) (its distance,
	// rounded, was at least last+1 powers of two): the k-th must weigh more
	slices.SortFunc(weights, func(a, b float64) int { return cmp.Compare(b, a) })
	return weights[s.topK-1] > math.Ldexp(1, -(last+1))*(1+1e-9)
}

// likeliest returns the tokens whose weight is at least a power of two
// chosen so that they hold the top-k tokens, or (no top-k) about a
// little more than the nucleus's share of sum: the only tokens cut need
// order, most of a large vocabulary left out of its heap. It is nil
// (every token) when a weight is NaN, whose place in the order no
// threshold can say.
func (s *Sampler) likeliest(probs []float64, sum float64, cutK, cutP bool) []int {
	const buckets = 64 // weights 2^0 .. 2^-62, and all below
	var count [buckets]int
	var mass [buckets]float64
	for _, p := range probs {
		if p != p {
			return nil
		}
		b := min(1023-int(math.Float64bits(p)>>52&0x7ff), buckets-1) // -floor(log2 p); 0 and subnormals last
		count[max(b, 0)]++
		mass[max(b, 0)] += p
	}
	n, m, last := 0, 0.0, buckets-1
	for b := range buckets {
		n, m = n+count[b], m+mass[b]
		if cutK && n >= s.topK || !cutK && cutP && m >= sum*(s.topP+(1-s.topP)/2) {
			last = min(b+1, buckets-1) // one more power: the cut's share is summed in another order
			break
		}
	}
	if last == buckets-1 {
		return nil
	}
	threshold := math.Ldexp(1, -last)
	ids := s.ids[:0]
	for id, p := range probs {
		if p >= threshold {
			ids = append(ids, id)
		}
	}
	s.ids = ids
	return ids
}

// drawKey is the noise key of a sequence's k-th draw under seed.
func drawKey(seed, k uint64) uint64 { return splitmix.Mix(seed ^ splitmix.Mix(k+0x9e3779b97f4a7c15)) }

// uniform is token id's uniform variate in (0, 1) under key, from the
// key and the id alone; its exponential variate is -log U.
func uniform(key uint64, id int) float64 {
	u := splitmix.Mix(key ^ (uint64(id)+1)*0xd1b54a32d192ed03)
	return (float64(u>>11) + 0.5) / (1 << 53)
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
	if len(v) == 0 {
		return 0
	}
	best, top := 0, v[0] // top in a register, not read back from v
	for i, x := range v {
		if x > top || (top != top && x == x) {
			best, top = i, x
		}
	}
	return best
}
