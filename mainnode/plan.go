package mainnode

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
)

// The planner is the main node's decision logic, kept apart from the
// network as etcd raft keeps its state machine apart from its transport:
// fed with one layer's routing (and the shadow's prediction for it), it
// says which worker runs each expert, which hints to send, and which
// activations to send, with what eviction marks. The Swarm only carries
// plans out. It touches no socket and no clock, so scenario tests drive it
// directly (plan_test.go).

// Input is what the planner knows of one layer once the router has chosen.
type Input struct {
	Step   model.Step
	Layer  int
	Tokens int           // rows in the batch: 1 in decode, the prompt's length in prefill
	Routes []model.Route // Tokens*k routes, each token's sorted by expert id
	// Batched marks a batched decode pass: one row per sequence of a
	// Batcher, each a decode step, so the policies treat it as decode.
	Batched bool
	// Predicted is the shadow's prediction for this layer (distinct
	// experts, sorted), nil when none has arrived: no shadow, or late.
	Predicted []int
	// PredictedOn is the worker the shadow hinted each of Predicted to,
	// nil when it did not say (sched.Layout.PlacePredicted).
	PredictedOn []int
}

// Prefill reports whether the batch is a prompt's (more than one row,
// not a batched decode pass).
func (in *Input) Prefill() bool { return in.Tokens > 1 && !in.Batched }

// Hint is a Prediction the main node sends: worker should load experts of
// layer for step.
type Hint struct {
	Worker  int
	Step    model.Step
	Layer   int
	Experts []int32
}

// Request is one Activation: rows Tokens of the batch (indices into it)
// for Experts on Worker.
type Request struct {
	Worker  int
	Experts []int32
	Tokens  []int
	// Keep leaves the expert loaded for the request's next mini-batch.
	Keep bool
	// Cache leaves the experts resident on the worker once computed
	// (-residency on): they run on their owners, which keep them.
	Cache bool
	// EndLayer marks the worker's last request of the layer: it evicts
	// what it loaded for the layer on a wrong prediction.
	EndLayer bool
	// RowCounts, when set, gives each expert its own rows of Tokens
	// (wire.Activation.RowCounts): expert j runs on Tokens[Rows[...]],
	// RowCounts[j] of them. Unset: every expert on every token.
	Rows, RowCounts []int32
}

// ExpertTokens returns the batch rows expert j of r runs on, appended to
// dst.
func (r *Request) ExpertTokens(dst []int, j int) []int {
	if len(r.RowCounts) == 0 {
		return append(dst, r.Tokens...)
	}
	off := 0
	for _, c := range r.RowCounts[:j] {
		off += int(c)
	}
	for _, row := range r.Rows[off : off+int(r.RowCounts[j])] {
		dst = append(dst, r.Tokens[row])
	}
	return dst
}

// Plan is what the main node does for one layer. Its slices are reused
// from one layer to the next: a Plan belongs to one sequence and is valid
// until the next Planner.Plan on it.
type Plan struct {
	Experts  []int // the distinct experts the layer's routes name, sorted
	Assign   []int // the worker that runs Experts[i]
	Hints    []Hint
	Requests []Request

	ids          []int32 // backing store of Hints' and Requests' Experts
	tokens       []int   // backing store of Requests' Tokens
	rows         []int32 // backing store of Requests' Rows and RowCounts
	hintAssigned bool    // HintAssigned was called
	scratch      []int
	perm         []int // the random policy's draws
}

// Hint adds a hint: worker is to load experts of layer for step.
func (p *Plan) Hint(worker int, step model.Step, layer int, experts ...int) {
	start := len(p.ids)
	for _, e := range experts {
		p.ids = append(p.ids, int32(e))
	}
	p.Hints = append(p.Hints, Hint{Worker: worker, Step: step, Layer: layer, Experts: p.ids[start:len(p.ids):len(p.ids)]})
}

// HintAssigned asks for every expert of the layer to be hinted to the
// worker that will run it, once placement is final (after workers out of
// the layout have been avoided): one hint per worker, experts in id order.
func (p *Plan) HintAssigned() { p.hintAssigned = true }

// workers calls f for each worker that runs some of the layer's experts,
// in order of their first expert, with those experts (in p.ids).
func (p *Plan) workers(f func(w int, experts []int32)) {
	for i, w := range p.Assign {
		if slices.Index(p.Assign, w) != i {
			continue // done with the worker's first expert
		}
		start := len(p.ids)
		for j, e := range p.Experts {
			if p.Assign[j] == w {
				p.ids = append(p.ids, int32(e))
			}
		}
		f(w, p.ids[start:len(p.ids):len(p.ids)])
	}
}

// Policy is a prefetch policy: where a layer's experts run and what the
// main node hints ahead of them. A Policy is shared by every sequence and
// keeps no state of its own between calls: what it decides follows from
// its input.
type Policy interface {
	// Name is the policy's -prefetch name.
	Name() string
	// Place fills p.Assign (one worker per p.Experts, within the layout)
	// and adds the hints the main node sends for this layer.
	Place(p *Plan, in *Input, layout sched.Layout)
}

// Planner plans layers for a layout of workers under a policy. Safe for
// concurrent use by sequences with plans of their own, and with SetLive
// (a layer planned while a worker goes out sees it in or out, and either
// is a valid plan: the Swarm re-sends what a lost worker had).
type Planner struct {
	layout    sched.Layout
	policy    Policy
	miniBatch int
	down      []atomic.Bool // workers out of the layout (lost)
	// placement, when set, is who owns each expert (-residency on): every
	// expert runs on its owner, which keeps it resident
	placement atomic.Pointer[sched.Placement]
	// spoiled are the experts a worker's store could not give (Spoil):
	// planned on another worker from then on
	spoiled atomic.Pointer[map[spoil]bool]
}

// spoil is an expert of a layer that worker cannot load.
type spoil struct{ worker, layer, expert int }

// Spoil records that worker w's store cannot give layer's expert (its
// bytes failed their checksum there): later plans run it elsewhere.
func (pl *Planner) Spoil(w, layer, expert int) {
	for {
		old := pl.spoiled.Load()
		m := map[spoil]bool{{w, layer, expert}: true}
		if old != nil {
			if (*old)[spoil{w, layer, expert}] {
				return
			}
			for k := range *old {
				m[k] = true
			}
		}
		if pl.spoiled.CompareAndSwap(old, &m) {
			return
		}
	}
}

// Unspoil forgets what worker w's store failed (it rejoined: its store
// may have been put back; what still fails is spoiled again).
func (pl *Planner) Unspoil(w int) {
	for {
		old := pl.spoiled.Load()
		if old == nil {
			return
		}
		m := map[spoil]bool{}
		for k := range *old {
			if k.worker != w {
				m[k] = true
			}
		}
		next := &m
		if len(m) == 0 {
			next = nil
		}
		if pl.spoiled.CompareAndSwap(old, next) {
			return
		}
	}
}

// NewPlanner returns a planner; miniBatch is the prefill tokens per
// activation.
func NewPlanner(layout sched.Layout, policy Policy, miniBatch int) (*Planner, error) {
	if miniBatch <= 0 {
		return nil, fmt.Errorf("mainnode: prefill mini-batch of %d tokens", miniBatch)
	}
	if layout.Workers < 1 || layout.Group < 1 || layout.Workers%layout.Group != 0 {
		return nil, fmt.Errorf("mainnode: layout of %d workers in groups of %d", layout.Workers, layout.Group)
	}
	return &Planner{layout: layout, policy: policy, miniBatch: miniBatch, down: make([]atomic.Bool, layout.Workers)}, nil
}

// Policy is the planner's prefetch policy.
func (pl *Planner) Policy() Policy { return pl.policy }

// SetPlacement makes every expert run on its owner in p and stay resident
// there (-residency on), whatever the policy would place; hints go to the
// owners too. nil goes back to the policy's placement, cacheless. Safe
// while sequences plan: a layer planned meanwhile follows one or the
// other, and either is a valid plan.
func (pl *Planner) SetPlacement(p *sched.Placement) error {
	if p != nil && p.Workers() != pl.layout.Workers {
		return fmt.Errorf("mainnode: a placement over %d workers for a layout of %d", p.Workers(), pl.layout.Workers)
	}
	pl.placement.Store(p)
	return nil
}

// Placement is the placement experts run on (nil: the policy's).
func (pl *Planner) Placement() *sched.Placement { return pl.placement.Load() }

// SetLive takes worker w out of the layout (live false) or puts it back:
// what would run on a worker that is out runs on a live one instead. It
// reports whether w's state changed. With no worker live, Plan must not
// be called (Live says so).
func (pl *Planner) SetLive(w int, live bool) (changed bool, err error) {
	if w < 0 || w >= len(pl.down) {
		return false, fmt.Errorf("mainnode: worker %d of %d", w, len(pl.down))
	}
	return pl.down[w].Swap(!live) == live, nil
}

// Live is the number of workers in the layout.
func (pl *Planner) Live() int {
	n := 0
	for i := range pl.down {
		if !pl.down[i].Load() {
			n++
		}
	}
	return n
}

// IsLive reports whether worker w is in the layout.
func (pl *Planner) IsLive(w int) bool { return !pl.down[w].Load() }

// Plan fills p for one layer: the experts the routes name, where each
// runs, the hints and the requests.
func (pl *Planner) Plan(p *Plan, in *Input) {
	p.Experts, p.Assign, p.Hints, p.Requests = p.Experts[:0], p.Assign[:0], p.Hints[:0], p.Requests[:0]
	p.ids, p.tokens, p.rows, p.hintAssigned = p.ids[:0], p.tokens[:0], p.rows[:0], false
	for _, r := range in.Routes {
		if !slices.Contains(p.Experts, r.Expert) {
			p.Experts = append(p.Experts, r.Expert)
		}
	}
	slices.Sort(p.Experts)
	pl.policy.Place(p, in, pl.layout)
	owners := pl.placement.Load()
	if owners != nil {
		p.Assign = owners.Owners(p.Assign[:0], in.Layer, p.Experts)
		ownHints(p, owners)
	}
	pl.avoidDown(p, in.Layer)
	pl.avoidSpoiled(p, in.Layer)
	if p.hintAssigned {
		p.workers(func(w int, experts []int32) {
			p.Hints = append(p.Hints, Hint{Worker: w, Step: in.Step, Layer: in.Layer, Experts: experts})
		})
	}
	switch {
	case in.Batched && in.Tokens > 1:
		pl.batchRequests(p, in)
	case in.Tokens > 1:
		pl.rowRequests(p, in)
	default:
		pl.decodeRequests(p)
	}
	if owners != nil {
		for i := range p.Requests {
			p.Requests[i].Cache = true
		}
	}
}

// ownHints sends each expert the policy hinted to its owner: one hint per
// (hint, owner), experts in the hint's order.
func ownHints(p *Plan, owners *sched.Placement) {
	n := len(p.Hints)
	for i := range n {
		h := p.Hints[i]
		for j, e := range h.Experts {
			w := owners.Owner(h.Layer, int(e))
			if slices.ContainsFunc(h.Experts[:j], func(d int32) bool { return owners.Owner(h.Layer, int(d)) == w }) {
				continue // done with this owner
			}
			start := len(p.ids)
			for _, d := range h.Experts[j:] {
				if owners.Owner(h.Layer, int(d)) == w {
					p.ids = append(p.ids, d)
				}
			}
			p.Hints = append(p.Hints, Hint{Worker: w, Step: h.Step, Layer: h.Layer, Experts: p.ids[start:len(p.ids):len(p.ids)]})
		}
	}
	p.Hints = append(p.Hints[:0], p.Hints[n:]...)
}

// avoidDown moves what the policy gave to workers out of the layout onto
// live ones: the next live worker of the same group, else the next live
// worker at all.
func (pl *Planner) avoidDown(p *Plan, layer int) {
	if pl.Live() == len(pl.down) {
		return
	}
	for i, w := range p.Assign {
		p.Assign[i] = pl.Substitute(w)
	}
	for i := range p.Hints {
		p.Hints[i].Worker = pl.Substitute(p.Hints[i].Worker)
	}
}

// avoidSpoiled moves each expert a worker cannot load off it: to the next
// live worker of its group that can, else the next live one at all (it
// stays where it is when none can: the request fails there, naming why).
// Its hints move with it (a hint may be for a later layer: that layer's
// plan moves the expert to the same worker), so the worker that runs it
// has loaded it ahead.
func (pl *Planner) avoidSpoiled(p *Plan, layer int) {
	if pl.spoiled.Load() == nil {
		return
	}
	for i, w := range p.Assign {
		if c, ok := pl.unspoiled(w, layer, int(p.Experts[i])); ok {
			p.Assign[i] = c
		}
	}
	n := len(p.Hints)
	for i := range n {
		h := p.Hints[i]
		if !slices.ContainsFunc(h.Experts, func(e int32) bool { return pl.isSpoiled(h.Worker, h.Layer, int(e)) }) {
			continue
		}
		start := len(p.ids) // the experts it keeps (h.Experts may be the policy's: not edited)
		for _, e := range h.Experts {
			if c, ok := pl.unspoiled(h.Worker, h.Layer, int(e)); ok {
				p.Hints = append(p.Hints, Hint{Worker: c, Step: h.Step, Layer: h.Layer, Experts: []int32{e}})
			} else {
				p.ids = append(p.ids, e)
			}
		}
		p.Hints[i].Experts = p.ids[start:len(p.ids):len(p.ids)]
	}
	p.Hints = slices.DeleteFunc(p.Hints, func(h Hint) bool { return len(h.Experts) == 0 })
}

// unspoiled is where expert e of layer goes instead of worker w, whose
// store failed it: false when w can load it (or no live worker can).
func (pl *Planner) unspoiled(w, layer, e int) (int, bool) {
	if !pl.isSpoiled(w, layer, e) {
		return w, false
	}
	return pl.nearest(w, func(c int) bool { return pl.IsLive(c) && !pl.isSpoiled(c, layer, e) })
}

// isSpoiled reports whether worker w's store failed layer's expert.
func (pl *Planner) isSpoiled(w, layer, expert int) bool {
	m := pl.spoiled.Load()
	return m != nil && (*m)[spoil{w, layer, expert}]
}

// nearest is the first worker after w that ok accepts, the others of w's
// group first, then every worker in order; w and false when none is.
func (pl *Planner) nearest(w int, ok func(c int) bool) (int, bool) {
	g, G := w/pl.layout.Group, pl.layout.Group
	for j := 1; j < G; j++ {
		if c := g*G + (w%G+j)%G; ok(c) {
			return c, true
		}
	}
	for j := 1; j < pl.layout.Workers; j++ {
		if c := (w + j) % pl.layout.Workers; ok(c) {
			return c, true
		}
	}
	return w, false
}

// Substitute is the worker that runs what the layout gives w: w itself
// while it is live, else the next live worker of its group, else the next
// live worker at all (w when none is).
func (pl *Planner) Substitute(w int) int {
	if !pl.down[w].Load() {
		return w
	}
	c, _ := pl.nearest(w, pl.IsLive)
	return c
}

// decodeRequests sends each worker one activation with all its experts on
// the one token; each is the worker's last of the layer.
func (pl *Planner) decodeRequests(p *Plan) {
	p.workers(func(w int, experts []int32) {
		p.tokens = append(p.tokens, 0)
		p.Requests = append(p.Requests, Request{Worker: w, Experts: experts,
			Tokens: p.tokens[len(p.tokens)-1 : len(p.tokens) : len(p.tokens)], EndLayer: true})
	})
}

// maxRequestExperts bounds the experts of one request (the Swarm marks
// each one's answer in a 64-bit mask).
const maxRequestExperts = 64

// batchRequests sends each worker of a batched decode pass one request
// (up to maxRequestExperts experts) with the rows of every sequence that
// routed to one of its experts, each expert with its own rows; each is
// the worker's last of the layer.
func (pl *Planner) batchRequests(p *Plan, in *Input) {
	k := len(in.Routes) / in.Tokens
	routed := func(t int, e int32) bool {
		for _, r := range in.Routes[t*k : (t+1)*k] {
			if r.Expert == int(e) {
				return true
			}
		}
		return false
	}
	p.workers(func(w int, experts []int32) {
		for lo := 0; lo < len(experts); lo += maxRequestExperts {
			exps := experts[lo:min(lo+maxRequestExperts, len(experts))]
			start := len(p.tokens)
			for t := range in.Tokens {
				if slices.ContainsFunc(exps, func(e int32) bool { return routed(t, e) }) {
					p.tokens = append(p.tokens, t)
				}
			}
			toks := p.tokens[start:len(p.tokens):len(p.tokens)]
			rstart := len(p.rows)
			for _, e := range exps {
				for i, t := range toks {
					if routed(t, e) {
						p.rows = append(p.rows, int32(i))
					}
				}
			}
			cstart := len(p.rows)
			for _, e := range exps {
				c := int32(0)
				for _, t := range toks {
					if routed(t, e) {
						c++
					}
				}
				p.rows = append(p.rows, c)
			}
			p.Requests = append(p.Requests, Request{Worker: w, Experts: exps, Tokens: toks,
				Rows: p.rows[rstart:cstart:cstart], RowCounts: p.rows[cstart:len(p.rows):len(p.rows)],
				EndLayer: lo+maxRequestExperts >= len(experts)})
		}
	})
}

// rowRequests sends each expert its rows in mini-batches (OD-MoE
// section 3.3), all but the last with Keep; each worker's last request
// ends the layer there.
func (pl *Planner) rowRequests(p *Plan, in *Input) {
	k := len(in.Routes) / in.Tokens
	for i, e := range p.Experts {
		start := len(p.tokens)
		for t := range in.Tokens {
			for _, r := range in.Routes[t*k : (t+1)*k] {
				if r.Expert == e {
					p.tokens = append(p.tokens, t)
				}
			}
		}
		toks := p.tokens[start:]
		p.ids = append(p.ids, int32(e))
		id := p.ids[len(p.ids)-1 : len(p.ids) : len(p.ids)]
		for lo := 0; lo < len(toks); lo += pl.miniBatch {
			hi := min(lo+pl.miniBatch, len(toks))
			p.Requests = append(p.Requests, Request{Worker: p.Assign[i], Experts: id, Tokens: toks[lo:hi:hi], Keep: hi < len(toks)})
		}
	}
	for w := range pl.layout.Workers {
		for i := len(p.Requests) - 1; i >= 0; i-- {
			if p.Requests[i].Worker == w {
				p.Requests[i].EndLayer = true
				break
			}
		}
	}
}
