package worker

import "math"

// makeRoom frees one expert nobody computes with, for slot req of layer
// (nil: a request's compute buffers), in this order:
//
//  1. the coldest expert left resident that nobody holds;
//  2. the oldest loaded expert of a layer other than layer that no
//     sequence holds for a later pass than it runs (a wrong
//     prediction, or a resident expert); for a prediction itself held
//     for a later pass (a shadow running ahead), only one whose
//     layer its holders have gone past;
//  3. a prediction not used yet that every holder holds for a later
//     pass than its sequence runs and than req is for: the latest
//     first, so the current pass's loads come first;
//  4. for a request waiting now (not a prediction), the newest prediction
//     not used yet, whatever its layer (predictions come in the order
//     requests follow, so the newest is needed last; if it is needed
//     after all it loads again, a miss), then the coldest resident expert
//     a prediction holds but no sequence keeps for its prompt's next
//     mini-batch.
//
// An expert computing is never taken, nor one of this layer kept for a
// prompt (another layer's is, by the second rule, as before residency).
// It reports whether it freed one.
func (e *Engine) makeRoom(layer int, req *slot) bool {
	demand := req == nil || !req.prefetched
	reqAhead, reqIt := false, int64(math.MinInt64)
	if !demand {
		e.mu.Lock()
		reqAhead, reqIt = req.future(e.at)
		if !reqAhead {
			reqIt = req.firstPass()
		}
		e.mu.Unlock()
	}
	// a candidate: loaded, idle, and not pinned for good
	idle := func(s *slot) bool { return s.users == 0 && s.loaded && s.err == nil && !s.pinned }
	colderOf := func(a, b *slot) bool { return colder(a.heat, a.order, b.heat, b.order, e.clock) }
	older := func(a, b *slot) bool { return a.order < b.order }
	newer := func(a, b *slot) bool { return a.order > b.order }
	if e.evictOne(func(_ slotKey, s *slot) bool { return idle(s) && s.cached && len(s.holders) == 0 }, colderOf) {
		return true // left resident, nobody holds it
	}
	if e.evictOne(func(k slotKey, s *slot) bool {
		if !idle(s) || k.layer == layer {
			return false
		}
		if ahead, _ := s.future(e.at); ahead {
			return false
		}
		return !reqAhead || s.passed(k.layer, e.at)
	}, older) {
		return true // another layer's: a wrong prediction, or resident
	}
	if e.evictOne(func(_ slotKey, s *slot) bool {
		ahead, first := s.future(e.at)
		return idle(s) && !s.used && ahead && first > reqIt
	}, func(a, b *slot) bool {
		_, fa := a.future(e.at)
		_, fb := b.future(e.at)
		return fa > fb || fa == fb && a.order > b.order
	}) {
		return true // a prediction for a later pass
	}
	if !demand {
		return false
	}
	return e.evictOne(func(_ slotKey, s *slot) bool { return idle(s) && !s.used }, newer) || // a prediction not used yet
		e.evictOne(func(_ slotKey, s *slot) bool { return idle(s) && len(s.keepers) == 0 }, colderOf) // resident, predicted again
}

// evictOne drops the expert that eligible accepts and that comes first
// by before; it reports whether there was one. A resident expert dropped
// counts as evicted.
func (e *Engine) evictOne(eligible func(k slotKey, s *slot) bool, before func(a, b *slot) bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	var victim *slot
	var vk slotKey
	for k, s := range e.slots {
		if eligible(k, s) && (victim == nil || before(s, victim)) {
			victim, vk = s, k
		}
	}
	if victim == nil {
		return false
	}
	if victim.cached {
		e.Stats.Evicted.Add(1)
	}
	e.dropLocked(vk, victim)
	return true
}
