package mainnode_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/serve"
	"github.com/odmoe/odmoe/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// TestExpertBytesIsWhatTheStoreHoldsPerExpert: the size the metrics turn
// loads into bytes with is the store's own size of every expert.
func TestExpertBytesIsWhatTheStoreHoldsPerExpert(t *testing.T) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny"} {
		t.Run(preset, func(t *testing.T) {
			f, err := inproc.Generate(context.Background(), t.TempDir(), preset, 3, 1)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := model.LoadConfig(f.Model)
			if err != nil {
				t.Fatal(err)
			}
			st, err := store.Open(f.Store, store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			want := mainnode.ExpertBytes(cfg)
			for _, l := range st.Layers() {
				for e := range cfg.NumExperts {
					got, err := st.ExpertBytes(l, e)
					if err != nil || int64(got) != want {
						t.Fatalf("layer %d expert %d: the store holds %d bytes (%v), ExpertBytes says %d", l, e, got, err, want)
					}
				}
			}
		})
	}
}

// TestSwarmMetricsAgreeWithItsFiguresAndPassPromtool runs a swarm of four
// workers driven by a shadow, first one sequence alone, then completions
// through the API, and scrapes GET /metrics: the swarm's counters agree
// with its Stats, the shadow's recall counters are OD-MoE eq. (3) and the
// batched passes' recall, every node is up, the API counted the tokens it
// generated, and Prometheus's own promtool finds nothing to lint.
func TestSwarmMetricsAgreeWithItsFiguresAndPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool (Prometheus's metrics linter) is not in PATH: apt-get install prometheus (Debian's package has it)")
	}
	f, err := inproc.Generate(context.Background(), t.TempDir(), "qwen3-moe-tiny", 5, 4)
	if err != nil {
		t.Fatal(err)
	}
	_, mainModel := loadModels(t, f)
	cfg := mainModel.Config
	tok, err := tokenizer.LoadDir(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(f.Store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	expertBytes, err := st.ExpertBytes(st.Layers()[0], 0)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	// an nf4 shadow aligned every 4th pass: it predicts some experts
	// wrong, so recall is not trivially 1 and misses have every cause
	var storeServed atomic.Int64 // what a main node serving its store (-store-listen) sent
	storeServed.Store(123456789)
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 4, KVPeriod: 4}, StoreServed: &storeServed}, &shadowSpec{quant: kernels.NF4})
	reg := prometheus.NewRegistry()
	reg.MustRegister(sw.Collector(int64(expertBytes)))
	if got := gather(t, reg)["odmoe_store_served_bytes_total"]; got != 123456789 {
		t.Errorf("odmoe_store_served_bytes_total = %v, the node's count 123456789", got)
	}

	// one sequence alone: every decode layer is scored, so the counters
	// are eq. (3)'s sums, which align.Recall divides
	const steps = 8
	generate(t, mainModel, sw, testPrompt(10, 31, 3, cfg.VocabSize), steps)
	alone, ok := sw.ShadowStats(10e9)
	if !ok {
		t.Fatal("no shadow stats")
	}
	m := gather(t, reg)
	predicted, routed := m["odmoe_shadow_predicted_experts_total"], m["odmoe_shadow_routed_experts_total"]
	if want := float64(cfg.TopK * len(cfg.ExpertLayers()) * (steps - 1)); routed != want {
		t.Errorf("alone: %v routed experts scored, want top-%d x %d layers x %d decode tokens = %v", routed, cfg.TopK, len(cfg.ExpertLayers()), steps-1, want)
	}
	if predicted/routed != alone.Recall {
		t.Errorf("alone: predicted/routed = %v/%v = %v, eq. (3) = %v", predicted, routed, predicted/routed, alone.Recall)
	}

	// completions through the API, batched
	b := sw.Batcher(mainModel)
	defer b.Close()
	srv, err := serve.New(serve.Config{Model: "m", Tokenizer: tok, Context: cfg.MaxPositions,
		Generator: b, Health: sw.Health, Registry: reg, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	prompts := []string{"The quick brown fox", "Once upon a time", "1 2 3 4 5"}
	const n = 6
	var wg sync.WaitGroup
	var mu sync.Mutex
	generated := 0
	for _, p := range prompts {
		wg.Go(func() {
			body, _ := json.Marshal(map[string]any{"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": true})
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var cr struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&cr); err != nil || resp.StatusCode != 200 {
				t.Errorf("%q: status %d, %v", p, resp.StatusCode, err)
				return
			}
			mu.Lock()
			generated += cr.Usage.CompletionTokens
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// the console's timelines: the last decode passes, every layer timed
	rp := sw.RecentPasses()
	if len(rp) == 0 || len(rp) > 16 {
		t.Fatalf("%d recent passes", len(rp))
	}
	for i, p := range rp {
		if p.Pass < 2 || len(p.Layers) > cfg.NumLayers { // decode passes: the prompt is pass 1
			t.Fatalf("recent pass %d: pass %d, %d layers of %d", i, p.Pass, len(p.Layers), cfg.NumLayers)
		}
		for _, l := range cfg.ExpertLayers() {
			if lt := p.Layers[l]; lt.MainMs <= 0 || lt.ExpertsMs <= 0 || lt.NetworkMs > lt.ExpertsMs || lt.StallMs > lt.ExpertsMs {
				t.Fatalf("recent pass %d, layer %d: %+v", i, l, lt)
			}
		}
	}
	sw.PollWorkersOnce(context.Background(), 5*time.Second)
	polled := sw.WorkerStats(context.Background(), 5*time.Second)
	served, ok := sw.ShadowStats(10e9) // the shadow's last predictions scored
	if !ok {
		t.Fatal("no shadow stats")
	}
	text := scrape(t, hs.URL)
	m = parseSamples(t, text)

	if generated != len(prompts)*n || m["odmoe_generated_tokens_total"] != float64(generated) {
		t.Errorf("odmoe_generated_tokens_total %v, the answers' usage says %d (want %d)", m["odmoe_generated_tokens_total"], generated, len(prompts)*n)
	}
	// every served request's own share: one recall and one misses sample each
	for _, h := range []string{"odmoe_request_shadow_recall_count", "odmoe_request_expert_misses_per_step_count"} {
		if m[h] != float64(len(prompts)) {
			t.Errorf("%s %v, want one a request (%d)", h, m[h], len(prompts))
		}
	}
	if m[`odmoe_requests_total{endpoint="completions",status="200"}`] != float64(len(prompts)) {
		t.Errorf("odmoe_requests_total for completions/200: %v, want %d", m[`odmoe_requests_total{endpoint="completions",status="200"}`], len(prompts))
	}
	// the served decode ran in batched passes: their union's share
	// predicted, summed with the lone sequence's passes before
	bp, br := m["odmoe_shadow_predicted_experts_total"], m["odmoe_shadow_routed_experts_total"]
	if br <= routed || bp/br != served.Recall {
		t.Errorf("served: predicted/routed = %v/%v (%v/%v before), the passes' recall %v", bp, br, predicted, routed, served.Recall)
	}

	stats := sw.Stats()
	pre, dec := mainnode.Total(stats.Prefill), mainnode.Total(stats.Decode)
	if pre.Loads+dec.Loads == 0 || pre.Calls == 0 || dec.Calls == 0 {
		t.Fatalf("nothing loaded or run: prefill %+v, decode %+v", pre, dec)
	}
	for _, ph := range []struct {
		name string
		s    mainnode.LayerStats
	}{{"prefill", pre}, {"decode", dec}} {
		for _, c := range []struct {
			metric string
			want   float64
		}{
			{`odmoe_expert_loads_total{phase="%s"}`, float64(ph.s.Loads)},
			{`odmoe_expert_misses_total{cause="late",phase="%s"}`, float64(ph.s.MissesLate)},
			{`odmoe_expert_misses_total{cause="wrong",phase="%s"}`, float64(ph.s.MissesWrong)},
			{`odmoe_expert_misses_total{cause="unscored",phase="%s"}`, float64(ph.s.Misses - ph.s.MissesLate - ph.s.MissesWrong)},
			{`odmoe_layer_passes_total{phase="%s"}`, float64(ph.s.Calls)},
			{`odmoe_layer_expert_results_total{phase="%s"}`, float64(ph.s.Results)},
			{`odmoe_layer_stall_seconds_total{phase="%s"}`, ph.s.Stall.Seconds()},
			{`odmoe_layer_main_seconds_total{phase="%s"}`, ph.s.Main.Seconds()},
		} {
			key := fmt.Sprintf(c.metric, ph.name)
			got, ok := m[key]
			if !ok || got != c.want {
				t.Errorf("%s = %v (present %v), Stats say %v", key, got, ok, c.want)
			}
		}
	}
	// per worker, from the results: they add up to the layers' figures
	var loads, results, misses, bytesLoaded, compute, late, wrong float64
	own := sw.WorkerStats(context.Background(), 5e9)
	for i := range 4 {
		w := fmt.Sprintf(`{worker="w%d"}`, i+1)
		if m["odmoe_worker_up"+w] != 1 {
			t.Errorf("odmoe_worker_up%s = %v, want 1", w, m["odmoe_worker_up"+w])
		}
		l := m["odmoe_worker_loads_total"+w]
		if own[i] == nil || l > float64(own[i].Loads) {
			t.Errorf("worker w%d: %v loads counted from its results, its own counters %+v", i+1, l, own[i])
		}
		loads += l
		results += m["odmoe_worker_results_total"+w]
		misses += m["odmoe_worker_misses_total"+w]
		bytesLoaded += m["odmoe_worker_load_bytes_total"+w]
		compute += m["odmoe_worker_compute_seconds_total"+w]
		late += m[fmt.Sprintf(`odmoe_worker_predicted_misses_total{cause="late",worker="w%d"}`, i+1)]
		wrong += m[fmt.Sprintf(`odmoe_worker_predicted_misses_total{cause="wrong",worker="w%d"}`, i+1)]
		if !regexp.MustCompile(fmt.Sprintf(`odmoe_worker_info\{addr="127\.0\.0\.1:\d+",worker="w%d"\} 1`, i+1)).MatchString(text) {
			t.Errorf("no odmoe_worker_info with w%d's loopback address", i+1)
		}
		if p := polled[i]; p == nil || m["odmoe_worker_device_budget_bytes"+w] != float64(p.DeviceBudget) || p.DeviceBudget == 0 ||
			m["odmoe_worker_resident_experts"+w] != float64(p.ResidentExperts) ||
			!strings.Contains(text, "odmoe_worker_store_fetched_bytes_total"+w) || m["odmoe_worker_store_fetched_bytes_total"+w] != float64(p.StoreFetched) ||
			!strings.Contains(text, "odmoe_worker_store_served_bytes_total"+w) || m["odmoe_worker_store_served_bytes_total"+w] != float64(p.StoreServed) {
			t.Errorf("worker %d: budget %v and resident %v in the metrics, it answers %+v", i, m["odmoe_worker_device_budget_bytes"+w], m["odmoe_worker_resident_experts"+w], p)
		}
	}
	if loads != float64(pre.Loads+dec.Loads) || results != float64(pre.Results+dec.Results) || misses != float64(pre.Misses+dec.Misses) {
		t.Errorf("workers' results: %v loads, %v results, %v misses; the layers' Stats: %d, %d, %d",
			loads, results, misses, pre.Loads+dec.Loads, pre.Results+dec.Results, pre.Misses+dec.Misses)
	}
	if late != float64(pre.MissesLate+dec.MissesLate) || wrong != float64(pre.MissesWrong+dec.MissesWrong) || late+wrong == 0 {
		t.Errorf("workers' late and wrong misses %v and %v; the layers' %d and %d", late, wrong, pre.MissesLate+dec.MissesLate, pre.MissesWrong+dec.MissesWrong)
	}
	if bytesLoaded != loads*float64(expertBytes) || compute <= 0 {
		t.Errorf("%v bytes loaded for %v loads of %d-byte experts; %v s of compute", bytesLoaded, loads, expertBytes, compute)
	}
	for _, c := range []struct {
		metric string
		want   float64
	}{
		{"odmoe_shadow_up", 1}, {"odmoe_workers_lost_total", 0}, {"odmoe_workers_rejoined_total", 0},
		{"odmoe_requests_resent_total", 0}, {"odmoe_shadow_lost_total", 0}, {"odmoe_shadow_reattached_total", 0},
		{"odmoe_reactive_iterations_total", float64(stats.Faults.ReactivePasses)},
		{"odmoe_shadow_align_token_period", float64(served.Align.TokenPeriod)},
		{"odmoe_shadow_align_kv_period", float64(served.Align.KVPeriod)},
	} {
		if got, ok := m[c.metric]; !ok || got != c.want {
			t.Errorf("%s = %v (present %v), want %v", c.metric, got, ok, c.want)
		}
	}

	// the shadow may run one more pass ahead between ShadowStats and the
	// scrape: the counter is at least what ShadowStats said
	if got := m["odmoe_shadow_ahead_passes_total"]; got < float64(served.Ahead) || got > float64(served.Ahead)+1 {
		t.Errorf("odmoe_shadow_ahead_passes_total = %v, ShadowStats said %d", got, served.Ahead)
	}
	// the guesses: every row the shadow ran ahead that an alignment met
	// or rewound, as ShadowStats counted them (one more pass may have
	// come between)
	var met, rewound float64
	for _, k := range []string{"greedy", "sampled", "constrained"} {
		met += m[`odmoe_shadow_guesses_total{kind="`+k+`",outcome="met"}`]
		rewound += m[`odmoe_shadow_guesses_total{kind="`+k+`",outcome="rewound"}`]
	}
	if g := m[`odmoe_shadow_guesses_total{kind="greedy",outcome="met"}`]; g != met {
		t.Errorf("greedy requests' guesses met %v of %v: the run's requests are greedy", g, met)
	}
	if met < float64(served.Agreed) || rewound < float64(served.Rewound) || met+rewound > float64(served.Agreed+served.Rewound)+4 || met+rewound == 0 {
		t.Errorf("odmoe_shadow_guesses_total met %v, rewound %v; ShadowStats said %d and %d", met, rewound, served.Agreed, served.Rewound)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	t.Logf("promtool check metrics: %v, %q", err, out)
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}
}

// gather scrapes reg as GET /metrics would.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer hs.Close()
	return parseSamples(t, scrape(t, hs.URL))
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// parseSamples reads the text exposition format's samples, keyed by name
// and labels as written (promhttp sorts the labels by name).
func parseSamples(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("/metrics: line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMainComputeCountsNoIdleTime: the main node's per-layer compute
// (odmoe_layer_main_seconds_total, Stats' Main) counts from each pass's
// start: two requests 400 ms apart through the pass loop add up to far
// less than the idle time between them, which used to land in the next
// pass's first layer.
func TestMainComputeCountsNoIdleTime(t *testing.T) {
	f, err := inproc.Generate(context.Background(), t.TempDir(), "tiny", 5, 4)
	if err != nil {
		t.Fatal(err)
	}
	_, mainModel := loadModels(t, f)
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Reactive}, nil)
	b := sw.Batcher(mainModel)
	defer b.Close()
	prompt := testPrompt(6, 31, 3, mainModel.Config.VocabSize)
	const idle = 400 * time.Millisecond
	for i := range 2 {
		if i > 0 {
			time.Sleep(idle)
		}
		if _, _, err := b.Generate(context.Background(), prompt, model.GenerateOptions{MaxTokens: 4}); err != nil {
			t.Fatal(err)
		}
	}
	var main time.Duration
	st := sw.Stats()
	for _, l := range append(append([]mainnode.LayerStats{}, st.Decode...), st.Prefill...) {
		main += l.Main
	}
	if main <= 0 || main >= idle/2 {
		t.Fatalf("main-node compute over two short requests %v apart: %v", idle, main)
	}
	t.Logf("main-node compute over two requests %v apart: %v", idle, main)
}
