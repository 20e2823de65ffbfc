package sched

// Residency: every expert of every layer has one owner worker, which keeps
// it loaded while its memory allows. The main node sends an expert's rows
// to its owner, the shadow tells the owner to prefetch it, and the main
// node (the only node that sees every routing decision) counts activations
// in a Heat and, at pass boundaries, asks Rebalance for the moves that
// pay for themselves (Prism's activation-aware placement and migration,
// with FluxMoE's budget-bounded residency deciding what stays loaded).

import (
	"fmt"
	"math"
	"slices"
)

// expertGrid is the shape Placement and Heat share: the layers that have
// experts (ascending) and the expert count of each.
type expertGrid struct {
	layers  []int
	experts int
}

// checkGrid says what is wrong with a grid of layers x experts, if
// anything. Layer numbers and worker indices travel as int32.
func checkGrid(layers []int, experts int) error {
	if experts < 1 {
		return fmt.Errorf("%d experts per layer: want at least 1", experts)
	}
	if len(layers) == 0 {
		return fmt.Errorf("no layers with experts")
	}
	if experts > math.MaxInt32/len(layers) {
		return fmt.Errorf("%d layers of %d experts: more than %d experts in all", len(layers), experts, math.MaxInt32)
	}
	for i, l := range layers {
		switch {
		case l < 0:
			return fmt.Errorf("layer %d: negative", l)
		case l > math.MaxInt32:
			return fmt.Errorf("layer %d: beyond int32", l)
		case i > 0 && l <= layers[i-1]:
			return fmt.Errorf("layer %d after layer %d: want strictly ascending layers", l, layers[i-1])
		}
	}
	return nil
}

// row is layer's position in g.layers; a layer without experts is a
// programmer error.
func (g *expertGrid) row(layer int) int {
	r, ok := slices.BinarySearch(g.layers, layer)
	if !ok {
		panic(fmt.Sprintf("sched: layer %d has no experts (layers %v)", layer, g.layers))
	}
	return r
}

// index is the layer-major index of (layer, expert).
func (g *expertGrid) index(layer, expert int) int {
	r := g.row(layer)
	if expert < 0 || expert >= g.experts {
		panic(fmt.Sprintf("sched: expert %d of layer %d: want 0..%d", expert, layer, g.experts-1))
	}
	return r*g.experts + expert
}

// Placement is the owner worker of every expert of every layer that has
// experts. It changes only through Apply, which bumps Version, so the main
// node and the shadow can tell which placement a message refers to. It is
// not safe for concurrent use: Clone it to hand it to another goroutine.
type Placement struct {
	expertGrid
	workers int
	owner   []int32 // layer-major: owner[row*experts+expert]
	version uint64
}

// NewPlacement is the initial placement over workers workers of a model
// whose layers with experts are layers (strictly ascending) with experts
// experts each: expert e of layer l is owned by worker (e + l) mod workers,
// as in Layout.Owner, so a layer's experts spread over all workers.
func NewPlacement(workers int, layers []int, experts int) (*Placement, error) {
	if workers < 1 || workers > math.MaxInt32 {
		return nil, fmt.Errorf("sched: placement: %d workers: want 1..%d", workers, math.MaxInt32)
	}
	if err := checkGrid(layers, experts); err != nil {
		return nil, fmt.Errorf("sched: placement: %w", err)
	}
	p := &Placement{
		expertGrid: expertGrid{layers: slices.Clone(layers), experts: experts},
		workers:    workers,
		owner:      make([]int32, len(layers)*experts),
	}
	for r, l := range layers {
		for e := range experts {
			p.owner[r*experts+e] = int32((e + l) % workers)
		}
	}
	return p, nil
}

// Workers is the number of workers experts are placed on.
func (p *Placement) Workers() int { return p.workers }

// Experts is the number of experts of each layer.
func (p *Placement) Experts() int { return p.experts }

// Layers is a copy of the layers that have experts, ascending.
func (p *Placement) Layers() []int { return slices.Clone(p.layers) }

// Owner is the worker that owns expert of layer. It panics if layer has
// no experts or expert is out of range.
func (p *Placement) Owner(layer, expert int) int { return int(p.owner[p.index(layer, expert)]) }

// Owners appends Owner(layer, e) for each of experts to dst; it allocates
// nothing but dst's growth.
func (p *Placement) Owners(dst []int, layer int, experts []int) []int {
	base := p.row(layer) * p.experts
	for _, e := range experts {
		if e < 0 || e >= p.experts {
			panic(fmt.Sprintf("sched: expert %d of layer %d: want 0..%d", e, layer, p.experts-1))
		}
		dst = append(dst, int(p.owner[base+e]))
	}
	return dst
}

// Owned lists the experts of layer that worker owns, ascending.
func (p *Placement) Owned(worker, layer int) []int {
	base := p.row(layer) * p.experts
	var out []int
	for e, w := range p.owner[base : base+p.experts] {
		if int(w) == worker {
			out = append(out, e)
		}
	}
	return out
}

// Version counts the Apply calls that changed something: 0 initially.
func (p *Placement) Version() uint64 { return p.version }

// Clone is an independent copy of p, version included.
func (p *Placement) Clone() *Placement {
	c := *p
	c.layers = slices.Clone(p.layers)
	c.owner = slices.Clone(p.owner)
	return &c
}

// Move hands expert of layer from worker From to worker To.
type Move struct {
	Layer, Expert, From, To int
	Gain                    float64 // modelled seconds saved per pass: of Cost, or of busy time for a move that breaks a tie (see Rebalance)
}

// Apply makes each move's To the owner of its expert, in order, and bumps
// Version if any move had From != To. If a move names a layer without
// experts, an expert or worker out of range, or a From that is not the
// expert's owner at that point (a stale move), Apply changes nothing and
// says which move.
func (p *Placement) Apply(moves []Move) error {
	changed := false
	for i, m := range moves {
		if err := p.move(m); err != nil {
			for _, done := range slices.Backward(moves[:i]) {
				p.owner[p.index(done.Layer, done.Expert)] = int32(done.From)
			}
			return fmt.Errorf("sched: move %d of %d: %w", i, len(moves), err)
		}
		changed = changed || m.From != m.To
	}
	if changed {
		p.version++
	}
	return nil
}

func (p *Placement) move(m Move) error {
	r, ok := slices.BinarySearch(p.layers, m.Layer)
	switch {
	case !ok:
		return fmt.Errorf("layer %d has no experts", m.Layer)
	case m.Expert < 0 || m.Expert >= p.experts:
		return fmt.Errorf("layer %d expert %d: want 0..%d", m.Layer, m.Expert, p.experts-1)
	case m.To < 0 || m.To >= p.workers:
		return fmt.Errorf("layer %d expert %d to worker %d: want 0..%d", m.Layer, m.Expert, m.To, p.workers-1)
	}
	i := r*p.experts + m.Expert
	if int(p.owner[i]) != m.From {
		return fmt.Errorf("layer %d expert %d: move from worker %d, but worker %d owns it (stale move)", m.Layer, m.Expert, m.From, p.owner[i])
	}
	p.owner[i] = int32(m.To)
	return nil
}

// Encode is p's wire form: its version, its layers, and the owners of all
// experts, layer-major (len(layers)*Experts()).
func (p *Placement) Encode() (version uint64, layers []int32, owners []int32) {
	layers = make([]int32, len(p.layers))
	for i, l := range p.layers {
		layers[i] = int32(l)
	}
	return p.version, layers, slices.Clone(p.owner)
}

// DecodePlacement is the placement that Encode wrote, for a swarm of
// workers workers and experts experts per layer (which the receiver knows
// from its own configuration). A message that does not fit them, or is
// inconsistent in itself, is an error.
func DecodePlacement(workers, experts int, version uint64, layers, owners []int32) (*Placement, error) {
	if workers < 1 || workers > math.MaxInt32 {
		return nil, fmt.Errorf("sched: placement message: %d workers: want 1..%d", workers, math.MaxInt32)
	}
	ls := make([]int, len(layers))
	for i, l := range layers {
		ls[i] = int(l)
	}
	if err := checkGrid(ls, experts); err != nil {
		return nil, fmt.Errorf("sched: placement message: %w", err)
	}
	if len(owners) != len(ls)*experts {
		return nil, fmt.Errorf("sched: placement message: %d owners for %d layers of %d experts: want %d",
			len(owners), len(ls), experts, len(ls)*experts)
	}
	for i, w := range owners {
		if w < 0 || int(w) >= workers {
			return nil, fmt.Errorf("sched: placement message: layer %d expert %d owned by worker %d: want 0..%d",
				ls[i/experts], i%experts, w, workers-1)
		}
	}
	return &Placement{
		expertGrid: expertGrid{layers: ls, experts: experts},
		workers:    workers,
		owner:      slices.Clone(owners),
		version:    version,
	}, nil
}
