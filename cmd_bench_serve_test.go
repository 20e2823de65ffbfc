package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestBenchServeMeasuresStreamingClients: `odmoe bench serve` starts a
// swarm of processes serving the API, streams every client count's
// requests through it and reports figures that add up: every requested
// token counted by the clients and by the node, latencies measured and
// ordered, tokens/s from them.
func TestBenchServeMeasuresStreamingClients(t *testing.T) {
	out := filepath.Join(t.TempDir(), "report")
	so, se, code := run(t, "", "bench", "serve", "-preset", "tiny", "-cache", t.TempDir(), "-workers", "4",
		"-clients", "1,2", "-requests", "1", "-max-tokens", "8", "-text-rounds", "1", "-out", out, "-log-level", "warn")
	if code != 0 {
		t.Fatalf("bench serve exit %d:\n%s\n%s", code, so, se)
	}
	var rep serveReport
	b, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 || rep.Workers != 4 || rep.Prefetch != "shadow" || rep.ExpertBytes <= 0 || rep.Machine.CPUs < 1 ||
		!strings.HasPrefix(rep.Command, "odmoe bench serve -preset tiny") {
		t.Fatalf("report: %s", b)
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
	for _, want := range []string{"| clients | requests |", "| 1 | 1 | 8 |", "| 2 | 2 | 16 |", "load average before", "command: `odmoe bench serve", "## The API against text mode on the same swarm", "| 1 | "} {
		if !strings.Contains(so, want) || !strings.Contains(string(md), want) {
			t.Errorf("stdout or report.md lacks %q:\n%s", want, so)
		}
	}
}

// ordered: no latencies, or positive ones with p99 >= p50.
func ordered(q quantiles) bool { return q.N == 0 || (q.P50 > 0 && q.P99 >= q.P50) }

func TestQuantilesAreNearestRank(t *testing.T) {
	ms := make([]float64, 200)
	for i := range ms {
		ms[i] = float64(200 - i) // 200..1, unsorted
	}
	cases := []struct {
		in   []float64
		want quantiles
	}{
		{nil, quantiles{}},
		{[]float64{7}, quantiles{7, 7, 7, 1}},
		{[]float64{3, 1, 2}, quantiles{2, 3, 2, 3}},
		{ms, quantiles{100, 198, 100.5, 200}},
	}
	for _, tc := range cases {
		if got := quantilesOf(tc.in); got != tc.want {
			t.Errorf("quantilesOf(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestParsePromTextSumsLabelSets(t *testing.T) {
	text := `# HELP odmoe_requests_total API requests.
# TYPE odmoe_requests_total counter
odmoe_requests_total{endpoint="completions",status="200"} 3
odmoe_requests_total{endpoint="chat",status="200"} 2
odmoe_generated_tokens_total 1.5e+02
odmoe_batch_size 0
odmoe_layer_passes_total{phase="decode"} 40
odmoe_layer_passes_total{phase="prefill"} 8
`
	got, err := parsePromText(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if got["odmoe_requests_total"] != 5 || got["odmoe_generated_tokens_total"] != 150 || len(got) != 6 ||
		got["odmoe_layer_passes_total"] != 48 || got[`odmoe_layer_passes_total{phase="decode"}`] != 40 || got[`odmoe_layer_passes_total{phase="prefill"}`] != 8 {
		t.Fatalf("got %v", got)
	}
	if _, err := parsePromText(strings.NewReader("odmoe_x{a=\"b\"}\n")); err == nil {
		t.Fatal("a sample without a value parsed")
	}
}

// TestHistogramQuantilesInterpolateWithinBuckets: from two reads of a
// histogram, written with its TYPE line (as our /metrics writes it) or
// without (untyped samples), the observations between them are 20, their
// median, 99th percentile and mean as histogram_quantile interpolates.
func TestHistogramQuantilesInterpolateWithinBuckets(t *testing.T) {
	for _, typed := range []bool{true, false} {
		text := func(sum float64, counts ...int) string {
			les := []string{"0.005", "0.01", "0.025", "+Inf"}
			var b strings.Builder
			if typed {
				b.WriteString("# TYPE odmoe_x_seconds histogram\n")
			}
			for i, c := range counts {
				fmt.Fprintf(&b, "odmoe_x_seconds_bucket{le=%q} %d\n", les[i], c)
			}
			fmt.Fprintf(&b, "odmoe_x_seconds_sum %g\nodmoe_x_seconds_count %d\n", sum, counts[len(counts)-1])
			return b.String()
		}
		before, err := parsePromText(strings.NewReader(text(0.01, 5, 5, 5, 5)))
		if err != nil {
			t.Fatal(err)
		}
		after, err := parsePromText(strings.NewReader(text(0.31, 5, 15, 25, 25)))
		if err != nil {
			t.Fatal(err)
		}
		// 20 observations: 10 in (5, 10] ms, 10 in (10, 25] ms
		q := histogramQuantiles(before, after, "odmoe_x_seconds")
		if q.N != 20 || math.Abs(q.P50-10) > 1e-9 || math.Abs(q.P99-24.7) > 1e-9 || math.Abs(q.Mean-15) > 1e-9 {
			t.Fatalf("typed %v: got %+v, want p50 10 ms, p99 24.7 ms, mean 15 ms of 20", typed, q)
		}
		if q := histogramQuantiles(after, after, "odmoe_x_seconds"); q.N != 0 {
			t.Fatalf("typed %v: no observations gave %+v", typed, q)
		}
	}
}
