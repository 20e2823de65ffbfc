// Package sched holds the swarm's placement decisions as plain code, fed
// with layer numbers and routes and returning worker indices, so that the
// main node (which sends activations) and the shadow (which sends
// predictions) always agree on who runs what, and so that the decisions
// can be tested without a socket.
//
// Decode (OD-MoE section 3.1): workers form Workers/Group groups; layer l
// runs on group l mod groups, round robin, and the i-th of a layer's
// distinct experts (in id order) goes to the group's worker i mod Group,
// so each expert is loaded to exactly one worker.
//
// Resident (the fully cached reference, no loading at all): expert e of
// layer l lives on worker (e + l) mod Workers for good, in decode and
// prefill, so a layer's distinct experts sit on distinct workers whenever
// there are no more experts than workers.
//
// Prefill (section 3.3): every expert of a layer is likely used, so expert
// e of every layer runs on worker e mod Workers, all workers at once.
package sched

import (
	"fmt"
	"slices"
)

// Layout is how the workers are grouped.
type Layout struct {
	Workers int // worker count
	Group   int // workers per group (G; the router's top-k in OD-MoE)
}

// NewLayout checks that workers split into whole groups.
func NewLayout(workers, group int) (Layout, error) {
	if workers < 1 || group < 1 {
		return Layout{}, fmt.Errorf("sched: %d workers in groups of %d: both must be positive", workers, group)
	}
	if workers%group != 0 {
		return Layout{}, fmt.Errorf("sched: %d workers do not split into groups of %d: give -group %d (or a worker count that is a multiple of %d)",
			workers, group, DefaultGroup(workers, group), group)
	}
	return Layout{Workers: workers, Group: group}, nil
}

// DefaultGroup is the group size when none is given: the router's top-k
// (OD-MoE: one worker per expert of a token), or, when the workers do not
// split into groups of that many, the largest size below it that they do
// split into (1 worker: groups of 1).
func DefaultGroup(workers, topK int) int {
	for g := min(topK, workers); g > 1; g-- {
		if workers%g == 0 {
			return g
		}
	}
	return 1
}

// Groups is the number of worker groups.
func (l Layout) Groups() int { return l.Workers / l.Group }

// GroupOf is the group that runs layer in decode: layer mod Groups.
func (l Layout) GroupOf(layer int) int { return layer % l.Groups() }

// DecodeWorker is the worker that runs the i-th (in expert-id order) of
// the distinct experts layer uses for a decode step.
func (l Layout) DecodeWorker(layer, i int) int {
	return l.GroupOf(layer)*l.Group + i%l.Group
}

// PrefillWorker is the worker that runs expert in prefill, at every layer.
func (l Layout) PrefillWorker(expert int) int { return expert % l.Workers }

// Holds reports whether worker runs expert of layer in a swarm of
// cacheless workers (its share of the store, issue 56): every expert of
// the layers its group runs in decode (DecodeWorker hands a layer's
// experts to any of the group's workers) and, at every layer, the experts
// it runs in prefill (PrefillWorker). A swarm that loses a worker moves
// its work to live ones, which then run experts outside their shares.
func (l Layout) Holds(worker, layer, expert int) bool {
	return l.GroupOf(layer) == worker/l.Group || l.PrefillWorker(expert) == worker
}

// Owner is the worker that holds expert of layer in a resident swarm.
func (l Layout) Owner(layer, expert int) int { return (expert + layer) % l.Workers }

// Owners appends Owner(layer, e) for each of experts to dst.
func (l Layout) Owners(dst []int, layer int, experts []int) []int {
	for _, e := range experts {
		dst = append(dst, l.Owner(layer, e))
	}
	return dst
}

// Owned lists the experts of layer that worker holds in a resident swarm
// of a model with experts experts per layer.
func (l Layout) Owned(worker, layer, experts int) []int {
	var out []int
	for e := range experts {
		if l.Owner(layer, e) == worker {
			out = append(out, e)
		}
	}
	return out
}

// Assign appends to dst, for each of experts (distinct, sorted by id), the
// worker that runs it: DecodeWorker for a decode step, PrefillWorker for a
// prefill batch.
func (l Layout) Assign(dst []int, layer int, experts []int, prefill bool) []int {
	for i, e := range experts {
		if prefill {
			dst = append(dst, l.PrefillWorker(e))
		} else {
			dst = append(dst, l.DecodeWorker(layer, i))
		}
	}
	return dst
}

// PlaceDecode appends to dst the worker for each of experts (distinct,
// sorted) of a decode step of layer, keeping an expert on the worker that
// was told to load it (hinted: expert -> worker, from the shadow's
// prediction) when that worker is in the layer's group, and giving the
// others the group's remaining workers in order. So a correct prediction
// is a hit wherever the shadow placed it, and only a wrong one loads.
func (l Layout) PlaceDecode(dst []int, layer int, experts []int, hinted map[int]int) []int {
	g := l.GroupOf(layer)
	inGroup := func(w int) bool { return w/l.Group == g }
	taken := make(map[int]int, len(experts)) // worker -> experts placed on it
	start := len(dst)
	for _, e := range experts {
		w, ok := hinted[e]
		if !ok || !inGroup(w) {
			w = -1
		} else {
			taken[w]++
		}
		dst = append(dst, w)
	}
	// the rest round robin over the group, least loaded first
	for i, w := range dst[start:] {
		if w >= 0 {
			continue
		}
		best := -1
		for j := range l.Group {
			cand := g*l.Group + j
			if best < 0 || taken[cand] < taken[best] {
				best = cand
			}
		}
		dst[start+i] = best
		taken[best]++
	}
	return dst
}

// PlacePredicted is PlaceDecode for a prediction (distinct experts,
// sorted) whose i-th expert was hinted to on[i], or, when on is nil, to
// DecodeWorker(layer, i), as the random policy and a fresh prediction of
// the shadow do (PredictionWorkers); it allocates nothing. A worker in on
// outside layer's group, or -1 (no hint went out), counts as no hint.
func (l Layout) PlacePredicted(dst []int, layer int, experts, predicted, on []int) []int {
	start := len(dst)
	g := l.GroupOf(layer)
	for _, e := range experts {
		w := -1
		for i, p := range predicted {
			if p != e {
				continue
			}
			if on == nil {
				w = l.DecodeWorker(layer, i)
			} else if i < len(on) && on[i] >= g*l.Group && on[i] < (g+1)*l.Group {
				w = on[i]
			}
			break
		}
		dst = append(dst, w)
	}
	l.fillLeastLoaded(layer, dst[start:], nil) // the rest round robin over the group
	return dst
}

// fillLeastLoaded gives each entry of placed that is -1, in order, the
// worker of layer's group that placed holds least so far, ties to the
// lower; only workers up says are up, when up is set and some are.
func (l Layout) fillLeastLoaded(layer int, placed []int, up func(w int) bool) {
	g := l.GroupOf(layer)
	if up != nil {
		anyUp := false
		for j := range l.Group {
			anyUp = anyUp || up(g*l.Group+j)
		}
		if !anyUp {
			up = nil // none is: any will do
		}
	}
	for i, w := range placed {
		if w >= 0 {
			continue
		}
		best, bestLoad := -1, 0
		for j := range l.Group {
			cand, load := g*l.Group+j, 0
			if up != nil && !up(cand) {
				continue
			}
			for _, o := range placed {
				if o == cand {
					load++
				}
			}
			if best < 0 || load < bestLoad {
				best, bestLoad = cand, load
			}
		}
		placed[i] = best
	}
}

// PredictionWorkers appends to dst the worker of layer's group each
// predicted expert (distinct, sorted) is to be hinted to: an expert that
// was already predicted (was, sorted, hinted to wasOn) stays where it
// was; each other goes, in id order, to the group's least loaded worker
// that up (if set) says is up, ties to the lower (DecodeWorker(layer, j)
// order). With was empty and every worker up that is DecodeWorker(layer,
// i) for the i-th expert, PredictionHints' rule.
func (l Layout) PredictionWorkers(dst []int, layer int, predicted, was, wasOn []int, up func(w int) bool) []int {
	start := len(dst)
	for _, e := range predicted {
		w := -1
		if i, ok := slices.BinarySearch(was, e); ok && i < len(wasOn) {
			w = wasOn[i]
		}
		dst = append(dst, w)
	}
	l.fillLeastLoaded(layer, dst[start:], up)
	return dst
}

// PredictionHints calls f once for each worker of layer's group that a
// prediction (distinct experts, sorted) hints, with the experts it is to
// load: the i-th predicted expert goes to DecodeWorker(layer, i), which is
// where PlacePredicted expects it. buf is scratch for the experts handed
// to f (valid until f returns); the grown buffer is returned for reuse.
func (l Layout) PredictionHints(layer int, predicted, buf []int, f func(worker int, experts []int)) []int {
	for j := range min(l.Group, len(predicted)) {
		buf = buf[:0]
		for i := j; i < len(predicted); i += l.Group {
			buf = append(buf, predicted[i])
		}
		f(l.DecodeWorker(layer, j), buf)
	}
	return buf
}
