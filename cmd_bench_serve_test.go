package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/harness/servebench"
)

// TestBenchServeMeasuresStreamingClients: `odmoe bench serve` starts a
// swarm of processes serving the API, streams every client count's
// requests through it and reports figures that add up: every requested
// token counted by the clients and by the node, latencies measured and
// ordered, tokens/s from them.
func TestBenchServeMeasuresStreamingClients(t *testing.T) {
	out, so, rep, b := benchServe(t, "-clients", "1,2", "-requests", "1", "-max-tokens", "8", "-text-rounds", "1", "-node-cpus", "0")
	if len(rep.Rows) != 2 || rep.Workers != 4 || rep.Prefetch != "shadow" || rep.ExpertBytes <= 0 || rep.Machine.CPUs < 1 ||
		!strings.HasPrefix(rep.Command, "odmoe bench serve -preset tiny") {
		t.Fatalf("report: %s", b)
	}
	// -node-cpus 0: every node on CPU 0 alone, as the kernel says
	if runtime.GOOS == "linux" && (!slices.Equal(rep.NodeCPUs, []string{"0"}) || rep.ClientCPUs == "") {
		t.Errorf("the nodes ran on %q and the clients on %q, want the nodes on CPU 0", rep.NodeCPUs, rep.ClientCPUs)
	}
	for i, r := range rep.Rows {
		clients, c := i+1, r.CPUPerToken
		want := clients * 1 * 8
		switch {
		case r.Clients != clients || r.Requests != clients || r.Failed != 0:
			t.Errorf("row %d: %d clients, %d requests, %d failed; want %d, %d, 0", i, r.Clients, r.Requests, r.Failed, clients, clients)
		case r.Tokens != want || r.ServerTokens != float64(want):
			t.Errorf("row %d: the clients counted %d tokens and the node %v; want %d", i, r.Tokens, r.ServerTokens, want)
		case r.Chunks > r.Tokens || r.TTFT.N > clients || (r.TTFT.N > 0) != (r.Chunks > 0) || r.InterToken.N > max(0, r.Chunks-r.TTFT.N):
			t.Errorf("row %d: %d content chunks for %d tokens, TTFT of %d requests and %d gaps between chunks", i, r.Chunks, r.Tokens, r.TTFT.N, r.InterToken.N)
		case !ordered(r.TTFT) || !ordered(r.InterToken):
			t.Errorf("row %d: TTFT %+v, inter-chunk %+v", i, r.TTFT, r.InterToken)
		// every request's first token, and every later one, as the node saw them
		case r.ServerTTFT.N != clients || r.ServerTTFT.P50 <= 0 || !ordered(r.ServerTTFT):
			t.Errorf("row %d: the node's TTFT %+v, want %d first tokens", i, r.ServerTTFT, clients)
		case r.ServerInterToken.N != want-clients || r.ServerInterToken.P50 <= 0 || !ordered(r.ServerInterToken):
			t.Errorf("row %d: the node's inter-token latency %+v, want %d gaps", i, r.ServerInterToken, want-clients)
		case !(r.WallS > 0 && r.TokensPerS > 0) || r.TokensPerS != float64(r.Tokens)/r.WallS:
			t.Errorf("row %d: %d tokens in %v s at %v tok/s", i, r.Tokens, r.WallS, r.TokensPerS)
		case i == 0 && r.Speedup != 1:
			t.Errorf("row 0: speedup %v over itself", r.Speedup)
		// the experts loaded for the row's prompts and tokens, hinted or not
		case r.Workers.Loads <= 0 || r.BytesPerToken <= 0 || rep.BytesFrom == "":
			t.Errorf("row %d: workers loaded %+v, %v expert bytes per token from %q", i, r.Workers, r.BytesPerToken, rep.BytesFrom)
		// one layer pass per layer of the tiny preset's decode passes;
		// each activates top-k (2) experts or more
		case r.DecodeLayer.Passes < float64(want-clients) || r.DecodeLayer.Experts < 2 || r.DecodeLayer.Experts > 8 || r.DecodeLayer.MainMs <= 0 || r.DecodeLayer.ExpertsMs <= 0:
			t.Errorf("row %d: decode layer %+v", i, r.DecodeLayer)
		// the nodes' CPU time from /proc, in 10 ms ticks: the row's
		// whole swarm used some
		case runtime.GOOS == "linux" && (min(c.Main, c.Shadow, c.Workers, c.Client) < 0 || c.Main+c.Shadow+c.Workers <= 0):
			t.Errorf("row %d: CPU ms per token %+v", i, c)
		// the shadow predicted decode layers: some of what they activated
		case !(r.ShadowRecall > 0 && r.ShadowRecall <= 1):
			t.Errorf("row %d: shadow recall %v", i, r.ShadowRecall)
		}
	}
	// -text-rounds 1: text mode's run and the API's, on the same swarm,
	// each generating -max-tokens
	if len(rep.TextRounds) != 1 {
		t.Fatalf("%d text rounds, want 1: %s", len(rep.TextRounds), b)
	}
	if tr := rep.TextRounds[0]; tr.Round != 1 || !(tr.APIDecode > 0 && tr.TextDecode > 0) || tr.Ratio != tr.APIDecode/tr.TextDecode ||
		tr.APITokens != 8 || tr.TextTokens != 8 || tr.APILoads <= 0 || tr.TextLoads <= 0 {
		t.Errorf("text round %+v", tr)
	}
	if rep.Rows[0].TTFT.N+rep.Rows[1].TTFT.N == 0 {
		t.Error("no request had a content chunk: no TTFT measured by the clients")
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| clients | requests |", "| 1 | 1 | 8 |", "| 2 | 2 | 16 |", "load average before", "- CPUs: the nodes on 0, the clients", "command: `odmoe bench serve", "## The API against text mode on the same swarm", "| 1 | "} {
		if !strings.Contains(so, want) || !strings.Contains(string(md), want) {
			t.Errorf("stdout or report.md lacks %q:\n%s", want, so)
		}
	}
}

// ordered: no latencies, or positive ones with p99 >= p50.
func ordered(q servebench.Quantiles) bool { return q.N == 0 || (q.P50 > 0 && q.P99 >= q.P50) }

// bench serve -kinds -rounds measures every kind of request at every
// client count, in rounds, on one swarm: the rows in that order, the
// shadow's guesses of each row (sampled requests too), and a table of
// medians by kind beside greedy's.
func TestBenchServeMeasuresKindsOfRequestInRounds(t *testing.T) {
	_, so, rep, b := benchServe(t, "-clients", "1", "-requests", "1", "-max-tokens", "12", "-kinds", "greedy,t0.7,json", "-rounds", "2")
	if !slices.Equal(rep.Kinds, []string{"greedy", "t0.7", "json"}) || rep.Rounds != 2 || len(rep.Rows) != 6 {
		t.Fatalf("kinds %q, %d rounds, %d rows: %s", rep.Kinds, rep.Rounds, len(rep.Rows), b)
	}
	for i, r := range rep.Rows {
		kind, round := rep.Kinds[i%3], 1+i/3
		switch {
		case r.Kind != kind || r.Round != round || r.Failed != 0 || r.Tokens < 1:
			t.Errorf("row %d: %s round %d, %d tokens, %d failed; want %s round %d", i, r.Kind, r.Round, r.Tokens, r.Failed, kind, round)
		case kind != "json" && r.Tokens != 12:
			t.Errorf("row %d (%s): %d tokens, want 12 (EOS ignored)", i, kind, r.Tokens)
		case r.Guesses.Met+r.Guesses.Rewound == 0 || r.TokenAgreement < 0 || r.TokenAgreement > 1:
			t.Errorf("row %d (%s): the shadow's guesses %+v, agreement %v", i, kind, r.Guesses, r.TokenAgreement)
		}
	}
	for _, want := range []string{"## By kind of request (medians over 2 rounds", "| 1 | greedy |", "| 1 | t0.7 |", "| 1 | json |", "| t0.7, 2 | 1 |"} {
		if !strings.Contains(so, want) {
			t.Errorf("the report lacks %q:\n%s", want, so)
		}
	}
}

// TestBenchServeComparesDraftSettings: -drafts off,4 measures each
// setting on the same swarm, the main node started again with it: off's
// rows check no guess, 4's check the shadow's and keep some (more than
// one token a decode pass), and the report sets them side by side.
func TestBenchServeComparesDraftSettings(t *testing.T) {
	_, so, rep, b := benchServe(t, "-clients", "1", "-requests", "1", "-max-tokens", "24", "-drafts", "off,4")
	if len(rep.Rows) != 2 {
		t.Fatalf("%d rows, want 2: %s", len(rep.Rows), b)
	}
	off, four := rep.Rows[0], rep.Rows[1]
	if off.Draft != "off" || four.Draft != "4" || off.Tokens != 24 || four.Tokens != 24 {
		t.Fatalf("rows %q with %d tokens and %q with %d, want off and 4 with 24 each", off.Draft, off.Tokens, four.Draft, four.Tokens)
	}
	if off.Drafting.Guesses != 0 || off.Drafting.TokensPerPass != 1 {
		t.Errorf("-draft off checked guesses: %+v", off.Drafting)
	}
	if d := four.Drafting; d.Guesses == 0 || d.Accepted == 0 || d.TokensPerPass <= 1 || d.DecodePasses+d.Accepted != 23 {
		t.Errorf("-draft 4: %+v, want guesses checked and kept, and decode passes + kept = the 23 tokens after the first", d)
	}
	for _, want := range []string{"## By -draft (medians over 1 rounds", "| 1 | greedy | off |", "| 1 | greedy | 4 |"} {
		if !strings.Contains(so, want) {
			t.Errorf("the report lacks %q:\n%s", want, so)
		}
	}
}

// benchServe runs `odmoe bench serve` on the tiny preset with 4 workers
// and args, and returns its -out directory, its stdout, and its
// report.json read and as written.
func benchServe(t *testing.T, args ...string) (out, stdout string, rep servebench.Report, raw []byte) {
	t.Helper()
	out = filepath.Join(t.TempDir(), "report")
	args = append([]string{"bench", "serve", "-preset", "tiny", "-cache", t.TempDir(), "-workers", "4", "-out", out, "-log-level", "warn"}, args...)
	so, se, code := run(t, "", args...)
	if code != 0 {
		t.Fatalf("bench serve exit %d:\n%s\n%s", code, so, se)
	}
	raw, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	return out, so, rep, raw
}

// TestBenchServeMeasuresAWorkerJoining: -join-rate kills the last worker
// and starts it again on an empty directory filling its share from the
// main node at that rate, each round: the report gives the streams'
// decode with it away and while it fills, and every request completes.
func TestBenchServeMeasuresAWorkerJoining(t *testing.T) {
	if testing.Short() {
		t.Skip("a swarm of processes")
	}
	_, so, rep, b := benchServe(t, "-prefetch", "reactive", "-clients", "1", "-requests", "1", "-max-tokens", "24", "-join-rate", "200KB", "-rounds", "2")
	if len(rep.Joins) != 2 || rep.JoinRate != "200KB" {
		t.Fatalf("joins %+v at %q, want 2 rounds at 200KB: %s", rep.Joins, rep.JoinRate, b)
	}
	for _, j := range rep.Joins {
		if j.Away <= 0 || j.Filling <= 0 || j.Ratio <= 0 {
			t.Errorf("round %d: %+v: want both windows measured", j.Round, j)
		}
	}
	if !strings.Contains(so, "## A worker joining the serving swarm, filling its share at 200KB") || !strings.Contains(so, "Median filling / away") {
		t.Errorf("the report lacks the joins' table:\n%s", so)
	}
	if _, se, code := run(t, "", "bench", "serve", "-preset", "tiny", "-workers", "1", "-join-rate", "1MB"); code != 2 || !strings.Contains(se, "-join-rate: a worker joins a swarm of 2 workers or more") {
		t.Errorf("-join-rate with one worker: exit %d, %s", code, se)
	}
}
