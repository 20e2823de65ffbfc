package stage

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// Client runs a first stage's later layers on the stages at the other
// end of its peers, each in turn: the first stage's model.LayerRunner.
// Safe for concurrent use (runs go one at a time).
type Client struct {
	mu     sync.Mutex
	stages []*remote
	id     uint64
	routes []model.Route
}

// remote is one stage: its peer, its layers and what it sends.
type remote struct {
	p      *wire.Peer
	layers model.LayerRange
	in     chan wire.Message // closed when p ends, err then set
	err    error
}

// LayersOf reads the layers a stage's Hello says it holds.
func LayersOf(h wire.Hello) (model.LayerRange, error) {
	if len(h.Layers) != 2 {
		return model.LayerRange{}, fmt.Errorf("stage: %s tells no layers (is it a stage?)", h.Name)
	}
	return model.LayerRange{First: h.Layers[0], End: h.Layers[1]}, nil
}

// NewClient runs layers on the stages at the other end of peers, which
// must hold, in this order, consecutive layers from first to the
// model's last (of layers layers) in quant, as their Hellos say; it
// reads from them until ctx ends or they do.
func NewClient(ctx context.Context, peers []*wire.Peer, first, layers int, quant string) (*Client, error) {
	c := &Client{}
	next := first
	for _, p := range peers {
		r, err := LayersOf(p.Hello())
		if err != nil {
			return nil, err
		}
		switch q := p.Hello().Quant; {
		case r.First != next:
			return nil, fmt.Errorf("stage: %s holds layers %s; the next stage must begin at layer %d", p.Identity(), r, next)
		case q != quant:
			return nil, fmt.Errorf("stage: %s holds its layers in %q, this node in %q", p.Identity(), q, quant)
		}
		next = r.End
		st := &remote{p: p, layers: r, in: make(chan wire.Message, 64)}
		c.stages = append(c.stages, st)
		go st.read(ctx)
	}
	if next != layers {
		return nil, fmt.Errorf("stage: the stages end at layer %d, the model has %d", next-1, layers)
	}
	return c, nil
}

func (st *remote) read(ctx context.Context) {
	defer close(st.in)
	for {
		m, err := st.p.Recv(ctx)
		if err != nil {
			st.err = err
			return
		}
		st.in <- m
	}
}

// Layers are the layers the stages hold, together.
func (c *Client) Layers() model.LayerRange {
	return model.LayerRange{First: c.stages[0].layers.First, End: c.stages[len(c.stages)-1].layers.End}
}

// RunLayers runs layers r, which must be the stages' together (see
// model.LayerRunner): each stage runs its layers on the rows the one
// before handed back.
func (c *Client) RunLayers(ctx context.Context, r model.LayerRange, spans []model.RowSpan, hidden []float32, onRoute func(layer int, routes []model.Route)) ([]float32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r != c.Layers() {
		return nil, fmt.Errorf("stage: layers %s asked of stages of layers %s", r, c.Layers())
	}
	run := &wire.StageRun{Routes: onRoute != nil}
	rows := 0
	for _, sp := range spans {
		run.Seqs, run.Starts, run.Counts = append(run.Seqs, sp.Seq), append(run.Starts, int32(sp.Start)), append(run.Counts, int32(sp.Count))
		rows += sp.Count
	}
	if rows == 0 || len(hidden)%rows != 0 {
		return nil, fmt.Errorf("stage: %d floats of hidden state for %d rows", len(hidden), rows)
	}
	for _, st := range c.stages {
		c.id++
		run.ID, run.First, run.End = c.id, st.layers.First, st.layers.End
		run.Hidden = wire.Float32Tensor(hidden, rows, len(hidden)/rows)
		if err := st.p.Send(ctx, run); err != nil {
			return nil, fmt.Errorf("stage: %s: %w", st.p.Identity(), err)
		}
		out, err := c.await(ctx, st, run.ID, onRoute)
		if err != nil {
			return nil, fmt.Errorf("stage: %s (layers %s): %w", st.p.Identity(), st.layers, err)
		}
		hidden = out
	}
	return hidden, nil
}

// await reads st's answer to run id: its layers' routes, then its rows.
func (c *Client) await(ctx context.Context, st *remote, id uint64, onRoute func(int, []model.Route)) ([]float32, error) {
	for {
		var m wire.Message
		var ok bool
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case m, ok = <-st.in:
		}
		if !ok {
			return nil, errors.Join(errors.New("the stage is gone"), st.err)
		}
		switch m := m.(type) {
		case *wire.StageRoutes:
			if m.ID != id || onRoute == nil {
				return nil, fmt.Errorf("routes of run %d, awaiting run %d", m.ID, id)
			}
			c.routes = c.routes[:0]
			for i, e := range m.Experts {
				c.routes = append(c.routes, model.Route{Expert: int(e), Weight: m.Weights[i]})
			}
			onRoute(m.Layer, c.routes)
		case *wire.StageRows:
			if m.ID != id {
				return nil, fmt.Errorf("the rows of run %d, awaiting run %d", m.ID, id)
			}
			return m.Hidden.Float32s()
		case *wire.Error:
			return nil, m
		}
	}
}

// ApplyKV sends each stage its layers' share of a KV alignment of
// sequence seq, which it writes before anything sent after.
func (c *Client) ApplyKV(ctx context.Context, seq uint64, kv align.KVRows) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.stages {
		m := &wire.StageKV{Seq: seq, FromPos: kv.From, First: st.layers.First}
		m.Keys, m.Values = kv.Layers(st.layers.First, st.layers.End).Tensors()
		if err := st.p.Send(ctx, m); err != nil {
			return fmt.Errorf("stage: %s: %w", st.p.Identity(), err)
		}
	}
	return nil
}

// End tells every stage that sequence seq is over.
func (c *Client) End(ctx context.Context, seq uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.stages {
		if err := st.p.Send(ctx, &wire.StageEnd{Seq: seq}); err != nil {
			return fmt.Errorf("stage: %s: %w", st.p.Identity(), err)
		}
	}
	return nil
}

// Reset tells every stage that every sequence is over (the first stage
// starts over: another main node).
func (c *Client) Reset(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.stages {
		if err := st.p.Send(ctx, &wire.StageEnd{All: true}); err != nil {
			return fmt.Errorf("stage: %s: %w", st.p.Identity(), err)
		}
	}
	return nil
}

// Close closes the stages' connections.
func (c *Client) Close() error {
	for _, st := range c.stages {
		st.p.Close()
	}
	return nil
}
