// Package draft decides how many guessed tokens the main node's next
// pass checks for a sequence (speculative decoding on the swarm): a pure
// function of what the swarm measures, as the pass planner is. No
// clock, no socket, no model; scenario tests drive it (draft_test.go).
//
// A pass that checks k guesses after a sequence's last token gives
// 1 + a + a^2 + ... + a^k tokens on average, a the chance a guess is
// kept when those before it were (the sequence's own record, Acceptance).
// It costs what a pass of one row costs (each layer's round trip to its
// workers, the main node's reading of its weights, its head) plus what
// each guessed row adds: the main node's and the workers' compute of one
// more row, and the loads of the experts it routes to that no other row
// did, where the pass waits for them. Round trips and weight reads are
// shared by the rows; loads are not: on a fine-grained MoE a guessed
// row's experts are mostly its own, so where loads dominate a pass,
// guessing costs more than it gives and Choose says 0.
package draft

import (
	"math"
	"time"
)

// Costs are a decode pass's parts, as the main node measures them.
type Costs struct {
	// Layers is how many layers wait for their experts, RoundTrip one
	// layer's wait with its loads hidden (the activations out and the
	// results back: two hops and the experts' compute).
	Layers    int
	RoundTrip time.Duration
	// Rest is the rest of a pass of one row: the main node's layers and
	// its head.
	Rest time.Duration
	// Row is what one more row adds to the pass's compute, on the main
	// node and on the workers; RowLoads the loads it adds that the pass
	// waits for (its experts no other row routed to, not predicted in
	// time), each Load long.
	Row      time.Duration
	RowLoads float64
	Load     time.Duration
}

// Pass is what a pass that checks k guesses costs.
func (c Costs) Pass(k int) time.Duration {
	one := time.Duration(c.Layers)*c.RoundTrip + c.Rest
	row := float64(c.Row) + c.RowLoads*float64(c.Load)
	return one + time.Duration(float64(k)*row)
}

// Expected is the mean number of tokens a pass gives that checks k
// guesses, each kept with chance accept when those before it were: its
// own sample, then one more for each guess kept in a row.
func Expected(accept float64, k int) float64 {
	accept = min(max(accept, 0), 1)
	if accept == 1 {
		return float64(k + 1)
	}
	return (1 - math.Pow(accept, float64(k+1))) / (1 - accept)
}

// Gain is how much guessing must beat a pass of one row by before Choose
// guesses at all: a measured rate's noise must not switch it on.
const Gain = 1.05

// Choose returns how many guesses (0..most) the next pass checks for a
// sequence whose guesses are kept with chance accept: the k that gives
// the most tokens a second, Expected(accept, k) / c.Pass(k), and 0
// unless that beats checking none by Gain.
func Choose(accept float64, c Costs, most int) int {
	rate := func(k int) float64 {
		d := c.Pass(k).Seconds()
		if d <= 0 {
			return math.Inf(1)
		}
		return Expected(accept, k) / d
	}
	base, best, bestRate := rate(0), 0, rate(0)
	for k := 1; k <= most; k++ {
		if r := rate(k); r > bestRate {
			best, bestRate = k, r
		}
	}
	if best == 0 || math.IsInf(base, 1) || bestRate < Gain*base {
		return 0
	}
	return best
}

// Acceptance is a sequence's record of checked guesses: those kept, and
// the passes whose guess was not (one a pass: the guesses after it were
// never checked).
type Acceptance struct {
	Kept, Missed int
}

// Prior is how many checked guesses a prior rate weighs as.
const Prior = 4

// Rate estimates the chance the sequence's next guess is kept: the
// kept share of its checked guesses, starting from prior (the swarm's
// rate over every sequence, or the shadow's token guesses') weighed as
// Prior guesses.
func (a Acceptance) Rate(prior float64) float64 {
	return (float64(a.Kept) + Prior*prior) / (float64(a.Kept+a.Missed) + Prior)
}
