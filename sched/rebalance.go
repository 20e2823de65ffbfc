package sched

import (
	"cmp"
	"fmt"
	"slices"
)

// Capacity is what a worker brings, as announced in its Hello.
type Capacity struct {
	CacheBytes   int64   // device memory it can keep experts resident in (its budget minus working space)
	LoadBytesSec float64 // how fast it loads an expert it does not hold (not positive: loads cost nothing)
	ComputeScale float64 // relative compute speed (1 = reference; not positive means 1)
}

// RebalanceOptions tune Cost and Rebalance.
type RebalanceOptions struct {
	ComputeSeconds float64 // seconds to compute one routed row of one expert at ComputeScale 1
	HorizonIters   float64 // a move must pay back its load (expert bytes / LoadBytesSec of the new owner) within this many passes (0: no move does)
	MaxMoves       int     // at most this many moves per Rebalance (0 or less: no bound)
}

// Cost is the modelled busy time, in seconds per pass, of the swarm
// under placement p with activations h: the sum over layers of the slowest
// worker's time on the layer. A layer's experts run in parallel on their
// owners and the next layer waits for the last of them, so experts of one
// layer crowded on one worker serialise, and a worker twice as capable
// should carry twice the work (Prism: placement by node capability).
//
// A worker's time on a layer is the sum, over the experts of the layer it
// owns, of
//
//	rate*ComputeSeconds/ComputeScale + miss*min(rate, 1)*bytes/LoadBytesSec
//
// where rate is the expert's expected routed rows per pass (h's
// decayed count over its decayed number of passes: exact right after
// Tick for a steady load; 0 before the first Tick), bytes is
// expertBytes(layer, expert), and miss is 0 if the worker keeps the expert
// resident, 1 if not. A pass is one pass of every layer, and a pass
// loads a missing expert once however many rows it runs, so a missing
// expert costs at most one load per pass, and about rate loads when
// it is used less than once per pass.
//
// Residency (FluxMoE: experts stay loaded while the budget allows): a
// worker keeps resident the longest run of the experts it owns, across all
// layers, hottest first (ties by layer, then expert), whose bytes fit in
// CacheBytes. For equal-sized experts this is the set that a cache evicting
// the coldest settles on; with mixed sizes, the first expert that does not
// fit ends the run, a pessimistic simplification.
//
// Not modelled: sending activations (the same whoever owns the expert) and
// loads overlapped with compute. CacheBytes below 0 counts as 0.
// Cost panics if len(caps) != p.Workers() or h does not have p's layers
// and experts.
func Cost(p *Placement, h *Heat, caps []Capacity, expertBytes func(layer, expert int) int64, opt RebalanceOptions) float64 {
	return newCostModel(p, h, caps, expertBytes, opt).total()
}

// Rebalance is the moves that lower Cost, or failing that the swarm's busy
// time, in the order to apply them; it does not change p. Its objective is
// lexicographic: first Cost; then, among placements of equal Cost (within
// a billionth of the initial Cost: float noise), the busy time, the sum
// over layers of every worker's time on the layer (worker-seconds per
// pass). The second key matters where several workers tie at a
// layer's maximum, as under the uniform heat the initial placement is
// computed from: no single move lowers the maximum, but moving experts off
// a tied worker onto one that runs them for less (more cache, faster
// loads or compute) lowers busy time and unties the maximum, so later
// moves lower Cost (Prism: placement by node capability).
//
// It is a deterministic greedy local search: each round takes, for every
// layer, the best move of one expert off a worker at the layer's maximum
// (within the epsilon) to any other worker, then applies these best first,
// each re-chosen for its layer against the moves already made; rounds go
// on until no move is left or MaxMoves are made. A move is kept if either
//
//   - it lowers Cost by more than the epsilon; its Gain is the Cost it
//     saves, or
//   - it does not raise Cost, leaves every worker it adds time to more
//     than the epsilon below its layer's maximum (so not even rounding
//     raises Cost), and lowers busy time by more than a billionth of the
//     initial busy time; its Gain is the busy time it saves,
//
// and it pays back its load within HorizonIters: Gain*HorizonIters >
// bytes/LoadBytesSec of To (Prism eq. (4), per move; for the second kind
// both sides are worker-seconds: those the move saves each pass, and
// those the new owner spends loading the expert once). Moves rank the
// first kind before the second, then by Gain, busy time saved, the
// receiver's time on the layer (least first: alike workers share equal
// gains, and spreading over them keeps room for the next moves), layer,
// expert and To. Each move's Gain is given the moves before it.
//
// Only single moves off the workers at a layer's maximum are tried: a move
// off another worker that would only lower busy time is not looked for,
// and a move whose gain is too small to pay back its load is not worth
// making anyway. Rebalance panics where Cost does.
func Rebalance(p *Placement, h *Heat, caps []Capacity, expertBytes func(layer, expert int) int64, opt RebalanceOptions) []Move {
	m := newCostModel(p, h, caps, expertBytes, opt)
	lim := limits{minCost: 1e-9 * m.total(), minBusy: 1e-9 * m.busy(), horizon: opt.HorizonIters}
	if !(lim.minCost > 0) {
		return nil // no heat: nothing to go on
	}
	var moves []Move
	var cands []candidate
	for {
		cands = cands[:0]
		for r := range m.layerNums {
			if c, ok := m.bestMove(r, lim); ok {
				cands = append(cands, c)
			}
		}
		if len(cands) == 0 {
			return moves
		}
		slices.SortFunc(cands, func(a, b candidate) int {
			if a.better(b) {
				return -1
			}
			if b.better(a) {
				return 1
			}
			return 0
		})
		for i, c := range cands {
			if opt.MaxMoves > 0 && len(moves) >= opt.MaxMoves {
				return moves
			}
			if i > 0 { // the moves before it changed the state c was chosen in
				var ok bool
				if c, ok = m.bestMove(c.row, lim); !ok {
					continue
				}
			}
			m.apply(c.row*m.experts+c.mv.Expert, c.mv.From, c.mv.To)
			moves = append(moves, c.mv)
		}
	}
}

// limits are what a move must beat to be kept.
type limits struct {
	minCost float64 // Cost differences up to this are float noise
	minBusy float64 // likewise for busy time
	horizon float64 // HorizonIters
}

// candidate is a move of the expert at row*experts+mv.Expert.
type candidate struct {
	row        int
	lowersCost bool    // Gain is Cost saved; else busy time saved at equal Cost
	busyGain   float64 // busy time saved
	toTime     float64 // To's seconds on the layer after the move
	mv         Move
}

// better orders candidates lexicographically: Cost moves first; then the
// larger Gain; then the larger busy time saved (the objective's second key,
// for Cost moves of equal Gain); then the receiver left least busy on the
// layer (gains tie exactly where workers are alike: spreading the moves
// over them keeps room under the maximum for the next ones, where filling
// the lowest-numbered first would stall with it at the maximum); then
// the lowest (layer, expert, To).
func (a candidate) better(b candidate) bool {
	if a.lowersCost != b.lowersCost {
		return a.lowersCost
	}
	if a.mv.Gain != b.mv.Gain {
		return a.mv.Gain > b.mv.Gain
	}
	if a.busyGain != b.busyGain {
		return a.busyGain > b.busyGain
	}
	if a.toTime != b.toTime {
		return a.toTime < b.toTime
	}
	return cmp.Or(cmp.Compare(a.mv.Layer, b.mv.Layer), cmp.Compare(a.mv.Expert, b.mv.Expert),
		cmp.Compare(a.mv.To, b.mv.To)) < 0
}

// costModel is the state behind Cost and Rebalance. Experts are indexed
// layer-major (x = row*experts + expert), as in Placement.
type costModel struct {
	experts, workers int
	layerNums        []int
	owner            []int32
	rate             []float64 // expected rows per pass
	bytes            []int64
	computeSec       []float64 // per worker: seconds per routed row
	loadSecPerByte   []float64 // per worker: 0 when loads are free
	cache            []int64   // per worker
	order            [][]int32 // per worker: the experts it owns, hottest first
	cum              [][]int64 // per worker: cum[i] = bytes of order[:i+1]
	fit              []int     // per worker: how many of order are resident
	resident         []bool
	t                []float64 // [row*workers+w]: worker w's seconds on the layer
	layerMax         []float64 // per row: the slowest worker's seconds
	top              []ranked  // [row*3+i]: the three slowest workers, slowest first (w -1: none)

	// scratch of drop and delta
	dropped  []rowDelta // w1's savings without the expert to move
	dt       []float64  // like t: the change a move would make
	seen     []bool     // per row: in rowsSeen
	rowsSeen []int
}

func newCostModel(p *Placement, h *Heat, caps []Capacity, expertBytes func(layer, expert int) int64, opt RebalanceOptions) *costModel {
	if len(caps) != p.workers {
		panic(fmt.Sprintf("sched: %d capacities for %d workers", len(caps), p.workers))
	}
	if !slices.Equal(p.layers, h.layers) || p.experts != h.experts {
		panic(fmt.Sprintf("sched: heat of layers %v x %d experts for a placement of layers %v x %d experts",
			h.layers, h.experts, p.layers, p.experts))
	}
	n, W := len(p.owner), p.workers
	m := &costModel{
		experts: p.experts, workers: W, layerNums: p.layers,
		owner: slices.Clone(p.owner), rate: make([]float64, n), bytes: make([]int64, n),
		computeSec: make([]float64, W), loadSecPerByte: make([]float64, W), cache: make([]int64, W),
		order: make([][]int32, W), cum: make([][]int64, W), fit: make([]int, W),
		resident: make([]bool, n), t: make([]float64, len(p.layers)*W), layerMax: make([]float64, len(p.layers)),
		top: make([]ranked, 3*len(p.layers)), dt: make([]float64, len(p.layers)*W), seen: make([]bool, len(p.layers)),
	}
	for r, l := range p.layers {
		for e := range p.experts {
			x := r*p.experts + e
			m.rate[x] = h.rate(x)
			m.bytes[x] = max(0, expertBytes(l, e))
		}
	}
	for w, c := range caps {
		scale := c.ComputeScale
		if !(scale > 0) {
			scale = 1
		}
		m.computeSec[w] = opt.ComputeSeconds / scale
		if c.LoadBytesSec > 0 {
			m.loadSecPerByte[w] = 1 / c.LoadBytesSec
		}
		m.cache[w] = max(0, c.CacheBytes)
	}
	for x, w := range m.owner {
		m.order[w] = append(m.order[w], int32(x))
	}
	for w := range W {
		slices.SortFunc(m.order[w], func(a, b int32) int {
			return cmp.Or(cmp.Compare(m.rate[b], m.rate[a]), cmp.Compare(a, b))
		})
		m.rebuild(w)
	}
	m.refreshMax()
	return m
}

// hotter orders experts hottest first, ties by index (layer, then expert).
func (m *costModel) hotter(a, b int32) bool {
	ra, rb := m.rate[a], m.rate[b]
	return ra > rb || ra == rb && a < b
}

// at is where x is, or would go, in w's hotness order.
func (m *costModel) at(w int, x int32) int {
	o := m.order[w]
	lo, hi := 0, len(o)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if m.hotter(o[mid], x) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// missCost is what w pays per pass for not keeping x resident.
func (m *costModel) missCost(x int32, w int) float64 {
	return min(m.rate[x], 1) * float64(m.bytes[x]) * m.loadSecPerByte[w]
}

func (m *costModel) itemCost(x int32, w int, resident bool) float64 {
	c := m.rate[x] * m.computeSec[w]
	if !resident {
		c += m.missCost(x, w)
	}
	return c
}

// rebuild recomputes w's residency and times from its order.
func (m *costModel) rebuild(w int) {
	o := m.order[w]
	c := m.cum[w][:0]
	var sum int64
	for _, x := range o {
		sum += m.bytes[x]
		c = append(c, sum)
	}
	m.cum[w] = c
	f := len(o)
	for i, s := range c {
		if s > m.cache[w] {
			f = i
			break
		}
	}
	m.fit[w] = f
	for r := range m.layerNums {
		m.t[r*m.workers+w] = 0
	}
	for i, x := range o {
		m.resident[x] = i < f
		m.t[int(x)/m.experts*m.workers+w] += m.itemCost(x, w, i < f)
	}
}

// ranked is worker w's seconds v on a layer.
type ranked struct {
	v float64
	w int
}

func (m *costModel) refreshMax() {
	for r := range m.layerNums {
		top := m.top[3*r : 3*r+3]
		for i := range top {
			top[i] = ranked{0, -1}
		}
		for w, v := range m.t[r*m.workers : (r+1)*m.workers] {
			switch {
			case top[0].w < 0 || v > top[0].v:
				top[0], top[1], top[2] = ranked{v, w}, top[0], top[1]
			case top[1].w < 0 || v > top[1].v:
				top[1], top[2] = ranked{v, w}, top[1]
			case top[2].w < 0 || v > top[2].v:
				top[2] = ranked{v, w}
			}
		}
		m.layerMax[r] = top[0].v
	}
}

// slowestOther is the slowest time on row r of the workers other than w1
// and w2 (0 if there are none: times are not negative).
func (m *costModel) slowestOther(r, w1, w2 int) float64 {
	for _, t := range m.top[3*r : 3*r+3] {
		if t.w != w1 && t.w != w2 {
			return t.v
		}
	}
	return 0
}

func (m *costModel) total() float64 {
	s := 0.0
	for _, v := range m.layerMax {
		s += v
	}
	return s
}

// busy is the busy time: every worker's seconds on every layer, summed.
func (m *costModel) busy() float64 {
	s := 0.0
	for _, v := range m.t {
		s += v
	}
	return s
}

// add notes that a move would change w's time on the layer of row r by v.
func (m *costModel) add(r, w int, v float64) {
	m.dt[r*m.workers+w] += v
	if !m.seen[r] {
		m.seen[r] = true
		m.rowsSeen = append(m.rowsSeen, r)
	}
}

// drop notes, for delta, what x's owner w1 would save without x: x's own
// time and, if x was in (or ended) the resident run, the misses of the
// experts after it that would then fit.
func (m *costModel) drop(x int32, w1 int) {
	b := m.bytes[x]
	k := m.at(w1, x)
	m.dropped = append(m.dropped[:0], rowDelta{int(x) / m.experts, -m.itemCost(x, w1, m.resident[x])})
	if o, c := m.order[w1], m.cum[w1]; k <= m.fit[w1] {
		for i := max(m.fit[w1], k+1); i < len(o) && c[i]-b <= m.cache[w1]; i++ {
			m.dropped = append(m.dropped, rowDelta{int(o[i]) / m.experts, -m.missCost(o[i], w1)})
		}
	}
}

type rowDelta struct {
	row int
	v   float64
}

// delta is the change in Cost and in busy time if x, just passed to drop,
// moved from its owner w1 to w2: only w1 and w2's times change, on x's
// layer and on the layers of the experts whose residency the move flips.
// crowds says whether w2 would end within margin of, or above, the maximum
// of a layer it gains time on. (w1's times only fall, also as rebuild
// sums them: float addition is monotone.) toTime is w2's new time on x's
// layer.
func (m *costModel) delta(x int32, w1, w2 int, margin float64) (cost, busy, toTime float64, crowds bool) {
	rx, b := int(x)/m.experts, m.bytes[x]
	for _, d := range m.dropped {
		m.add(d.row, w1, d.v)
		busy += d.v
	}

	// w2 takes x at its place in the order; experts of the resident run
	// after it that no longer fit (all of them if x does not) are evicted.
	k := m.at(w2, x)
	o, c, f := m.order[w2], m.cum[w2], m.fit[w2]
	var before int64
	if k > 0 {
		before = c[k-1]
	}
	fits := k <= f && before+b <= m.cache[w2]
	v := m.itemCost(x, w2, fits)
	m.add(rx, w2, v)
	busy += v
	for i := f - 1; i >= k && (!fits || c[i]+b > m.cache[w2]); i-- {
		v := m.missCost(o[i], w2)
		m.add(int(o[i])/m.experts, w2, v)
		busy += v
	}

	for _, r := range m.rowsSeen {
		t, dt := m.t[r*m.workers:(r+1)*m.workers], m.dt[r*m.workers:(r+1)*m.workers]
		if dt[w2] > 0 && t[w2]+dt[w2] > m.layerMax[r]-margin {
			crowds = true
		}
		if r == rx {
			toTime = t[w2] + dt[w2]
		}
		// only w1 and w2 change
		slowest := max(m.slowestOther(r, w1, w2), t[w1]+dt[w1], t[w2]+dt[w2])
		dt[w1], dt[w2] = 0, 0
		cost += slowest - m.layerMax[r]
		m.seen[r] = false
	}
	m.rowsSeen = m.rowsSeen[:0]
	return cost, busy, toTime, crowds
}

// bestMove is the best move (see candidate.better) of one expert of row r
// off a worker within lim.minCost of the layer's maximum that Rebalance
// may keep (see there).
func (m *costModel) bestMove(r int, lim limits) (candidate, bool) {
	t := m.t[r*m.workers : (r+1)*m.workers]
	floor := m.layerMax[r] - lim.minCost
	best := candidate{row: r}
	found := false
	for e := range m.experts {
		x := int32(r*m.experts + e)
		w1 := int(m.owner[x])
		if t[w1] < floor || m.rate[x] == 0 {
			continue // off the maximum, or cold: moving it saves nothing
		}
		m.drop(x, w1)
		for w2 := range m.workers {
			if w2 == w1 {
				continue
			}
			cost, busy, toTime, crowds := m.delta(x, w1, w2, lim.minCost)
			c := candidate{row: r, lowersCost: -cost > lim.minCost, busyGain: -busy, toTime: toTime}
			switch {
			case c.lowersCost:
				c.mv.Gain = -cost
			case cost <= 0 && !crowds && -busy > lim.minBusy:
				c.mv.Gain = -busy
			default:
				continue
			}
			if !(c.mv.Gain*lim.horizon > float64(m.bytes[x])*m.loadSecPerByte[w2]) {
				continue
			}
			c.mv.Layer, c.mv.Expert, c.mv.From, c.mv.To = m.layerNums[r], e, w1, w2
			if !found || c.better(best) {
				best, found = c, true
			}
		}
	}
	return best, found
}

// apply moves x from w1 to w2.
func (m *costModel) apply(x int, w1, w2 int) {
	k := m.at(w1, int32(x))
	m.order[w1] = slices.Delete(m.order[w1], k, k+1)
	k = m.at(w2, int32(x))
	m.order[w2] = slices.Insert(m.order[w2], k, int32(x))
	m.owner[x] = int32(w2)
	m.rebuild(w1)
	m.rebuild(w2)
	m.refreshMax()
}
