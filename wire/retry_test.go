package wire

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestBackoffDoublesUpToItsCap(t *testing.T) {
	wait := backoff(100*time.Millisecond, time.Second)
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := wait(i + 1); got != w*time.Millisecond {
			t.Errorf("wait after failure %d = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
}

func TestRetryWaitsTheBackoffBetweenAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errDown := errors.New("not listening yet")
		var at []time.Duration
		start := time.Now()
		calls := 0
		err := retry(context.Background(), 10, backoff(100*time.Millisecond, time.Second), func() error {
			at = append(at, time.Since(start))
			calls++
			if calls < 6 {
				return errDown
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// 0, +100, +200, +400, +800, +1000 ms
		want := []time.Duration{0, 100, 300, 700, 1500, 2500}
		for i := range want {
			if at[i] != want[i]*time.Millisecond {
				t.Errorf("attempt %d at %v, want %v", i+1, at[i], want[i]*time.Millisecond)
			}
		}
	})
}

func TestRetryGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errDown := errors.New("not listening yet")
		calls := 0
		start := time.Now()
		err := retry(context.Background(), 3, backoff(time.Second, time.Minute), func() error { calls++; return errDown })
		if !errors.Is(err, errDown) || calls != 3 || time.Since(start) != 3*time.Second {
			t.Fatalf("err %v after %d calls and %v; want errDown after 3 calls and 3s", err, calls, time.Since(start))
		}

		calls = 0
		refused := &ConnError{Code: CodeIdentity}
		err = retry(context.Background(), 3, backoff(time.Second, time.Minute), func() error { calls++; return refused })
		if !errors.Is(err, ErrIdentity) || calls != 1 {
			t.Fatalf("a refusal was retried: %v after %d calls", err, calls)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		start = time.Now()
		err = retry(ctx, 100, backoff(time.Second, time.Minute), func() error { return errDown })
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 1500*time.Millisecond {
			t.Fatalf("err %v after %v, want the context's deadline at 1.5s", err, time.Since(start))
		}
	})
}

func TestRedialWaitDoublesFrom250msTo2s(t *testing.T) {
	want := []time.Duration{250, 500, 1000, 2000, 2000}
	for i, w := range want {
		if got := RedialWait(i + 1); got != w*time.Millisecond {
			t.Errorf("RedialWait(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
}

// TestRedialReportsEachFailureAndEndsWithItsContext: every failed attempt
// is reported before the wait that follows it, and the loop ends with its
// context, without a peer.
func TestRedialReportsEachFailureAndEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var failures []int
		start := time.Now()
		p, attempt, err := Redial(ctx, func(context.Context) (*Peer, error) { return nil, errors.New("no answer") },
			func(Identity) error { return nil },
			func(attempt int, err error) {
				failures = append(failures, attempt)
				if attempt == 3 {
					cancel()
				}
			})
		if p != nil || attempt != 3 || !errors.Is(err, context.Canceled) || len(failures) != 3 {
			t.Fatalf("peer %v, attempt %d, err %v, failures %v", p, attempt, err, failures)
		}
		if waited := time.Since(start); waited != 750*time.Millisecond { // 250 + 500 before attempts 2 and 3
			t.Fatalf("waited %v between attempts, want 750ms", waited)
		}
	})
}
