package sim

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/odmoe/odmoe/sched"
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

// promptLayer is what a prompt layer's routing gives its experts,
// averaged over many draws (promptDraws).
type promptLayer struct {
	busiest float64 // the tokens the busiest expert gets (what its layer waits for)
	used    float64 // the experts that get any (what a reactive swarm loads)
	// on a layout's workers (each running the experts PrefillWorker gives
	// it; none without one): the experts the busiest worker runs, and the
	// tokens an expert gets
	workerExperts, tokens float64
}

// promptDraws is promptLayer for a layer of a prompt of n tokens routed
// as a profile of skew by draws them, on layout l (the zero Layout: no
// workers counted).
func promptDraws(s Shape, n int, by float64, l sched.Layout) promptLayer {
	rng := rand.New(rand.NewPCG(0xb05, uint64(n)))
	k := newSkew(Shape{Layers: 1, Experts: s.Experts}, by, 0xb05)
	count := make([]int, s.Experts)
	per := make([]int, l.Workers)
	const draws = 256
	e := make([]int, 0, s.TopK)
	var out promptLayer
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
		out.busiest += float64(slices.Max(count))
		clear(per)
		used := 0
		for x, c := range count {
			if c > 0 {
				used++
				if l.Workers > 0 {
					per[l.PrefillWorker(x)]++
				}
			}
		}
		out.used += float64(used)
		if l.Workers > 0 {
			out.workerExperts += float64(slices.Max(per))
			out.tokens += float64(n*s.TopK) / float64(used)
		}
	}
	out.busiest, out.used, out.workerExperts, out.tokens = out.busiest/draws, out.used/draws, out.workerExperts/draws, out.tokens/draws
	return out
}
