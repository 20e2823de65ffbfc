package mainnode

import (
	"slices"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// TestForwardedPredictionsAreTakenOncePerPassAndLayer: a main stage keeps
// the predictions its main node hands on by pass and layer, sorted with
// the workers they were hinted to; each is taken once; a later one of the
// same pass and layer replaces it; a pass that runs lets the earlier
// passes' go; a Withdraw of the sequence's passes from one on drops
// those (a worker's withdrawal of some experts does not); one for a pass
// already run is not kept; an ended sequence keeps none.
func TestForwardedPredictionsAreTakenOncePerPassAndLayer(t *testing.T) {
	f := newForwarded()
	pred := func(seq uint64, it int64, layer int, experts, workers []int32) *wire.Prediction {
		return &wire.Prediction{Seq: seq, Pass: it, Layer: layer, Experts: experts, Workers: workers, Token: -1}
	}
	f.heard(pred(7, 3, 2, []int32{5, 1}, []int32{1, 0}))
	f.heard(pred(7, 3, 2, []int32{9, 4}, []int32{0, 1})) // revised
	f.heard(pred(7, 3, 3, []int32{2, 6}, nil))
	f.heard(pred(7, 4, 2, []int32{8, 3}, nil))
	f.heard(pred(7, 5, 2, []int32{1, 2}, nil))
	f.heard(pred(8, 1, 2, []int32{0, 1}, nil))
	es, on := f.take(model.Step{Seq: 7, Pass: 3}, 2)
	if !slices.Equal(es, []int{4, 9}) || !slices.Equal(on, []int{1, 0}) {
		t.Fatalf("took %v on %v, want the revision [4 9] on [1 0]", es, on)
	}
	if es, _ := f.take(model.Step{Seq: 7, Pass: 3}, 2); es != nil {
		t.Fatalf("taken twice: %v", es)
	}
	f.heard(&wire.Withdraw{Seq: 7, From: 5, Layer: 2, Experts: []int32{1}}) // a worker's: not ours
	f.heard(&wire.Withdraw{Seq: 7, From: 5})
	if es, _ := f.take(model.Step{Seq: 7, Pass: 4}, 2); !slices.Equal(es, []int{3, 8}) {
		t.Fatalf("pass 4 took %v, want [3 8]", es)
	}
	if es, _ := f.take(model.Step{Seq: 7, Pass: 3}, 3); es != nil {
		t.Fatalf("pass 3's layer 3 kept after pass 4 ran: %v", es)
	}
	if es, _ := f.take(model.Step{Seq: 7, Pass: 5}, 2); es != nil {
		t.Fatalf("a withdrawn prediction was taken: %v", es)
	}
	f.heard(pred(7, 4, 3, []int32{1, 3}, nil)) // its pass has run
	if es, _ := f.take(model.Step{Seq: 7, Pass: 4}, 3); es != nil {
		t.Fatalf("a prediction for a pass run was kept: %v", es)
	}
	f.end(8)
	if es, _ := f.take(model.Step{Seq: 8, Pass: 1}, 2); es != nil || len(f.pred) != 0 {
		t.Fatalf("an ended sequence's prediction %v, %d kept", es, len(f.pred))
	}
}
