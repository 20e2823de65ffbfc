package stage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// Serve runs l's layers for the first stage at the other end of p until
// p ends or ctx does, and then lets every sequence's rows go (a first
// stage that comes back starts its sequences again). A run that fails
// (rows it does not fit, a sequence it cannot go back in) is answered
// with an Error naming it; a message no stage takes closes p.
func Serve(ctx context.Context, p *wire.Peer, l *Layers) error {
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		l.EndAll(ctx) // a node it cannot reach forgets with the connection
	}()
	h := l.m.Config.HiddenSize
	var routes wire.StageRoutes
	// the figures and the CPU time are this connection's: a stage counts
	// from its start, and a main node that connects later (bench rig runs
	// one a request against the same stages) is told what its own passes
	// cost
	base, cpu0 := l.runner.Figures(l.Held()), procmem.CPUTime()
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
			rows := &wire.StageRows{ID: m.ID, Hidden: wire.Float32Tensor(out.hidden, len(out.hidden)/h, h), Figures: sinceFigures(l.runner.Figures(l.Held()), base), CPU: max(0, procmem.CPUTime()-cpu0)}
			for i, kv := range out.kv {
				k := wire.StageKV{Seq: m.Seqs[i], FromPos: kv.From, First: kv.First}
				k.Keys, k.Values = kv.Tensors()
				rows.KV = append(rows.KV, k)
			}
			if err := p.Send(ctx, rows); err != nil {
				return err
			}
		case *wire.StageKV:
			kv, err := align.FromTensors(m.FromPos, m.First, m.Keys, m.Values)
			if err == nil {
				err = l.ApplyKV(m.Seq, kv)
			}
			if err != nil { // the sequence's rows are no longer the first stage's
				l.End(ctx, m.Seq)
				if err := p.Send(ctx, &wire.Error{Code: wire.ReqBadRequest, Msg: fmt.Sprintf("stage: KV rows of sequence %d: %v", m.Seq, err), Seq: m.Seq}); err != nil {
					return err
				}
			}
		case *wire.StageEnd:
			// a worker the runner cannot reach forgets with the connection
			if m.All {
				l.EndAll(ctx)
			} else {
				l.End(ctx, m.Seq)
			}
		case *wire.Prediction, *wire.Withdraw:
			l.runner.Predicted(m)
		case *wire.Heartbeat, *wire.Trace:
		default:
			p.CloseFor(fmt.Sprintf("a stage takes no %T", msg))
			return fmt.Errorf("stage: %s sent a %T", p.Identity(), msg)
		}
	}
}

// ran is what a StageRun gives back: the rows after the stage's layers,
// and the KV rows it wrote when asked.
type ran struct {
	hidden []float32
	kv     []align.KVRows
}

// run runs one StageRun on l, sending each layer's routes as it is
// routed when asked.
func run(ctx context.Context, p *wire.Peer, l *Layers, m *wire.StageRun, h int, routes *wire.StageRoutes) (ran, error) {
	hidden, err := m.Hidden.Float32s()
	if err != nil {
		return ran{}, err
	}
	spans := make([]model.RowSpan, len(m.Seqs))
	rows := 0
	for i := range spans {
		spans[i] = model.RowSpan{Seq: m.Seqs[i], Start: int(m.Starts[i]), Count: int(m.Counts[i])}
		rows += spans[i].Count
	}
	if len(hidden) != rows*h {
		return ran{}, fmt.Errorf("stage: run %d: %d rows of hidden state %d, given %d floats", m.ID, rows, h, len(hidden))
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
	step, r := model.Step{Seq: m.Batch, Pass: m.Pass}, model.LayerRange{First: m.First, End: m.End}
	var out ran
	if m.KV {
		out.hidden, out.kv, err = l.RunPassKV(ctx, step, m.Prefill, r, spans, hidden, onRoute)
	} else {
		out.hidden, err = l.RunPass(ctx, step, m.Prefill, r, spans, hidden, onRoute)
	}
	return out, errors.Join(err, sendErr)
}

// ServeEach serves one peer after another as they connect on ln, until
// ctx ends: each is closed once serve returns, and gone told why.
func ServeEach(ctx context.Context, ln *wire.Listener, serve func(context.Context, *wire.Peer) error, gone func(error)) error {
	for {
		p, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		err = serve(ctx, p)
		p.Close()
		if ctx.Err() != nil {
			return nil
		}
		gone(err)
	}
}
