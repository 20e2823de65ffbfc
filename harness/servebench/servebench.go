// Package servebench is `odmoe bench serve`: a swarm of processes on this
// machine (procswarm) serving the OpenAI-compatible API to N streaming
// clients at once, measured from the clients' side, the main node's
// /metrics and the workers' counters, and, on request, against text mode
// on the same swarm.
package servebench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/odmoe/odmoe/internal/metricnames"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/harness/procswarm"
	"github.com/odmoe/odmoe/internal/cpuset"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/internal/quantile"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/testbed"
	"github.com/odmoe/odmoe/wire"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	promodel "github.com/prometheus/common/model"
	"github.com/rs/zerolog"
)

// Report is what `odmoe bench serve` measured (report.json).
type Report struct {
	Date         string          `json:"date"`
	Command      string          `json:"command"`
	Machine      testbed.Machine `json:"machine"`
	LoadBefore   string          `json:"loadavg_before"` // /proc/loadavg: 1, 5, 15 min
	LoadAfter    string          `json:"loadavg_after"`
	Model        string          `json:"model"`
	Preset       string          `json:"preset,omitempty"`
	Workers      int             `json:"workers"`
	Prefetch     string          `json:"prefetch"`
	Residency    string          `json:"residency,omitempty"`
	Quant        string          `json:"quant,omitempty"` // the shadow's
	MaxBatch     int             `json:"max_batch"`
	Requests     int             `json:"requests_per_client"`
	PromptTokens int             `json:"prompt_tokens"`
	MaxTokens    int             `json:"max_tokens"`
	// ExpertBytes is one expert's size (3 matrices of hidden x
	// intermediate, BF16); BytesFrom says where the bytes loaded per
	// token come from (the metric read from the main node's /metrics).
	// Kinds are the kinds of request measured (Options.Kinds' names),
	// Rounds how many times each, Seed their seeds' base.
	Kinds  []string `json:"kinds,omitempty"`
	Rounds int      `json:"rounds,omitempty"`
	Seed   uint64   `json:"seed,omitempty"`
	// NodeCPUs are the CPU lists the swarm's node processes ran on and
	// ClientCPUs this process's (its streaming clients), as the kernel
	// had them once the swarm answered (-node-cpus, taskset).
	NodeCPUs    []string `json:"node_cpus,omitempty"`
	ClientCPUs  string   `json:"client_cpus,omitempty"`
	ExpertBytes int64    `json:"expert_bytes"`
	BytesFrom   string   `json:"bytes_from"`
	Rows        []Result `json:"rows"`
	// TextRounds are -text-rounds' rounds: the API at 1 client against
	// text mode on the same swarm.
	TextRounds []TextRound `json:"text_rounds,omitempty"`
	// Joins are -join-rate's rounds: the running streams' decode while
	// the last worker is away, and while it fills its share again from
	// an empty directory at JoinRate.
	JoinRate string      `json:"join_rate,omitempty"`
	Joins    []JoinRound `json:"joins,omitempty"`
}

// JoinRound is one round of a worker joining a serving swarm: the
// streams' decode tokens/s (from the main node's mean inter-token time)
// with the last worker killed (Away), then started again on an empty
// directory, filling its share from the main node and its group at the
// join rate (Filling), and whether the fill was still going when the
// streams ended (else part of the window ran with it back).
type JoinRound struct {
	Round       int     `json:"round"`
	Away        float64 `json:"away_decode_tokens_per_s"`
	Filling     float64 `json:"filling_decode_tokens_per_s"`
	Ratio       float64 `json:"filling_over_away"`
	FillRunning bool    `json:"fill_running_at_end"`
	// AwayCPU and FillingCPU are the main node's and the workers' CPU ms
	// per generated token in each window (the filling worker's among
	// them): what the fill costs the machine.
	AwayCPU    [2]float64 `json:"away_cpu_ms_per_token"`
	FillingCPU [2]float64 `json:"filling_cpu_ms_per_token"`
}

// TextRound is one round of the API against text mode on the same swarm,
// the API's requests sending text mode's prompt:
// each one's decode tokens/s (the API's from its node's mean inter-token
// time, text mode's from its -stats), and each one's expert loads and
// misses (the API's from the workers' counters, text mode's from its
// -stats).
type TextRound struct {
	Round      int     `json:"round"`
	TextFirst  bool    `json:"text_first"` // text mode ran before the API in this round
	APIDecode  float64 `json:"api_decode_tokens_per_s"`
	TextDecode float64 `json:"text_decode_tokens_per_s"`
	Ratio      float64 `json:"api_over_text"`
	APILoads   int64   `json:"api_loads"`
	APIMisses  int64   `json:"api_misses"`
	TextLoads  int64   `json:"text_loads"`
	TextMisses int64   `json:"text_misses"`
	APITokens  int     `json:"api_tokens"`
	TextTokens int     `json:"text_tokens"`
}

// Result is one client count's figures.
type Result struct {
	Clients int    `json:"clients"`
	Kind    string `json:"kind"` // the requests' (Kind.Name)
	// Draft is the main node's -draft for the row ("": the default, off)
	Draft string `json:"draft,omitempty"`
	// Drafting are the node's drafting figures meanwhile: guesses checked
	// and kept, decode passes, and the tokens a decode pass gave
	// ((passes + kept) / passes; 0: no decode pass)
	Drafting struct {
		Guesses       float64 `json:"guesses"`
		Accepted      float64 `json:"accepted"`
		DecodePasses  float64 `json:"decode_passes"`
		TokensPerPass float64 `json:"tokens_per_pass"`
	} `json:"drafting"`
	// DecodeTokensPerS is 1000 over the node's mean inter-token time
	// (ServerInterToken.Mean): the decode rate, prompts left out
	DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	Round            int     `json:"round"` // from 1
	Requests         int     `json:"requests"`
	Failed           int     `json:"failed"`
	// Guesses are the shadow's guesses of the rows' next tokens on the
	// passes it ran ahead, met and rewound (odmoe_shadow_guesses_total),
	// TokenAgreement met over both (-1: none)
	Guesses struct {
		Met     float64 `json:"met"`
		Rewound float64 `json:"rewound"`
	} `json:"shadow_guesses"`
	TokenAgreement float64 `json:"token_agreement"`
	// Tokens are the completion tokens the responses counted
	// (usage.completion_tokens); ServerTokens what the node's
	// odmoe_generated_tokens_total grew by meanwhile.
	Tokens       int     `json:"tokens"`
	ServerTokens float64 `json:"server_tokens"`
	WallS        float64 `json:"wall_s"`
	TokensPerS   float64 `json:"tokens_per_s"`
	Speedup      float64 `json:"speedup"` // tokens/s over the first row's
	// TTFT: from sending a request to its first content chunk (requests
	// without one have none); InterToken: between consecutive content
	// chunks of a request. A chunk carries the text of one token or more,
	// or none: a token whose text is not complete yet, or is empty,
	// waits for the next; Chunks counts the content chunks.
	TTFT       Quantiles `json:"ttft_ms"`
	InterToken Quantiles `json:"inter_token_ms"`
	Chunks     int       `json:"content_chunks"`
	// ServerTTFT and ServerInterToken are the same per generated token,
	// as the node observed them meanwhile (its
	// odmoe_time_to_first_token_seconds and
	// odmoe_inter_token_latency_seconds histograms), interpolated within
	// their buckets as Prometheus's histogram_quantile does.
	ServerTTFT       Quantiles `json:"server_ttft_ms"`
	ServerInterToken Quantiles `json:"server_inter_token_ms"`
	// ExpertBytesLoaded is what the swarm loaded meanwhile (prefill and
	// decode); BytesPerToken that over Tokens. Negative: unknown.
	ExpertBytesLoaded float64 `json:"expert_bytes_loaded"`
	BytesPerToken     float64 `json:"expert_bytes_per_token"`
	// Workers are the workers' own counters meanwhile, summed: experts
	// loaded (hinted or not), hinted loads evicted unused, requests
	// whose expert was loaded on demand.
	Workers struct {
		Loads       int64 `json:"loads"`
		WastedLoads int64 `json:"wasted_loads"`
		Misses      int64 `json:"misses"`
	} `json:"workers"`
	// ShadowRecall is the shadow's recall meanwhile (OD-MoE eq. 3 over
	// the decode passes: odmoe_shadow_predicted_experts_total over
	// odmoe_shadow_routed_experts_total); -1 without a shadow.
	ShadowRecall float64 `json:"shadow_recall"`
	CPUBusy      float64 `json:"cpu_busy"` // the whole machine's, over the wall time
	LoadAvg      string  `json:"loadavg_after"`
	// DecodeLayer is the main node's figures per decode layer pass (a
	// layer of one batched forward pass) meanwhile: Experts activated
	// (the union of the pass's rows', one result each), MainMs of its own compute
	// before them (attention, router), ExpertsMs from sending the
	// activations to the last result.
	DecodeLayer struct {
		Passes    float64 `json:"passes"`
		Experts   float64 `json:"experts"`
		MainMs    float64 `json:"main_ms"`
		ExpertsMs float64 `json:"experts_ms"`
	} `json:"decode_layer"`
	// CPUPerToken is the CPU time (user and system, from /proc) the
	// swarm's processes used meanwhile over the generated tokens, by
	// role, in milliseconds: which node a token's cost falls on.
	CPUPerToken struct {
		Main    float64 `json:"main"`
		Shadow  float64 `json:"shadow"`
		Workers float64 `json:"workers"`
		// Client is the benchmark's own process: its streaming clients
		// share the machine with the swarm
		Client float64 `json:"client"`
	} `json:"cpu_ms_per_token"`
}

// Quantiles are a latency's median and 99th percentile (nearest rank)
// and its mean, in milliseconds, over N samples.
type Quantiles struct {
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
	N    int     `json:"n"`
}

func quantilesOf(ms []float64) Quantiles {
	if len(ms) == 0 {
		return Quantiles{}
	}
	q := quantile.Of(ms, 0.50, 0.99)
	var sum float64
	for _, v := range ms {
		sum += v
	}
	return Quantiles{P50: q[0], P99: q[1], Mean: sum / float64(len(ms)), N: len(ms)}
}

// Options are `odmoe bench serve`'s settings.
type Options struct {
	Preset, Model, StoreDir, Cache    string
	Swarm                             procswarm.Options
	Clients                           []int
	Requests, MaxTokens, PromptTokens int
	MaxBatch                          int
	ReadyTimeout                      time.Duration
	Out                               string
	TextRounds                        int
	// Kinds are the kinds of request each client count is measured with,
	// in turn (none: greedy alone), in Rounds rounds (0: one); Seed
	// seeds the requests (each its own, seedOf).
	Kinds  []Kind
	Rounds int
	Seed   uint64
	// Drafts are the main node's -draft settings measured in turn each
	// round (none: the swarm's own, Swarm.Draft)
	Drafts []string
	// JoinRate, if set, has the main node serve its model and store
	// (-store-listen) and, after the rows, Rounds rounds of the last
	// worker killed and started again on an empty directory filling at
	// this -fetch-rate (Report.Joins), at Clients[0] clients.
	JoinRate string
}

// Run starts the swarm and its API, then measures every client
// count into rep.
func Run(ctx context.Context, f *Options, rep *Report, log zerolog.Logger) error {
	tmp, err := os.MkdirTemp("", "odmoe-bench-serve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	files, err := serveFiles(ctx, f, tmp, log)
	if err != nil {
		return err
	}
	rep.Model = files.Model
	if f.Model == "" {
		rep.Preset = f.Preset
	}
	cfg, err := model.LoadConfig(files.Model)
	if err != nil {
		return err
	}
	rep.ExpertBytes = 3 * int64(cfg.HiddenSize) * int64(cfg.IntermediateSize) * 2
	tok, err := tokenizer.LoadDir(files.Model)
	if err != nil {
		return err
	}
	// the API takes the tokenizer's ids (a synthetic model's vocabulary
	// may be smaller than its embeddings)
	vocab := min(cfg.VocabSize, tok.VocabSize())
	decode := func(ids []int) string { return tok.Decode(ids, true) }

	sw, err := procswarm.Start(ctx, files, f.Swarm)
	if err != nil {
		return err
	}
	defer sw.Close()
	addr, err := procswarm.FreeTCPAddr()
	if err != nil {
		return err
	}
	m := sw.MainFlags(f.Swarm.Prefetch, 1, 1)
	m.HTTP, m.MaxBatch, m.Log.Level = addr, f.MaxBatch, "warn"
	if f.JoinRate != "" {
		if m.StoreListen, err = sw.NextAddr(); err != nil {
			return err
		}
		m.Store, m.Log.Level = files.Store, "info" // (its log says when the worker rejoins)
	}
	base := "http://" + addr
	c := &Client{base: base, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: f.MaxBatch}}}
	var mainNode *procswarm.Node
	defer func() {
		if mainNode != nil {
			mainNode.Stop()
		}
	}()
	// startAPI starts the API's main node and waits for it to answer
	startAPI := func() error {
		if mainNode, err = sw.RunNode(ctx, "main", m.Args()...); err != nil {
			return err
		}
		t0 := time.Now()
		if err := c.WaitReady(ctx, mainNode.Exited(), f.ReadyTimeout); err != nil {
			sw.PrintLogs(os.Stderr)
			return err
		}
		log.Info().Dur("took", time.Since(t0)).Msg("swarm ready")
		return nil
	}
	log.Info().Int("workers", f.Swarm.Workers).Str("prefetch", f.Swarm.Prefetch).Str("api", base).Msg("swarm started; waiting for /healthz")
	if err := startAPI(); err != nil {
		return err
	}
	rep.NodeCPUs = sw.NodeCPUs()
	rep.ClientCPUs, _ = cpuset.OfProcess(0)
	counters, err := newWorkerCounters(files.Certs, sw.Workers())
	if err != nil {
		return err
	}

	// one short request first: connections, page cache and the first
	// batch are not what any row measures
	if r := c.complete(ctx, promptIDs(vocab, f.PromptTokens, 0, 0, 0), 2); r.err != nil {
		sw.PrintLogs(os.Stderr)
		return fmt.Errorf("warm-up request: %w", r.err)
	}
	bytesMetric := ""
	readWorkers := true // the workers' counters (not while one is away)
	// measure measures n clients on the API as it runs now, client k's
	// r-th request sending prompt(k, r)
	measure := func(n int, kind Kind, round int, prompt func(k, r int) []int) (Result, error) {
		before, err := c.metrics(ctx)
		if err != nil {
			return Result{}, err
		}
		var wBefore, wAfter wire.WorkerStats
		if readWorkers {
			if wBefore, err = counters.read(ctx); err != nil {
				return Result{}, err
			}
		}
		cpu0 := sw.CPU()
		row, results := c.measure(ctx, n, f, func(k, r int) (string, []byte) {
			ids := prompt(k, r)
			return kind.request(ids, decode, f.MaxTokens, seedOf(f.Seed, round, k, r))
		})
		row.Kind, row.Round = kind.Name, round
		cpu1 := sw.CPU()
		perTok := func(a, b time.Duration) float64 {
			return float64(b-a) / float64(time.Millisecond) / float64(max(1, row.Tokens))
		}
		row.CPUPerToken.Main, row.CPUPerToken.Shadow, row.CPUPerToken.Workers = perTok(cpu0.Main, cpu1.Main), perTok(cpu0.Shadow, cpu1.Shadow), perTok(cpu0.Workers, cpu1.Workers)
		row.CPUPerToken.Client = perTok(cpu0.Client, cpu1.Client)
		after, err := c.metrics(ctx)
		if err != nil {
			return Result{}, err
		}
		if readWorkers {
			if wAfter, err = counters.read(ctx); err != nil {
				return Result{}, err
			}
		}
		row.Workers.Loads, row.Workers.WastedLoads, row.Workers.Misses = wAfter.Loads-wBefore.Loads, wAfter.WastedLoads-wBefore.WastedLoads, wAfter.Misses-wBefore.Misses
		row.ServerTokens = after[metricnames.GeneratedTokensTotal] - before[metricnames.GeneratedTokensTotal]
		row.ServerTTFT = histogramQuantiles(before, after, metricnames.TimeToFirstTokenSeconds)
		row.ServerInterToken = histogramQuantiles(before, after, metricnames.InterTokenLatencySeconds)
		d := func(name string) float64 { return after[name] - before[name] }
		if l := &row.DecodeLayer; d(`odmoe_layer_passes_total{phase="decode"}`) > 0 {
			l.Passes = d(`odmoe_layer_passes_total{phase="decode"}`)
			l.Experts = d(`odmoe_layer_expert_results_total{phase="decode"}`) / l.Passes
			l.MainMs = 1000 * d(`odmoe_layer_main_seconds_total{phase="decode"}`) / l.Passes
			l.ExpertsMs = 1000 * d(`odmoe_layer_experts_seconds_total{phase="decode"}`) / l.Passes
		}
		row.Guesses.Met, row.Guesses.Rewound = d(`odmoe_shadow_guesses_total{outcome="met"}`), d(`odmoe_shadow_guesses_total{outcome="rewound"}`)
		dr := &row.Drafting
		dr.Guesses, dr.Accepted, dr.DecodePasses = d(metricnames.DraftGuessesTotal), d(metricnames.DraftAcceptedTotal), d(metricnames.DecodePassesTotal)
		if dr.DecodePasses > 0 {
			dr.TokensPerPass = (dr.DecodePasses + dr.Accepted) / dr.DecodePasses
		}
		if row.ServerInterToken.Mean > 0 {
			row.DecodeTokensPerS = 1000 / row.ServerInterToken.Mean
		}
		row.TokenAgreement = -1
		if g := row.Guesses.Met + row.Guesses.Rewound; g > 0 {
			row.TokenAgreement = row.Guesses.Met / g
		}
		row.ShadowRecall = -1
		if routed := d(metricnames.ShadowRoutedExpertsTotal); routed > 0 {
			row.ShadowRecall = d(metricnames.ShadowPredictedExpertsTotal) / routed
		}
		var from string
		row.ExpertBytesLoaded, from = expertBytesLoaded(before, after, rep.ExpertBytes)
		if from == "" { // the workers' own count
			row.ExpertBytesLoaded, from = float64(row.Workers.Loads*rep.ExpertBytes), "the workers' expert loads (wire.WorkerStats) x an expert's bytes"
		}
		bytesMetric = cmp.Or(bytesMetric, from)
		row.BytesPerToken = -1
		if row.ExpertBytesLoaded >= 0 && row.Tokens > 0 {
			row.BytesPerToken = row.ExpertBytesLoaded / float64(row.Tokens)
		}
		if len(rep.Rows) > 0 && rep.Rows[0].TokensPerS > 0 {
			row.Speedup = row.TokensPerS / rep.Rows[0].TokensPerS
		} else {
			row.Speedup = 1
		}
		for _, r := range results {
			if r.err != nil {
				log.Error().Int("clients", n).Err(r.err).Msg("request failed")
			}
		}
		log.Info().Int("clients", n).Str("kind", kind.Name).Int("round", round).Int("tokens", row.Tokens).Float64("tok_per_s", row.TokensPerS).
			Float64("ttft_p50_ms", row.TTFT.P50).Float64("itl_p50_ms", row.InterToken.P50).Str("loadavg", row.LoadAvg).Msg("measured")
		return row, nil
	}
	kinds := f.Kinds
	if len(kinds) == 0 {
		kinds = []Kind{greedy}
	}
	drafts := f.Drafts
	if len(drafts) == 0 {
		drafts = []string{m.Draft}
	}
	for round := 1; round <= max(1, f.Rounds); round++ {
		for _, draft := range drafts { // in turn, on the same workers and shadow: the main node started again with each
			if draft != m.Draft {
				if err := mainNode.Stop(); err != nil {
					log.Warn().Err(err).Msg("the main node did not exit cleanly")
				}
				mainNode, m.Draft = nil, draft
				if err := startAPI(); err != nil {
					return err
				}
				if r := c.complete(ctx, promptIDs(vocab, f.PromptTokens, 0, 0, 0), 2); r.err != nil {
					return fmt.Errorf("warm-up request with -draft %s: %w", draft, r.err)
				}
			}
			for _, n := range f.Clients {
				for _, kind := range kinds { // in turn: a drift of the machine's speed weighs on each alike
					if err := ctx.Err(); err != nil {
						return err
					}
					row, err := measure(n, kind, round, func(k, r int) []int { return promptIDs(vocab, f.PromptTokens, n, k, r) })
					if err != nil {
						return err
					}
					if len(f.Drafts) > 0 {
						row.Draft = draft
					}
					rep.Rows = append(rep.Rows, row)
				}
			}
		}
	}
	if f.JoinRate != "" {
		rep.JoinRate = f.JoinRate
		last := len(sw.Workers()) - 1
		readWorkers = false // one is away or filling
		for round := 1; round <= max(1, f.Rounds); round++ {
			jr, err := joinRound(ctx, sw, last, m.StoreListen, f.JoinRate, tmp, round, func(phase string) (Result, error) {
				n := f.Clients[0]
				if r := c.complete(ctx, promptIDs(vocab, f.PromptTokens, 0, 0, 0), 2); r.err != nil { // (the main node finds it lost, or sees it back)
					return Result{}, fmt.Errorf("%s: warm-up request: %w", phase, r.err)
				}
				return measure(n, greedy, round, func(k, r int) []int { return promptIDs(vocab, f.PromptTokens, n, k, r) })
			})
			if err != nil {
				sw.PrintLogs(os.Stderr)
				return err
			}
			log.Info().Int("round", round).Float64("away", jr.Away).Float64("filling", jr.Filling).Float64("ratio", jr.Ratio).Bool("fill_running", jr.FillRunning).Msg("a worker joining the serving swarm")
			rep.Joins = append(rep.Joins, jr)
		}
	}
	// the API's requests in a text round send text mode's prompt (its
	// -prompt at its default, made -prompt-tokens long)
	textIDs := mainnode.CycleTokens(tok.Encode(runflags.For(runflags.RoleMain).Prompt, true), f.PromptTokens, tok.BOS())
	// apiRound measures the API at 1 client, after a warm-up request
	apiRound := func() (Result, error) {
		if r := c.complete(ctx, promptIDs(vocab, f.PromptTokens, 0, 0, 0), 2); r.err != nil {
			return Result{}, fmt.Errorf("warm-up request: %w", r.err)
		}
		return measure(1, greedy, 1, func(int, int) []int { return textIDs }) // text mode's prompt: the same routing to load
	}
	// runText runs text mode with the API's main node stopped, then
	// starts it again
	runText := func(round int) (*mainnode.RunStats, error) {
		if err := mainNode.Stop(); err != nil {
			log.Warn().Err(err).Msg("the main node did not exit cleanly")
		}
		mainNode = nil
		text, err := textMode(ctx, sw, f, tmp, round)
		if err != nil {
			return nil, err
		}
		return text, startAPI()
	}
	for r := range f.TextRounds {
		if err := ctx.Err(); err != nil {
			return err
		}
		// odd rounds run text mode first, even rounds the API: a drift
		// of the machine's speed over the rounds favours neither
		var row Result
		var text *mainnode.RunStats
		var err error
		if r%2 == 0 {
			if text, err = runText(r + 1); err == nil {
				row, err = apiRound()
			}
		} else if row, err = apiRound(); err == nil {
			text, err = runText(r + 1)
		}
		if err != nil {
			return err
		}
		if row.Failed > 0 || row.ServerInterToken.Mean <= 0 || text.DecodeTokensPerS <= 0 {
			return fmt.Errorf("text round %d: %d requests failed, inter-token mean %v ms, text mode %v tok/s", r+1, row.Failed, row.ServerInterToken.Mean, text.DecodeTokensPerS)
		}
		tr := TextRound{Round: r + 1, TextFirst: r%2 == 0, APIDecode: 1000 / row.ServerInterToken.Mean, TextDecode: text.DecodeTokensPerS,
			APILoads: row.Workers.Loads, APIMisses: row.Workers.Misses, TextLoads: text.ExpertLoads, TextMisses: text.Misses, APITokens: row.Tokens, TextTokens: text.GeneratedTokens}
		tr.Ratio = tr.APIDecode / tr.TextDecode
		log.Info().Int("round", tr.Round).Float64("api_decode", tr.APIDecode).Float64("text_decode", tr.TextDecode).Float64("ratio", tr.Ratio).Msg("the API against text mode")
		rep.TextRounds = append(rep.TextRounds, tr)
	}
	rep.BytesFrom = bytesMetric
	if err := mainNode.Stop(); err != nil {
		log.Warn().Err(err).Msg("the main node did not exit cleanly")
	}
	mainNode = nil
	return nil
}

// joinRound kills worker w of sw, measures the streams (measure) with it
// away, starts it again on an empty directory under tmp with
// -fetch-from storeAddr at rate, and measures them again while it fills
// its share (kept out of the layout until its share is in).
func joinRound(ctx context.Context, sw *procswarm.Swarm, w int, storeAddr, rate, tmp string, round int, measure func(phase string) (Result, error)) (JoinRound, error) {
	jr := JoinRound{Round: round}
	if err := sw.KillWorker(w); err != nil {
		return jr, err
	}
	away, err := measure("away")
	if err != nil {
		return jr, err
	}
	dir := filepath.Join(tmp, fmt.Sprintf("join-%d", round))
	logName := fmt.Sprintf("w%d-join-%d", w+1, round)
	if err := sw.RestartWorker(w, logName, func(f *runflags.Flags) {
		f.Store, f.FetchFrom, f.FetchRate, f.Log.Level = dir, storeAddr, rate, "info"
	}); err != nil {
		return jr, err
	}
	// the worker listens once it has the store's index; the main node
	// redials it and, at its next pass, tells it its place and keeps it
	// out while it fills
	logPath := filepath.Join(sw.LogDir(), logName+".log")
	deadline := time.Now().Add(time.Minute)
	for {
		if b, _ := os.ReadFile(logPath); bytes.Contains(b, []byte("worker ready")) {
			break
		}
		if time.Now().After(deadline) {
			return jr, fmt.Errorf("join round %d: the worker did not listen within a minute; its log: %s", round, logPath)
		}
		select {
		case <-ctx.Done():
			return jr, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	filling, err := measure("filling")
	if err != nil {
		return jr, err
	}
	b, _ := os.ReadFile(logPath)
	jr.FillRunning = bytes.Contains(b, []byte("worker: filling its share of the store in the background")) && !bytes.Contains(b, []byte("worker: its share of the store filled"))
	jr.Away, jr.Filling = away.DecodeTokensPerS, filling.DecodeTokensPerS
	jr.AwayCPU = [2]float64{away.CPUPerToken.Main, away.CPUPerToken.Workers}
	jr.FillingCPU = [2]float64{filling.CPUPerToken.Main, filling.CPUPerToken.Workers}
	if jr.Away > 0 {
		jr.Ratio = jr.Filling / jr.Away
	}
	if away.Failed > 0 || filling.Failed > 0 {
		return jr, fmt.Errorf("join round %d: %d and %d requests failed", round, away.Failed, filling.Failed)
	}
	return jr, nil
}

// textMode runs text mode on sw (its workers and shadow; the API's main
// node stopped): a main node decoding one prompt of -prompt-tokens to
// -max-tokens tokens, EOS ignored, and returns its -stats.
func textMode(ctx context.Context, sw *procswarm.Swarm, f *Options, tmp string, round int) (*mainnode.RunStats, error) {
	t := sw.MainFlags(f.Swarm.Prefetch, 1, 1)
	t.PromptTokens, t.N, t.IgnoreEOS, t.Log.Level = f.PromptTokens, f.MaxTokens, true, "warn"
	t.Stats = filepath.Join(tmp, fmt.Sprintf("text-%d.json", round))
	n, err := sw.RunNode(ctx, "text", t.Args()...)
	if err != nil {
		return nil, err
	}
	select {
	case <-n.Exited():
	case <-ctx.Done():
		n.Stop()
		return nil, ctx.Err()
	}
	if n.Err() != nil {
		sw.PrintLogs(os.Stderr)
		return nil, fmt.Errorf("text mode, round %d: %w", round, n.Err())
	}
	b, err := os.ReadFile(t.Stats)
	if err != nil {
		return nil, err
	}
	var st mainnode.RunStats
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("text mode's -stats: %w", err)
	}
	return &st, nil
}

// serveFiles finds (or makes) the model, its store and certificates for
// the swarm; certificates and a converted -model's store go under tmp.
func serveFiles(ctx context.Context, f *Options, tmp string, log zerolog.Logger) (inproc.Files, error) {
	files := inproc.Files{Model: f.Model, Store: f.StoreDir, Certs: filepath.Join(tmp, "certs")}
	if f.Model == "" {
		cache := f.Cache
		if cache == "" {
			var err error
			if cache, err = synth.CacheDir(); err != nil {
				return files, err
			}
		}
		update, finish := progress.Reporter("model")
		dir, err := synth.Cached(cache, f.Preset, 1, update)
		finish()
		if err != nil {
			return files, err
		}
		// the store the in-process benchmarks keep (inproc.Cached)
		files.Model, files.Store = dir, filepath.Join(cache, "bench", f.Preset+"-seed1", "store")
	}
	if files.Store == "" {
		files.Store = filepath.Join(tmp, "store")
	}
	if err := testbed.EnsureStore(ctx, files.Model, files.Store, log); err != nil {
		return files, err
	}
	return files, inproc.EnsureCerts(files.Certs, f.Swarm.Workers)
}

// promptIDs is request r of client c in round n: prompt tokens of random
// ids, distinct for every request (so that requests in a batch route as
// unrelated text does).
func promptIDs(vocab, tokens, n, c, r int) []int {
	rng := rand.New(rand.NewPCG(uint64(n)<<32|uint64(c), uint64(r)+1))
	ids := make([]int, tokens)
	for i := range ids {
		ids[i] = 3 + rng.IntN(max(1, vocab-3)) // past the usual special ids
	}
	return ids
}

// Client talks to the API as a plain OpenAI client would.
type Client struct {
	base string
	http *http.Client
}

// NewClient is a client of the API at base (http://HOST:PORT) over h.
func NewClient(base string, h *http.Client) *Client { return &Client{base: base, http: h} }

// Base is the API's address (http://HOST:PORT).
func (c *Client) Base() string { return c.base }

// WaitReady polls /healthz until it answers 200, the main node exits or
// timeout passes.
func (c *Client) WaitReady(ctx context.Context, exited <-chan struct{}, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := "no answer"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/healthz", nil)
		if resp, err := c.http.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s %s", resp.Status, bytes.TrimSpace(b))
		}
		select {
		case <-exited:
			return errors.New("the main node exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("the swarm was not ready after %v (/healthz: %s)", timeout, last)
		case <-tick.C:
		}
	}
}

// metrics reads the main node's /metrics.
func (c *Client) metrics(ctx context.Context) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("/metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parsePromText(resp.Body)
}

// parsePromText sums each metric's samples over their label sets, from
// Prometheus's text exposition format (parsed by expfmt); a histogram's
// buckets are kept apart too, each as name_bucket{le="bound"} (with
// name_sum and name_count), and so are the samples of each phase, as
// name{phase="decode"}.
func parsePromText(r io.Reader) (map[string]float64, error) {
	parser := expfmt.NewTextParser(promodel.LegacyValidation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	out := map[string]float64{}
	add := func(name string, labels []*dto.LabelPair, v float64, byLabels ...string) {
		out[name] += v
		for _, l := range labels {
			if slices.Contains(byLabels, l.GetName()) {
				out[name+"{"+l.GetName()+`="`+l.GetValue()+`"}`] += v
			}
		}
	}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			switch {
			case m.Histogram != nil:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() { // the text has +Inf's too
					out[name+`_bucket{le="`+strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)+`"}`] += float64(b.GetCumulativeCount())
				}
				add(name+"_sum", m.GetLabel(), h.GetSampleSum(), "phase")
				add(name+"_count", m.GetLabel(), float64(h.GetSampleCount()), "phase")
			case m.Counter != nil:
				add(name, m.GetLabel(), m.GetCounter().GetValue(), "phase", "outcome")
			case m.Gauge != nil:
				add(name, m.GetLabel(), m.GetGauge().GetValue(), "phase")
			case m.Untyped != nil: // a bucket written without its TYPE line keeps its le
				byLabels := []string{"phase", "outcome"}
				if strings.HasSuffix(name, "_bucket") {
					byLabels = append(byLabels, "le")
				}
				add(name, m.GetLabel(), m.GetUntyped().GetValue(), byLabels...)
			}
		}
	}
	return out, nil
}

// histogramQuantiles are the median and 99th percentile, in
// milliseconds, of what histogram name (in seconds) observed between two
// reads of the metrics, interpolated linearly within a bucket as
// Prometheus's histogram_quantile does.
func histogramQuantiles(before, after map[string]float64, name string) Quantiles {
	type bucket struct{ le, count float64 }
	var bs []bucket
	prefix := name + `_bucket{le="`
	for k, v := range after {
		if b, ok := strings.CutPrefix(k, prefix); ok {
			le, err := strconv.ParseFloat(strings.TrimSuffix(b, `"}`), 64)
			if err == nil {
				bs = append(bs, bucket{le, v - before[k]})
			}
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	if len(bs) == 0 || bs[len(bs)-1].count <= 0 {
		return Quantiles{}
	}
	total := bs[len(bs)-1].count // the +Inf bucket
	at := func(q float64) float64 {
		rank := q * total
		lower, below := 0.0, 0.0
		for _, b := range bs {
			if b.count >= rank {
				if math.IsInf(b.le, 1) {
					return 1000 * lower // the highest finite bound
				}
				return 1000 * (lower + (b.le-lower)*(rank-below)/max(b.count-below, 1e-12))
			}
			lower, below = b.le, b.count
		}
		return 1000 * lower
	}
	mean := 1000 * (after[name+"_sum"] - before[name+"_sum"]) / total
	return Quantiles{P50: at(0.5), P99: at(0.99), Mean: mean, N: int(total)}
}

// The main node's counters the bytes loaded per token come from (its
// swarm metrics, mainnode/metrics.go), the first it exposes: the bytes of the
// experts loaded for its requests, else their count (times an expert's
// size). Without either, the workers' own counters are read instead.
var (
	expertBytesCounters = []string{metricnames.WorkerLoadBytesTotal}
	expertLoadCounters  = []string{metricnames.ExpertLoadsTotal}
)

// expertBytesLoaded is what the swarm loaded between two reads of its
// metrics, and the metric it comes from; -1 when there is none.
func expertBytesLoaded(before, after map[string]float64, expertBytes int64) (float64, string) {
	for _, m := range expertBytesCounters {
		if v, ok := after[m]; ok {
			return v - before[m], m
		}
	}
	for _, m := range expertLoadCounters {
		if v, ok := after[m]; ok {
			return (v - before[m]) * float64(expertBytes), m + " x expert bytes"
		}
	}
	return -1, ""
}

// workerCounters read the workers' counters (wire.WorkerStats) over
// connections of their own, as a main-role peer named bench.
type workerCounters struct {
	addrs []string
	cfg   *wire.Config
}

// newWorkerCounters issues the bench's certificate from the cluster CA
// in certDir.
func newWorkerCounters(certDir string, addrs []string) (*workerCounters, error) {
	specs, err := wire.ParseNodes("bench=main")
	if err != nil {
		return nil, err
	}
	if _, err := wire.WriteCerts(certDir, specs, wire.CertOptions{}); err != nil {
		return nil, err
	}
	certs, err := wire.LoadCerts(certDir, "bench")
	if err != nil {
		return nil, err
	}
	return &workerCounters{addrs: addrs, cfg: &wire.Config{Certs: certs, Log: zerolog.Nop(), DialAttempts: 3}}, nil
}

// read sums every worker's counters, dialing each for one answer.
func (w *workerCounters) read(ctx context.Context) (wire.WorkerStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var sum wire.WorkerStats
	for _, addr := range w.addrs {
		st, err := w.readOne(ctx, addr)
		if err != nil {
			return sum, fmt.Errorf("reading worker %s's counters: %w", addr, err)
		}
		sum.Loads += st.Loads
		sum.WastedLoads += st.WastedLoads
		sum.Misses += st.Misses
	}
	return sum, nil
}

func (w *workerCounters) readOne(ctx context.Context, addr string) (*wire.WorkerStats, error) {
	p, err := wire.Dial(ctx, addr, w.cfg)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if err := p.Send(ctx, &wire.StatsRequest{}); err != nil {
		return nil, err
	}
	for {
		m, err := p.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if st, ok := m.(*wire.WorkerStats); ok {
			return st, nil
		}
	}
}

// streamResult is one streamed request as its client saw it.
type streamResult struct {
	ttft   time.Duration   // to the first content chunk; 0: none came
	gaps   []time.Duration // between content chunks
	chunks int             // content chunks
	tokens int             // usage.completion_tokens
	err    error
}

// measure runs n clients at once, each sending f.Requests streamed
// requests one after another.
func (c *Client) measure(ctx context.Context, n int, f *Options, request func(k, r int) (path string, body []byte)) (Result, []streamResult) {
	results := make([]streamResult, n*f.Requests)
	cpu0 := testbed.ReadCPU()
	t0 := time.Now()
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			for r := range f.Requests {
				path, body := request(k, r)
				results[k*f.Requests+r] = c.stream(ctx, path, body)
			}
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	row := Result{Clients: n, Requests: len(results), WallS: wall.Seconds(), CPUBusy: testbed.ReadCPU().BusySince(cpu0), LoadAvg: testbed.LoadAvg()}
	var ttft, gaps []float64
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, r := range results {
		if r.err != nil {
			row.Failed++
			continue
		}
		row.Tokens += r.tokens
		row.Chunks += r.chunks
		if r.chunks > 0 {
			ttft = append(ttft, ms(r.ttft))
		}
		for _, g := range r.gaps {
			gaps = append(gaps, ms(g))
		}
	}
	row.TTFT, row.InterToken = quantilesOf(ttft), quantilesOf(gaps)
	row.TokensPerS = float64(row.Tokens) / wall.Seconds()
	return row, results
}

// streamChunk is the part of a streamed completion chunk the client
// reads.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"` // a completion's
		Delta struct {
			Content string `json:"content"` // a chat completion's
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// complete sends one streamed, greedy completion of prompt (token ids)
// for exactly maxTokens tokens and times its chunks.
func (c *Client) complete(ctx context.Context, prompt []int, maxTokens int) streamResult {
	path, body := greedy.request(prompt, nil, maxTokens, 0)
	return c.stream(ctx, path, body)
}

// stream sends one streamed request (body, to path) and times its
// content chunks.
func (c *Client) stream(ctx context.Context, path string, body []byte) streamResult {
	var res streamResult
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		res.err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		res.err = err
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		res.err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
		return res
	}
	var last time.Time
	usage, done := false, false
	br := bufio.NewReader(resp.Body)
	for !done {
		line, err := br.ReadBytes('\n')
		now := time.Now()
		if err != nil {
			res.err = fmt.Errorf("the stream ended before [DONE]: %w", err)
			return res
		}
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
		if !ok {
			continue // blank separators, comments, other fields
		}
		if string(data) == "[DONE]" {
			done = true
			continue
		}
		var ch streamChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			res.err = fmt.Errorf("chunk %q: %w", data, err)
			return res
		}
		switch {
		case ch.Error != nil:
			res.err = fmt.Errorf("server error in the stream: %s", ch.Error.Message)
			return res
		case ch.Usage != nil:
			res.tokens, usage = ch.Usage.CompletionTokens, true
		}
		if len(ch.Choices) == 0 || ch.Choices[0].Text == "" && ch.Choices[0].Delta.Content == "" {
			continue
		}
		res.chunks++
		if last.IsZero() {
			res.ttft = now.Sub(sent)
		} else {
			res.gaps = append(res.gaps, now.Sub(last))
		}
		last = now
	}
	if !usage {
		res.err = errors.New("the stream had no usage chunk (stream_options.include_usage)")
	}
	return res
}

// WriteMarkdown writes the report: where it ran and one row per
// client count.
func WriteMarkdown(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "# odmoe serving benchmark\n\n")
	fmt.Fprintf(w, "- date: %s\n- machine: %s; load average before %s, after %s\n", rep.Date, rep.Machine, rep.LoadBefore, rep.LoadAfter)
	model := rep.Model
	if rep.Preset != "" {
		model = fmt.Sprintf("%s preset (%s)", rep.Preset, rep.Model)
	}
	swarm := fmt.Sprintf("%d workers, -prefetch %s", rep.Workers, rep.Prefetch)
	if rep.Quant != "" {
		swarm += ", " + rep.Quant + " shadow"
	}
	if rep.Residency == "on" {
		swarm += ", -residency on"
	}
	fmt.Fprintf(w, "- model: %s\n- swarm: %s, every node a process on loopback QUIC with mutual TLS; main node -max-batch %d\n", model, swarm, rep.MaxBatch)
	if len(rep.NodeCPUs) > 0 {
		fmt.Fprintf(w, "- CPUs: the nodes on %s, the clients (this process) on %s\n", strings.Join(rep.NodeCPUs, " and "), rep.ClientCPUs)
	}
	how := "greedy, ignore_eos) via /v1/completions"
	if len(rep.Kinds) > 0 && !slices.Equal(rep.Kinds, []string{"greedy"}) {
		how = fmt.Sprintf("ignore_eos but json's) as each row's kind of request says (%s, seeds from %d)", strings.Join(rep.Kinds, ", "), rep.Seed)
	}
	fmt.Fprintf(w, "- load: N streaming clients at once, each sending %d requests one after another: %d random prompt token ids, %d tokens generated (%s\n",
		rep.Requests, rep.PromptTokens, rep.MaxTokens, how)
	fmt.Fprintf(w, "- command: `%s`\n\n", rep.Command)
	first := 1
	if len(rep.Rows) > 0 {
		first = rep.Rows[0].Clients
	}
	fmt.Fprintf(w, "| kind, round | clients | requests | tokens | tok/s | vs %d client(s) | TTFT p50 / p99 ms | inter-chunk p50 / p99 ms | chunks / token | node TTFT p50 / p99 ms | node inter-token p50 / p99 ms | expert bytes / token | expert loads missed | shadow recall | experts a decode layer | decode layer: main, experts ms | CPU busy | CPU ms / token: main, shadow, workers, clients | load 1 min |\n", first)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rep.Rows {
		perTok := "–"
		if r.BytesPerToken >= 0 {
			perTok = progress.Bytes(int64(r.BytesPerToken))
		}
		req := strconv.Itoa(r.Requests)
		if r.Failed > 0 {
			req += fmt.Sprintf(" (%d failed)", r.Failed)
		}
		load, _, _ := strings.Cut(r.LoadAvg, " ")
		c, l := r.CPUPerToken, r.DecodeLayer
		missed := "–"
		if r.Workers.Loads > 0 {
			missed = fmt.Sprintf("%.1f%% (%d of %d)", 100*float64(r.Workers.Misses)/float64(r.Workers.Loads), r.Workers.Misses, r.Workers.Loads)
		}
		recall := "–"
		if r.ShadowRecall >= 0 {
			recall = fmt.Sprintf("%.1f%%", 100*r.ShadowRecall)
		}
		fmt.Fprintf(w, "| %s, %d | %d | %s | %d | %.2f | %.2fx | %s | %s | %.2f | %s | %s | %s | %s | %s | %.2f | %.2f, %.2f | %.0f%% | %.1f, %.1f, %.1f, %.1f | %s |\n",
			r.Kind, r.Round, r.Clients, req, r.Tokens, r.TokensPerS, r.Speedup, r.TTFT, r.InterToken, float64(r.Chunks)/float64(max(1, r.Tokens)),
			r.ServerTTFT, r.ServerInterToken, perTok, missed, recall, l.Experts, l.MainMs, l.ExpertsMs, 100*r.CPUBusy, c.Main, c.Shadow, c.Workers, c.Client, load)
	}
	fmt.Fprintf(w, "\nTokens: the responses' usage.completion_tokens; tok/s: all clients' tokens over the row's wall time. TTFT: from sending a request to its first content chunk (its prompt's prefill included, and any wait for a place in the batch); inter-chunk: between consecutive content chunks of one request. A chunk carries the text of one token or more, or none (a token whose text is empty or not a whole character yet waits for the next): with fewer chunks than tokens, the node's own figures per generated token (from its /metrics histograms, interpolated within their buckets as histogram_quantile does) say more. Expert bytes per generated token: the swarm's expert loads during the row (prompts' prefill included) over its tokens, from %s; one expert is %s (3 BF16 matrices of hidden x intermediate). Expert loads missed: the workers' requests whose expert was neither loaded nor loading when it arrived (loaded on demand, the layer waiting), over every expert load they made (prefill included). Shadow recall: the experts the decode passes activated that the shadow had predicted, over all they activated (OD-MoE eq. 3, from odmoe_shadow_predicted_experts_total and odmoe_shadow_routed_experts_total). Experts a decode layer: the experts a decode pass's rows activated in one layer (their union), from odmoe_layer_expert_results_total over odmoe_layer_passes_total{phase=\"decode\"}; decode layer main and experts ms: the main node's compute before a layer's experts and the time from sending its activations to its last result, a decode layer pass. CPU ms per token: the CPU time (user and system) the main node, the shadow, all workers and this benchmark's own clients used during the row, over its tokens.\n",
		rep.BytesFrom, progress.Bytes(rep.ExpertBytes))
	writeKinds(w, rep)
	writeDrafts(w, rep)
	writeJoins(w, rep)
	if len(rep.TextRounds) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## The API against text mode on the same swarm\n\n")
	fmt.Fprintln(w, "| round | API decode tok/s | text mode decode tok/s | API / text | API loads missed | text mode loads missed |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
	var api, text float64
	for _, r := range rep.TextRounds {
		fmt.Fprintf(w, "| %d | %.1f | %.1f | %.3f | %d of %d | %d of %d |\n", r.Round, r.APIDecode, r.TextDecode, r.Ratio, r.APIMisses, r.APILoads, r.TextMisses, r.TextLoads)
		api, text = api+r.APIDecode, text+r.TextDecode
	}
	fmt.Fprintf(w, "\nOver the %d rounds: API %.1f, text mode %.1f decode tok/s on average, %.3f. Each round runs text mode (`odmoe run -role main`, a prompt of %d tokens, %d generated, EOS ignored) on the same workers and shadow, the API's main node stopped meanwhile, and measures the API at 1 client, odd rounds text mode first, even rounds the API (%d requests of %d tokens, each with text mode's prompt): the API's decode tokens/s is 1000 over its node's mean inter-token time (odmoe_inter_token_latency_seconds' sum over its count), text mode's its -stats decode_tokens_per_s.\n",
		len(rep.TextRounds), api/float64(len(rep.TextRounds)), text/float64(len(rep.TextRounds)), api/text, rep.PromptTokens, rep.MaxTokens, rep.Requests, rep.MaxTokens)
}

// writeJoins gives -join-rate's rounds: the streams' decode with the
// last worker away against while it fills its share again.
func writeJoins(w io.Writer, rep *Report) {
	if len(rep.Joins) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## A worker joining the serving swarm, filling its share at %s\n\n", rep.JoinRate)
	fmt.Fprintln(w, "| round | decode tok/s, worker away | decode tok/s, worker filling | filling / away | fill still running at the end | CPU ms/token main, workers: away | filling |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---|---|---|")
	var ratios []float64
	for _, j := range rep.Joins {
		fmt.Fprintf(w, "| %d | %.2f | %.2f | %.3f | %v | %.1f, %.1f | %.1f, %.1f |\n", j.Round, j.Away, j.Filling, j.Ratio, j.FillRunning, j.AwayCPU[0], j.AwayCPU[1], j.FillingCPU[0], j.FillingCPU[1])
		ratios = append(ratios, j.Ratio)
	}
	slices.Sort(ratios)
	fmt.Fprintf(w, "\nMedian filling / away: **%.3f** over %d rounds. Each round kills the last worker (SIGKILL), measures the streams (%d requests a client of %d tokens; decode tok/s is 1000 over the main node's mean inter-token time), starts the worker again on an empty directory with -fetch-from the main node's -store-listen and -fetch-rate %s (the main node keeps it out of the layout until its share is in), and measures them again while it fills.\n",
		ratios[(len(ratios)-1)/2], len(ratios), rep.Requests, rep.MaxTokens, rep.JoinRate)
}

// String formats q as "p50 / p99" milliseconds ("–" when empty).
func (q Quantiles) String() string {
	if q.N == 0 {
		return "–"
	}
	f := func(v float64) string {
		if v < 10 {
			return strconv.FormatFloat(v, 'f', 1, 64)
		}
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return f(q.P50) + " / " + f(q.P99)
}

// WriteReport writes report.json and report.md into dir.
func WriteReport(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var md bytes.Buffer
	WriteMarkdown(&md, rep)
	return os.WriteFile(filepath.Join(dir, "report.md"), md.Bytes(), 0o644)
}
