package worker

import (
	"testing"

	"github.com/rs/zerolog"
)

// TestLatePredictionsAreDroppedUntilANewSequence: a prediction for a layer
// that has already run in that iteration is late; when iterations start
// again (a new prompt) predictions count again.
func TestLatePredictionsAreDroppedUntilANewSequence(t *testing.T) {
	arena, _ := NewArena(1 << 20)
	eng := NewEngine(nil, 8, arena, NewLink(0), zerolog.Nop())
	defer eng.Close()
	s := NewServer(eng, zerolog.Nop())
	s.endLayer(1, 0) // prefill
	s.endLayer(2, 0)
	s.endLayer(2, 1)
	cases := []struct {
		it    int64
		layer int
		late  bool
	}{
		{2, 0, true},  // layer 0 of iteration 2 has run
		{3, 0, false}, // the next iteration's is early, good
		{2, 1, true},
		{2, 2, false}, // layer 2 has not run yet
	}
	for _, c := range cases {
		if got := s.ranLocked(c.it, c.layer); got != c.late {
			t.Errorf("iteration %d layer %d: late=%v, want %v", c.it, c.layer, got, c.late)
		}
	}
	s.endLayer(1, 0) // a new sequence's prefill
	if s.ranLocked(2, 1) {
		t.Error("after a new sequence began, layer 1 of iteration 2 still counts as run")
	}
}
