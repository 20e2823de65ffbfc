package model

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// LayerRange is the layers [First, End) one stage of a staged model
// holds and runs (a main stage's or a shadow stage's): the first stage's
// rows begin with the embedding, the last's end at the output head.
type LayerRange struct{ First, End int }

// AllLayers is the whole of a model of layers layers.
func AllLayers(layers int) LayerRange { return LayerRange{0, layers} }

// ParseLayerRange reads "A-B" (0-based, inclusive, as -layers takes it),
// or "A-" (from A to the last layer), for a model of layers layers.
func ParseLayerRange(s string, layers int) (LayerRange, error) {
	r, err := ReadLayerRange(s)
	if err != nil {
		return r, err
	}
	if r.End == toTheLast {
		r.End = max(layers, r.First+1)
	}
	return r, r.Within(layers)
}

// toTheLast is the End ReadLayerRange gives "A-": the model's last layer,
// which ParseLayerRange knows.
const toTheLast = math.MaxInt

// ReadLayerRange reads "A-B" or "A-" as ParseLayerRange does, without a
// model to hold it against (where only its first layer matters: a later
// stage's flags, a rig's order of stages).
func ReadLayerRange(s string) (LayerRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if ok && strings.TrimSpace(b) == "" {
		last, err2 = toTheLast-1, nil
	}
	if !ok || err1 != nil || err2 != nil || first < 0 || last < first {
		return LayerRange{}, fmt.Errorf("layers %q: want A-B, the first and last layer (0-based), or A- (from A to the last)", s)
	}
	return LayerRange{first, last + 1}, nil
}

// NoLayers is the share of a node that holds none of the layers: a main
// node of a model staged whole (LoadOptions.Layers with Head), which
// embeds the tokens, hands every layer to its stages, and samples.
var NoLayers = LayerRange{}

// heldOf checks r is a share of a model of layers layers one node can
// hold: a range of its layers (Within), or NoLayers.
func (r LayerRange) heldOf(layers int) error {
	if r == NoLayers {
		return nil
	}
	return r.Within(layers)
}

// Within checks r is a non-empty range of a model's layers layers.
func (r LayerRange) Within(layers int) error {
	if r.First < 0 || r.End <= r.First || r.End > layers {
		return fmt.Errorf("layers %s: not a range of the model's %d layers (0-%d)", r, layers, layers-1)
	}
	return nil
}

// Contains reports whether r holds layer l.
func (r LayerRange) Contains(l int) bool { return r.First <= l && l < r.End }

// Covers reports whether r holds every layer of o.
func (r LayerRange) Covers(o LayerRange) bool { return r.First <= o.First && o.End <= r.End }

// String is r as -layers takes it: "A-B", inclusive ("none" for
// NoLayers).
func (r LayerRange) String() string {
	if r == NoLayers {
		return "none"
	}
	return fmt.Sprintf("%d-%d", r.First, r.End-1)
}

// LayerRunner runs the layers a staged model's process does not hold:
// those of the stages after its own, on other nodes (SetLayerRunner), as
// an ExpertRunner runs its experts.
type LayerRunner interface {
	// RunLayers runs layers r of pass step (the first stage's batch's, or
	// its session's) over the rows of spans, whose
	// hidden state after layer r.First-1 is hidden ([rows, hidden], the
	// spans' rows in order), and returns their hidden state after r's
	// last layer. A span is positions Start..Start+Count-1 of the
	// sequence Seq (a session's Seq): its positions from Start on are
	// forgotten first (a rewind), and those before held. onRoute, if
	// set, sees each layer's routes of the pass's rows as it is routed.
	RunLayers(ctx context.Context, step Step, r LayerRange, spans []RowSpan, hidden []float32, onRoute func(layer int, routes []Route)) ([]float32, error)
}

// RowSpan is one sequence's rows of a pass (LayerRunner).
type RowSpan struct {
	Seq          uint64
	Start, Count int
}

// SetLayerRunner makes the layers after those m holds run on r: a
// Forward of m's sessions (Batch.Forward, Session.ForwardHidden) runs
// its own layers, then r's, and ends at the output head, which m must
// hold (LoadOptions.Head).
func (m *Model) SetLayerRunner(r LayerRunner) error {
	if m.held.End < m.Config.NumLayers && len(m.LMHead.Data) == 0 {
		return fmt.Errorf("model: layers %s run elsewhere after, and no output head bound (LoadOptions.Head)", m.held)
	}
	m.remote = r
	return nil
}

// runRest has m's LayerRunner run the layers after those m holds over
// spans' rows, whose hidden state after m's last layer is rows, and
// writes theirs after the model's last layer back into rows. on, if
// set, is the pass's routing hook (step's), each layer's routes as they
// come (no router logits: they stay on the stage).
func (m *Model) runRest(ctx context.Context, step Step, spans []RowSpan, rows []float32, on func(Step, int, []float32, []Route)) error {
	if m.remote == nil {
		return fmt.Errorf("model: layers %s run nowhere (no LayerRunner)", m.rest())
	}
	var hook func(int, []Route)
	if on != nil {
		hook = func(l int, routes []Route) { on(step, l, nil, routes) }
	}
	out, err := m.remote.RunLayers(ctx, step, m.rest(), spans, rows, hook)
	if err != nil {
		return fmt.Errorf("model: layers %s: %w", m.rest(), err)
	}
	if len(out) != len(rows) {
		return fmt.Errorf("model: layers %s returned %d floats for %d", m.rest(), len(out), len(rows))
	}
	copy(rows, out)
	return nil
}

// Split cuts r into k stages of consecutive layers, as even as r's layers
// divide (the later stages the larger).
func (r LayerRange) Split(k int) []LayerRange {
	n := r.End - r.First
	out := make([]LayerRange, k)
	for i := range out {
		out[i] = LayerRange{First: r.First + i*n/k, End: r.First + (i+1)*n/k}
	}
	return out
}

// rest is the layers after those m holds, which its LayerRunner runs
// (empty where m holds the last layer).
func (m *Model) rest() LayerRange { return LayerRange{m.held.End, m.Config.NumLayers} }
