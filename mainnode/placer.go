package mainnode

import (
	"math"
	"sync"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// The placer is residency's statistics and placement decisions on the
// main node, the only node that sees every routing decision (Prism): it
// counts decode activations per expert with decay (sched.Heat), measures
// each worker's load bandwidth and compute speed from its results, and at
// pass boundaries asks sched.Rebalance which experts to move to another
// owner, moves only those that pay back their own load, and hands the new
// placement to the planner.

const (
	// rebalanceEvery is how many decode passes go between two looks at
	// the placement: often enough to follow drifting popularity, rarely
	// enough that its cost (~2 ms for 48 layers x 128 experts x 16
	// workers once settled) stays far below the passes'.
	rebalanceEvery = 32
	// heatHalfLife, in decode passes, is how fast popularity is forgotten.
	heatHalfLife = 256
	// paybackPasses: a move must save its own load within this many passes.
	paybackPasses = 128
	// maxMovesPerRebalance bounds the loads one rebalance causes, so that
	// migrations never crowd a pass's own loads.
	maxMovesPerRebalance = 16
	// measureWeight is the weight of a new measurement in the running
	// means of load bandwidth and compute time.
	measureWeight = 0.05
	// defaultLoadBytesSec stands for a worker's load bandwidth until it
	// has loaded something (and said nothing in its Hello): a store read
	// and decompression on one core (FIELD-NOTES: ~1.9 GB/s).
	defaultLoadBytesSec = 1.9e9
	// defaultComputeBytesSec stands for how fast a worker streams an
	// expert's weights through one row until it has computed something
	// (FIELD-NOTES: BF16 matvec on one core, ~10 GB/s).
	defaultComputeBytesSec = 10e9
)

// ResidencyStats are what residency decided: absent with -residency off.
type ResidencyStats struct {
	Rebalances int64  // looks at the placement
	Migrations int64  // experts moved to another owner
	Version    uint64 // the placement's version now
}

type placer struct {
	log         zerolog.Logger
	first       int   // the first layer with experts: a decode pass starts there
	expertBytes int64 // one expert's BF16 bytes (every expert of these models has the same shape)

	every int64 // rebalanceEvery; tests shorten it

	mu      sync.Mutex
	heat    *sched.Heat
	caps    []sched.Capacity
	loadBps []float64 // measured, 0 until the first load
	rowSec  []float64 // compute seconds per row, measured, 0 until the first result
	passes  int64
	stats   ResidencyStats
}

// newPlacer returns the placer of a swarm over workers that said hellos,
// for a model whose layers (ascending) have experts experts of
// expertBytes each.
func newPlacer(layers []int, experts int, expertBytes int64, hellos []wire.Hello, log zerolog.Logger) (*placer, error) {
	heat, err := sched.NewHeat(layers, experts, heatHalfLife)
	if err != nil {
		return nil, err
	}
	pc := &placer{log: log, first: layers[0], expertBytes: expertBytes, every: rebalanceEvery, heat: heat,
		caps: make([]sched.Capacity, len(hellos)), loadBps: make([]float64, len(hellos)), rowSec: make([]float64, len(hellos))}
	for w, h := range hellos {
		pc.caps[w] = sched.Capacity{CacheBytes: cacheBytes(h.DeviceMemBytes, expertBytes), LoadBytesSec: h.LoadBytesSec}
	}
	return pc, nil
}

// initial is the placement to start from: cur moved, expert by expert,
// until each worker's share of the experts follows what it can hold,
// load and compute (Prism's capability-proportional placement), with
// every expert assumed equally popular, and nothing loaded yet, so every
// move is free. Equal workers keep cur as it is.
func (pc *placer) initial(cur *sched.Placement, topK int) (*sched.Placement, error) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	h, err := sched.NewHeat(cur.Layers(), cur.Experts(), math.Inf(1))
	if err != nil {
		return nil, err
	}
	for _, l := range cur.Layers() {
		for e := range cur.Experts() {
			h.Observe(l, e, float64(topK)/float64(cur.Experts()))
		}
	}
	h.Tick()
	opt, caps := pc.options()
	opt.HorizonIters, opt.MaxMoves = math.Inf(1), 0
	moves := sched.Rebalance(cur, h, caps, func(int, int) int64 { return pc.expertBytes }, opt)
	next := cur.Clone()
	if err := next.Apply(moves); err != nil {
		return nil, err
	}
	pc.stats.Version = next.Version()
	return next, nil
}

// cacheBytes is what a worker of budget bytes can keep resident: its
// budget less room for two experts passing through (one loading for a
// request, one predicted).
func cacheBytes(budget, expertBytes int64) int64 { return max(budget-2*expertBytes, 0) }

// observe counts a decode pass's routes of layer.
func (pc *placer) observe(layer int, routes []model.Route) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for _, r := range routes {
		pc.heat.Observe(layer, r.Expert, 1)
	}
}

// measured takes what a result of worker w says of its speed: its
// compute time over rows, and its load time if it loaded the expert.
func (pc *placer) measured(w int, res *wire.ExpertResult, rows int) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if rows > 0 && res.ComputeTime > 0 {
		pc.rowSec[w] = runningMean(pc.rowSec[w], res.ComputeTime.Seconds()/float64(rows))
	}
	if res.Loaded && res.LoadTime > 0 {
		pc.loadBps[w] = runningMean(pc.loadBps[w], float64(pc.expertBytes)/res.LoadTime.Seconds())
	}
}

func runningMean(mean, x float64) float64 {
	if mean == 0 {
		return x
	}
	return mean + measureWeight*(x-mean)
}

// pass marks the start of a decode pass; every rebalanceEvery passes it
// returns a new placement, the moves that make it from cur, or nil when
// nothing is worth moving.
func (pc *placer) pass(cur *sched.Placement) (*sched.Placement, []sched.Move) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.heat.Tick()
	pc.passes++
	if pc.passes%pc.every != 0 {
		return nil, nil
	}
	pc.stats.Rebalances++
	opt, caps := pc.options()
	moves := sched.Rebalance(cur, pc.heat, caps, func(int, int) int64 { return pc.expertBytes }, opt)
	if len(moves) == 0 {
		return nil, nil
	}
	next := cur.Clone()
	if err := next.Apply(moves); err != nil { // Rebalance's moves start from cur: a bug
		pc.log.Error().Err(err).Msg("mainnode: rebalancing produced moves that do not apply: placement kept")
		return nil, nil
	}
	pc.stats.Migrations += int64(len(moves))
	pc.stats.Version = next.Version()
	return next, moves
}

// options are the rebalance options and the workers' capacities as
// measured so far: a worker's compute scale is the workers' mean compute
// time per row over its own, its bandwidth what its loads took.
func (pc *placer) options() (sched.RebalanceOptions, []sched.Capacity) {
	var sum float64
	n := 0
	for _, s := range pc.rowSec {
		if s > 0 {
			sum, n = sum+s, n+1
		}
	}
	// until measured: a row reads the expert's weights once, at about
	// one core's memory bandwidth
	mean := float64(pc.expertBytes) / defaultComputeBytesSec
	if n > 0 {
		mean = sum / float64(n)
	}
	caps := make([]sched.Capacity, len(pc.caps))
	for w, c := range pc.caps {
		c.ComputeScale = 1
		if pc.rowSec[w] > 0 {
			c.ComputeScale = mean / pc.rowSec[w]
		}
		switch {
		case pc.loadBps[w] > 0:
			c.LoadBytesSec = pc.loadBps[w]
		case c.LoadBytesSec <= 0:
			c.LoadBytesSec = defaultLoadBytesSec
		}
		caps[w] = c
	}
	return sched.RebalanceOptions{ComputeSeconds: mean, HorizonIters: paybackPasses, MaxMoves: maxMovesPerRebalance}, caps
}

// snapshot returns the figures so far.
func (pc *placer) snapshot() ResidencyStats {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.stats
}
