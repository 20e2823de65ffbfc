package stage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// Client runs a first stage's later layers on the stages at the other
// end of its peers, each in turn: the first stage's model.LayerRunner.
// Safe for concurrent use (runs go one at a time).
type Client struct {
	mu sync.Mutex
	// smu guards stages for Tell, which does not wait for a run (mu):
	// Reset, which replaces a lost stage, holds both
	smu    sync.RWMutex
	stages []*remote
	layers model.LayerRange // the stages' together (a stage replaced holds the same)
	id     uint64
	routes []model.Route
	quant  string
	// refused is a stage's refusal of a sequence's KV rows (an Error of
	// no run), which ApplyKV hands on
	refused error
	// redial connects to stage i again (nil: a lost stage stays lost)
	redial func(ctx context.Context, i int) (*wire.Peer, error)
	// prefill is the last pass said to feed prompt chunks (Prefill)
	prefill model.Step
	// figures are each stage's latest (StageRows.Figures), by stage;
	// retired, what the stages it replaced (Reset) had counted, which
	// Figures adds, so that the counts never go back
	fmu              sync.Mutex
	figures, retired []*wire.StageFigures
	// cpu is each stage's process CPU time as its last rows said, by
	// stage; retiredCPU, what the stages it replaced had used
	cpu, retiredCPU []time.Duration
	// keepKV asks every run for the KV rows it writes (KeepKV), which
	// kv keeps by sequence, by stage, until ForgetKV
	keepKV bool
	kv     map[uint64][]kvJournal
}

// kvJournal is one stage's KV rows of a sequence, as its runs wrote them:
// runs of consecutive positions, the last ending where the sequence does.
type kvJournal []align.KVRows

var _ model.LayerRunner = (*Client)(nil)

// remote is one stage: its peer, its layers and what it sends.
type remote struct {
	p      *wire.Peer
	layers model.LayerRange
	in     chan wire.Message // closed when p ends, err then set
	err    error
	// ended is set as in closes: a run can learn the stage is gone from
	// in before p's Done is closed (a Reset then must redial it)
	ended atomic.Bool
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
// reads from them until ctx ends or they do. redial, if set, connects to
// stage i again when Reset finds it lost.
func NewClient(ctx context.Context, peers []*wire.Peer, first, layers int, quant string, redial func(ctx context.Context, i int) (*wire.Peer, error)) (*Client, error) {
	c := &Client{quant: quant, redial: redial}
	next := first
	for _, p := range peers {
		r, err := c.check(p, next)
		if err != nil {
			return nil, err
		}
		next = r.End
		st := &remote{p: p, layers: r, in: make(chan wire.Message, 64)}
		c.stages = append(c.stages, st)
		go st.read(ctx)
	}
	if next != layers {
		return nil, fmt.Errorf("stage: the stages end at layer %d, the model has %d", next-1, layers)
	}
	c.layers = model.LayerRange{First: first, End: layers}
	return c, nil
}

// check reads the layers p's Hello says it holds, which must begin at
// first, in the client's quant.
func (c *Client) check(p *wire.Peer, first int) (model.LayerRange, error) {
	r, err := LayersOf(p.Hello())
	if err != nil {
		return r, err
	}
	switch q := p.Hello().Quant; {
	case r.First != first:
		return r, fmt.Errorf("stage: %s holds layers %s; the next stage must begin at layer %d", p.Identity(), r, first)
	case q != c.quant:
		return r, fmt.Errorf("stage: %s holds its layers in %q, this node in %q", p.Identity(), q, c.quant)
	}
	return r, nil
}

// send sends m to st, an error naming it.
func (st *remote) send(ctx context.Context, m wire.Message) error {
	if err := st.p.Send(ctx, m); err != nil {
		if st.lost() {
			err = errors.Join(ErrLost, err)
		}
		return fmt.Errorf("stage: %s: %w", st.p.Identity(), err)
	}
	return nil
}

// ErrLost is what a run fails with (errors.Is) when a stage's connection
// has ended: every sequence's rows on it are gone (Recover).
var ErrLost = errors.New("the stage is gone")

// lost reports whether st's connection has ended.
func (st *remote) lost() bool {
	if st.ended.Load() {
		return true
	}
	select {
	case <-st.p.Done():
		return true
	default:
		return false
	}
}

func (st *remote) read(ctx context.Context) {
	defer close(st.in)
	defer st.ended.Store(true)
	for {
		m, err := st.p.Recv(ctx)
		if err != nil {
			st.err = err
			return
		}
		select {
		case st.in <- m:
		case <-st.p.Done(): // closed (Close, or a redial replaced it): nobody reads on
			return
		}
	}
}

// Hellos are what the stages said when they were dialed (the latest
// connection's, for a stage dialed again), in order.
func (c *Client) Hellos() []wire.Hello {
	c.smu.RLock()
	defer c.smu.RUnlock()
	out := make([]wire.Hello, len(c.stages))
	for i, st := range c.stages {
		out[i] = st.p.Hello()
	}
	return out
}

// Layers are the layers the stages hold, together.
func (c *Client) Layers() model.LayerRange { return c.layers }

// Prefill says pass step feeds prompt chunks (a main node's pass loop
// knows; the stages plan its experts as prefill): told before it runs.
func (c *Client) Prefill(step model.Step) {
	c.mu.Lock()
	c.prefill = step
	c.mu.Unlock()
}

// RunLayers runs layers r of pass step, which must be the stages'
// together (see model.LayerRunner): each stage runs its layers on the
// rows the one before handed back. Rows go at most maxRunBytes of hidden state a
// message (a long history in several, each a stage's pass: onRoute then
// sees each layer's routes once they have all come).
func (c *Client) RunLayers(ctx context.Context, step model.Step, r model.LayerRange, spans []model.RowSpan, hidden []float32, onRoute func(layer int, routes []model.Route)) ([]float32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r != c.Layers() {
		return nil, fmt.Errorf("stage: layers %s asked of stages of layers %s", r, c.Layers())
	}
	rows := 0
	for _, sp := range spans {
		rows += sp.Count
	}
	if rows == 0 || len(hidden)%rows != 0 {
		return nil, fmt.Errorf("stage: %d floats of hidden state for %d rows", len(hidden), rows)
	}
	h := len(hidden) / rows
	most := max(1, maxRunBytes/(4*h)) // rows a message
	if rows <= most {
		return c.run(ctx, step, spans, hidden, h, onRoute)
	}
	// in several runs, each layer's routes are gathered and seen once,
	// all the pass's rows together, once the last run is done
	var byLayer map[int][]model.Route
	var gather func(int, []model.Route)
	if onRoute != nil {
		byLayer = map[int][]model.Route{}
		gather = func(l int, rs []model.Route) { byLayer[l] = append(byLayer[l], rs...) }
	}
	out := make([]float32, 0, len(hidden))
	for _, part := range chunks(spans, most) {
		n := 0
		for _, sp := range part {
			n += sp.Count
		}
		o, err := c.run(ctx, step, part, hidden[len(out):len(out)+n*h], h, gather)
		if err != nil {
			return nil, err
		}
		out = append(out, o...)
	}
	for l := r.First; l < r.End && onRoute != nil; l++ {
		if rs, ok := byLayer[l]; ok {
			onRoute(l, rs)
		}
	}
	return out, nil
}

// maxRunBytes bounds the hidden state one StageRun carries, well within
// a frame (wire's MaxFrameBytes, 64 MiB by default).
var maxRunBytes = 16 << 20 // a var: tests cut runs smaller

// chunks cuts spans into runs of at most most rows, a span cut where it
// must (its later part begins where the earlier ends, so the stage goes
// on from it).
func chunks(spans []model.RowSpan, most int) [][]model.RowSpan {
	var out [][]model.RowSpan
	var cur []model.RowSpan
	n := 0
	for _, sp := range spans {
		for sp.Count > 0 {
			take := min(sp.Count, most-n)
			cur = append(cur, model.RowSpan{Seq: sp.Seq, Start: sp.Start, Count: take})
			sp.Start, sp.Count, n = sp.Start+take, sp.Count-take, n+take
			if n == most {
				out, cur, n = append(out, cur), nil, 0
			}
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// run runs spans' rows of pass step (hidden, h floats a row) through
// every stage.
func (c *Client) run(ctx context.Context, step model.Step, spans []model.RowSpan, hidden []float32, h int, onRoute func(layer int, routes []model.Route)) ([]float32, error) {
	// KV rows are asked of decode passes only: a prompt's rows never go to
	// the shadow (it computes them itself), and a long history's would
	// pass a frame
	prefill := c.prefill == step
	run := &wire.StageRun{Routes: onRoute != nil, Batch: step.Seq, Pass: step.Pass, Prefill: prefill, KV: c.keepKV && !prefill}
	for _, sp := range spans {
		run.Seqs, run.Starts, run.Counts = append(run.Seqs, sp.Seq), append(run.Starts, int32(sp.Start)), append(run.Counts, int32(sp.Count))
	}
	for _, st := range c.stages {
		c.id++
		run.ID, run.First, run.End = c.id, st.layers.First, st.layers.End
		run.Hidden = wire.Float32Tensor(hidden, len(hidden)/h, h)
		if err := st.send(ctx, run); err != nil {
			return nil, err
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
// What answers an earlier run (one whose caller stopped waiting: its
// context ended) is let go; a refusal of a sequence's KV rows (an Error
// of no run) is kept for ApplyKV.
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
			return nil, errors.Join(ErrLost, st.err)
		}
		switch m := m.(type) {
		case *wire.StageRoutes:
			if m.ID < id {
				continue
			}
			if m.ID != id || onRoute == nil {
				return nil, fmt.Errorf("routes of run %d, awaiting run %d", m.ID, id)
			}
			c.routes = c.routes[:0]
			for i, e := range m.Experts {
				c.routes = append(c.routes, model.Route{Expert: int(e), Weight: m.Weights[i]})
			}
			onRoute(m.Layer, c.routes)
		case *wire.StageRows:
			c.keepFigures(st, m.Figures, m.CPU)
			if m.ID < id {
				continue
			}
			if m.ID != id {
				return nil, fmt.Errorf("the rows of run %d, awaiting run %d", m.ID, id)
			}
			if err := c.journal(st, m.KV); err != nil {
				return nil, err
			}
			return m.Hidden.Float32s()
		case *wire.Error:
			switch {
			case m.ID == 0:
				c.refused = m
			case m.ID == id:
				return nil, m
			}
		}
	}
}

// Tell sends m to the stage that holds layer (every stage where layer <
// 0) without waiting for a run under way: what the first stage hears for
// the stages' layers (a shadow's predictions and withdrawals, for a main
// stage's placement). A stage it cannot reach is an error.
func (c *Client) Tell(ctx context.Context, layer int, m wire.Message) error {
	c.smu.RLock()
	var to []*remote
	for _, st := range c.stages {
		if layer < 0 || st.layers.Contains(layer) {
			to = append(to, st)
		}
	}
	c.smu.RUnlock()
	var errs []error
	for _, st := range to {
		errs = append(errs, st.send(ctx, m))
	}
	return errors.Join(errs...)
}

// KeepKV asks every run from now on for the KV rows it writes, kept by
// sequence for KVRows (a main node whose shadow is KV-aligned: the rows
// of its stages' layers are theirs).
func (c *Client) KeepKV() {
	c.mu.Lock()
	c.keepKV = true
	c.mu.Unlock()
}

// journal keeps the KV rows st's run wrote, a span's each: a sequence's
// rows from a span's start on (a rewind) give way to the new ones. Call
// with mu held.
func (c *Client) journal(st *remote, rows []wire.StageKV) error {
	if len(rows) == 0 {
		return nil
	}
	i := slices.Index(c.stages, st)
	if c.kv == nil {
		c.kv = map[uint64][]kvJournal{}
	}
	for _, m := range rows {
		kv, err := align.FromTensors(m.FromPos, m.First, m.Keys, m.Values)
		if err != nil {
			return fmt.Errorf("KV rows of sequence %d: %w", m.Seq, err)
		}
		js := c.kv[m.Seq]
		for len(js) < len(c.stages) {
			js = append(js, nil)
		}
		j := js[i]
		for len(j) > 0 && j[len(j)-1].From >= kv.From { // a rewind: the rows from kv.From on are gone
			j = j[:len(j)-1]
		}
		if n := len(j); n > 0 && j[n-1].From+j[n-1].Rows > kv.From {
			j[n-1] = j[n-1].Positions(j[n-1].From, kv.From)
		}
		if n := len(j); n > 0 && j[n-1].From+j[n-1].Rows < kv.From {
			j = j[:0] // a gap: rows nobody handed back
		}
		js[i] = append(j, kv)
		c.kv[m.Seq] = js
	}
	return nil
}

// KVRows are the KV rows of sequence seq at positions [from, to) in the
// stages' layers, every stage's in order, as their runs wrote them
// (KeepKV); false when some are not kept.
func (c *Client) KVRows(seq uint64, from, to int) (align.KVRows, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	js := c.kv[seq]
	if len(js) != len(c.stages) || from >= to {
		return align.KVRows{}, false
	}
	var parts []align.KVRows
	for _, j := range js {
		var runs []align.KVRows
		for _, kv := range j {
			lo, hi := max(kv.From, from), min(kv.From+kv.Rows, to)
			if lo < hi {
				runs = append(runs, kv.Positions(lo, hi))
			}
		}
		kv, ok := joinPositions(runs, from, to)
		if !ok {
			return align.KVRows{}, false
		}
		parts = append(parts, kv)
	}
	kv, err := align.JoinLayers(parts...)
	return kv, err == nil
}

// joinPositions is runs of one stage's rows, consecutive, as the rows of
// positions [from, to); false if they do not cover them.
func joinPositions(runs []align.KVRows, from, to int) (align.KVRows, bool) {
	if len(runs) == 0 || runs[0].From != from {
		return align.KVRows{}, false
	}
	if len(runs) == 1 {
		return runs[0], runs[0].Rows == to-from
	}
	out := runs[0]
	out.Rows = to - from
	out.Keys = make([][]uint16, len(runs[0].Keys))
	if runs[0].Values != nil {
		out.Values = make([][]uint16, len(runs[0].Values))
	}
	next := from
	for _, r := range runs {
		if r.From != next {
			return align.KVRows{}, false
		}
		for l := range r.Keys {
			out.Keys[l] = append(out.Keys[l], r.Keys[l]...)
			if out.Values != nil {
				out.Values[l] = append(out.Values[l], r.Values[l]...)
			}
		}
		next += r.Rows
	}
	return out, next == to
}

// ForgetKV lets go of sequence seq's kept KV rows before position before
// (all of them where before < 0: the sequence is over).
func (c *Client) ForgetKV(seq uint64, before int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if before < 0 {
		delete(c.kv, seq)
		return
	}
	for i, j := range c.kv[seq] {
		k := 0
		for _, kv := range j {
			switch {
			case kv.From+kv.Rows <= before:
			case kv.From < before:
				j[k] = kv.Positions(before, kv.From+kv.Rows)
				k++
			default:
				j[k] = kv
				k++
			}
		}
		c.kv[seq][i] = j[:k]
	}
}

// keepFigures keeps f (where not nil) as st's latest figures, and cpu
// (where not 0) as its latest CPU time.
func (c *Client) keepFigures(st *remote, f *wire.StageFigures, cpu time.Duration) {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	i := slices.Index(c.stages, st)
	if i < 0 {
		return
	}
	for len(c.figures) <= i {
		c.figures = append(c.figures, nil)
	}
	for len(c.cpu) <= i {
		c.cpu = append(c.cpu, 0)
	}
	if f != nil {
		c.figures[i] = f
	}
	if cpu > 0 {
		c.cpu[i] = cpu
	}
}

// CPU is the CPU time the stages' processes have used, as their last
// rows said, the stages they replaced counted too (a stage restarted
// counts from nothing): what a pass costs the stages is its change over
// the pass. Safe to call while the stages run.
func (c *Client) CPU() time.Duration {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	var t time.Duration
	for _, d := range c.cpu {
		t += d
	}
	for _, d := range c.retiredCPU {
		t += d
	}
	return t
}

// Figures are each stage's figures of its layers (a main stage's: what
// they cost) as its last run's rows brought them, those of the stages it
// replaced added; a stage that sent none is left out. Safe to call while
// a run is under way.
func (c *Client) Figures() []*wire.StageFigures {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	var out []*wire.StageFigures
	for i := range max(len(c.figures), len(c.retired)) {
		var f *wire.StageFigures
		if i < len(c.figures) {
			f = c.figures[i]
		}
		if i < len(c.retired) && c.retired[i] != nil {
			f = addFigures(c.retired[i], f)
		}
		if f != nil {
			out = append(out, f)
		}
	}
	return out
}

// retire adds stage i's latest figures to what the stages it replaced
// counted: a stage restarted counts from nothing.
func (c *Client) retire(i int) {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	if i < len(c.cpu) {
		for len(c.retiredCPU) <= i {
			c.retiredCPU = append(c.retiredCPU, 0)
		}
		c.retiredCPU[i], c.cpu[i] = c.retiredCPU[i]+c.cpu[i], 0
	}
	if i >= len(c.figures) || c.figures[i] == nil {
		return
	}
	for len(c.retired) <= i {
		c.retired = append(c.retired, nil)
	}
	c.retired[i], c.figures[i] = addFigures(c.retired[i], c.figures[i]), nil
}

// addFigures is a and b (either may be nil: the other), summed layer by
// layer and worker by worker into a new value.
func addFigures(a, b *wire.StageFigures) *wire.StageFigures {
	if a == nil || b == nil {
		if a == nil {
			return b
		}
		return a
	}
	return combineFigures(a, b, 1)
}

// sinceFigures is what a stage's figures now counted beyond base, its
// figures at an earlier moment (nil: nothing then, now whole): a stage
// counts from its start, and a main node that connects later is told what
// its own passes cost.
func sinceFigures(now, base *wire.StageFigures) *wire.StageFigures {
	if now == nil || base == nil {
		return now
	}
	return combineFigures(now, base, -1)
}

// combineFigures is a plus sign times b, layer by layer and worker by
// worker, into a new value (a's First).
func combineFigures(a, b *wire.StageFigures, sign int64) *wire.StageFigures {
	out := &wire.StageFigures{First: a.First}
	layer := func(x, y []wire.LayerFigures) []wire.LayerFigures {
		s := make([]wire.LayerFigures, max(len(x), len(y)))
		for i := range s {
			var p, q wire.LayerFigures
			if i < len(x) {
				p = x[i]
			}
			if i < len(y) {
				q = y[i]
			}
			s[i] = wire.LayerFigures{Calls: p.Calls + sign*q.Calls, Main: p.Main + sign*q.Main, Experts: p.Experts + sign*q.Experts, Worker: p.Worker + sign*q.Worker,
				Network: p.Network + sign*q.Network, Stall: p.Stall + sign*q.Stall, Load: p.Load + sign*q.Load, Loads: p.Loads + sign*q.Loads, Misses: p.Misses + sign*q.Misses,
				MissesLate: p.MissesLate + sign*q.MissesLate, MissesWrong: p.MissesWrong + sign*q.MissesWrong, Results: p.Results + sign*q.Results}
		}
		return s
	}
	out.Decode, out.Prefill = layer(a.Decode, b.Decode), layer(a.Prefill, b.Prefill)
	out.Workers = make([]wire.WorkerFigures, max(len(a.Workers), len(b.Workers)))
	for i := range out.Workers {
		var p, q wire.WorkerFigures
		if i < len(a.Workers) {
			p = a.Workers[i]
		}
		if i < len(b.Workers) {
			q = b.Workers[i]
		}
		out.Workers[i] = wire.WorkerFigures{Results: p.Results + sign*q.Results, Loads: p.Loads + sign*q.Loads, Misses: p.Misses + sign*q.Misses, Late: p.Late + sign*q.Late,
			Wrong: p.Wrong + sign*q.Wrong, LoadNs: p.LoadNs + sign*q.LoadNs, ComputeNs: p.ComputeNs + sign*q.ComputeNs, StallNs: p.StallNs + sign*q.StallNs}
	}
	return out
}

// ApplyKV sends each stage its layers' share of a KV alignment of
// sequence seq, which it writes before anything sent after.
//
// A stage's refusal of earlier KV rows (it then dropped that sequence)
// comes back here: the caller starts over.
func (c *Client) ApplyKV(ctx context.Context, seq uint64, kv align.KVRows) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.refused; err != nil {
		c.refused = nil
		return fmt.Errorf("stage: a stage refused KV rows: %w", err)
	}
	if last := c.stages[len(c.stages)-1].layers.End; kv.First > c.stages[0].layers.First || kv.First+len(kv.Keys) < last {
		return fmt.Errorf("stage: KV rows of layers %d to %d for stages of layers %s", kv.First, kv.First+len(kv.Keys)-1, c.Layers())
	}
	for _, st := range c.stages {
		m := &wire.StageKV{Seq: seq, FromPos: kv.From, First: st.layers.First}
		m.Keys, m.Values = kv.Layers(st.layers.First, st.layers.End).Tensors()
		if err := st.send(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// End tells every stage that sequence seq is over.
func (c *Client) End(ctx context.Context, seq uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.kv, seq)
	var errs []error
	for _, st := range c.stages { // a stage it cannot reach forgets with the connection; the others still hear
		errs = append(errs, st.send(ctx, &wire.StageEnd{Seq: seq}))
	}
	return errors.Join(errs...)
}

// Recover waits for every lost stage to answer again on its address (a
// stage restarted from its own files), for as long as ctx allows, and
// then tells every stage that every sequence is over: the caller runs
// its sequences again from their first tokens, the stages' rows being
// gone. It returns how many stages were lost.
func (c *Client) Recover(ctx context.Context) (int, error) {
	c.mu.Lock()
	lost := 0
	for _, st := range c.stages {
		if st.lost() {
			lost++
		}
	}
	c.mu.Unlock()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		err := c.Reset(ctx)
		if err == nil || c.redial == nil {
			return lost, err
		}
		select {
		case <-ctx.Done():
			return lost, errors.Join(ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// Reset tells every stage that every sequence is over (the first stage
// starts over: another main node), first connecting again to any stage
// lost (a stage restarted holds no sequence anyway). A stage it cannot
// reach is an error: the first stage cannot follow a main node without
// every layer.
func (c *Client) Reset(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.kv)
	for i, st := range c.stages {
		// a stage whose end closed may not look lost yet (its peer's
		// close has not come in): the send fails then, and it is
		// dialled again once
		for redialed := false; ; redialed = true {
			if st.lost() || redialed {
				var err error
				if st, err = c.replace(ctx, i, st); err != nil {
					return err
				}
			}
			err := st.send(ctx, &wire.StageEnd{All: true})
			if err == nil {
				break
			}
			if redialed || c.redial == nil {
				return err
			}
		}
	}
	return nil
}

// replace connects to stage i (st, lost) again, checks it holds st's
// layers, and puts it in st's place. Call with mu held.
func (c *Client) replace(ctx context.Context, i int, st *remote) (*remote, error) {
	if c.redial == nil {
		return nil, fmt.Errorf("stage: %s (layers %s) is lost", st.p.Identity(), st.layers)
	}
	p, err := c.redial(ctx, i)
	if err != nil {
		return nil, fmt.Errorf("stage: layers %s: %w", st.layers, err)
	}
	r, err := c.check(p, st.layers.First)
	if err == nil && r != st.layers {
		err = fmt.Errorf("stage: %s holds layers %s, the stage it replaces %s", p.Identity(), r, st.layers)
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	c.retire(i)
	st = &remote{p: p, layers: r, in: make(chan wire.Message, 64)} // the lost one's reader keeps its own
	c.smu.Lock()
	c.stages[i] = st
	c.smu.Unlock()
	go st.read(context.WithoutCancel(ctx))
	return st, nil
}

// Close closes the stages' connections.
func (c *Client) Close() error {
	for _, st := range c.stages {
		st.p.Close()
	}
	return nil
}
