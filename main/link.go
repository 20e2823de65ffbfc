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
	beats  chan *wire.Heartbeat
	traces chan *wire.Trace

	mu    sync.Mutex
	waits map[uint64]chan reply
	err   error // set when the connection ended
}

type reply struct {
	res *wire.ExpertResult
	err error
	at  time.Time // when it arrived
}

// expect registers the channel that receives the replies to request id.
func (l *link) expect(id uint64, ch chan reply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		ch <- reply{err: l.err}
		return
	}
	l.waits[id] = ch
}

// receive dispatches messages until the connection ends, then fails every
// waiting request with the reason.
func (l *link) receive() {
	for {
		m, err := l.peer.Recv(context.Background())
		if err != nil {
			l.mu.Lock()
			l.err = err
			for id, ch := range l.waits {
				select {
				case ch <- reply{err: err}:
				default:
				}
				delete(l.waits, id)
			}
			l.mu.Unlock()
			return
		}
		switch m := m.(type) {
		case *wire.ExpertResult:
			l.deliver(m.ID, reply{res: m, at: time.Now()}, false)
		case *wire.Error:
			l.deliver(m.ID, reply{err: m}, true)
		case *wire.Heartbeat:
			select {
			case l.beats <- m:
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

// deliver hands r to request id; after an error the request is over.
func (l *link) deliver(id uint64, r reply, last bool) {
	l.mu.Lock()
	ch, ok := l.waits[id]
	if ok && last {
		delete(l.waits, id)
	}
	l.mu.Unlock()
	if !ok {
		return
	}
	select {
	case ch <- r:
	default: // the request has all it wanted
	}
	if !last && len(ch) == cap(ch) {
		l.mu.Lock()
		delete(l.waits, id)
		l.mu.Unlock()
	}
}

// WorkerMetrics asks every worker for its counters (loads, misses, peak
// device memory, ...) and returns them in worker order; a worker that
// does not answer within timeout gets nil.
func (s *Swarm) WorkerMetrics(ctx context.Context, timeout time.Duration) []wire.Metrics {
	out := make([]wire.Metrics, len(s.workers))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, l := range s.workers {
		select { // drop a stale answer
		case <-l.beats:
		default:
		}
		if err := l.peer.Send(ctx, &wire.Heartbeat{Seq: uint64(l.index), UnixNano: time.Now().UnixNano()}); err != nil {
			continue
		}
	}
	for i, l := range s.workers {
		select {
		case hb := <-l.beats:
			out[i] = hb.Stats
		case <-ctx.Done():
		}
	}
	return out
}
