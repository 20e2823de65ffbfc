package mainnode

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// RunStats is what -stats writes: the run's figures for scripts.
type RunStats struct {
	PromptTokens      int     `json:"prompt_tokens"`
	GeneratedTokens   int     `json:"generated_tokens"`
	FinishReason      string  `json:"finish_reason"` // stop (EOS) or length (-n, or the context full)
	TTFTms            float64 `json:"ttft_ms"`
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	DecodeTokensPerS  float64 `json:"decode_tokens_per_s"`
	OutputTokensPerS  float64 `json:"output_tokens_per_s"`
	ExpertLoads       int64   `json:"expert_loads"`
	Misses            int64   `json:"misses"`
	// MissesLate and MissesWrong split the shadow-driven decode's misses:
	// predicted too late, or not predicted.
	MissesLate  int64 `json:"misses_late"`
	MissesWrong int64 `json:"misses_wrong"`
	// StallFraction is decode time spent waiting for expert loads (the
	// slowest request of each layer) over decode wall time.
	StallFraction float64             `json:"stall_fraction"`
	PeakMemory    map[string]int64    `json:"peak_memory_bytes"` // per role: main/local RSS, worker device memory
	Workers       []*wire.WorkerStats `json:"workers,omitempty"`
	DecodeLayers  []LayerStatsJSON    `json:"decode_layers,omitempty"`
	PrefillLayers []LayerStatsJSON    `json:"prefill_layers,omitempty"`
	// Passes are summed over each forward pass's layers; "layer"
	// holds the pass (1 = the prompt).
	Passes []LayerStatsJSON `json:"iterations,omitempty"`
	// Recall is OD-MoE eq. (3) over the run, RecallByToken eq. (2) per
	// output token; LateDepartureMs is the shadow's alignment delay per
	// decode pass. Absent without a shadow.
	Recall          *float64  `json:"recall,omitempty"`
	RecallByToken   []float64 `json:"recall_by_token,omitempty"`
	LateDepartureMs []float64 `json:"late_departure_ms,omitempty"`
	// Align is the alignment used: the fixed periods (-align-token,
	// -align-kv), or those -align-adaptive ran the most decode steps
	// under. Absent without a shadow.
	Align string `json:"align,omitempty"`
	// Faults are what lost nodes cost: absent in local mode.
	Faults *FaultsJSON `json:"faults,omitempty"`
	// Residency is what -residency on did: absent with it off.
	Residency *ResidencyJSON `json:"residency,omitempty"`
	// LeadMs is the distribution of how long before its request each
	// decode load made on a prediction had its prediction: absent when
	// none was.
	LeadMs *LeadJSON `json:"prediction_lead_ms,omitempty"`
	// Ahead is what the shadow's running ahead did: absent without a
	// shadow.
	Ahead *AheadJSON `json:"shadow_ahead,omitempty"`
	// TierBytes are the expert bytes the workers hold at the end, summed,
	// per tier: device_resident (decompressed, left resident),
	// host_decompressed (-host-cache), host_compressed (-host-compressed).
	TierBytes map[string]int64 `json:"tier_bytes,omitempty"`
	// DecodeCPU is the CPU time each role used over decode, in seconds:
	// from the first token to the last, without start-up, prefill and
	// the figures' collection (main or local; stages, all together, as
	// their rows said; workers, all together; shadow, its stages too). A
	// role whose processes did not say is absent.
	DecodeCPU map[string]float64 `json:"decode_cpu_s,omitempty"`
	// Drafting is what checking the shadow's guesses did (-draft):
	// absent when no pass checked one.
	Drafting *DraftingJSON `json:"drafting,omitempty"`
	// DecodePassMs is the spread of the decode passes' times (each from
	// the pass before to its token): absent without a decode pass.
	DecodePassMs *model.PassSpread `json:"decode_pass_ms,omitempty"`
}

// DraftingJSON are a run's drafting figures: the guesses its decode
// passes checked and kept, its decode passes, and the tokens a decode
// pass gave ((passes + kept) / passes).
type DraftingJSON struct {
	Guesses       int     `json:"guesses"`
	Accepted      int     `json:"accepted"`
	DecodePasses  int     `json:"decode_passes"`
	TokensPerPass float64 `json:"tokens_per_pass"`
}

// LeadJSON is a distribution of prediction leads, in milliseconds.
type LeadJSON struct {
	Samples int     `json:"samples"`
	P5      float64 `json:"p5"`
	P50     float64 `json:"p50"`
	P95     float64 `json:"p95"`
}

// AheadJSON is what the shadow's running ahead of its alignments did
// (ShadowStats), and what its withdrawn predictions cost the workers.
type AheadJSON struct {
	Passes  int64 `json:"iterations"` // decode passes run ahead, on the shadow's own tokens
	Agreed  int64 `json:"agreed"`     // members' rows run ahead that their alignment met
	Rewound int64 `json:"rewound"`    // members' rows run ahead on another token: rewound
	// TokenAgreement is Agreed over Agreed+Rewound (0 when none).
	TokenAgreement float64 `json:"token_agreement"`
	// ByKind are the rows met and rewound by the kind of request
	// (greedy, sampled, constrained): a sampled or constrained request's
	// guesses are drawn as the main node draws.
	ByKind               map[string]GuessCounts `json:"by_kind,omitempty"`
	WithdrawnPredictions int64                  `json:"withdrawn_predictions"` // layers' predictions taken back from the main node
	OffPath              int64                  `json:"off_path_predictions"`  // dropped by the main node before their withdrawal came
	WithdrawnLoads       int64                  `json:"withdrawn_loads"`       // worker loads dropped unused
	WithdrawnBytes       int64                  `json:"withdrawn_bytes"`
	// Unhinted is the layers the shadow predicted after the main node had
	// started a later pass (it had fallen behind): no loads hinted.
	Unhinted int64 `json:"unhinted_layers"`
}

// ResidencyJSON is what residency did over a run: the main node's
// placement decisions and, summed over the workers, what their resident
// experts served.
type ResidencyJSON struct {
	Rebalances       int64  `json:"rebalances"`
	Migrations       int64  `json:"migrations"`
	PlacementVersion uint64 `json:"placement_version"`
	ResidentHits     int64  `json:"resident_hits"`    // requests served with no load
	ResidentEvicted  int64  `json:"resident_evicted"` // resident experts evicted for room
	ResidentExperts  int64  `json:"resident_experts"` // resident at the end
	ResidentBytes    int64  `json:"resident_bytes"`
}

// FaultsJSON are FaultStats for scripts.
type FaultsJSON struct {
	WorkersLost      int64 `json:"workers_lost"`
	Rejoins          int64 `json:"rejoins"`
	Resent           int64 `json:"resent_requests"`
	ShadowLost       int64 `json:"shadow_lost"`
	ShadowReattached int64 `json:"shadow_reattached"`
	ReactivePasses   int64 `json:"reactive_iterations"`
	LoadFailures     int64 `json:"load_failures"`
	StagesLost       int64 `json:"stages_lost"`
	Refills          int64 `json:"refills"`
}

// LayerStatsJSON is one layer's sums, in milliseconds.
type LayerStatsJSON struct {
	Layer     int     `json:"layer"`
	Calls     int64   `json:"calls"`
	MainMs    float64 `json:"main_ms"`
	ExpertsMs float64 `json:"experts_ms"`
	WorkerMs  float64 `json:"worker_ms"`
	NetworkMs float64 `json:"network_ms"`
	StallMs   float64 `json:"stall_ms"`
	LoadMs    float64 `json:"load_ms"`
	Loads     int64   `json:"loads"`
	Misses    int64   `json:"misses"`
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func layersJSON(ls []LayerStats) []LayerStatsJSON {
	out := make([]LayerStatsJSON, len(ls))
	for i, l := range ls {
		out[i] = LayerStatsJSON{Layer: i, Calls: l.Calls, MainMs: ms(l.Main), ExpertsMs: ms(l.Experts), WorkerMs: ms(l.Worker),
			NetworkMs: ms(l.Network), StallMs: ms(l.Stall), LoadMs: ms(l.Load), Loads: l.Loads, Misses: l.Misses}
	}
	return out
}

// runStats builds the figures of a run; sw is nil in local mode.
func runStats(st model.GenerateStats, sw *Stats) RunStats {
	rs := RunStats{
		PromptTokens: st.PromptTokens, GeneratedTokens: st.GeneratedTokens, FinishReason: st.FinishReason,
		TTFTms: ms(st.Prefill), PrefillTokensPerS: st.PrefillTokensPerSec(), DecodeTokensPerS: st.DecodeTokensPerSec(),
		PeakMemory: map[string]int64{}, DecodePassMs: model.SpreadOf(st.PassTimes),
	}
	if total := st.Prefill + st.Decode; total > 0 {
		rs.OutputTokensPerS = float64(st.GeneratedTokens) / total.Seconds()
	}
	if st.Drafted > 0 {
		d := &DraftingJSON{Guesses: st.Drafted, Accepted: st.Accepted, DecodePasses: max(st.GeneratedTokens-1-st.Accepted, 0)}
		if d.DecodePasses > 0 {
			d.TokensPerPass = float64(d.DecodePasses+d.Accepted) / float64(d.DecodePasses)
		}
		rs.Drafting = d
	}
	if sw == nil {
		rs.PeakMemory["local"] = procmem.PeakRSS()
		return rs
	}
	rs.PeakMemory["main"] = procmem.PeakRSS()
	dec, pre := Total(sw.Decode), Total(sw.Prefill)
	rs.ExpertLoads = dec.Loads + pre.Loads
	rs.Misses = dec.Misses + pre.Misses
	rs.MissesLate, rs.MissesWrong = dec.MissesLate, dec.MissesWrong
	if st.Decode > 0 {
		rs.StallFraction = dec.Stall.Seconds() / st.Decode.Seconds()
	}
	rs.DecodeLayers, rs.PrefillLayers = layersJSON(sw.Decode), layersJSON(sw.Prefill)
	rs.Passes = layersJSON(sw.Passes)
	f := sw.Faults
	rs.Faults = &FaultsJSON{WorkersLost: f.WorkersLost, Rejoins: f.Rejoins, Resent: f.Resent, ShadowLost: f.ShadowLost,
		ShadowReattached: f.ShadowReattached, ReactivePasses: f.ReactivePasses, LoadFailures: f.LoadFailures, StagesLost: f.StagesLost, Refills: f.Refills}
	for i := range rs.Passes {
		rs.Passes[i].Layer = i + 1
	}
	if len(sw.Leads) > 0 {
		p5, p50, p95 := sw.LeadPercentiles()
		rs.LeadMs = &LeadJSON{Samples: len(sw.Leads), P5: ms(p5), P50: ms(p50), P95: ms(p95)}
	}
	if r := sw.Residency; r != nil {
		rs.Residency = &ResidencyJSON{Rebalances: r.Rebalances, Migrations: r.Migrations, PlacementVersion: r.Version}
	}
	return rs
}

// addWorkers records the workers' counters and their peak device memory.
func (rs *RunStats) addWorkers(ws []*wire.WorkerStats) {
	rs.Workers = ws
	for _, w := range ws {
		if w != nil && w.ResidentBytes+w.HostCacheBytes+w.HostCompressedBytes > 0 {
			if rs.TierBytes == nil {
				rs.TierBytes = map[string]int64{}
			}
			rs.TierBytes["device_resident"] += w.ResidentBytes
			rs.TierBytes["host_decompressed"] += w.HostCacheBytes
			rs.TierBytes["host_compressed"] += w.HostCompressedBytes
		}
		if w != nil && rs.Residency != nil {
			r := rs.Residency
			r.ResidentHits, r.ResidentEvicted = r.ResidentHits+w.ResidentHits, r.ResidentEvicted+w.ResidentEvicted
			r.ResidentExperts, r.ResidentBytes = r.ResidentExperts+w.ResidentExperts, r.ResidentBytes+w.ResidentBytes
		}
		if w != nil {
			rs.PeakMemory["worker_device"] = max(rs.PeakMemory["worker_device"], w.DevicePeak)
			rs.PeakMemory["worker_rss"] = max(rs.PeakMemory["worker_rss"], w.RSSPeak)
		}
	}
}

// addDecodeCPU records what each role's CPU cost over decode: the main
// node's own, its stages', the workers' since their figures at decode's
// start (those recorded last, by addWorkers, are at its end), and the
// shadow's (its stages' too).
func (rs *RunStats) addDecodeCPU(main, stages time.Duration, workersAtStart []*wire.WorkerStats, shadow time.Duration) {
	cpu := map[string]float64{}
	if main > 0 {
		cpu["main"] = main.Seconds()
	}
	if stages > 0 {
		cpu["stages"] = stages.Seconds()
	}
	var workers time.Duration
	heard := len(workersAtStart) > 0 && len(workersAtStart) == len(rs.Workers)
	for i := range workersAtStart {
		if !heard {
			break
		}
		a, b := workersAtStart[i], rs.Workers[i]
		if a == nil || b == nil || a.CPU <= 0 || b.CPU < a.CPU {
			heard = false
			break
		}
		workers += b.CPU - a.CPU
	}
	if heard {
		cpu["workers"] = workers.Seconds()
	}
	if shadow > 0 {
		cpu["shadow"] = shadow.Seconds()
	}
	if len(cpu) > 0 {
		rs.DecodeCPU = cpu
	}
}

// addShadow records the shadow's recall, late departures and running
// ahead (after addWorkers: the workers' withdrawn loads count in it).
func (rs *RunStats) addShadow(sh ShadowStats) {
	rs.Recall = &sh.Recall
	if sh.PeakRSS > 0 {
		rs.PeakMemory["shadow"] = sh.PeakRSS
	}
	rs.RecallByToken = sh.RecallByToken
	rs.LateDepartureMs = sh.LateDepartureMs
	rs.Align = sh.Align.String()
	a := &AheadJSON{Passes: sh.Ahead, Agreed: sh.Agreed, Rewound: sh.Rewound, WithdrawnPredictions: sh.Withdrawn, OffPath: sh.OffPath, Unhinted: sh.Unhinted, ByKind: sh.Guesses}
	if n := sh.Agreed + sh.Rewound; n > 0 {
		a.TokenAgreement = float64(sh.Agreed) / float64(n)
	}
	for _, w := range rs.Workers { // recorded first (addWorkers)
		if w != nil {
			a.WithdrawnLoads, a.WithdrawnBytes = a.WithdrawnLoads+w.WithdrawnLoads, a.WithdrawnBytes+w.WithdrawnBytes
		}
	}
	rs.Ahead = a
}

func writeStats(path string, rs RunStats) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// printSwarmSummary prints what a person wants to see after a swarm run.
func printSwarmSummary(w io.Writer, rs RunStats, sw *Stats) {
	dec := Total(sw.Decode)
	fmt.Fprintf(w, "swarm: TTFT %.1f ms, decode %.2f tok/s, output %.2f tok/s; expert loads %d, misses %d, stall %.1f%% of decode\n",
		rs.TTFTms, rs.DecodeTokensPerS, rs.OutputTokensPerS, rs.ExpertLoads, rs.Misses, 100*rs.StallFraction)
	fmt.Fprintln(w, "  (a miss: an expert that was not loaded, nor loading, when its activation reached the worker, so it was loaded then; stall: decode time spent waiting for loads)")
	var loads, wasted, late int64
	for _, ws := range rs.Workers {
		if ws != nil {
			loads, wasted, late = loads+ws.Loads, wasted+ws.WastedLoads, late+ws.LatePredictions
		}
	}
	if loads > 0 {
		fmt.Fprintf(w, "  workers loaded %d experts in all: the %d above were used by requests; %d were loaded on a prediction and evicted unused; %d predictions reached a worker after their layer had run (counters of a worker that restarted start again)\n",
			loads, rs.ExpertLoads, wasted, late)
	}
	if dec.Calls > 0 {
		per := func(d time.Duration) float64 { return ms(d) / float64(dec.Calls) }
		fmt.Fprintf(w, "per decode layer: main %.2f ms, experts %.2f ms (worker %.2f, network %.2f, stall %.2f), load %.2f ms\n",
			per(dec.Main), per(dec.Experts), per(dec.Worker), per(dec.Network), per(dec.Stall), per(dec.Load))
	}
	if rs.Recall != nil {
		var late float64
		for _, l := range rs.LateDepartureMs {
			late += l
		}
		if n := len(rs.LateDepartureMs); n > 0 {
			late /= float64(n)
		}
		fmt.Fprintf(w, "shadow: recall %.2f%% (eq. 3) over %d tokens, aligned %s, late departure %.2f ms per pass; decode misses: %d late (predicted, but the prediction or hint came after the activation), %d wrong (not predicted)\n",
			100**rs.Recall, len(rs.RecallByToken), rs.Align, late, rs.MissesLate, rs.MissesWrong)
	}
	if a := rs.Ahead; a != nil && a.Passes > 0 {
		fmt.Fprintf(w, "shadow ran ahead: %d decode passes on its own tokens; token agreement %.2f%% (%d members' rows met, %d rewound); %d predictions withdrawn (%d dropped here first), %d loads withdrawn on the workers (%s, %.1f KiB per token)\n",
			a.Passes, 100*a.TokenAgreement, a.Agreed, a.Rewound, a.WithdrawnPredictions, a.OffPath, a.WithdrawnLoads, progress.Bytes(a.WithdrawnBytes),
			float64(a.WithdrawnBytes)/1024/float64(max(rs.GeneratedTokens, 1)))
	}
	if a := rs.Ahead; a != nil && a.Unhinted > 0 {
		fmt.Fprintf(w, "shadow fell behind: %d layers predicted after this node had finished their pass; their loads were not hinted\n", a.Unhinted)
	}
	if l := rs.LeadMs; l != nil {
		load := 0.0
		if dec.Loads > 0 {
			load = ms(dec.Load) / float64(dec.Loads)
		}
		fmt.Fprintf(w, "prediction lead over %d decode loads made on a prediction: p5 %.2f, p50 %.2f, p95 %.2f ms, against %.2f ms a load (a load hides when its lead covers it)\n",
			l.Samples, l.P5, l.P50, l.P95, load)
	}
	if r := rs.Residency; r != nil {
		fmt.Fprintf(w, "residency: %d requests served by resident experts (no load), %d resident experts evicted for room, %d resident at the end (%s); placement: %d rebalances, %d experts migrated\n",
			r.ResidentHits, r.ResidentEvicted, r.ResidentExperts, progress.Bytes(r.ResidentBytes), r.Rebalances, r.Migrations)
	}
	if t := rs.TierBytes; t != nil {
		fmt.Fprintf(w, "expert bytes held by the workers: device (resident) %s, host decompressed %s, host compressed %s\n",
			progress.Bytes(t["device_resident"]), progress.Bytes(t["host_decompressed"]), progress.Bytes(t["host_compressed"]))
	}
	if f := sw.Faults; f != (FaultStats{}) {
		fmt.Fprintf(w, "faults: %d worker(s) lost, %d rejoined, %d request(s) re-sent; shadow lost %d time(s), re-attached %d, %d decode pass(s) reactive without it",
			f.WorkersLost, f.Rejoins, f.Resent, f.ShadowLost, f.ShadowReattached, f.ReactivePasses)
		if f.StagesLost > 0 {
			fmt.Fprintf(w, "; %d stage(s) lost, %d sequence(s) run again from their first token", f.StagesLost, f.Refills)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "peak memory: main %s RSS, worker device %s (RSS %s)",
		progress.Bytes(rs.PeakMemory["main"]), progress.Bytes(rs.PeakMemory["worker_device"]), progress.Bytes(rs.PeakMemory["worker_rss"]))
	if sh, ok := rs.PeakMemory["shadow"]; ok {
		fmt.Fprintf(w, ", shadow %s RSS", progress.Bytes(sh))
	}
	fmt.Fprintln(w)
}
