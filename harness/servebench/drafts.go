package servebench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// writeDrafts writes, when the rows were measured under more than one
// -draft, each setting's medians over the rounds by client count and
// kind of request, beside the first setting's on the same swarm: the
// decode rate (1000 over the node's mean inter-token time), the tokens
// a decode pass gave and the guesses kept.
func writeDrafts(w io.Writer, rep *Report) {
	type key struct {
		clients     int
		kind, draft string
	}
	by := map[key][]Result{}
	var keys []key
	var drafts []string
	for _, r := range rep.Rows {
		if r.Draft == "" {
			return // one setting: nothing to set beside it
		}
		k := key{r.Clients, r.Kind, r.Draft}
		if by[k] == nil {
			keys = append(keys, k)
		}
		by[k] = append(by[k], r)
		if !slices.Contains(drafts, r.Draft) {
			drafts = append(drafts, r.Draft)
		}
	}
	if len(drafts) < 2 {
		return
	}
	median := func(rows []Result, f func(Result) float64) float64 {
		v := make([]float64, 0, len(rows))
		for _, r := range rows {
			v = append(v, f(r))
		}
		return quantilesOf(v).P50
	}
	decode := func(r Result) float64 { return r.DecodeTokensPerS }
	fmt.Fprintf(w, "\n## By -draft (medians over %d rounds, each round every setting in turn on the same workers and shadow)\n\n", len(by[keys[0]]))
	fmt.Fprintf(w, "| clients | kind | -draft | decode tok/s | vs -draft %s | tok/s | tokens a decode pass | guesses kept | expert loads / token | loads missed | rounds' decode tok/s |\n", drafts[0])
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, k := range keys {
		rows := by[k]
		d := median(rows, decode)
		vs := "–"
		if base := by[key{k.clients, k.kind, drafts[0]}]; base != nil && k.draft != drafts[0] {
			vs = fmt.Sprintf("%.2fx", d/median(base, decode))
		}
		var each []string
		var guesses, kept float64
		for _, r := range rows {
			each = append(each, fmt.Sprintf("%.1f", r.DecodeTokensPerS))
			guesses, kept = guesses+r.Drafting.Guesses, kept+r.Drafting.Accepted
		}
		keptShare := "–"
		if guesses > 0 {
			keptShare = fmt.Sprintf("%.0f of %.0f (%.0f%%)", kept, guesses, 100*kept/guesses)
		}
		missed := median(rows, func(r Result) float64 { return float64(r.Workers.Misses) / math.Max(1, float64(r.Workers.Loads)) })
		perToken := median(rows, func(r Result) float64 { return float64(r.Workers.Loads) / math.Max(1, float64(r.Tokens)) })
		fmt.Fprintf(w, "| %d | %s | %s | %.1f | %s | %.1f | %.2f | %s | %.2f | %.1f%% | %s |\n", k.clients, k.kind, k.draft, d, vs,
			median(rows, func(r Result) float64 { return r.TokensPerS }), median(rows, func(r Result) float64 { return r.Drafting.TokensPerPass }),
			keptShare, perToken, 100*missed, strings.Join(each, ", "))
	}
	fmt.Fprintln(w, "\nDecode tok/s: 1000 over the node's mean inter-token time (odmoe_inter_token_latency_seconds), prompts left out; tokens a decode pass: (decode passes + guesses kept) / decode passes (odmoe_decode_passes_total, odmoe_draft_accepted_total); guesses kept: of those the passes checked (odmoe_draft_guesses_total), summed over the rounds.")
}
