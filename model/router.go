package model

import (
	"fmt"

	"github.com/odmoe/odmoe/kernels"
)

// Route is one expert chosen for one token, with its mixing weight.
type Route struct {
	Expert int
	Weight float32
}

// route turns one token's router logits into its top-k routes, HF Mixtral
// style: softmax over all experts in float32, the k most probable (ties go
// to the lower index), weights renormalised to sum to one when normTopK.
// probs is scratch of len(logits). The routes come back sorted by expert
// id: the fixed order in which expert outputs are summed (swarm == local).
func route(dst []Route, logits, probs []float32, normTopK bool) {
	copy(probs, logits)
	kernels.Softmax(probs)
	k := len(dst)
	for i := range dst {
		best := -1
		for e, p := range probs {
			if taken(dst[:i], e) {
				continue
			}
			if best < 0 || p > probs[best] {
				best = e
			}
		}
		dst[i] = Route{Expert: best, Weight: probs[best]}
	}
	if normTopK {
		// sum in descending-probability order, as torch sums topk's output
		var sum float32
		for _, r := range dst[:k] {
			sum += r.Weight
		}
		for i := range dst {
			dst[i].Weight /= sum
		}
	}
	sortRoutes(dst)
}

func taken(rs []Route, e int) bool {
	for _, r := range rs {
		if r.Expert == e {
			return true
		}
	}
	return false
}

// sortRoutes orders routes by expert id (insertion sort: k is tiny and this
// runs per token per layer without allocating).
func sortRoutes(rs []Route) {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].Expert < rs[j-1].Expert; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}

// CheckRoutes validates routes received from elsewhere (a peer or a file)
// against the model's expert count.
func CheckRoutes(rs []Route, numExperts int) error {
	for i, r := range rs {
		if r.Expert < 0 || r.Expert >= numExperts {
			return fmt.Errorf("model: route %d names expert %d of %d", i, r.Expert, numExperts)
		}
	}
	return nil
}
