package model

import (
	"fmt"
	"math"

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
	topK(dst, probs)
	for i := range dst {
		dst[i].Weight = probs[dst[i].Expert]
	}
	if normTopK {
		renormalise(dst, 0)
	}
	sortRoutes(dst)
}

// topK puts in dst's experts the len(dst) largest of by, largest first
// (ties to the lower index), as torch.topk orders them.
func topK(dst []Route, by []float32) {
	for i := range dst {
		best := -1
		for e, v := range by {
			if !taken(dst[:i], e) && (best < 0 || v > by[best]) {
				best = e
			}
		}
		dst[i].Expert = best
	}
}

// renormalise divides the routes' weights by their sum plus eps, summed
// in the routes' order (topK's: descending, as torch sums topk's output).
func renormalise(dst []Route, eps float32) {
	var sum float32
	for _, r := range dst {
		sum += r.Weight
	}
	sum += eps
	for i := range dst {
		dst[i].Weight /= sum
	}
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

// GroupRouting is DeepSeek-V3's router (transformers'
// DeepseekV3TopkRouter), where a MoE block has one: sigmoid scores, a
// per-expert bias added for choosing only, the experts in Groups groups
// of which the GroupsKept with the highest sums of their two best biased
// scores are kept, top-k over the kept groups, weights the unbiased
// scores of the chosen (renormalised when NormTopK) times Scale.
type GroupRouting struct {
	Bias               []float32 // [experts]: e_score_correction_bias
	Groups, GroupsKept int       // n_group, topk_group
	Scale              float32   // routed_scaling_factor
}

// scratch is how many floats routeGrouped needs for experts.
func (g *GroupRouting) scratch(experts int) int { return 2*experts + g.Groups }

// routeGrouped turns one token's router logits into its top-k routes as
// transformers' DeepseekV3TopkRouter does, in float32: scores =
// sigmoid(logits); choice = scores + Bias; a group's score is the sum of
// its two best choices; the GroupsKept best groups are kept and every
// other expert's choice set to 0 (not minus infinity: with negative
// biases a dropped expert can still be chosen, as in transformers); the k
// best choices (ties to the lower index) are the routes, weighted by
// their scores, divided by their sum plus 1e-20 when normTopK, times
// Scale. scratch holds g.scratch(len(logits)) floats. The routes come
// back sorted by expert id, as route's.
func routeGrouped(dst []Route, logits, scratch []float32, g *GroupRouting, normTopK bool) {
	E := len(logits)
	scores, choice, groups := scratch[:E], scratch[E:2*E], scratch[2*E:2*E+g.Groups]
	for e, x := range logits {
		scores[e] = 1 / (1 + kernels.Exp(-x))
		choice[e] = scores[e] + g.Bias[e]
	}
	per := E / g.Groups
	for i := range groups {
		top1, top2 := -1, -1
		for e := i * per; e < (i+1)*per; e++ {
			switch {
			case top1 < 0 || choice[e] > choice[top1]:
				top1, top2 = e, top1
			case top2 < 0 || choice[e] > choice[top2]:
				top2 = e
			}
		}
		groups[i] = choice[top1]
		if top2 >= 0 {
			groups[i] += choice[top2]
		}
	}
	// keep the GroupsKept best groups: mark the others by zeroing their
	// experts' choices, as masked_fill(~mask, 0.0) does
	for range g.Groups - g.GroupsKept {
		worst := 0
		for i, s := range groups {
			if s < groups[worst] || s == groups[worst] && i > worst {
				worst = i
			}
		}
		clear(choice[worst*per : (worst+1)*per])
		groups[worst] = float32(math.Inf(1)) // dropped: never the worst again
	}
	topK(dst, choice)
	for i := range dst {
		dst[i].Weight = scores[dst[i].Expert]
	}
	if normTopK {
		renormalise(dst, 1e-20)
	}
	for i := range dst {
		dst[i].Weight *= g.Scale
	}
	sortRoutes(dst)
}

// routeTopKSoftmax turns one token's router logits (the router's bias
// already added) into its top-k routes as transformers' GptOssTopKRouter
// does: the k largest logits (ties to the lower index), weighted by the
// softmax of those k alone, in float32 (kernels.Softmax over them in
// descending order, as topk returns them). scratch holds k floats. The
// routes come back sorted by expert id, as route's.
func routeTopKSoftmax(dst []Route, logits, scratch []float32) {
	topK(dst, logits)
	for i := range dst {
		scratch[i] = logits[dst[i].Expert]
	}
	kernels.Softmax(scratch[:len(dst)])
	for i := range dst {
		dst[i].Weight = scratch[i]
	}
	sortRoutes(dst)
}
