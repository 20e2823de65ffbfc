package worker

import (
	"testing"

	"github.com/rs/zerolog"
)

// TestLatePredictionsAreCountedPerSequence: a prediction for a layer that
// has already run in that pass of its sequence is late; another
// sequence's progress never makes it so, and a sequence that ended is
// forgotten.
func TestLatePredictionsAreCountedPerSequence(t *testing.T) {
	arena, _ := NewArena(1 << 20)
	eng := NewEngine(nil, 8, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer eng.Close()
	s := NewServer(eng, zerolog.Nop())
	const a, b = 7, 9
	s.endLayer(a, 1, 0) // prefill
	s.endLayer(a, 2, 0)
	s.endLayer(a, 2, 1)
	s.endLayer(b, 1, 0) // another sequence, behind
	cases := []struct {
		seq   uint64
		it    int64
		layer int
		late  bool
	}{
		{a, 2, 0, true},  // layer 0 of pass 2 has run
		{a, 3, 0, false}, // the next pass's is early, good
		{a, 2, 1, true},
		{a, 2, 2, false}, // layer 2 has not run yet
		{b, 2, 0, false}, // b is still at its prompt: a's pass 2 says nothing about b's
		{b, 1, 0, true},
		{b, 1, 1, false},
	}
	for _, c := range cases {
		if got := s.ranLocked(c.seq, c.it, c.layer); got != c.late {
			t.Errorf("sequence %d pass %d layer %d: late=%v, want %v", c.seq, c.it, c.layer, got, c.late)
		}
	}
	s.endSequence(a)
	if !s.ranLocked(a, 3, 5) {
		t.Error("a prediction for sequence a after its end would still load experts")
	}
	if !s.ranLocked(b, 1, 0) {
		t.Error("ending sequence a forgot sequence b's progress")
	}
}
