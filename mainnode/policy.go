package mainnode

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/odmoe/odmoe/sched"
)

// Prefetch names a loading policy (the -prefetch flag): who tells the
// workers what to load, when. NewPolicy turns a name into its Policy.
type Prefetch string

// The policies (OD-MoE section 4.2's ablation cases name them).
const (
	// Reactive sends no hints in decode: workers load an expert when its
	// activation arrives (ablation case 6).
	Reactive Prefetch = "reactive"
	// OracleNext hints a layer's group the moment the main node's router
	// has chosen, just before the activation: it exercises the hint path
	// with always-correct predictions and no lookahead.
	OracleNext Prefetch = "oracle-next"
	// Shadow loads on the shadow node's predictions (SEP); a wrong one is
	// reloaded on demand and counted as a miss (ablation cases 1-4, with
	// the alignment periods).
	Shadow Prefetch = "shadow"
	// Random hints each layer's group with random experts one layer ahead
	// (ablation case 5).
	Random Prefetch = "random"
	// Resident is the fully cached reference, not a loading policy: every
	// expert lives on its owner worker (sched.Layout.Owner), which pinned
	// it at start (worker -resident), so nothing is loaded at all.
	Resident Prefetch = "resident"
)

// Prefetches lists the policies this build knows.
var Prefetches = []Prefetch{Reactive, OracleNext, Shadow, Random, Resident}

// ParsePrefetch checks a -prefetch value.
func ParsePrefetch(s string) (Prefetch, error) {
	if slices.Contains(Prefetches, Prefetch(s)) {
		return Prefetch(s), nil
	}
	names := make([]string, len(Prefetches))
	for i, p := range Prefetches {
		names[i] = string(p)
	}
	return "", fmt.Errorf("prefetch policy %q unknown (have %s)", s, strings.Join(names, ", "))
}

// PolicyModel is what a policy may need to know of the model: the random
// policy draws from it. Layers are the layers that have experts,
// ascending.
type PolicyModel struct {
	Layers        []int
	Experts, TopK int
	Seed          uint64 // the random policy's draws
}

// NewPolicy returns the Policy named p.
func NewPolicy(p Prefetch, m PolicyModel) (Policy, error) {
	switch p {
	case Reactive:
		return reactive{}, nil
	case OracleNext:
		return oracleNext{}, nil
	case Shadow:
		return shadowPolicy{}, nil
	case Random:
		if len(m.Layers) == 0 || m.TopK <= 0 || m.Experts < m.TopK {
			return nil, fmt.Errorf("mainnode: -prefetch random needs the model's layers, experts and top-k, got %+v", m)
		}
		return randomPolicy{m}, nil
	case Resident:
		return resident{}, nil
	}
	_, err := ParsePrefetch(string(p))
	return nil, err
}

// prefillAll is every loading policy's prefill: expert e of the layer runs
// on worker e mod Workers, and every worker is told at once which experts
// it will run, so all of them load in parallel (OD-MoE section 3.3).
func prefillAll(p *Plan, in *Input, layout sched.Layout) {
	p.Assign = layout.Assign(p.Assign, in.Layer, p.Experts, true)
	p.HintAssigned()
}

type reactive struct{}

func (reactive) Name() string { return string(Reactive) }

func (reactive) Place(p *Plan, in *Input, layout sched.Layout) {
	if in.Prefill() {
		prefillAll(p, in, layout)
		return
	}
	p.Assign = layout.Assign(p.Assign, in.Layer, p.Experts, false)
}

type oracleNext struct{}

func (oracleNext) Name() string { return string(OracleNext) }

func (oracleNext) Place(p *Plan, in *Input, layout sched.Layout) {
	if in.Prefill() {
		prefillAll(p, in, layout)
		return
	}
	p.Assign = layout.Assign(p.Assign, in.Layer, p.Experts, false)
	p.HintAssigned()
}

// shadowPolicy keeps each expert the shadow predicted on the worker the
// shadow told to load it; the shadow, not the main node, sends the hints.
type shadowPolicy struct{}

func (shadowPolicy) Name() string { return string(Shadow) }

func (shadowPolicy) Place(p *Plan, in *Input, layout sched.Layout) {
	if in.Prefill() {
		prefillAll(p, in, layout)
		return
	}
	p.Assign = layout.PlacePredicted(p.Assign, in.Layer, p.Experts, in.Predicted, in.PredictedOn)
}

// randomPolicy hints the next layer's group with TopK experts drawn at
// random, and places each layer as if those draws were a prediction. The
// draws are a function of (seed, sequence, pass, layer), so the
// policy needs no memory of what it hinted.
type randomPolicy struct{ m PolicyModel }

func (randomPolicy) Name() string { return string(Random) }

func (r randomPolicy) Place(p *Plan, in *Input, layout sched.Layout) {
	if in.Prefill() {
		prefillAll(p, in, layout)
		return
	}
	// this layer was hinted by the one before it, unless that was the prompt
	if in.Layer > r.m.Layers[0] || in.Step.Pass > 2 {
		p.Assign = layout.PlacePredicted(p.Assign, in.Layer, p.Experts, r.draw(p, in.Step.Seq, in.Step.Pass, in.Layer), nil)
	} else {
		p.Assign = layout.Assign(p.Assign, in.Layer, p.Experts, false)
	}
	it, next := in.Step.Pass, r.m.Layers[0] // the next layer with experts
	if i, _ := slices.BinarySearch(r.m.Layers, in.Layer+1); i < len(r.m.Layers) {
		next = r.m.Layers[i]
	} else {
		it++
	}
	drawn := r.draw(p, in.Step.Seq, it, next)
	step := in.Step
	step.Pass = it
	p.scratch = layout.PredictionHints(next, drawn, p.scratch, func(w int, experts []int) { p.Hint(w, step, next, experts...) })
}

// draw returns TopK distinct experts for (seq, pass, layer), sorted,
// in p's scratch (a partial Fisher-Yates shuffle; no allocation once the
// scratch has grown).
func (r randomPolicy) draw(p *Plan, seq uint64, it int64, layer int) []int {
	var src rand.PCG
	src.Seed(r.m.Seed^seq, uint64(it)<<20|uint64(layer))
	perm := p.perm[:0]
	for e := range r.m.Experts {
		perm = append(perm, e)
	}
	for i := range r.m.TopK {
		j := i + int(src.Uint64()%uint64(r.m.Experts-i))
		perm[i], perm[j] = perm[j], perm[i]
	}
	p.perm = perm
	drawn := perm[:r.m.TopK]
	slices.Sort(drawn)
	return drawn
}

// resident runs every expert on the worker that pinned it at start: no
// hints, no loads.
type resident struct{}

func (resident) Name() string { return string(Resident) }

func (resident) Place(p *Plan, in *Input, layout sched.Layout) {
	p.Assign = layout.Owners(p.Assign, in.Layer, p.Experts)
}
