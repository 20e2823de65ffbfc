package sim

import (
	"math"
	"math/rand/v2"
	"slices"
)

// skew draws a layer's experts unevenly (Profile.PromptSkew): the i-th
// most chosen expert of a layer with weight exp(-skew * i), each layer's
// order of its experts its own. The zero skew draws none: Run draws
// evenly then, as it always has.
type skew struct {
	weights []float64 // by rank, most chosen first
	order   [][]int   // per layer: its experts by rank
}

// newSkew is the skew of a Profile's PromptSkew for s, each layer's order
// drawn from seed (a source of its own, so that an even draw's run is
// what it always was); nil for none.
func newSkew(s Shape, by float64, seed uint64) *skew {
	if by <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x5ce3))
	k := &skew{weights: make([]float64, s.Experts), order: make([][]int, s.Layers)}
	for i := range k.weights {
		k.weights[i] = math.Exp(-by * float64(i))
	}
	for l := range k.order {
		k.order[l] = rng.Perm(s.Experts)
	}
	return k
}

// draw adds experts of layer l to e until it holds k distinct ones, each
// drawn by its weight among those not yet chosen.
func (k *skew) draw(rng *rand.Rand, l int, e []int, want int) []int {
	order := k.order[l]
	for len(e) < want {
		var total float64
		for i, x := range order {
			if !slices.Contains(e, x) {
				total += k.weights[i]
			}
		}
		u := rng.Float64() * total
		pick := -1
		for i, x := range order {
			if slices.Contains(e, x) {
				continue
			}
			pick = x
			if u -= k.weights[i]; u < 0 {
				break
			}
		}
		e = append(e, pick)
	}
	return e
}

// promptCounts are, for a layer of a prompt of n tokens routed as a
// profile of skew by draws them, the tokens each expert gets, averaged
// over many draws: the busiest expert's (what its layer waits for) and
// how many experts get any (what a reactive swarm loads).
func promptCounts(s Shape, n int, by float64) (busiest, used float64) {
	rng := rand.New(rand.NewPCG(0xb05, uint64(n)))
	k := newSkew(Shape{Layers: 1, Experts: s.Experts}, by, 0xb05)
	count := make([]int, s.Experts)
	const draws = 256
	e := make([]int, 0, s.TopK)
	for range draws {
		clear(count)
		for range n {
			e = e[:0]
			if k != nil {
				e = k.draw(rng, 0, e, s.TopK)
			} else {
				e = append(e, rng.Perm(s.Experts)[:s.TopK]...)
			}
			for _, x := range e {
				count[x]++
			}
		}
		busiest += float64(slices.Max(count))
		for _, c := range count {
			if c > 0 {
				used++
			}
		}
	}
	return busiest / draws, used / draws
}

// promptWorkers are, for a layer of a prompt of n tokens routed as a
// profile of skew by draws them, on workers workers each running the
// experts PrefillWorker gives it (expert mod workers), the experts its
// busiest worker runs and the tokens an expert it runs gets, averaged
// over many draws.
func promptWorkers(s Shape, n int, by float64, workers int) (experts, tokens float64) {
	rng := rand.New(rand.NewPCG(0xb05, uint64(n)))
	k := newSkew(Shape{Layers: 1, Experts: s.Experts}, by, 0xb05)
	count := make([]int, s.Experts)
	per := make([]int, workers)
	const draws = 256
	e := make([]int, 0, s.TopK)
	for range draws {
		clear(count)
		clear(per)
		for range n {
			e = e[:0]
			if k != nil {
				e = k.draw(rng, 0, e, s.TopK)
			} else {
				e = append(e, rng.Perm(s.Experts)[:s.TopK]...)
			}
			for _, x := range e {
				count[x]++
			}
		}
		used := 0
		for x, c := range count {
			if c > 0 {
				per[x%workers]++
				used++
			}
		}
		experts += float64(slices.Max(per))
		tokens += float64(n*s.TopK) / float64(used)
	}
	return experts / draws, tokens / draws
}
