package servebench

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestQuantilesAreNearestRank(t *testing.T) {
	ms := make([]float64, 200)
	for i := range ms {
		ms[i] = float64(200 - i) // 200..1, unsorted
	}
	cases := []struct {
		in   []float64
		want Quantiles
	}{
		{nil, Quantiles{}},
		{[]float64{7}, Quantiles{7, 7, 7, 1}},
		{[]float64{3, 1, 2}, Quantiles{2, 3, 2, 3}},
		{ms, Quantiles{100, 198, 100.5, 200}},
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
odmoe_shadow_guesses_total{outcome="met"} 30
odmoe_shadow_guesses_total{outcome="rewound"} 2
`
	got, err := parsePromText(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if got[`odmoe_shadow_guesses_total{outcome="met"}`] != 30 || got[`odmoe_shadow_guesses_total{outcome="rewound"}`] != 2 || got["odmoe_shadow_guesses_total"] != 32 {
		t.Errorf("the guesses by outcome: %v", got)
	}
	if got["odmoe_requests_total"] != 5 || got["odmoe_generated_tokens_total"] != 150 || len(got) != 9 ||
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

func TestParseKindsNamesWhatIsWrong(t *testing.T) {
	ks, err := ParseKinds("greedy, t0.7,t1,penalties,json,greedy-penalties")
	if err != nil {
		t.Fatal(err)
	}
	want := []Kind{{Name: "greedy"}, {Name: "t0.7", Temperature: 0.7}, {Name: "t1", Temperature: 1},
		{Name: "penalties", Temperature: 0.7, Presence: 0.5, Frequency: 0.5}, {Name: "json", Temperature: 0.7, JSONSchema: true},
		{Name: "greedy-penalties", Presence: 0.5, Frequency: 0.5}}
	if !slices.Equal(ks, want) {
		t.Errorf("ParseKinds = %+v, want %+v", ks, want)
	}
	for in, says := range map[string]string{"t3": "[0, 2]", "tx": `"tx"`, "beam": "unknown", "greedy,greedy": "twice", "": `""`} {
		if _, err := ParseKinds(in); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("ParseKinds(%q) = %v, want an error saying %s", in, err, says)
		}
	}
}

// A request of each kind says what it is: the json kind a chat
// completion following the schema, the others a completion of the token
// ids, EOS ignored; every one seeded, penalties where asked for.
func TestKindsRequestWhatTheySay(t *testing.T) {
	ks, _ := ParseKinds("greedy,t0.7,penalties,json")
	for _, k := range ks {
		path, body := k.request([]int{5, 6}, func([]int) string { return "five six" }, 9, 42)
		var req map[string]any
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatal(err)
		}
		if req["temperature"] != k.Temperature || req["seed"] != float64(42) || req["stream"] != true {
			t.Errorf("%s: %s", k.Name, body)
		}
		if _, ok := req["presence_penalty"]; ok != (k.Name == "penalties") {
			t.Errorf("%s: penalties %v in %s", k.Name, ok, body)
		}
		if k.JSONSchema {
			rf, _ := req["response_format"].(map[string]any)
			if path != "/v1/chat/completions" || rf["type"] != "json_schema" || req["max_completion_tokens"] != float64(9) || !strings.Contains(string(body), "five six") {
				t.Errorf("json: %s %s", path, body)
			}
		} else if path != "/v1/completions" || req["ignore_eos"] != true || req["max_tokens"] != float64(9) {
			t.Errorf("%s: %s %s", k.Name, path, body)
		}
	}
	if seedOf(1, 1, 0, 0) == seedOf(1, 2, 0, 0) || seedOf(1, 1, 1, 0) == seedOf(1, 1, 0, 1) {
		t.Error("two requests of a run share a seed")
	}
}
