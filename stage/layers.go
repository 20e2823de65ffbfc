package stage

import (
	"context"
	"fmt"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/model"
)

// Layers runs a model's own layers (those it holds: a stage's) for the
// sequences of a first stage, keeping each one's KV rows: a
// model.LayerRunner in process, and what Serve runs for a remote first
// stage. Not safe for concurrent use.
type Layers struct {
	m        *model.Model
	batch    *model.Batch
	seqs     map[uint64]*model.Session
	sessions []*model.Session // scratch: a run's
	feeds    [][]int
	zeros    []int
}

// NewLayers runs m's layers, its experts in process.
func NewLayers(m *model.Model) *Layers {
	return &Layers{m: m, batch: model.NewBatch(m, model.NewResidentExperts(m)), seqs: map[uint64]*model.Session{}}
}

// Held are the layers it runs.
func (l *Layers) Held() model.LayerRange { return l.m.HeldLayers() }

// Sequences is how many sequences it holds rows of.
func (l *Layers) Sequences() int { return len(l.seqs) }

// RunLayers runs layers r (all of them its own) over spans' rows (see
// model.LayerRunner): a sequence seen first starts empty; one whose rows
// go past a span's start forgets them, one whose rows stop short of it
// is an error (rows the first stage ran and never handed on).
func (l *Layers) RunLayers(ctx context.Context, r model.LayerRange, spans []model.RowSpan, hidden []float32, onRoute func(layer int, routes []model.Route)) ([]float32, error) {
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

// End lets sequence seq's rows go.
func (l *Layers) End(seq uint64) { delete(l.seqs, seq) }
