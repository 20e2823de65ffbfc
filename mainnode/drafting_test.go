package mainnode

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/passloop"
)

// TestParseDraftNamesWhatIsWrong: off, auto and 1..8 read; anything else
// is refused with the choices named.
func TestParseDraftNamesWhatIsWrong(t *testing.T) {
	for s, want := range map[string]Drafting{"off": {}, "": {}, "0": {}, "auto": {Auto: true, K: 8}, "3": {K: 3}, "8": {K: 8}} {
		if got, err := ParseDraft(s); err != nil || got != want {
			t.Errorf("ParseDraft(%q) = %+v, %v; want %+v", s, got, err, want)
		}
	}
	for _, s := range []string{"9", "-1", "always", "2.5"} {
		if _, err := ParseDraft(s); err == nil {
			t.Errorf("ParseDraft(%q) took it", s)
		}
	}
}

// TestPassTimesFitALine: passes of 1 to 5 rows costing 4 ms + 0.5 ms a
// row give back a = 4 ms and b = 0.5 ms; passes whose members change,
// or that feed a prompt, are not timed; before rows differ, b is 0.
func TestPassTimesFitALine(t *testing.T) {
	var pt passTimes
	at := time.Unix(0, 0)
	m := func(rows int) []passloop.Row { return rowsOf(7, rows) }
	for i := range 40 {
		rows := 1 + i%5
		pt.started(m(rows), rows, false, at)
		at = at.Add(4*time.Millisecond + time.Duration(rows)*500*time.Microsecond)
	}
	pt.started(m(1), 1, false, at)
	a, b := pt.fit()
	if math.Abs(a-0.004) > 1e-6 || math.Abs(b-0.0005) > 1e-6 {
		t.Fatalf("fit a %.6f s, b %.6f s; want 0.004, 0.0005", a, b)
	}
	w := pt.w
	pt.started(append(m(1), rowsOf(9, 1)...), 2, false, at.Add(time.Second)) // a member joined: not this line's pass
	pt.started(append(m(1), rowsOf(9, 39)...), 40, true, at.Add(2*time.Second))
	pt.started(append(m(1), rowsOf(9, 1)...), 2, false, at.Add(3*time.Second)) // after a prompt's pass
	if pt.w != w {
		t.Fatalf("passes with members changed or a prompt were timed: weight %v -> %v", w, pt.w)
	}
	var one passTimes
	for i := range 5 {
		one.started(m(1), 1, false, time.Unix(0, int64(i)*int64(time.Millisecond)))
	}
	if a, b := one.fit(); b != 0 || math.Abs(a-0.001) > 1e-9 {
		t.Fatalf("passes of one row: a %v, b %v; want 0.001, 0", a, b)
	}
}

// TestAutoDraftsWhereRowsAreCheapAndNotWhereTheyCostMoreThanTheySave:
// the drafter's answers over a member's passes, its guesses kept as
// the scenario says.
func TestAutoDraftsWhereRowsAreCheapAndNotWhereTheyCostMoreThanTheySave(t *testing.T) {
	const seq, batch = 5, 1
	// run drives n passes of member seq: each pass costs base + row a
	// row, the drafter's guesses are checked when the shadow drafted
	// them (asked the pass before), and kept(k) of them are kept. It
	// returns the guesses each pass checked.
	run := func(d *drafter, n int, base, row time.Duration, kept func(k int) int) []int {
		pos, at, asked := 100, time.Unix(0, 0), 0
		var used []int
		for range n {
			use, ask := d.choose(seq, batch, pos, 8, 0.9)
			g := min(use, asked) // the shadow drafted asked for this pass
			d.given(seq, g)
			used = append(used, g)
			rows := 1 + max(g, asked)
			d.passStarted(batch, rowsOf(seq, 1+g), false, at)
			at = at.Add(base + time.Duration(rows)*row)
			pos += 1 + kept(g)
			asked = ask
		}
		return used
	}
	sum := func(xs []int) (s int) {
		for _, x := range xs {
			s += x
		}
		return s
	}
	// round trips dominate, every guess kept: it drafts, many a pass
	d := newDrafter(Drafting{Auto: true, K: 8})
	used := run(d, 60, 10*time.Millisecond, 200*time.Microsecond, func(k int) int { return k })
	t.Logf("cheap rows, every guess kept: %v", used)
	if tail := used[40:]; sum(tail) < 4*len(tail) {
		t.Fatalf("cheap rows, every guess kept: %v guesses a pass at the end, want 4 or more", tail)
	}
	// loads dominate (a row's loads cost three times the rest of a
	// pass) and 60% of the guesses are kept: a guess saves less than it
	// costs, so it is off, but for one guess every 16th pass
	rng := rand.New(rand.NewPCG(1, 2))
	sixty := func(k int) int {
		kept := 0
		for kept < k && rng.Float64() < 0.6 {
			kept++
		}
		return kept
	}
	d = newDrafter(Drafting{Auto: true, K: 8})
	used = run(d, 96, 2*time.Millisecond, 6*time.Millisecond, sixty)
	t.Logf("dear rows, 60%% kept: %v", used)
	if tail := used[32:]; sum(tail) > len(tail)/16+1 {
		t.Fatalf("dear rows, 60%% kept: %v guesses a pass after the first 32, want one every 16 passes at most", tail)
	}
	// the same share kept where round trips dominate: it drafts
	d = newDrafter(Drafting{Auto: true, K: 8})
	used = run(d, 96, 10*time.Millisecond, 200*time.Microsecond, sixty)
	t.Logf("cheap rows, 60%% kept: %v", used)
	if tail := used[32:]; sum(tail) < len(tail) {
		t.Fatalf("cheap rows, 60%% kept: %v guesses a pass after the first 32, want one a pass or more", tail)
	}
	// guesses never kept: off
	d = newDrafter(Drafting{Auto: true, K: 8})
	used = run(d, 64, 10*time.Millisecond, 200*time.Microsecond, func(int) int { return 0 })
	if tail := used[32:]; sum(tail) > len(tail)/16+1 {
		t.Fatalf("no guess kept: %v guesses a pass after the first 32, want one every 16 passes at most", tail)
	}
	// the shadow's guesses never come in time (a shadow slower than a
	// pass): never more than one asked for, and off once it shows
	d = newDrafter(Drafting{Auto: true, K: 8})
	var asks []int
	pos, at := 100, time.Unix(0, 0)
	for range 64 {
		_, ask := d.choose(seq, batch, pos, 8, 0.9)
		d.given(seq, 0)
		d.passStarted(batch, rowsOf(seq, 1), false, at)
		at = at.Add(60 * time.Millisecond)
		pos++
		asks = append(asks, ask)
	}
	t.Logf("guesses never in time, asked for: %v", asks)
	if slices.Max(asks) > 1 || sum(asks[16:]) > len(asks[16:])/16+1 {
		t.Fatalf("guesses never in time: asked for %v, want one at most, and one every 16 passes after the first 16", asks)
	}
	// a fixed -draft K asks for K every pass, whatever was kept
	d = newDrafter(Drafting{K: 3})
	if use, ask := d.choose(seq, batch, 10, 8, 0.5); use != 3 || ask != 3 {
		t.Fatalf("-draft 3: use %d, ask %d", use, ask)
	}
}

// TestDrafterScoresGuessesFromWhereTheNextPassBegins: a pass whose rows
// began at pos and checked g guesses kept those its successor's position
// says; one that wanted guesses the shadow drafted and checked none
// counts as turned down.
func TestDrafterScoresGuessesFromWhereTheNextPassBegins(t *testing.T) {
	d := newDrafter(Drafting{K: 4})
	d.choose(1, 1, 10, 8, 0.5)
	d.given(1, 4)
	d.choose(1, 1, 13, 8, 0.5) // kept 2 of 4: turned down at the third
	if q := d.seqs[1]; q.acc.Kept != 2 || q.acc.Missed != 1 {
		t.Fatalf("after keeping 2 of 4: %+v", q.acc)
	}
	d.given(1, 4)
	d.choose(1, 1, 18, 8, 0.5) // kept all 4
	d.given(1, 0)              // the shadow's guesses did not come
	d.choose(1, 1, 19, 8, 0.5)
	if q := d.seqs[1]; q.acc.Kept != 6 || q.acc.Missed != 2 || d.acc != q.acc {
		t.Fatalf("after keeping 4 of 4 and a pass without the guesses asked for: member %+v, swarm %+v", q.acc, d.acc)
	}
	d.end(1)
	if d.seqs[1] != nil {
		t.Fatal("an ended member is kept")
	}
}

// rowsOf is member seq's part of a pass: rows rows.
func rowsOf(seq uint64, rows int) []passloop.Row {
	return []passloop.Row{{Step: model.Step{Seq: seq}, Tokens: make([]int, rows)}}
}
