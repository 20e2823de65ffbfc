package mainnode

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/wire"
)

// link is the main node's connection to one worker: it routes each
// ExpertResult or Error to the request waiting for it. When the
// connection ends the link is down until a new connection to the same
// worker replaces it (rejoin).
type link struct {
	peer   atomic.Pointer[wire.Peer] // the current connection
	name   string                    // the worker's name, the same on every connection
	index  int
	stats  chan *wire.WorkerStats
	traces chan *wire.Trace
	counts workerCounts // what its results say it did, for the metrics

	mu        sync.Mutex
	waits     map[uint64]waiter
	err       error      // why the current connection ended; nil while it is up
	next      *wire.Peer // a new connection waiting to rejoin at a pass boundary
	redialing bool       // a goroutine is dialing the worker again
	// shareIn, if set, is called (once) when the worker says its share
	// is in (wire.ShareIn): a rejoined worker then takes its experts again
	shareIn func(fetched int64)
}

func newLink(p *wire.Peer, index int) *link {
	l := &link{name: p.Identity().Name, index: index, waits: map[uint64]waiter{},
		stats: make(chan *wire.WorkerStats, 1), traces: make(chan *wire.Trace, 1)}
	l.peer.Store(p)
	return l
}

// conn is the link's current connection (possibly ended).
func (l *link) conn() *wire.Peer { return l.peer.Load() }

// lostError is a request's reply when the connection to its worker ended
// before the results came: the request is re-sent to another worker.
type lostError struct {
	worker string
	err    error
}

func (e *lostError) Error() string { return "connection to " + e.worker + " lost: " + e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

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
		ch <- reply{id: id, err: &lostError{l.name, l.err}}
		return
	}
	l.waits[id] = waiter{ch, n}
}

// receive dispatches p's messages until the connection or ctx ends, then
// fails every waiting request with a *lostError, and returns the reason.
func (l *link) receive(ctx context.Context, p *wire.Peer) error {
	for {
		m, err := p.Recv(ctx)
		if err != nil {
			l.mu.Lock()
			l.err = err
			for id, w := range l.waits {
				select {
				case w.ch <- reply{id: id, err: &lostError{l.name, err}}:
				default:
				}
				delete(l.waits, id)
			}
			l.mu.Unlock()
			p.Close()
			return err
		}
		switch m := m.(type) {
		case *wire.ExpertResult:
			l.counts.add(m)
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
		case *wire.ShareIn:
			l.mu.Lock()
			f := l.shareIn
			l.shareIn = nil
			l.mu.Unlock()
			if f != nil {
				f(m.Fetched)
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
// device memory, ...) and returns them in worker order; a worker that is
// down or does not answer within timeout gets nil. A worker that rejoined
// counts from its restart.
func (s *Swarm) WorkerStats(ctx context.Context, timeout time.Duration) []*wire.WorkerStats {
	s.asking.Lock()
	defer s.asking.Unlock()
	out := make([]*wire.WorkerStats, len(s.workers))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	asked := make([]bool, len(s.workers))
	for i, l := range s.workers {
		select { // drop a stale answer
		case <-l.stats:
		default:
		}
		asked[i] = l.conn().Send(ctx, &wire.StatsRequest{}) == nil // fails at once on a connection that has ended
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

// PollWorkers asks the workers for their counters every period until
// ctx ends, keeping the latest answers for the metrics (device memory in
// use and resident experts are the workers' own: nothing else reports
// them while the swarm serves).
func (s *Swarm) PollWorkers(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.PollWorkersOnce(ctx, every/2)
		select {
		case <-ctx.Done():
			return
		case <-s.life.Done():
			return
		case <-t.C:
		}
	}
}

// PollWorkersOnce is one round of PollWorkers: a worker that does not
// answer within timeout keeps its earlier answer.
func (s *Swarm) PollWorkersOnce(ctx context.Context, timeout time.Duration) {
	got := s.WorkerStats(ctx, timeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.polled == nil {
		s.polled = make([]*wire.WorkerStats, len(got))
	}
	for i, st := range got {
		if st != nil {
			s.polled[i] = st
		}
	}
}
