package worker

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestLinkQueuesTransfersAtItsRate: three 4 MB transfers on a 4 MB/s link
// issued together finish at 1 s, 2 s and 3 s (fake clock via synctest).
func TestLinkQueuesTransfersAtItsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLink(4e6)
		start := time.Now()
		var mu sync.Mutex
		var done []time.Duration
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				if err := l.Transfer(context.Background(), 4e6); err != nil {
					t.Error(err)
				}
				mu.Lock()
				done = append(done, time.Since(start))
				mu.Unlock()
			})
			synctest.Wait() // issue in order
		}
		wg.Wait()
		want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
		for i := range want {
			if done[i] != want[i] {
				t.Fatalf("transfer %d finished at %v, want %v (all: %v)", i, done[i], want[i], done)
			}
		}
		// an idle link does not bank credit: the next transfer takes 1 s again
		time.Sleep(10 * time.Second)
		t0 := time.Now()
		l.Transfer(context.Background(), 4e6)
		if d := time.Since(t0); d != time.Second {
			t.Fatalf("after idling, transfer took %v", d)
		}
	})
}

func TestUnpacedLinkAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if err := NewLink(0).Transfer(context.Background(), 1<<40); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		l := NewLink(1)
		errc := make(chan error)
		go func() { errc <- l.Transfer(ctx, 1000) }()
		synctest.Wait()
		cancel()
		if err := <-errc; err != context.Canceled {
			t.Fatalf("cancelled transfer: %v", err)
		}
	})
}

// TestLinkDoesNotSleepBelowTheTimerGrain: a transfer whose wait is under
// half the timer's grain ends at once instead of sleeping the grain out,
// while the link stays booked: twenty 100 us transfers on a 1 ms grain
// still take their 2 ms together, ending ahead by less than half a grain.
func TestLinkDoesNotSleepBelowTheTimerGrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLink(1e9) // 100 us per 100 kB
		l.grain = time.Millisecond
		t0 := time.Now()
		if err := l.Transfer(context.Background(), 1e5); err != nil || time.Since(t0) != 0 {
			t.Fatalf("a 100 us transfer slept %v (%v), want none", time.Since(t0), err)
		}
		for range 19 {
			if err := l.Transfer(context.Background(), 1e5); err != nil {
				t.Fatal(err)
			}
		}
		if d := time.Since(t0); d < 1500*time.Microsecond || d > 2*time.Millisecond {
			t.Fatalf("twenty 100 us transfers took %v, want 2 ms less at most half a grain", d)
		}
		// a wait of a grain or more is slept whole
		time.Sleep(time.Second)
		t0 = time.Now()
		l.Transfer(context.Background(), 3e6)
		if d := time.Since(t0); d != 3*time.Millisecond {
			t.Fatalf("a 3 ms transfer took %v", d)
		}
	})
}
