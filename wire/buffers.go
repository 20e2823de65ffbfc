package wire

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// peerBuffers is the room a connection's received frames may take: its
// own (Config.MaxConnBufferedBytes) and, for a connection a Listener
// accepted, a share of the listener's (Config.MaxBufferedBytes). A frame
// reserves its length before its body is read and gives it back when
// Recv hands its message out (or it is dropped); what the connection
// still holds when it ends goes back to the listener.
type peerBuffers struct {
	ctx   context.Context // the connection's: waiting for room ends with it
	conn  *semaphore.Weighted
	all   *semaphore.Weighted // nil for a dialed connection
	stats *Stats

	mu    sync.Mutex
	held  int64 // of all, not yet given back
	ended bool
}

func newPeerBuffers(ctx context.Context, cfg *Config, all *semaphore.Weighted) *peerBuffers {
	return &peerBuffers{ctx: ctx, conn: semaphore.NewWeighted(cfg.MaxConnBufferedBytes), all: all, stats: cfg.Stats}
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
	if !b.all.TryAcquire(n) {
		b.stats.BufferWaits.Add(1)
		if err := b.all.Acquire(b.ctx, n); err != nil {
			b.conn.Release(n)
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended { // the connection ended meanwhile: nothing will give it back
		b.all.Release(n)
	} else {
		b.held += n
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
	if !b.ended {
		b.held -= n
		b.all.Release(n)
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
