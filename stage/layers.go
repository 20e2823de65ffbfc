package stage

import (
	"context"
	"errors"
	"fmt"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// Runner runs a stage's experts and hears of its passes and sequences:
// in process (a shadow stage's, NewLayers), or on a swarm of workers (a
// main stage's, whose runner keeps per sequence what the workers hold).
type Runner interface {
	model.ExpertRunner
	// BeforePass is told of each pass before its first layer: step is
	// its first stage's, spans its rows, prefill whether it feeds prompt
	// chunks (else each span is a decode step).
	BeforePass(ctx context.Context, step model.Step, spans []model.RowSpan, prefill bool) error
	// EndSequence is told when sequence seq is over: a member's, or a
	// batch's (a step's Seq).
	EndSequence(ctx context.Context, seq uint64) error
	// Figures are what layers r have cost so far (nil: nothing measured),
	// handed back with each run's rows.
	Figures(r model.LayerRange) *wire.StageFigures
	// Predicted hears a shadow's Prediction of one of the stage's
	// layers, or its Withdraw, as the first stage heard it.
	Predicted(m wire.Message)
}

// resident runs a model's experts in process, and keeps nothing per
// pass or sequence beyond the KV rows Layers keeps.
type resident struct{ model.ExpertRunner }

func (resident) BeforePass(context.Context, model.Step, []model.RowSpan, bool) error { return nil }
func (resident) EndSequence(context.Context, uint64) error                           { return nil }
func (resident) Figures(model.LayerRange) *wire.StageFigures                         { return nil }
func (resident) Predicted(wire.Message)                                              {}

// Layers runs a model's own layers (those it holds: a stage's) for the
// sequences of a first stage, keeping each one's KV rows: a
// model.LayerRunner in process, and what Serve runs for a remote first
// stage. Its passes run as the first stage's (Batch.RunAs), so a main
// stage's experts run on its workers under the step the first stage's
// would. Not safe for concurrent use.
type Layers struct {
	m        *model.Model
	batch    *model.Batch
	runner   Runner
	seqs     map[uint64]*model.Session
	batches  map[uint64]bool  // the first stage's batches seen (their steps' Seq)
	sessions []*model.Session // scratch: a run's
	feeds    [][]int
	zeros    []int
	// kv, when a run asks (RunPass's kv), are the KV rows it wrote, a
	// span's each
	kv []align.KVRows
}

// NewLayers runs m's layers, its experts in process.
func NewLayers(m *model.Model) *Layers {
	return NewLayersOn(m, resident{model.NewResidentExperts(m)})
}

// NewLayersOn runs m's layers, its experts on r.
func NewLayersOn(m *model.Model, r Runner) *Layers {
	return &Layers{m: m, batch: model.NewBatch(m, r), runner: r, seqs: map[uint64]*model.Session{}, batches: map[uint64]bool{}}
}

// Held are the layers it runs.
func (l *Layers) Held() model.LayerRange { return l.m.HeldLayers() }

// Sequences is how many sequences it holds rows of.
func (l *Layers) Sequences() int { return len(l.seqs) }

// RunLayers runs layers r (all of them its own) of pass step over spans'
// rows (see model.LayerRunner), as RunPass does; the pass is prefill
// where a span carries several rows.
func (l *Layers) RunLayers(ctx context.Context, step model.Step, r model.LayerRange, spans []model.RowSpan, hidden []float32, onRoute func(layer int, routes []model.Route)) ([]float32, error) {
	prefill := false
	for _, sp := range spans {
		prefill = prefill || sp.Count > 1
	}
	return l.RunPass(ctx, step, prefill, r, spans, hidden, onRoute)
}

// RunPass runs layers r (all of them its own) of pass step, which feeds
// prompt chunks if prefill, over spans' rows: a sequence seen first
// starts empty; one whose rows go past a span's start forgets them, one
// whose rows stop short of it is an error (rows the first stage ran and
// never handed on).
func (l *Layers) RunPass(ctx context.Context, step model.Step, prefill bool, r model.LayerRange, spans []model.RowSpan, hidden []float32, onRoute func(layer int, routes []model.Route)) ([]float32, error) {
	out, err := l.runPass(ctx, step, prefill, r, spans, hidden, onRoute)
	l.kv = l.kv[:0]
	return out, err
}

// RunPassKV is RunPass that also returns the KV rows the pass wrote in
// its layers, a span's each (in fp16: what a KV alignment of the shadow
// carries), valid until the next run.
func (l *Layers) RunPassKV(ctx context.Context, step model.Step, prefill bool, r model.LayerRange, spans []model.RowSpan, hidden []float32, onRoute func(layer int, routes []model.Route)) ([]float32, []align.KVRows, error) {
	out, err := l.runPass(ctx, step, prefill, r, spans, hidden, onRoute)
	if err != nil {
		return nil, nil, err
	}
	l.kv = l.kv[:0]
	for i, sp := range spans {
		kv, err := align.PackKV(l.sessions[i].Cache(), sp.Start, sp.Start+sp.Count)
		if err != nil {
			return nil, nil, err
		}
		l.kv = append(l.kv, kv)
	}
	return out, l.kv, nil
}

func (l *Layers) runPass(ctx context.Context, step model.Step, prefill bool, r model.LayerRange, spans []model.RowSpan, hidden []float32, onRoute func(layer int, routes []model.Route)) ([]float32, error) {
	if !l.Held().Covers(r) {
		return nil, fmt.Errorf("stage: layers %s asked of a stage of layers %s", r, l.Held())
	}
	l.sessions, l.feeds = l.sessions[:0], l.feeds[:0]
	for _, sp := range spans {
		s, err := l.session(sp.Seq, sp.Start+sp.Count)
		if err != nil {
			return nil, err
		}
		switch c := s.Cache(); {
		case c.Len() < sp.Start:
			return nil, fmt.Errorf("stage: sequence %d: rows from %d, and the stage holds %d", sp.Seq, sp.Start, c.Len())
		case c.Len() > sp.Start:
			if !c.Holds(sp.Start) {
				return nil, fmt.Errorf("stage: sequence %d: back to row %d, which a windowed layer no longer holds", sp.Seq, sp.Start)
			}
			c.Truncate(sp.Start)
		}
		// a stage after the first reads no token ids: the rows count
		for len(l.zeros) < sp.Count {
			l.zeros = append(l.zeros, 0)
		}
		l.sessions, l.feeds = append(l.sessions, s), append(l.feeds, l.zeros[:sp.Count])
	}
	if err := l.runner.BeforePass(ctx, step, spans, prefill); err != nil {
		return nil, err
	}
	l.batches[step.Seq] = true
	l.batch.RunAs(step)
	if onRoute != nil {
		l.batch.SetOnRoute(func(_ model.Step, layer int, _ []float32, routes []model.Route) { onRoute(layer, routes) })
		defer l.batch.SetOnRoute(nil)
	}
	return l.batch.ForwardLayers(ctx, l.sessions, l.feeds, r, hidden)
}

// ApplyKV writes a KV alignment's rows of sequence seq into its layers
// (kv may hold other layers too: its own are taken); a sequence not seen
// yet starts with them.
func (l *Layers) ApplyKV(seq uint64, kv align.KVRows) error {
	s, err := l.session(seq, kv.From+kv.Rows)
	if err != nil {
		return err
	}
	return kv.Apply(s.Cache())
}

// session is sequence seq's, made empty (room for capacity rows) if it
// is new.
func (l *Layers) session(seq uint64, capacity int) (*model.Session, error) {
	if s, ok := l.seqs[seq]; ok {
		return s, nil
	}
	s, err := model.NewStageSession(l.m, nil, capacity, l.Held())
	if err != nil {
		return nil, err
	}
	l.seqs[seq] = s
	return s, nil
}

// End lets sequence seq's rows go (a member's, or what a batch's passes
// left on the runner).
func (l *Layers) End(ctx context.Context, seq uint64) error {
	delete(l.seqs, seq)
	delete(l.batches, seq)
	return l.runner.EndSequence(ctx, seq)
}

// EndAll lets every sequence go: the first stage is gone, or starts
// over.
func (l *Layers) EndAll(ctx context.Context) error {
	var errs []error
	for seq := range l.seqs {
		errs = append(errs, l.End(ctx, seq))
	}
	for seq := range l.batches {
		errs = append(errs, l.End(ctx, seq))
	}
	return errors.Join(errs...)
}
