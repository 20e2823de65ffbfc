package wire

import (
	"context"
	"time"

	"github.com/odmoe/odmoe/internal/trace"
)

// AnswerTrace handles a Trace request that arrived on p: a window starts
// rec afresh, a clock request gets this node's clock, a collect gets what
// rec holds with this node's clock.
func AnswerTrace(ctx context.Context, p *Peer, rec *trace.Recorder, m *Trace) error {
	if m.Clock {
		return p.Send(ctx, &Trace{Clock: true, UnixNano: time.Now().UnixNano()})
	}
	if !m.Collect {
		rec.Window(m.From, m.To)
		return nil
	}
	events, dropped := rec.Events()
	return p.Send(ctx, &Trace{Collect: true, Events: events, Dropped: dropped, UnixNano: time.Now().UnixNano()})
}
