package mainnode

import (
	"context"
	"sync"
	"time"

	"github.com/odmoe/odmoe/wire"
)

// link is the main node's connection to one worker: it routes each
// ExpertResult or Error to the request waiting for it.
type link struct {
	peer   *wire.Peer
	index  int
	stats  chan *wire.WorkerStats
	traces chan *wire.Trace

	mu    sync.Mutex
	waits map[uint64]waiter
	err   error // set when the connection ended
}

// waiter is a request waiting for its replies.
type waiter struct {
	ch   chan reply
	left int // results still to come
}

type reply struct {
	id  uint64 // the request's
	res *wire.ExpertResult
	err error
	at  time.Time // when it arrived
}

// expect registers the channel that receives the n replies to request id;
// ch must have room for them (a channel may serve several requests).
func (l *link) expect(id uint64, n int, ch chan reply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		ch <- reply{id: id, err: l.err}
		return
	}
	l.waits[id] = waiter{ch, n}
}

// receive dispatches messages until the connection or ctx ends, then
// fails every waiting request with the reason, and returns it.
func (l *link) receive(ctx context.Context) error {
	for {
		m, err := l.peer.Recv(ctx)
		if err != nil {
			l.mu.Lock()
			l.err = err
			for id, w := range l.waits {
				select {
				case w.ch <- reply{id: id, err: err}:
				default:
				}
				delete(l.waits, id)
			}
			l.mu.Unlock()
			return err
		}
		switch m := m.(type) {
		case *wire.ExpertResult:
			l.deliver(reply{id: m.ID, res: m, at: time.Now()})
		case *wire.Error:
			l.deliver(reply{id: m.ID, err: m})
		case *wire.WorkerStats:
			select {
			case l.stats <- m:
			default:
			}
		case *wire.Trace:
			select {
			case l.traces <- m:
			default:
			}
		}
	}
}

// deliver hands r to the request it answers; after its last result or an
// error the request is over, and what else comes for it is dropped.
func (l *link) deliver(r reply) {
	l.mu.Lock()
	w, ok := l.waits[r.id]
	if ok {
		w.left--
		if w.left <= 0 || r.err != nil {
			delete(l.waits, r.id)
		} else {
			l.waits[r.id] = w
		}
	}
	l.mu.Unlock()
	if !ok {
		return
	}
	select {
	case w.ch <- r:
	default: // cannot happen: the channel has room for every result it expects
	}
}

// WorkerStats asks every worker for its counters (loads, misses, peak
// device memory, ...) and returns them in worker order; a worker that
// does not answer within timeout gets nil.
func (s *Swarm) WorkerStats(ctx context.Context, timeout time.Duration) []*wire.WorkerStats {
	out := make([]*wire.WorkerStats, len(s.workers))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	asked := make([]bool, len(s.workers))
	for i, l := range s.workers {
		select { // drop a stale answer
		case <-l.stats:
		default:
		}
		asked[i] = l.peer.Send(ctx, &wire.StatsRequest{}) == nil
	}
	for i, l := range s.workers {
		if !asked[i] {
			continue
		}
		select {
		case out[i] = <-l.stats:
		case <-ctx.Done():
		}
	}
	return out
}
