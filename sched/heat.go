package sched

import (
	"fmt"
	"math"
	"slices"
)

// minHeatScale is where Heat folds its global scale into the counts: far
// above float64's smallest normal, so that rows/scale stays finite.
const minHeatScale = 0x1p-100

// Heat counts the rows routed to each expert, decayed exponentially per
// pass, so that recent routing weighs most (Prism: migrate when
// popularity drifts). The main node feeds it every routing decision.
type Heat struct {
	expertGrid
	decay float64   // per Tick: 2^(-1/halfLife)
	scale float64   // a count is count[i]*scale: Tick is O(1) amortised
	count []float64 // layer-major
	iters float64   // decayed count of completed passes: sum of decay^k, k = 1..Ticks
}

// NewHeat counts activations of experts experts in each of layers
// (strictly ascending); a count halves every halfLife passes (> 0;
// +Inf: never).
func NewHeat(layers []int, experts int, halfLife float64) (*Heat, error) {
	if err := checkGrid(layers, experts); err != nil {
		return nil, fmt.Errorf("sched: heat: %w", err)
	}
	if !(halfLife > 0) {
		return nil, fmt.Errorf("sched: heat: half-life %v passes: want > 0", halfLife)
	}
	return &Heat{
		expertGrid: expertGrid{layers: slices.Clone(layers), experts: experts},
		decay:      math.Exp2(-1 / halfLife),
		scale:      1,
		count:      make([]float64, len(layers)*experts),
	}, nil
}

// Observe adds rows (>= 0) routed to expert of layer in one pass. It
// panics if layer has no experts or expert is out of range.
func (h *Heat) Observe(layer, expert int, rows float64) {
	h.count[h.index(layer, expert)] += rows / h.scale
}

// Tick ends a pass: every count decays by 2^(-1/halfLife).
func (h *Heat) Tick() {
	h.iters = (h.iters + 1) * h.decay
	s := h.scale * h.decay
	if s < minHeatScale {
		for i := range h.count {
			h.count[i] *= s
		}
		s = 1
	}
	h.scale = s
}

// Of is the decayed count of rows routed to expert of layer.
func (h *Heat) Of(layer, expert int) float64 { return h.count[h.index(layer, expert)] * h.scale }

// rate is the expected rows per pass of the expert at layer-major
// index i: the decayed count over the decayed number of passes, exact
// right after Tick for a steady load (rows observed since the last Tick
// count toward the next pass). 0 before the first Tick.
func (h *Heat) rate(i int) float64 {
	if h.iters == 0 {
		return 0
	}
	return h.count[i] * h.scale / h.iters
}
