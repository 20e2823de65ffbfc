package align

import "math"

// Controller says, decode step by decode step, when the main node
// re-aligns the shadow. With a fixed Policy it answers as the Policy does.
// With an adaptive one (Policy.Adaptive) the Policy's periods are the
// longest it may choose: it starts at T1/KV1 and, every Window decode
// steps, looks at the window's recall and the shadow's rewinds:
//
//   - recall fell more than Drop below the recall of the windows aligned
//     every step (the reference), and more than two standard errors of
//     the window's sampling: the period grown last halves (the shadow
//     drifted on it; with none to undo, the token period if over 1, else
//     the KV period), and does not grow again for a back-off that doubles
//     each time;
//   - the shadow rewound (it ran ahead on a token the main node did not
//     sample): the token period goes back to 1, so rewinds stay early,
//     and backs off the same way;
//   - otherwise, recall within Hold (and one standard error) of the
//     reference: one period doubles,
//     up to the Policy's: the KV period first (KV rows are what alignment
//     costs in bytes), then the token period.
//
// Not safe for concurrent use.
type Controller struct {
	bound   Policy
	cur     Policy
	steps   int   // decode steps in the current window
	correct int64 // the window's predicted activations
	total   int64 // and activations
	rewinds int64
	// the reference: activations predicted, and in all, over the windows
	// aligned every step
	refCorrect, refTotal int64
	grown                axis // the period doubled last, if it has not been undone
	// per period: windows left before it may grow again, and the next
	// back-off
	blocked, backoff [2]int
	// Counts are the decode steps run under each choice.
	Counts map[Policy]int
}

// axis names a period of a Policy.
type axis int

const (
	none axis = iota - 1
	kvAxis
	tokenAxis
)

// Window is how many decode steps an adaptive Controller looks at before
// it chooses again; Drop and Hold are its recall margins.
const (
	Window = 16
	Drop   = 0.005
	Hold   = 0.001
)

// NewController returns the controller of p.
func NewController(p Policy) *Controller {
	c := &Controller{bound: p, cur: p, grown: none, backoff: [2]int{firstBackoff, firstBackoff}, Counts: map[Policy]int{}}
	if p.Adaptive {
		c.cur = Policy{TokenPeriod: 1, KVPeriod: 1}
	}
	return c
}

// Current is the periods in force.
func (c *Controller) Current() Policy { return c.cur }

// Step is called once per decode step it (1-based) of a sequence whose
// latest KV alignment went with step lastKV (0: none yet), before the
// step's alignment is sent; it reports whether the token and the KV rows
// go with it.
func (c *Controller) Step(it, lastKV int64) (token, kv bool) {
	if !c.bound.Adaptive {
		return c.cur.TokenDue(it), c.cur.KVDue(it)
	}
	if c.steps == Window {
		c.choose()
	}
	c.steps++
	c.Counts[c.cur]++
	token = c.cur.TokenPeriod > 0 && it%int64(c.cur.TokenPeriod) == 0
	kv = c.cur.KVPeriod > 0 && it-lastKV >= int64(c.cur.KVPeriod)
	return token, kv
}

// Observe records one scored decode layer: of total activated experts,
// correct were predicted.
func (c *Controller) Observe(correct, total int) {
	c.correct += int64(correct)
	c.total += int64(total)
}

// Rewound records rewinds of the shadow (an alignment's token differed
// from the one it ran ahead on).
func (c *Controller) Rewound(n int64) { c.rewinds += n }

// firstBackoff and maxBackoff bound, in windows, how long a period that
// cost recall (or a rewind) waits before it grows again.
const (
	firstBackoff = 2
	maxBackoff   = 64
)

// choose ends a window: it sets the periods for the next one.
func (c *Controller) choose() {
	defer func() { c.steps, c.correct, c.total, c.rewinds = 0, 0, 0, 0 }()
	for a := range c.blocked {
		c.blocked[a] = max(0, c.blocked[a]-1)
	}
	if c.total == 0 {
		return // nothing scored: keep what is in force
	}
	r := float64(c.correct) / float64(c.total)
	if c.cur.TokenPeriod == 1 && c.cur.KVPeriod == 1 {
		c.refCorrect += c.correct
		c.refTotal += c.total
	}
	ref := float64(c.refCorrect) / float64(max(1, c.refTotal))
	// the window's recall is a sample of total activations: a standard
	// error of it (binomial) is noise, not drift
	// (of a smoothed reference: one that never missed still has some)
	p := float64(c.refCorrect+1) / float64(c.refTotal+2)
	se := math.Sqrt(p * (1 - p) / float64(c.total))
	switch {
	case c.refTotal > 0 && r < ref-Drop-2*se:
		a := c.grown
		if a == none { // nothing grown to undo: the token every step first
			a = kvAxis
			if c.cur.TokenPeriod > 1 {
				a = tokenAxis
			}
		}
		c.set(a, c.period(a)/2)
		c.backOff(a)
	case c.rewinds > 0:
		c.set(tokenAxis, 1)
		c.backOff(tokenAxis)
	case r >= ref-Hold-se:
		for _, a := range []axis{kvAxis, tokenAxis} {
			if c.blocked[a] == 0 && c.period(a) < c.bound.period(a) {
				c.set(a, 2*c.period(a))
				c.grown = a
				break
			}
		}
	}
}

// backOff keeps period a from growing for its back-off, and doubles that.
func (c *Controller) backOff(a axis) {
	c.blocked[a] = c.backoff[a]
	c.backoff[a] = min(maxBackoff, 2*c.backoff[a])
	c.grown = none
}

func (c *Controller) period(a axis) int { return c.cur.period(a) }

// set sets the current period a to n (at least 1, at most the bound).
func (c *Controller) set(a axis, n int) {
	n = min(max(1, n), c.bound.period(a))
	if a == kvAxis {
		c.cur.KVPeriod = n
	} else {
		c.cur.TokenPeriod = n
	}
}

func (p Policy) period(a axis) int {
	if a == kvAxis {
		return p.KVPeriod
	}
	return p.TokenPeriod
}

// Chosen is the choice the controller ran the most decode steps under
// (the fixed Policy when not adaptive, or before any step).
func (c *Controller) Chosen() Policy { return MostSteps(c.Counts, c.cur) }

// MostSteps is the choice counts holds the most decode steps under (of
// two as many, the shorter KV period, then the shorter token period);
// none when counts is empty.
func MostSteps(counts map[Policy]int, none Policy) Policy {
	best, n := none, 0
	for p, m := range counts {
		if m > n || m == n && (p.KVPeriod < best.KVPeriod || p.KVPeriod == best.KVPeriod && p.TokenPeriod < best.TokenPeriod) {
			best, n = p, m
		}
	}
	return best
}
