package align

// Controller says, decode step by decode step, when the main node
// re-aligns the shadow. With a fixed Policy it answers as the Policy does.
// With an adaptive one (Policy.Adaptive) the Policy's periods are the
// longest it may choose: it starts at T1/KV1 and, every Window decode
// steps, looks at the window's recall and the shadow's rewinds:
//
//   - recall fell more than Drop below the best window recall seen while
//     aligned every step (the reference): the KV period halves and the
//     token period goes back to 1 (the shadow has drifted);
//   - the shadow rewound (it ran ahead on a token the main node did not
//     sample): the token period goes back to 1, so rewinds stay early;
//   - otherwise, recall within Hold of the reference: both periods
//     double, up to the Policy's, so alignment costs less while it buys
//     nothing.
//
// Not safe for concurrent use.
type Controller struct {
	bound   Policy
	cur     Policy
	steps   int   // decode steps in the current window
	correct int64 // the window's predicted activations
	total   int64 // and activations
	rewinds int64
	ref     float64 // the best window recall at T1/KV1; -1: none yet
	// Counts are the decode steps run under each choice.
	Counts map[Policy]int
}

// Window is how many decode steps an adaptive Controller looks at before
// it chooses again; Drop and Hold are its recall margins.
const (
	Window = 16
	Drop   = 0.005
	Hold   = 0.001
)

// NewController returns the controller of p.
func NewController(p Policy) *Controller {
	c := &Controller{bound: p, cur: p, ref: -1, Counts: map[Policy]int{}}
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

// choose ends a window: it sets the periods for the next one.
func (c *Controller) choose() {
	defer func() { c.steps, c.correct, c.total, c.rewinds = 0, 0, 0, 0 }()
	if c.total == 0 {
		return // nothing scored: keep what is in force
	}
	r := float64(c.correct) / float64(c.total)
	if c.cur.TokenPeriod == 1 && c.cur.KVPeriod == 1 && r > c.ref {
		c.ref = r
	}
	switch {
	case r < c.ref-Drop:
		c.cur.KVPeriod = max(1, c.cur.KVPeriod/2)
		c.cur.TokenPeriod = 1
	case c.rewinds > 0:
		c.cur.TokenPeriod = 1
	case r >= c.ref-Hold:
		c.cur.KVPeriod = min(c.bound.KVPeriod, 2*c.cur.KVPeriod)
		c.cur.TokenPeriod = min(c.bound.TokenPeriod, 2*c.cur.TokenPeriod)
	}
}

// Chosen is the choice the controller ran the most decode steps under
// (the fixed Policy when not adaptive, or before any step).
func (c *Controller) Chosen() Policy {
	best, n := c.cur, 0
	for p, m := range c.Counts {
		if m > n || m == n && (p.KVPeriod < best.KVPeriod || p.KVPeriod == best.KVPeriod && p.TokenPeriod < best.TokenPeriod) {
			best, n = p, m
		}
	}
	return best
}
