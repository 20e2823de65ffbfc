package serve

import (
	"errors"
	"testing"
	"time"
)

// TestEventWriterNeverWaitsOnTheClient: while the client takes the first
// event (send blocks), put queues the rest at once; close sends them all,
// in order. A send that fails makes the next put and close report it.
func TestEventWriterNeverWaitsOnTheClient(t *testing.T) {
	gate := make(chan struct{})
	var got []any
	w := newEventWriter(func(v any) error {
		if len(got) == 0 {
			<-gate // the client reads nothing yet
		}
		got = append(got, v)
		return nil
	})
	queued := make(chan struct{})
	go func() {
		for i := range 100 {
			if err := w.put(i); err != nil {
				t.Error(err)
			}
		}
		close(queued)
	}()
	select {
	case <-queued:
	case <-time.After(10 * time.Second):
		t.Fatal("put waited on a client that reads nothing")
	}
	close(gate)
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 100 {
		t.Fatalf("sent %d events, want 100", len(got))
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("event %d is %v: out of order", i, v)
		}
	}

	gone := errors.New("client gone")
	sent := 0
	w = newEventWriter(func(any) error {
		if sent++; sent == 3 {
			return gone
		}
		return nil
	})
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		err = w.put(i)
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, gone) || !errors.Is(w.close(), gone) {
		t.Fatalf("after a failed send: put %v, close %v; want %v", err, w.close(), gone)
	}
}
