package passes

import (
	"fmt"
	"strings"
	"testing"
)

// arrival is a sequence of a scenario: it arrives before pass At with a
// prompt of Prompt tokens and decodes Decode tokens after its first.
type arrival struct {
	Name           string
	At             int
	Prompt, Decode int
}

// simulate runs passes until every sequence is done and renders each as
// one line a person can check, e.g.
//
//	a+1 b:64/1000
//
// (a decodes a token; b feeds 64 prompt tokens, 1000 still to feed
// after; "!" marks a prompt's last chunk).
func simulate(t *testing.T, arrivals []arrival, b Budget) []string {
	t.Helper()
	type running struct {
		name           string
		prompt, decode int
	}
	var live []running
	var lines []string
	var rows []Row
	next := 0
	for pass := 0; pass < 1000; pass++ {
		for next < len(arrivals) && arrivals[next].At <= pass {
			a := arrivals[next]
			live = append(live, running{a.Name, a.Prompt, a.Decode})
			next++
		}
		if len(live) == 0 {
			if next == len(arrivals) {
				return lines
			}
			lines = append(lines, "idle")
			continue
		}
		seqs := make([]Seq, len(live))
		for i, r := range live {
			seqs[i] = Seq{PromptLeft: r.prompt}
		}
		rows = Next(rows[:0], seqs, b)
		if len(rows) == 0 {
			t.Fatalf("pass %d: an empty pass over %d sequences", pass, len(live))
		}
		var parts []string
		for _, r := range rows {
			s := &live[r.Seq]
			switch {
			case !r.Prompt:
				if s.prompt > 0 {
					t.Fatalf("pass %d: %s decodes with %d prompt tokens left", pass, s.name, s.prompt)
				}
				s.decode--
				parts = append(parts, s.name+"+1")
			default:
				if r.Tokens <= 0 || r.Tokens > s.prompt || r.Last != (r.Tokens == s.prompt) {
					t.Fatalf("pass %d: %s feeds %d prompt tokens (last %v) of %d left", pass, s.name, r.Tokens, r.Last, s.prompt)
				}
				s.prompt -= r.Tokens
				mark := ""
				if r.Last {
					mark = "!"
				}
				parts = append(parts, fmt.Sprintf("%s:%d/%d%s", s.name, r.Tokens, s.prompt, mark))
			}
		}
		lines = append(lines, strings.Join(parts, " "))
		kept := live[:0]
		for _, r := range live {
			if r.prompt > 0 || r.decode > 0 {
				kept = append(kept, r)
			}
		}
		live = kept
	}
	t.Fatal("no end after 1000 passes")
	return nil
}

// TestPassScenarios: what each pass carries when prompts join running
// streams, for chunked and whole prompts.
func TestPassScenarios(t *testing.T) {
	cases := []struct {
		name     string
		arrivals []arrival
		budget   Budget
		want     []string
	}{
		{"one sequence, its prompt in chunks, then decode",
			[]arrival{{"a", 0, 10, 2}}, Budget{Chunk: 4},
			[]string{"a:4/6", "a:4/2", "a:2/0!", "a+1", "a+1"}},
		{"a long prompt joins two streams: they decode in every pass",
			[]arrival{{"a", 0, 1, 6}, {"b", 0, 1, 6}, {"c", 1, 9, 1}}, Budget{Chunk: 4},
			[]string{"a:1/0! b:1/0!", "a+1 b+1 c:4/5", "a+1 b+1 c:4/1", "a+1 b+1 c:1/0!", "a+1 b+1 c+1", "a+1 b+1", "a+1 b+1"}},
		{"prompts share the budget fairly: the short ones go in whole",
			[]arrival{{"a", 0, 20, 0}, {"b", 0, 3, 0}, {"c", 0, 2, 0}}, Budget{Chunk: 8},
			[]string{"a:3/17 b:3/0! c:2/0!", "a:8/9", "a:8/1", "a:1/0!"}},
		{"a short prompt arriving while a long one is fed goes in at once",
			[]arrival{{"a", 0, 30, 0}, {"b", 1, 2, 1}, {"c", 2, 1, 0}}, Budget{Chunk: 8},
			[]string{"a:8/22", "a:6/16 b:2/0!", "a:7/9 b+1 c:1/0!", "a:8/1", "a:1/0!"}},
		{"equal needs: equal shares, rounded up for the oldest",
			[]arrival{{"a", 0, 10, 0}, {"b", 0, 10, 0}, {"c", 0, 10, 0}}, Budget{Chunk: 8},
			[]string{"a:3/7 b:3/7 c:2/8", "a:3/4 b:3/4 c:2/6", "a:3/1 b:3/1 c:2/4", "a:1/0! b:1/0! c:4/0!"}},
		{"more prompts than budget tokens: one token each, smallest first, the rest wait",
			[]arrival{{"a", 0, 3, 0}, {"b", 0, 2, 0}, {"c", 0, 1, 0}}, Budget{Chunk: 2},
			[]string{"b:1/1 c:1/0!", "a:1/2 b:1/0!", "a:2/0!"}},
		{"a prompt shorter than the chunk leaves room for the next",
			[]arrival{{"a", 0, 2, 1}, {"b", 0, 5, 0}}, Budget{Chunk: 4},
			[]string{"a:2/0! b:2/3", "a+1 b:3/0!"}},
		{"no chunking: prompts go in whole beside decode",
			[]arrival{{"a", 0, 3, 2}, {"b", 1, 300, 0}}, Budget{},
			[]string{"a:3/0!", "a+1 b:300/0!", "a+1"}},
		{"a sequence that finishes leaves the next pass",
			[]arrival{{"a", 0, 1, 1}, {"b", 0, 1, 3}}, Budget{Chunk: 8},
			[]string{"a:1/0! b:1/0!", "a+1 b+1", "b+1", "b+1"}},
		{"nothing running: idle until an arrival",
			[]arrival{{"a", 2, 1, 0}}, Budget{Chunk: 8},
			[]string{"idle", "idle", "a:1/0!"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := simulate(t, c.arrivals, c.budget)
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("passes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}
