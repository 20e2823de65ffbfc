package worker

import (
	"context"
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
}

// NewLink returns a link moving bytesPerSec (0: unpaced).
func NewLink(bytesPerSec float64) *Link {
	return &Link{bytesPerSec: bytesPerSec, now: time.Now, sleep: sleepCtx}
}

// Transfer blocks until n bytes have crossed the link after every transfer
// queued before it. It books the link first and sleeps after, so
// concurrent callers queue without holding a lock while they wait, and
// Go's ~1 ms timer granularity never accumulates (the schedule is kept in
// absolute time).
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
	return l.sleep(ctx, done.Sub(now))
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
