package shadow

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
)

// hintNode is a shadow over workers of layout (all up) whose messages
// stay in its queue; sent drains them, one line each.
func hintNode(t *testing.T, layout sched.Layout) (*Node, func() []string) {
	t.Helper()
	out := make(chan outgoing, 64)
	n := &Node{layout: layout, out: out}
	for range layout.Workers {
		w := &workerLink{}
		w.up.Store(true)
		n.workers = append(n.workers, w)
	}
	return n, func() []string {
		var lines []string
		for {
			select {
			case o := <-out:
				to := "main"
				if o.worker >= 0 {
					to = fmt.Sprintf("w%d", o.worker)
				}
				switch m := o.msg.(type) {
				case *wire.Prediction:
					if m.Workers != nil {
						lines = append(lines, fmt.Sprintf("%s predict %v on %v", to, m.Experts, m.Workers))
					} else {
						lines = append(lines, fmt.Sprintf("%s predict %v", to, m.Experts))
					}
				case *wire.Withdraw:
					lines = append(lines, fmt.Sprintf("%s withdraw %v", to, m.Experts))
				}
			default:
				return lines
			}
		}
	}
}

// TestHintsGoToOwnersWhenResident: with experts resident on their
// owners, a prediction is split by owner, each hinted once with the
// experts it owns, in id order, and the main node is told each expert's
// owner.
func TestHintsGoToOwnersWhenResident(t *testing.T) {
	layout, _ := sched.NewLayout(4, 2)
	n, sent := hintNode(t, layout)
	owners, err := sched.NewPlacement(4, []int{0, 2}, 8)
	if err != nil {
		t.Fatal(err)
	}
	n.owners = owners
	n.hint(context.Background(), 1, 2, 5, 2, []int{0, 1, 2, 4, 6}, nil)
	// layer 2: owner (e+2) mod 4: e0 -> w2, e1 -> w3, e2 -> w0, e4 -> w2, e6 -> w0
	want := []string{"w2 predict [0 4]", "w3 predict [1]", "w0 predict [2 6]", "main predict [0 1 2 4 6] on [2 3 0 2 0]"}
	if got := sent(); !slices.Equal(got, want) {
		t.Fatalf("hints %q, want %q", got, want)
	}
}

// TestARevisedPredictionMovesNothingThatStays: layer 1 of a pass run
// ahead predicted experts 1, 4, 6 and 9 (layer 1's group of 4x2, the
// second: w2 and w3, by index). Revised to 0, 1, 6, 9, 11 (the row that wanted 4 was taken
// back, a new row wants 0 and 11): 1, 6 and 9 are neither hinted again
// nor moved, 4 is withdrawn from the worker it was hinted to, 0 and 11
// go to the less loaded workers, and the main node is told where each
// is. A worker that is down gets no hint: its share goes to the group's
// live worker, fresh or revised (an expert it held moves); with the
// whole group down, nothing is hinted and the main node hears that each
// expert went nowhere (-1).
func TestARevisedPredictionMovesNothingThatStays(t *testing.T) {
	layout, _ := sched.NewLayout(4, 2)
	n, sent := hintNode(t, layout)
	ctx := context.Background()
	on := slices.Clone(n.hint(ctx, 7, 3, 5, 1, []int{1, 4, 6, 9}, nil))
	want := []string{"w2 predict [1 6]", "w3 predict [4 9]", "main predict [1 4 6 9] on [2 3 2 3]"}
	if got := sent(); !slices.Equal(got, want) {
		t.Fatalf("first prediction: %q, want %q", got, want)
	}
	was := &layerHints{experts: []int{1, 4, 6, 9}, on: on}
	n.hint(ctx, 7, 3, 6, 1, []int{0, 1, 6, 9, 11}, was)
	// after 4 leaves w3, w2 holds 1 and 6, w3 holds 9: 0 goes to w3, then 11 to w2 (a tie: the lower)
	want = []string{"w3 predict [0]", "w2 predict [11]", "w3 withdraw [4]", "main predict [0 1 6 9 11] on [3 2 2 3 2]"}
	if got := sent(); !slices.Equal(got, want) {
		t.Fatalf("revised prediction: %q, want %q", got, want)
	}
	n.workers[3].up.Store(false)
	n.hint(ctx, 7, 4, 6, 1, []int{2, 5}, nil)
	want = []string{"w2 predict [2 5]", "main predict [2 5] on [2 2]"}
	if got := sent(); !slices.Equal(got, want) {
		t.Fatalf("with w3 down: %q, want %q", got, want)
	}
	// revised while w3 is down: its kept expert moves to the live worker
	// of the group and is hinted there; nothing goes to w3
	n.hint(ctx, 7, 5, 6, 1, []int{2, 5}, &layerHints{experts: []int{2, 5}, on: []int{2, 3}})
	want = []string{"w2 predict [5]", "main predict [2 5] on [2 2]"}
	if got := sent(); !slices.Equal(got, want) {
		t.Fatalf("revised with w3 down: %q, want %q", got, want)
	}
	n.workers[2].up.Store(false)
	n.hint(ctx, 7, 6, 6, 1, []int{2, 5}, nil)
	want = []string{"main predict [2 5] on [-1 -1]"}
	if got := sent(); !slices.Equal(got, want) {
		t.Fatalf("with the whole group down: %q, want %q", got, want)
	}
}

// TestAPassRunAheadRecordsItsHintsWithoutAllocating: recording a layer's
// hints in a pass run ahead (for a later revision) reuses the record's
// buffers: predict allocates no more with a record than without one (its
// messages, which the sender owns, are all it allocates).
func TestAPassRunAheadRecordsItsHintsWithoutAllocating(t *testing.T) {
	layout, _ := sched.NewLayout(4, 2)
	n, _ := hintNode(t, layout)
	out := make(chan outgoing, 4096)
	n.out = out
	routes := []model.Route{{Expert: 1}, {Expert: 6}, {Expert: 6}, {Expert: 3}}
	ctx := context.Background()
	var bf passFollow
	bf.pushAhead(2, 2)
	rec := &bf.ahead[0]
	n.predict(ctx, 9, 2, 5, 1, routes, rec) // the record's buffers grow once
	drain := func() {
		for len(out) > 0 {
			<-out
		}
	}
	without := testing.AllocsPerRun(50, func() { n.predict(ctx, 9, 2, 5, 1, routes, nil); drain() })
	with := testing.AllocsPerRun(50, func() { n.predict(ctx, 9, 2, 5, 1, routes, rec); drain() })
	if with > without {
		t.Fatalf("predict allocates %v times with a record, %v without", with, without)
	}
	if lh := rec.layers[1]; !slices.Equal(lh.rows, []int{1, 6, 6, 3}) || !slices.Equal(lh.experts, []int{1, 3, 6}) || len(lh.on) != 3 {
		t.Fatalf("recorded %+v, want rows [1 6 6 3], experts [1 3 6] with their workers", lh)
	}
	// a retired record's buffers serve the next pass run ahead
	bf.retire(bf.ahead[0])
	bf.ahead = bf.ahead[:0]
	bf.pushAhead(3, 2)
	if p := bf.ahead[0]; p.it != 3 || len(p.layers[1].rows) != 0 || cap(p.layers[1].rows) < 4 {
		t.Fatalf("reused record: pass %d, layer 1 rows %v (cap %d); want pass 3, emptied, its buffer kept", p.it, p.layers[1].rows, cap(p.layers[1].rows))
	}
}
