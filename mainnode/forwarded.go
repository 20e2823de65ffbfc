package mainnode

import (
	"sync"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// forwarded are the shadow's predictions of a main stage's layers as its
// main node hands them on (Options.Forwarded): what the shadow policy
// places on there, each taken once. The main node scores them; the
// stage only places.
type forwarded struct {
	mu   sync.Mutex
	pred map[layerKey]predicted
	// last is each sequence's latest pass that took a prediction: the
	// predictions of its earlier passes are let go then
	last map[uint64]int64
}

func newForwarded() *forwarded {
	return &forwarded{pred: map[layerKey]predicted{}, last: map[uint64]int64{}}
}

// heard takes a Prediction (kept for its pass and layer, a later one of
// the same replacing it) or a Withdraw of a sequence's passes from one on
// (those predictions dropped); a worker's withdrawal of some experts is
// not the main node's business.
func (f *forwarded) heard(m wire.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch m := m.(type) {
	case *wire.Prediction:
		if m.Pass < f.last[m.Seq] {
			return // its pass has run
		}
		es, on := predictedOn(m.Experts, m.Workers)
		f.pred[layerKey{model.Step{Seq: m.Seq, Pass: m.Pass}, m.Layer}] = predicted{experts: es, on: on, token: m.Token}
	case *wire.Withdraw:
		if len(m.Experts) > 0 {
			return
		}
		for k := range f.pred {
			if k.step.Seq == m.Seq && k.step.Pass >= m.From {
				delete(f.pred, k)
			}
		}
	}
}

// take takes the prediction of a decode layer of pass step, if it has
// come: its experts and the worker each was hinted to (nil, nil
// otherwise).
func (f *forwarded) take(step model.Step, layer int) (experts, on []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if step.Pass > f.last[step.Seq] {
		f.last[step.Seq] = step.Pass
		for k := range f.pred {
			if k.step.Seq == step.Seq && k.step.Pass < step.Pass {
				delete(f.pred, k)
			}
		}
	}
	key := layerKey{step, layer}
	p := f.pred[key]
	delete(f.pred, key)
	return p.experts, p.on
}

// end lets sequence seq's predictions go.
func (f *forwarded) end(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.last, seq)
	for k := range f.pred {
		if k.step.Seq == seq {
			delete(f.pred, k)
		}
	}
}
