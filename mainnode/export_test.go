package mainnode

import (
	"slices"

	"github.com/odmoe/odmoe/sched"
)

// RejoinReady reports whether a lost worker's new connection waits to
// rejoin at the next forward pass.
func (s *Swarm) RejoinReady() bool { return s.rejoins.Load() > 0 }

// Filling makes worker w one that is back but filling its share (its
// ShareIn still owed), as rejoin leaves it.
func (s *Swarm) Filling(w int) {
	l := s.workers[w]
	l.mu.Lock()
	l.shareIn = func(int64) {}
	l.mu.Unlock()
}

// ShadowReady reports whether a shadow connection waits to attach at the
// next forward pass.
func (s *Swarm) ShadowReady() bool {
	s.shadow.mu.Lock()
	defer s.shadow.mu.Unlock()
	return s.shadow.next != nil
}

// RebalanceEvery makes residency look at the placement every n decode
// passes (tests run few).
func (s *Swarm) RebalanceEvery(n int) { s.placer.every = int64(n) }

// PlacerCapacities is what the placer (-residency on) knows of each
// worker's memory and load bandwidth, nil without one.
func (s *Swarm) PlacerCapacities() []sched.Capacity {
	if s.placer == nil {
		return nil
	}
	s.placer.mu.Lock()
	defer s.placer.mu.Unlock()
	return slices.Clone(s.placer.caps)
}

// CheckStages is checkStages, for the external tests.
var CheckStages = checkStages
