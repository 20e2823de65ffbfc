package main

import (
	"encoding/json"
	"os"
	"path/filepath"
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
		"-clients", "1,2", "-requests", "1", "-max-tokens", "8", "-out", out, "-log-level", "warn")
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
		clients := i + 1
		want := clients * 1 * 8
		switch {
		case r.Clients != clients || r.Requests != clients || r.Failed != 0:
			t.Errorf("row %d: %d clients, %d requests, %d failed; want %d, %d, 0", i, r.Clients, r.Requests, r.Failed, clients, clients)
		case r.Tokens != want || r.ServerTokens != float64(want):
			t.Errorf("row %d: the clients counted %d tokens and the node %v; want %d", i, r.Tokens, r.ServerTokens, want)
		case !(r.TTFT.P50 > 0 && r.TTFT.P99 >= r.TTFT.P50 && r.TTFT.N == clients):
			t.Errorf("row %d: TTFT %+v", i, r.TTFT)
		case !(r.InterToken.P50 > 0 && r.InterToken.P99 >= r.InterToken.P50 && r.InterToken.N > 0):
			t.Errorf("row %d: inter-token %+v", i, r.InterToken)
		case !(r.WallS > 0 && r.TokensPerS > 0) || r.TokensPerS != float64(r.Tokens)/r.WallS:
			t.Errorf("row %d: %d tokens in %v s at %v tok/s", i, r.Tokens, r.WallS, r.TokensPerS)
		case i == 0 && r.Speedup != 1:
			t.Errorf("row 0: speedup %v over itself", r.Speedup)
		case r.BytesPerToken <= 0 && !strings.HasPrefix(rep.BytesFrom, "unknown"):
			t.Errorf("row %d: %v expert bytes per token from %s", i, r.BytesPerToken, rep.BytesFrom)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| clients | requests |", "| 1 | 1 | 8 |", "| 2 | 2 | 16 |", "load average before", "command: `odmoe bench serve"} {
		if !strings.Contains(so, want) || !strings.Contains(string(md), want) {
			t.Errorf("stdout or report.md lacks %q:\n%s", want, so)
		}
	}
}

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
		{[]float64{7}, quantiles{7, 7, 1}},
		{[]float64{3, 1, 2}, quantiles{2, 3, 3}},
		{ms, quantiles{100, 198, 200}},
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
`
	got, err := parsePromText(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if got["odmoe_requests_total"] != 5 || got["odmoe_generated_tokens_total"] != 150 || len(got) != 3 {
		t.Fatalf("got %v", got)
	}
	if _, err := parsePromText(strings.NewReader("odmoe_x{a=\"b\"}\n")); err == nil {
		t.Fatal("a sample without a value parsed")
	}
}
