package wire

import (
	"context"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// peerBuffers is the room a connection's received frames may take: its
// own (Config.MaxConnBufferedBytes) and, for a connection a Listener
// accepted, a share of the listener's pool (Config.MaxBufferedBytes)
// beyond the first ConnGuaranteedBytes, which are the connection's alone:
// however other connections hold the pool, its small frames (every
// decode activation, a prefill mini-batch) never wait. A frame reserves
// its length before its body is read and gives it back when Recv hands
// its message out (or it is dropped); what the connection still holds of
// the pool when it ends goes back to it, and the memory of bodies cut
// short goes back to the OS (memoryBack).
type peerBuffers struct {
	ctx        context.Context // the connection's: waiting for room ends with it
	conn       *semaphore.Weighted
	all        *semaphore.Weighted // nil for a dialed connection
	stats      *Stats
	guaranteed int64 // the room of its own before the pool (ConnGuaranteedBytes)

	mu    sync.Mutex
	held  int64 // of all, not yet given back
	own   int64 // of guaranteed, in use
	ended bool
}

func newPeerBuffers(ctx context.Context, cfg *Config, all *semaphore.Weighted) *peerBuffers {
	return &peerBuffers{ctx: ctx, conn: semaphore.NewWeighted(cfg.MaxConnBufferedBytes), all: all, stats: cfg.Stats, guaranteed: cfg.ConnGuaranteedBytes}
}

// reserve waits for room for n bytes, first on the connection, then on
// the listener; it fails only when the connection ends.
func (b *peerBuffers) reserve(n int64) error {
	if !b.conn.TryAcquire(n) {
		b.stats.BufferWaits.Add(1)
		if err := b.conn.Acquire(b.ctx, n); err != nil {
			return err
		}
	}
	if b.all == nil {
		return nil
	}
	b.mu.Lock()
	own := min(n, b.guaranteed-b.own) // the connection's own room first
	b.own += own
	b.mu.Unlock()
	pool := n - own
	if pool == 0 {
		return nil
	}
	if !b.all.TryAcquire(pool) {
		b.stats.BufferWaits.Add(1)
		if err := b.all.Acquire(b.ctx, pool); err != nil {
			b.mu.Lock()
			b.own -= own
			b.mu.Unlock()
			b.conn.Release(n)
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended { // the connection ended meanwhile: nothing will give it back
		b.all.Release(pool)
	} else {
		b.held += pool
	}
	return nil
}

// unreserve gives back n bytes reserved by reserve.
func (b *peerBuffers) unreserve(n int64) {
	b.conn.Release(n)
	if b.all == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// the pool first: which frame took which room does not matter, only
	// that the connection never holds more of its own than guaranteed
	pool := min(n, b.held)
	b.own -= n - pool
	if !b.ended && pool > 0 {
		b.held -= pool
		b.all.Release(pool)
	}
}

// end gives the listener back what the connection still holds (messages
// never received, frames cut short).
func (b *peerBuffers) end() {
	if b.all == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.ended {
		b.ended = true
		b.all.Release(b.held)
		b.held = 0
	}
}

// dropAfterBytes is how big a frame body cut short must be for
// memoryBack to run.
const dropAfterBytes = 4 << 20

// memoryBack gives the OS back the memory of frame bodies cut short (a
// connection that ended inside them, a stalled body): Go's collector
// frees them at its next cycle, which a node idle after an attack may
// not run for two minutes, and only then does its scavenger return the
// pages, so what a peer made this node buffer would stay resident long
// after it left.
var memoryBack = releaser{delay: time.Second}

// releaser runs debug.FreeOSMemory delay after it is asked to, once for
// every request made meanwhile (the goroutines holding the dropped frames
// end first).
type releaser struct {
	delay   time.Duration
	mu      sync.Mutex
	pending bool
}

func (r *releaser) soon() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending {
		return
	}
	r.pending = true
	time.AfterFunc(r.delay, func() {
		r.mu.Lock()
		r.pending = false
		r.mu.Unlock()
		// twice: what sync.Pools hold (quic-go's packet buffers, pooled
		// first pieces of bodies) is freed at the second collection only
		debug.FreeOSMemory()
		debug.FreeOSMemory()
	})
}
