package stage

import (
	"context"
	"errors"
	"fmt"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// Serve runs l's layers for the first stage at the other end of p until
// p ends or ctx does, and then lets every sequence's rows go (a first
// stage that comes back starts its sequences again). A run that fails
// (rows it does not fit, a sequence it cannot go back in) is answered
// with an Error naming it; a message no stage takes closes p.
func Serve(ctx context.Context, p *wire.Peer, l *Layers) error {
	defer clear(l.seqs)
	h := l.m.Config.HiddenSize
	var routes wire.StageRoutes
	for {
		msg, err := p.Recv(ctx)
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *wire.StageRun:
			out, err := run(ctx, p, l, m, h, &routes)
			if err != nil {
				if ctx.Err() != nil || p.Err() != nil {
					return err
				}
				if err := p.Send(ctx, &wire.Error{Code: wire.ReqBadRequest, Msg: err.Error(), ID: m.ID}); err != nil {
					return err
				}
				continue
			}
			if err := p.Send(ctx, &wire.StageRows{ID: m.ID, Hidden: wire.Float32Tensor(out, len(out)/h, h)}); err != nil {
				return err
			}
		case *wire.StageKV:
			kv, err := align.FromTensors(m.FromPos, m.First, m.Keys, m.Values)
			if err == nil {
				err = l.ApplyKV(m.Seq, kv)
			}
			if err != nil { // the sequence's rows are no longer the first stage's
				l.End(m.Seq)
				if err := p.Send(ctx, &wire.Error{Code: wire.ReqBadRequest, Msg: fmt.Sprintf("stage: KV rows of sequence %d: %v", m.Seq, err), Seq: m.Seq}); err != nil {
					return err
				}
			}
		case *wire.StageEnd:
			if m.All {
				clear(l.seqs)
			}
			l.End(m.Seq)
		case *wire.Heartbeat, *wire.Trace:
		default:
			p.CloseFor(fmt.Sprintf("a stage takes no %T", msg))
			return fmt.Errorf("stage: %s sent a %T", p.Identity(), msg)
		}
	}
}

// run runs one StageRun on l, sending each layer's routes as it is
// routed when asked.
func run(ctx context.Context, p *wire.Peer, l *Layers, m *wire.StageRun, h int, routes *wire.StageRoutes) ([]float32, error) {
	hidden, err := m.Hidden.Float32s()
	if err != nil {
		return nil, err
	}
	spans := make([]model.RowSpan, len(m.Seqs))
	rows := 0
	for i := range spans {
		spans[i] = model.RowSpan{Seq: m.Seqs[i], Start: int(m.Starts[i]), Count: int(m.Counts[i])}
		rows += spans[i].Count
	}
	if len(hidden) != rows*h {
		return nil, fmt.Errorf("stage: run %d: %d rows of hidden state %d, given %d floats", m.ID, rows, h, len(hidden))
	}
	var onRoute func(int, []model.Route)
	var sendErr error
	if m.Routes {
		onRoute = func(layer int, rs []model.Route) {
			routes.ID, routes.Layer = m.ID, layer
			routes.Experts, routes.Weights = routes.Experts[:0], routes.Weights[:0]
			for _, r := range rs {
				routes.Experts, routes.Weights = append(routes.Experts, int32(r.Expert)), append(routes.Weights, r.Weight)
			}
			if err := p.Send(ctx, routes); err != nil && sendErr == nil {
				sendErr = err
			}
		}
	}
	out, err := l.RunLayers(ctx, model.LayerRange{First: m.First, End: m.End}, spans, hidden, onRoute)
	return out, errors.Join(err, sendErr)
}
