package servebench

import (
	"strings"
	"testing"
)

// TestDraftsTableSetsEachSettingBesideTheFirst: rows measured under two
// -draft settings in two rounds give one line per setting and kind, its
// decode rate the median over the rounds and set against the first
// setting's, and the tokens a decode pass and the guesses kept summed
// over the rounds; rows of one setting give no table.
func TestDraftsTableSetsEachSettingBesideTheFirst(t *testing.T) {
	row := func(draft string, decode, guesses, kept float64) Result {
		r := Result{Clients: 1, Kind: "greedy", Draft: draft, DecodeTokensPerS: decode, Tokens: 64}
		r.Drafting.Guesses, r.Drafting.Accepted = guesses, kept
		if guesses > 0 {
			r.Drafting.TokensPerPass = 2
		} else {
			r.Drafting.TokensPerPass = 1
		}
		return r
	}
	rep := &Report{Rows: []Result{row("off", 80, 0, 0), row("auto", 200, 30, 24), row("off", 100, 0, 0), row("auto", 180, 20, 16)}}
	var b strings.Builder
	writeDrafts(&b, rep)
	out := b.String()
	for _, want := range []string{
		"| 1 | greedy | off | 80.0 | – |",       // the nearest-rank median of 80 and 100
		"| 1 | greedy | auto | 180.0 | 2.25x |", // 180 over 80
		"| 2.00 | 40 of 50 (80%) |", "| 200.0, 180.0 |\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	writeDrafts(&b, &Report{Rows: []Result{row("", 80, 0, 0), row("", 90, 0, 0)}})
	if b.Len() != 0 {
		t.Errorf("one setting gave a table:\n%s", b.String())
	}
}
