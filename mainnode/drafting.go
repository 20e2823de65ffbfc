package mainnode

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/odmoe/odmoe/draft"
	"github.com/odmoe/odmoe/passloop"
)

// Drafting is the main node's -draft: how many of the shadow's guessed
// tokens a pass checks after each decoding member's last one. Off (the
// zero value) checks none; a fixed count checks that many where the
// shadow has made them; Auto has package draft choose, member by member
// and pass by pass, from the measured acceptance and pass times.
type Drafting struct {
	Auto bool
	K    int // the guesses a pass checks (Auto: at most)
}

// ParseDraft reads -draft: off, auto, or a count from 1 to
// passloop.MaxDraft.
func ParseDraft(s string) (Drafting, error) {
	switch s {
	case "", "off", "0":
		return Drafting{}, nil
	case "auto":
		return Drafting{Auto: true, K: passloop.MaxDraft}, nil
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 || k > passloop.MaxDraft {
		return Drafting{}, fmt.Errorf("%q: off, auto, or the guesses a pass checks, 1 to %d", s, passloop.MaxDraft)
	}
	return Drafting{K: k}, nil
}

func (d Drafting) String() string {
	switch {
	case d.Auto:
		return "auto"
	case d.K == 0:
		return "off"
	}
	return strconv.Itoa(d.K)
}

// exploreEvery is how often (in a member's decode passes) auto tries one
// guess where the policy says none: the costs it measures must not go
// stale where drafting is off, nor a cost measured once keep it off.
const exploreEvery = 16

// drafter is the main node's drafting state: each member's record of
// guesses checked, and each batch's pass times by rows, from which Auto
// chooses.
type drafter struct {
	mode Drafting
	mu   sync.Mutex
	seqs map[uint64]*draftSeq
	// passes times each batch's decode passes (by batch sequence)
	passes map[uint64]*passTimes
	// totals over every member: guesses checked and kept
	acc draft.Acceptance
	// reach is how many guesses the shadow has had ready in time for a
	// pass lately (the most, halved each time asked-for guesses did not
	// come): auto asks for at most twice it (one at first), as a
	// shadow asked for more than it can draft in a pass's time falls
	// behind and its predictions with it
	reach int
}

// draftSeq is one member's drafting: its record of guesses checked, where
// its last pass's rows began, how many guesses it wanted and checked,
// its decode passes so far, and how many guesses the shadow was asked
// for: by the pass before the last (for the last: drafted) and by the
// last (asked, for the next).
type draftSeq struct {
	acc                draft.Acceptance
	pos, wanted, given int
	passes             int
	drafted, asked     int
}

func newDrafter(mode Drafting) *drafter {
	return &drafter{mode: mode, seqs: map[uint64]*draftSeq{}, passes: map[uint64]*passTimes{}}
}

// choose is how many guesses the pass about to run checks for member
// seq, whose last token sits at position pos, with at most most; and how
// many the shadow is to guess for its next pass. It first scores the
// member's previous pass: its rows began at d.pos, and the guesses it
// kept moved it on past them.
func (d *drafter) choose(seq uint64, batch uint64, pos, most int, prior float64) (use, ask int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.seqs[seq]
	if q == nil {
		q = &draftSeq{}
		d.seqs[seq] = q
	}
	switch {
	case q.given > 0:
		d.reach = max(d.reach, q.given)
		if kept := pos - q.pos - 1; kept >= 0 && kept <= q.given {
			q.acc.Kept += kept
			d.acc.Kept += kept
			if kept < q.given {
				q.acc.Missed++
				d.acc.Missed++
			}
		}
	case q.wanted > 0 && q.drafted > 0:
		// the shadow drafted for the pass, which wanted guesses and
		// checked none: they came too late, or the shadow had run ahead
		// on a guess turned down the pass before. A guess that does not
		// come saves nothing, as one turned down does.
		q.acc.Missed++
		d.acc.Missed++
		d.reach /= 2
	}
	q.pos, q.given = pos, 0
	q.passes++
	q.drafted = q.asked // what the shadow drafted for this pass
	most = min(most, d.mode.K)
	use, ask = d.decide(q, batch, most, prior)
	q.wanted, q.asked = use, ask
	return use, ask
}

// decide is choose's answer for member q once its last pass is scored.
func (d *drafter) decide(q *draftSeq, batch uint64, most int, prior float64) (use, ask int) {
	if !d.mode.Auto {
		return most, most
	}
	most = min(most, max(1, 2*d.reach))
	pt := d.passes[batch]
	if pt == nil || pt.w == 0 {
		return min(most, 1), min(most, 1) // nothing measured yet: one guess
	}
	if d.acc.Kept+d.acc.Missed > 0 {
		prior = d.acc.Rate(prior)
	}
	k := draft.Choose(q.acc.Rate(prior), pt.costs(), most)
	use, ask = k, k
	if k == 0 && most > 0 {
		if q.passes%exploreEvery == 0 {
			use = 1
		}
		if (q.passes+1)%exploreEvery == 0 {
			ask = 1
		}
	}
	return use, ask
}

// given records that member seq's pass checks n guesses.
func (d *drafter) given(seq uint64, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if q := d.seqs[seq]; q != nil {
		q.given = n
	}
}

// end forgets member seq.
func (d *drafter) end(seq uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.seqs, seq)
	delete(d.passes, seq)
}

// passStarted times batch b's passes: the time from one decode pass's
// start to the next's is the pass's (its head and draws included) when
// the same members ran both and neither fed a prompt chunk. The pass
// starting now feeds members[i] fed[i] rows; what it costs grows with the rows the shadow ran for each member too
// (it drafted them, hinted their experts to the workers), so a member
// counts for the more of its rows fed and the rows the shadow ran.
func (d *drafter) passStarted(b uint64, members []passloop.Row, prompt bool, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	pt := d.passes[b]
	if pt == nil {
		pt = &passTimes{}
		d.passes[b] = pt
	}
	rows := 0
	for _, r := range members {
		n := len(r.Tokens)
		if q := d.seqs[r.Step.Seq]; q != nil && !prompt {
			n = max(n, 1+q.drafted)
		}
		rows += n
	}
	pt.started(members, rows, prompt, now)
}

// passTimes fits a batch's decode pass times as a + b*rows, weighing
// recent passes the most: a is what every pass pays (each layer's round
// trip to its workers, the main node's weight reads, the head), b what
// each row adds (its compute, here and on the workers, and the loads its
// own experts add).
type passTimes struct {
	// the last pass: when it started, its members and rows, whether it
	// fed a prompt chunk
	at      time.Time
	members []uint64
	rows    int
	prompt  bool
	// decayed sums of the samples (rows r, seconds t)
	w, r, t, rr, rt float64
	// rowsNow is the rows of the latest pass timed
	rowsNow int
}

// decay is how much an earlier pass weighs against the next: ~20
// passes' memory.
const decay = 0.95

func (pt *passTimes) started(members []passloop.Row, rows int, prompt bool, now time.Time) {
	same := len(pt.members) == len(members)
	for i := 0; same && i < len(members); i++ {
		same = pt.members[i] == members[i].Step.Seq
	}
	if !pt.at.IsZero() && !pt.prompt && !prompt && same {
		r, t := float64(pt.rows), now.Sub(pt.at).Seconds()
		pt.w, pt.r, pt.t, pt.rr, pt.rt = decay*pt.w+1, decay*pt.r+r, decay*pt.t+t, decay*pt.rr+r*r, decay*pt.rt+r*t
		pt.rowsNow = pt.rows
	}
	pt.members = pt.members[:0]
	for _, r := range members {
		pt.members = append(pt.members, r.Step.Seq)
	}
	pt.at, pt.rows, pt.prompt = now, rows, prompt
}

// fit is the line's a and b in seconds; b is 0 until passes of
// different rows have been timed (guessing looks free until measured).
func (pt *passTimes) fit() (a, b float64) {
	if pt.w == 0 {
		return 0, 0
	}
	mr, mt := pt.r/pt.w, pt.t/pt.w
	if v := pt.rr/pt.w - mr*mr; v > 1e-6 {
		b = max((pt.rt/pt.w-mr*mt)/v, 0)
	}
	return max(mt-b*mr, 0), b
}

// costs are the fit as package draft's costs of a member's pass: one
// "layer" whose round trip is a pass of the members' rows without this
// member's guesses, and b a row.
func (pt *passTimes) costs() draft.Costs {
	a, b := pt.fit()
	rows := max(len(pt.members), 1)
	return draft.Costs{Layers: 1, RoundTrip: seconds(a + b*float64(rows)), Row: seconds(b)}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
