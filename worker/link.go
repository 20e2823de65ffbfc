package worker

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Link paces loads to emulate a device's host-to-device link (PCIe 3.0 x4
// on a Jetson ~4 GB/s; an RTX 3090 ~25 GB/s) so that timings on a CPU-only
// machine mean something. One link per worker: transfers queue behind each
// other, as on a real bus. A zero rate means unpaced.
type Link struct {
	bytesPerSec float64
	mu          sync.Mutex
	free        time.Time // when the link is next idle
	now         func() time.Time
	sleep       func(context.Context, time.Duration) error
	grain       time.Duration // the shortest sleep the process gets
}

// NewLink returns a link moving bytesPerSec (0: unpaced).
func NewLink(bytesPerSec float64) *Link {
	l := &Link{bytesPerSec: bytesPerSec, now: time.Now, sleep: sleepCtx}
	if bytesPerSec > 0 {
		l.grain = timerGrain()
	}
	return l
}

// timerGrain is the shortest sleep this process gets, measured once: on
// Linux ~1.1 ms, whatever shorter sleep is asked for, since Go's poller
// waits in whole milliseconds when nothing else wakes it.
var timerGrain = sync.OnceValue(func() time.Duration {
	var took []time.Duration
	for range 5 {
		t0 := time.Now()
		time.Sleep(10 * time.Microsecond)
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)
	return took[len(took)/2]
})

// Transfer blocks until n bytes have crossed the link after every transfer
// queued before it. It books the link first and sleeps after, so
// concurrent callers queue without holding a lock while they wait, and
// the timer's grain never accumulates (the schedule is kept in absolute
// time). A wait shorter than half the grain is not slept: the sleep would
// last the whole grain (a 192 KiB expert at 4 GB/s, 49 us, would take
// 1.1 ms, 22 times its time), so the transfer ends that much early
// instead, while the link stays booked until its true end, so that a run
// of such transfers still moves at the link's rate.
func (l *Link) Transfer(ctx context.Context, n int64) error {
	if l == nil || l.bytesPerSec <= 0 || n <= 0 {
		return nil
	}
	d := time.Duration(float64(n) / l.bytesPerSec * float64(time.Second))
	l.mu.Lock()
	now := l.now()
	start := l.free
	if start.Before(now) {
		start = now
	}
	l.free = start.Add(d)
	done := l.free
	l.mu.Unlock()
	if wait := done.Sub(now); wait >= l.grain/2 {
		return l.sleep(ctx, wait)
	}
	return ctx.Err()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
