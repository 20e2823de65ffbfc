package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestArgmaxTakesLowestIndexOnTiesAndSkipsNaN(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		v    []float32
		want int
	}{
		{[]float32{1, 3, 3, 2}, 1},
		{[]float32{nan, 0, 5}, 2},
		{[]float32{-1}, 0},
		{[]float32{2, nan, 2}, 0},
	}
	for _, tc := range cases {
		if got := Argmax(tc.v); got != tc.want {
			t.Errorf("Argmax(%v) = %d, want %d", tc.v, got, tc.want)
		}
	}
}

func TestSamplerFollowsTemperatureAndTopP(t *testing.T) {
	logits := []float32{2, 1, 0, -1}
	if got := draw(t, NewSampler(0, 1, 1), logits); got != 0 {
		t.Fatalf("greedy picked %d", got)
	}
	// top-p 0.5 keeps only the most probable token (p0 = 0.64 at T=1)
	s := NewSampler(1, 0.5, 9)
	for range 200 {
		if got := draw(t, s, logits); got != 0 {
			t.Fatalf("top-p 0.5 sampled %d", got)
		}
	}
	// at T=1 without a cut, frequencies follow softmax(logits)
	s = NewSampler(1, 1, 42)
	counts := make([]int, 4)
	const n = 20000
	for range n {
		counts[draw(t, s, logits)]++
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	for i, l := range logits {
		p := math.Exp(float64(l)) / z
		got := float64(counts[i]) / n
		if math.Abs(got-p) > 4*math.Sqrt(p*(1-p)/n)+1e-3 {
			t.Errorf("token %d: frequency %.4f, want %.4f", i, got, p)
		}
	}
	// same seed, same draws
	a, b := NewSampler(0.8, 0.9, 5), NewSampler(0.8, 0.9, 5)
	for range 50 {
		if draw(t, a, logits) != draw(t, b, logits) {
			t.Fatal("same seed gave different samples")
		}
	}
}

// TestSamplerTopKComesBeforeTopP: top-k 2 draws only the two most likely
// tokens, in proportion to their renormalised probabilities, and the
// nucleus cut is then taken over those two (Hugging Face's warper order).
func TestSamplerTopKComesBeforeTopP(t *testing.T) {
	logits := []float32{2, 1, 0, -1}
	s := NewSampler(1, 1, 3).WithTopK(2)
	counts := make([]int, 4)
	const n = 20000
	for range n {
		counts[draw(t, s, logits)]++
	}
	p0 := math.E / (math.E + 1) // softmax over the top two at T=1
	if counts[2]+counts[3] != 0 {
		t.Fatalf("top-k 2 sampled tokens outside the top two: %v", counts)
	}
	if got := float64(counts[0]) / n; math.Abs(got-p0) > 4*math.Sqrt(p0*(1-p0)/n) {
		t.Fatalf("token 0: frequency %.4f, want %.4f", got, p0)
	}
	// over the top two, p0 = 0.73 >= 0.7: the nucleus keeps token 0 alone
	// (over all four tokens p0 = 0.64 would have kept token 1 too)
	s = NewSampler(1, 0.7, 4).WithTopK(2)
	for range 500 {
		if got := draw(t, s, logits); got != 0 {
			t.Fatalf("top-k 2 then top-p 0.7 sampled %d", got)
		}
	}
}

func TestRouteRenormalisesAndSortsByExpert(t *testing.T) {
	logits := []float32{0.1, 2, -1, 1.5, 0}
	probs := make([]float32, len(logits))
	routes := make([]Route, 2)
	route(routes, logits, probs, true)
	if routes[0].Expert != 1 || routes[1].Expert != 3 {
		t.Fatalf("routes %+v, want experts 1 and 3 in id order", routes)
	}
	e1, e3 := math.Exp(2), math.Exp(1.5)
	if w := float64(routes[0].Weight); math.Abs(w-e1/(e1+e3)) > 1e-6 {
		t.Fatalf("weight %v, want %v", w, e1/(e1+e3))
	}
	if s := routes[0].Weight + routes[1].Weight; math.Abs(float64(s)-1) > 1e-6 {
		t.Fatalf("weights sum to %v", s)
	}
	if err := CheckRoutes([]Route{{Expert: 5}}, 5); err == nil {
		t.Fatal("expert 5 of 5 accepted")
	}
}

func draw(t *testing.T, s *Sampler, logits []float32) int {
	t.Helper()
	id, err := s.Sample(logits)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestSamplerPenalisesAsOpenAIDefines: mu[j] - c[j]*frequency -
// (c[j] > 0)*presence, c counting the tokens chosen so far; hand-worked
// greedy sequences.
func TestSamplerPenalisesAsOpenAIDefines(t *testing.T) {
	logits := []float32{2, 1.9, 0}
	cases := []struct {
		presence, frequency float64
		want                []int
	}{
		// c0=1: 1.5 < 1.9; c1=1: 1.4 < 1.5; c0=2: 1.0 < 1.4; c1=2: 0.9 < 1.0
		{0, 0.5, []int{0, 1, 0, 1, 0}},
		// 1.7 < 1.9, then both once penalised: 1.7 > 1.6 for good
		{0.3, 0, []int{0, 1, 0, 0, 0}},
		// a negative penalty repeats
		{0, -1, []int{0, 0, 0, 0, 0}},
	}
	for _, tc := range cases {
		s := NewSampler(0, 1, 1).WithPenalties(tc.presence, tc.frequency)
		var got []int
		for range tc.want {
			got = append(got, draw(t, s, logits))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("presence %v frequency %v: chose %v, want %v", tc.presence, tc.frequency, got, tc.want)
		}
	}
}

func TestSamplerBiasesLogits(t *testing.T) {
	logits := []float32{2, 1, 0, -1}
	if got := draw(t, NewSampler(0, 1, 1).WithBias(map[int]float64{3: 3.5}), logits); got != 3 {
		t.Fatalf("greedy with +3.5 on token 3 chose %d", got)
	}
	s := NewSampler(1, 1, 7).WithBias(map[int]float64{0: -100})
	for range 2000 {
		if draw(t, s, logits) == 0 {
			t.Fatal("a token biased by -100 was drawn")
		}
	}
}

// TestSamplerLogprobsAreLogSoftmaxOfTheProcessedLogits checks against
// float64 log-softmax written out here, with a bias in the way.
func TestSamplerLogprobsAreLogSoftmaxOfTheProcessedLogits(t *testing.T) {
	logits := []float32{2, 1, 0.5, -1}
	s := NewSampler(0, 1, 1).WithBias(map[int]float64{2: 1}).WithLogprobs(2)
	id := draw(t, s, logits)
	z := []float64{2, 1, 1.5, -1}
	var sum float64
	for _, v := range z {
		sum += math.Exp(v)
	}
	lp := func(i int) float64 { return z[i] - math.Log(sum) }
	c := s.Last()
	if id != 0 || c.ID != 0 || math.Abs(c.Logprob-lp(0)) > 1e-12 {
		t.Fatalf("chose %d with %+v, want 0 at %v", id, c, lp(0))
	}
	if len(c.Top) != 2 || c.Top[0].ID != 0 || c.Top[1].ID != 2 || math.Abs(c.Top[1].Logprob-lp(2)) > 1e-12 {
		t.Fatalf("top %+v, want tokens 0 and 2 (%v)", c.Top, lp(2))
	}
}

// TestSamplerDrawsTheSameWhenProcessingChangesNothing: asking for
// logprobs, or penalties of 0, leaves the seeded draws as they were.
func TestSamplerDrawsTheSameWhenProcessingChangesNothing(t *testing.T) {
	logits := []float32{0.3, 1, 0.2, -0.5, 0.9}
	plain := NewSampler(0.9, 0.95, 11).WithTopK(4)
	logged := NewSampler(0.9, 0.95, 11).WithTopK(4).WithLogprobs(3).WithBias(map[int]float64{})
	for i := range 300 {
		if a, b := draw(t, plain, logits), draw(t, logged, logits); a != b {
			t.Fatalf("draw %d: %d plain, %d with logprobs", i, a, b)
		}
	}
}

// allowList allows the ids of its current step, then moves to the next.
type allowList struct {
	steps    [][]int
	accepted []int
}

func (a *allowList) Allowed() ([]uint64, error) {
	if len(a.accepted) >= len(a.steps) {
		return nil, errors.New("no step left")
	}
	set := make([]uint64, 1)
	for _, id := range a.steps[len(a.accepted)] {
		set[id/64] |= 1 << (id % 64)
	}
	return set, nil
}

func (a *allowList) Accept(id int) error {
	if !slices.Contains(a.steps[len(a.accepted)], id) {
		return fmt.Errorf("%d not allowed", id)
	}
	a.accepted = append(a.accepted, id)
	return nil
}

func TestSamplerKeepsToItsConstraint(t *testing.T) {
	logits := []float32{2, 1, 0, -1}
	c := &allowList{steps: [][]int{{1, 3}, {2}}}
	s := NewSampler(0, 1, 1).WithConstraint(c).WithLogprobs(4)
	if a, b := draw(t, s, logits), draw(t, s, logits); a != 1 || b != 2 {
		t.Fatalf("greedy under the constraint chose %d, %d; want 1, 2", a, b)
	}
	// the second step allowed token 2 alone: probability 1, no other
	// token among the alternatives
	if c := s.Last(); c.Logprob != 0 || len(c.Top) != 1 || c.Top[0].ID != 2 {
		t.Fatalf("logprobs under a one-token constraint: %+v", c)
	}
	if !slices.Equal(c.accepted, []int{1, 2}) {
		t.Fatalf("the constraint accepted %v", c.accepted)
	}
	if _, err := s.Sample(logits); err == nil {
		t.Fatal("a constraint's error did not stop the sampler")
	}
	// sampling at T=1 draws only what is allowed
	c = &allowList{steps: slices.Repeat([][]int{{0, 3}}, 500)}
	s = NewSampler(1, 0.5, 3).WithConstraint(c)
	seen := map[int]int{}
	for range 500 {
		seen[draw(t, s, logits)]++
	}
	if seen[1]+seen[2] != 0 || seen[0] == 0 {
		t.Fatalf("drew %v under a constraint allowing 0 and 3", seen)
	}
	// a constraint that allows nothing is an error
	c = &allowList{steps: [][]int{{}}}
	if _, err := NewSampler(0, 1, 1).WithConstraint(c).Sample(logits); err == nil {
		t.Fatal("an empty allowed set gave a token")
	}
}

// BenchmarkSampler times one choice over Qwen3's vocabulary (151,936
// logits, normal with a standard deviation of 3, about a language
// model's spread): greedy, with each processing step, and drawn at
// temperature 0.8 with top_p 0.95, to set beside a decode step.
func BenchmarkSampler(b *testing.B) {
	const vocab = 151936
	logits := make([]float32, vocab)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range logits {
		logits[i] = float32(3 * rng.NormFloat64())
	}
	all := make([]uint64, (vocab+63)/64)
	for i := range all {
		all[i] = ^uint64(0)
	}
	for _, bc := range []struct {
		name string
		s    func() *Sampler
	}{
		{"greedy", func() *Sampler { return NewSampler(0, 1, 1) }},
		{"greedy+penalties", func() *Sampler { return NewSampler(0, 1, 1).WithPenalties(0.5, 0.5) }},
		{"greedy+logprobs5", func() *Sampler { return NewSampler(0, 1, 1).WithLogprobs(5) }},
		{"greedy+constraint", func() *Sampler { return NewSampler(0, 1, 1).WithConstraint(allowAll(all)) }},
		{"T0.8", func() *Sampler { return NewSampler(0.8, 0.95, 1) }},
		{"T1", func() *Sampler { return NewSampler(1, 1, 1) }},                                         // OpenAI's defaults: no cut
		{"T0.8 top_k 40 top_p 0.95", func() *Sampler { return NewSampler(0.8, 0.95, 1).WithTopK(40) }}, // llama-server's
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := bc.s()
			for range b.N {
				if _, err := s.Sample(logits); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type allowAll []uint64

func (a allowAll) Allowed() ([]uint64, error) { return a, nil }
func (a allowAll) Accept(int) error           { return nil }

// TestGuessIsWhatSampleChooses: a sampler made from another's Sampling
// guesses, from the same logits, each token the other chooses, at any
// position on its own (counter-based noise: no state carried from one
// draw to the next), with penalties counted from the tokens it is told
// were chosen before.
func TestGuessIsWhatSampleChooses(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	for _, tc := range []struct {
		name string
		s    *Sampler
	}{
		{"greedy+penalties", NewSampler(0, 1, 3).WithPenalties(0.4, 0.7)},
		{"T1", NewSampler(1, 1, 4)},
		{"T0.7 top_p 0.9", NewSampler(0.7, 0.9, 5)},
		{"T1.3 top_k 20 penalties bias", NewSampler(1.3, 1, 6).WithTopK(20).WithPenalties(0.5, 1).WithBias(map[int]float64{3: 2, 7: -100})},
		{"T0.8 min_p 0.1", NewSampler(0.8, 1, 7).WithMinP(0.1)},
		{"greedy repeat 1.5 over 8", NewSampler(0, 1, 8).WithRepeatPenalty(1.5, 8, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})},
		{"T1 top_p 0.95 min_p 0.05 repeat 1.3 over 64", NewSampler(1, 0.95, 9).WithMinP(0.05).WithRepeatPenalty(1.3, 64, []int{4, 4, 9})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			guesser := NewSamplerOf(tc.s.Sampling())
			var chosen []int
			steps := make([][]float32, 60)
			for k := range steps {
				steps[k] = make([]float32, 50)
				for i := range steps[k] {
					steps[k][i] = float32(2 * rng.NormFloat64())
				}
				id, err := tc.s.Sample(steps[k])
				if err != nil {
					t.Fatal(err)
				}
				chosen = append(chosen, id)
			}
			// out of order: each guess from its position alone
			for _, k := range rng.Perm(len(steps)) {
				if got := guesser.Guess(steps[k], chosen[:k], nil); got != chosen[k] {
					t.Fatalf("position %d: guessed %d, Sample chose %d", k, got, chosen[k])
				}
			}
		})
	}
}

// TestCoupledDrawsAgreeWhereLogitsDifferALittle: two nodes whose logits
// differ by a quantized copy's error (here noise of 0.05 on logits of
// spread 2) draw the same token with the same seed and position nearly
// always, where independent draws of the same distribution agree only as
// often as the distribution repeats itself. Gumbel-max's coupling
// promises P(differ) <= 2 TV / (1 + TV), TV the distributions' total
// variation distance; the test holds it to that, measured.
func TestCoupledDrawsAgreeWhereLogitsDifferALittle(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 11))
	const vocab, n = 200, 3000
	main, shadow, other := NewSampler(1, 1, 77), NewSampler(1, 1, 77), NewSampler(1, 1, 78)
	same, indep := 0, 0
	var bound float64
	var chosen []int // the main node's, before each draw: its position
	for range n {
		a, b := make([]float32, vocab), make([]float32, vocab)
		for i := range a {
			a[i] = float32(2 * rng.NormFloat64())
			b[i] = a[i] + float32(0.05*rng.NormFloat64())
		}
		x, _ := main.Sample(a)
		if shadow.Guess(b, chosen, nil) == x {
			same++
		}
		chosen = append(chosen, x)
		if y, _ := other.Sample(a); y == x {
			indep++
		}
		tv := totalVariation(a, b)
		bound += 2 * tv / (1 + tv)
	}
	differ := float64(n-same) / n
	t.Logf("coupled: %d of %d the same (differ %.4f, bound %.4f); independent: %d", same, n, differ, bound/n, indep)
	if limit := bound/n + 4*math.Sqrt(bound/n/n); differ > limit {
		t.Errorf("coupled draws differ %.4f of the time, more than Gumbel-max's %.4f", differ, limit)
	}
	if same <= 3*indep {
		t.Errorf("coupled draws agree %d times, independent ones %d: no coupling", same, indep)
	}
}

func totalVariation(a, b []float32) float64 {
	pa, pb := softmaxOf(a), softmaxOf(b)
	var tv float64
	for i := range pa {
		tv += math.Abs(pa[i] - pb[i])
	}
	return tv / 2
}

func softmaxOf(v []float32) []float64 {
	p := make([]float64, len(v))
	mx := float64(v[Argmax(v)])
	var sum float64
	for i, x := range v {
		p[i] = math.Exp(float64(x) - mx)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

// raceDefinition is the Gumbel-max race as defined: of ids, in order,
// each token of weight w(id) > 0 races with E = -log U (U from key and
// its id), the smallest E/w winning (ties: the lowest id); when none
// races, the most likely of z.
func raceDefinition(z []float64, ids []int, w func(id int) float64, key uint64) int {
	best, bestID := math.Inf(1), -1
	for _, id := range ids {
		if wt := w(id); wt > 0 {
			if r := -math.Log(uniform(key, id)) / wt; r < best || r == best && id < bestID {
				best, bestID = r, id
			}
		}
	}
	if bestID < 0 {
		return argmax(z)
	}
	return bestID
}

// The shapes of drawLogits beyond plain noise.
const (
	shapeNoise    = iota
	shapeTies     // rounded: ties at the top and below it
	shapeRuledOut // four in five -Inf
	shapeNaN      // a NaN
	shapeNone     // every one -Inf
	shapeFlat     // every one 0
)

// drawLogits are vocab logits of spread in shape, for the draws' tests.
func drawLogits(rng *rand.Rand, vocab int, spread float64, shape int) []float64 {
	z := make([]float64, vocab)
	for i := range z {
		z[i] = spread * rng.NormFloat64()
	}
	for i := range z {
		switch shape {
		case shapeTies:
			z[i] = math.Round(z[i])
		case shapeRuledOut:
			if i%5 != 0 {
				z[i] = math.Inf(-1)
			}
		case shapeNone:
			z[i] = math.Inf(-1)
		case shapeFlat:
			z[i] = 0
		}
	}
	if shape == shapeNaN {
		z[rng.IntN(vocab)] = math.NaN()
	}
	return z
}

// TestRaceAllIsTheRaceOfEveryToken: the uncut draw, which works out a
// weight only where its bound could win, chooses what the definition
// chooses, every token's E/w worked out in id order, the smallest
// winning (ties: the lowest id): over vocabularies small and large,
// spreads narrow and wide, temperatures low and high, with ties, tokens
// ruled out (-Inf) and NaNs.
func TestRaceAllIsTheRaceOfEveryToken(t *testing.T) {
	definition := func(z []float64, temperature float64, key uint64) int {
		mx := z[argmax(z)]
		ids := make([]int, len(z))
		for i := range ids {
			ids[i] = i
		}
		return raceDefinition(z, ids, func(id int) float64 { return math.Exp((z[id] - mx) / temperature) }, key)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	draws, differ := 0, 0
	for _, vocab := range []int{1, 2, 7, 50, 1000, 151936} {
		rounds := max(2, 40000/vocab)
		for round := range rounds {
			spread := []float64{0.01, 1, 3, 10, 100}[round%5]
			temperature := []float64{0.05, 0.3, 0.7, 1, 1.5, 4}[round%6]
			z := drawLogits(rng, vocab, spread, []int{shapeNoise, shapeTies, shapeRuledOut, shapeNaN, shapeNone, shapeNoise, shapeNoise}[round%7])
			s := NewSampler(temperature, 1, rng.Uint64())
			for k := range uint64(3) {
				key := drawKey(s.seed, k)
				got, want := s.raceAll(slices.Clone(z), key), definition(z, temperature, key)
				draws++
				if got != want {
					differ++
					if differ <= 5 {
						t.Errorf("vocab %d, spread %g, T %g, draw %d: raceAll chose %d, the definition %d", vocab, spread, temperature, k, got, want)
					}
				}
			}
		}
	}
	if differ > 0 {
		t.Fatalf("%d of %d draws differ", differ, draws)
	}
	t.Logf("%d draws, every one the definition's", draws)
}

// TestCutDrawIsTheDefinition: the draw with a top-k or nucleus cut,
// which orders only the likeliest tokens, chooses what the definition
// chooses: every token sorted by weight (ties: the lowest id first), the
// top k kept, then the smallest prefix whose share (summed in that order)
// reaches top_p, every kept token's E/w worked out, the smallest winning.
func TestCutDrawIsTheDefinition(t *testing.T) {
	definition := func(z []float64, temperature, topP float64, topK int, key uint64) int {
		probs := make([]float64, len(z))
		mx := z[argmax(z)]
		for i, l := range z {
			probs[i] = math.Exp((l - mx) / temperature)
		}
		order := make([]int, len(z))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case probs[a] > probs[b]:
				return -1
			case probs[a] < probs[b]:
				return 1
			}
			return 0
		})
		keep, sum := len(z), 0.0
		if topK > 0 && topK < len(z) {
			keep = topK
			for _, id := range order[:keep] {
				sum += probs[id]
			}
		} else {
			for _, p := range probs {
				sum += p
			}
		}
		if topP > 0 && topP < 1 {
			acc := 0.0
			for i, id := range order[:keep] {
				acc += probs[id] / sum
				if acc >= topP {
					keep = i + 1
					break
				}
			}
		}
		return raceDefinition(z, order[:keep], func(id int) float64 { return probs[id] }, key)
	}
	rng := rand.New(rand.NewPCG(13, 14))
	draws, differ := 0, 0
	for _, vocab := range []int{2, 7, 50, 1000, 32000, 151936} {
		rounds := max(4, 60000/vocab)
		for round := range rounds {
			spread := []float64{0.01, 1, 3, 10, 30}[round%5]
			temperature := []float64{0.3, 0.7, 1, 1.5}[round%4]
			topP := []float64{1, 0.5, 0.9, 0.95, 0.999999}[round%5]
			topK := []int{0, 1, 5, 40, 0, 2000}[round%6]
			if topP == 1 && topK == 0 {
				topK = 20
			}
			z := drawLogits(rng, vocab, spread, []int{shapeNoise, shapeTies, shapeRuledOut, shapeNoise, shapeFlat, shapeNoise, shapeNoise}[round%7])
			s := NewSampler(temperature, topP, rng.Uint64()).WithTopK(topK)
			for k := range uint64(2) {
				key := drawKey(s.seed, k)
				got, want := s.draw(slices.Clone(z), k), definition(z, temperature, topP, topK, key)
				draws++
				if got != want {
					differ++
					if differ <= 5 {
						t.Errorf("vocab %d, spread %g, T %g, top_p %g, top_k %d, draw %d: draw chose %d, the definition %d", vocab, spread, temperature, topP, topK, k, got, want)
					}
				}
			}
		}
	}
	if differ > 0 {
		t.Fatalf("%d of %d draws differ", differ, draws)
	}
	t.Logf("%d draws, every one the definition's", draws)
}

// TestMinPKeepsOnlyTheLikelyTokens: with min_p the draw is the race of
// the tokens at least min_p times as likely as the likeliest at the
// temperature (exp((z - max)/T) >= min_p), as Hugging Face's
// MinPLogitsWarper keeps them, and no other: over many seeds, no token
// below the line is ever chosen, and every one chosen is the
// definition's.
func TestMinPKeepsOnlyTheLikelyTokens(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, minP := range []float64{0.01, 0.1, 0.5, 1} {
		for _, temperature := range []float64{0.5, 1, 2} {
			logits := make([]float32, 300)
			for i := range logits {
				logits[i] = float32(2 * rng.NormFloat64())
			}
			z := make([]float64, len(logits))
			for i, l := range logits {
				z[i] = float64(l)
			}
			mx := z[argmax(z)]
			ids := make([]int, len(z))
			for i := range ids {
				ids[i] = i
			}
			for seed := range uint64(200) {
				s := NewSampler(temperature, 1, seed).WithMinP(minP)
				got, _ := s.Sample(logits)
				want := raceDefinition(z, ids, func(id int) float64 {
					if w := math.Exp((z[id] - mx) / temperature); w >= minP {
						return w
					}
					return 0
				}, drawKey(seed, 0))
				if got != want {
					t.Fatalf("min_p %g T %g seed %d: chose %d, the definition %d", minP, temperature, seed, got, want)
				}
				if w := math.Exp((z[got] - mx) / temperature); w < minP {
					t.Fatalf("min_p %g T %g: chose %d at %g of the likeliest", minP, temperature, got, w)
				}
			}
		}
	}
}

// TestRepeatPenaltyIsLlamaCpps: each token among the last n of the
// prompt and the chosen tokens has a positive logit divided by the
// penalty, a negative one multiplied, once however often it appears;
// tokens before the window are untouched.
func TestRepeatPenaltyIsLlamaCpps(t *testing.T) {
	// token 0 leads (2.0), 1 next (1.5), 2 and 3 negative
	logits := []float32{2, 1.5, -1, -1.2, 0.5}
	for _, tc := range []struct {
		name   string
		n      int
		prompt []int
		want   int
	}{
		{"0 in the window: 2/2 = 1 < 1.5", 4, []int{3, 0, 0}, 1},
		{"0 before the window", 2, []int{0, 4, 4}, 0},
		{"0 and 1 in it: 1 > 0.75", 8, []int{1, 0}, 0},
	} {
		s := NewSampler(0, 1, 0).WithRepeatPenalty(2, tc.n, tc.prompt)
		if got, _ := s.Sample(logits); got != tc.want {
			t.Errorf("%s: chose %d, want %d", tc.name, got, tc.want)
		}
	}
	// the chosen tokens join the window (n 2): each step's choice is the
	// definition's over the two tokens before it
	s := NewSampler(0, 1, 0).WithRepeatPenalty(2, 2, nil)
	var chosen []int
	for range 6 {
		id, _ := s.Sample(logits)
		chosen = append(chosen, id)
	}
	z := func(window []int) int {
		best, bestID := math.Inf(-1), -1
		for id, l := range logits {
			v := float64(l)
			if slices.Contains(window, id) {
				if v > 0 {
					v /= 2
				} else {
					v *= 2
				}
			}
			if v > best {
				best, bestID = v, id
			}
		}
		return bestID
	}
	var want []int
	for i := range 6 {
		want = append(want, z(chosen[max(i-2, 0):i]))
	}
	if !slices.Equal(chosen, want) {
		t.Fatalf("chose %v, the definition %v", chosen, want)
	}
}
