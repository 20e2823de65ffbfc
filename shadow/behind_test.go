package shadow

import (
	"context"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
)

// TestShadowBehindTheMainNodeHintsNoLoads: a layer predicted for an
// pass the main node has already left (its next alignment has
// arrived) still goes to the main node, for scoring, but hints no
// worker, and is counted; the same layer before that hints its workers.
// A sequence that restarts (a prompt alignment) starts the count of its
// passes afresh, and an ended one is forgotten.
func TestShadowBehindTheMainNodeHintsNoLoads(t *testing.T) {
	layout, err := sched.NewLayout(4, 2)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan outgoing, 64)
	n := &Node{layout: layout, out: out}
	for range 4 {
		w := &workerLink{}
		w.up.Store(true)
		n.workers = append(n.workers, w)
	}
	routes := []model.Route{{Expert: 1, Weight: 0.5}, {Expert: 6, Weight: 0.5}}
	sent := func() (workers, main int) {
		for {
			select {
			case o := <-out:
				if o.worker >= 0 {
					workers++
				} else {
					main++
				}
			default:
				return workers, main
			}
		}
	}
	ctx := context.Background()
	n.started.saw(&wire.Alignment{Seq: 9, Pass: 5, History: []int32{1, 2}})
	n.predict(ctx, 9, 5, 3, 0, routes, nil)
	if w, m := sent(); w == 0 || m != 1 {
		t.Fatalf("pass 5 while the main node runs it: %d worker hints, %d predictions to the main node; want hints and 1", w, m)
	}
	n.started.saw(&wire.Alignment{Seq: 9, Pass: 6})
	n.predict(ctx, 9, 5, 3, 1, routes, nil)
	if w, m := sent(); w != 0 || m != 1 || n.unhinted != 1 {
		t.Fatalf("pass 5 after the main node started 6: %d worker hints, %d predictions, %d unhinted; want 0, 1, 1", w, m, n.unhinted)
	}
	n.started.saw(&wire.Alignment{Seq: 9, Pass: 2, History: []int32{1, 2, 3}}) // restarted
	if n.started.passed(9, 2) || !n.started.passed(9, 1) {
		t.Fatal("a restarted sequence kept its old passes")
	}
	n.started.forget(9)
	if n.started.passed(9, 0) {
		t.Fatal("an ended sequence is still remembered")
	}
}
