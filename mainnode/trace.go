package mainnode

import (
	"context"
	"fmt"
	"time"

	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/wire"
)

// StartTrace starts recording passes from..to on this node (its
// Options.Trace), on every worker and on the shadow. Call it before the
// prompt: a node drops what it recorded before.
func (s *Swarm) StartTrace(ctx context.Context, from, to int64) error {
	if s.opt.Trace == nil {
		return fmt.Errorf("mainnode: tracing needs Options.Trace")
	}
	s.opt.Trace.Window(from, to)
	s.traced = [2]int64{from, to}
	w := &wire.Trace{From: from, To: to}
	for i := range s.workers {
		if err := s.sendTo(ctx, i, w); err != nil {
			return err
		}
	}
	if p := s.shadowConn(); p != nil {
		if err := p.Send(ctx, w); err != nil {
			return fmt.Errorf("mainnode: starting the shadow's trace: %w", err)
		}
	}
	return nil
}

// clockProbes is how many clock round trips CollectTrace makes per node;
// it keeps the one with the shortest round trip.
const clockProbes = 8

// CollectTrace gathers what every node recorded since StartTrace into one
// trace, each node's events moved onto this node's clock by an offset
// measured as NTP does (the remote clock minus the midpoint of send and
// receive) on the shortest of clockProbes small round trips, whose error
// is at most half that round trip. Call it after ShadowStats, so the
// shadow has finished. A node that does not answer within timeout is
// left out and named in File.Dropped (with -1).
func (s *Swarm) CollectTrace(ctx context.Context, timeout time.Duration, layers int) (*trace.File, error) {
	if s.opt.Trace == nil {
		return nil, fmt.Errorf("mainnode: tracing needs Options.Trace")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	self := s.opt.Trace.Node()
	own, dropped := s.opt.Trace.Events()
	f := &trace.File{From: s.traced[0], To: s.traced[1], Layers: layers, Nodes: []string{self}, ClockOffsetNs: map[string]int64{self: 0}, ClockRTTNs: map[string]int64{self: 0}, Dropped: map[string]int{}, Events: own}
	if dropped > 0 {
		f.Dropped[self] = dropped
	}
	type remote struct {
		peer *wire.Peer
		in   chan *wire.Trace
	}
	var remotes []remote
	if p := s.shadowConn(); p != nil {
		remotes = append(remotes, remote{p, s.shadow.traces})
	}
	for _, l := range s.workers {
		remotes = append(remotes, remote{l.conn(), l.traces})
	}
	for _, r := range remotes {
		name := r.peer.Identity().Name
		f.Nodes = append(f.Nodes, name)
		select { // drop a stale answer
		case <-r.in:
		default:
		}
		ask := func(m *wire.Trace) (t *wire.Trace, rtt time.Duration, offset int64) {
			sent := time.Now()
			if err := r.peer.Send(ctx, m); err != nil {
				return nil, 0, 0
			}
			select {
			case t = <-r.in:
			case <-ctx.Done():
				return nil, 0, 0
			}
			got := time.Now()
			return t, got.Sub(sent), t.UnixNano - (sent.UnixNano()+got.UnixNano())/2
		}
		var offset int64
		best := time.Duration(-1)
		for range clockProbes {
			t, rtt, off := ask(&wire.Trace{Clock: true})
			if t == nil {
				break
			}
			if best < 0 || rtt < best {
				best, offset = rtt, off
			}
		}
		t, _, _ := ask(&wire.Trace{Collect: true})
		if t == nil || best < 0 {
			f.Dropped[name] = -1
			continue
		}
		for i := range t.Events {
			t.Events[i].Node = name // the certificate's name, not what the node calls itself
		}
		trace.Shift(t.Events, offset)
		f.ClockOffsetNs[name] = offset
		f.ClockRTTNs[name] = int64(best)
		if t.Dropped > 0 {
			f.Dropped[name] = t.Dropped
		}
		f.Events = append(f.Events, t.Events...)
	}
	if len(f.Dropped) == 0 {
		f.Dropped = nil
	}
	return f, nil
}
