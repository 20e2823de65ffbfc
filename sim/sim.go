// Package sim is a model of the swarm's decode at the level of
// docs/DESIGN.md's timeline, for rigs and scales that cannot be run here
// (issue 18): the main node's layers, the k expert activations of each
// layer sent to the workers of its group, each worker's expert loads (one
// link, one load at a time) and expert compute, the network hops, and the
// shadow node's passes and predictions, departing late (on the main
// node's alignment) or running ahead of it, and the stages either may be
// split into by layer range (each called in turn by the main node, or by
// the shadow's first stage, over its link and back; each stage's layers'
// traffic on its own link). Each node has
// its own CPU and link: what a real rig has and the emulated one on two
// shared cores does not. It is deterministic for a seed.
//
// A Profile's costs come from published figures (testbed/profiles) or are
// fitted to a measured bench rig run (Calibrate).
package sim

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/odmoe/odmoe/sched"
)

// Profile is what a rig's parts cost, in milliseconds and bytes per
// second.
type Profile struct {
	Name    string   `json:"name"`
	Sources []string `json:"sources,omitempty"` // where each figure comes from
	// MainLayerMs is the main node's part of a decode layer before its
	// experts (norm, attention, router); MainTokenMs the rest of a token
	// (embedding, final norm, output head, sampling).
	MainLayerMs float64 `json:"main_layer_ms"`
	MainTokenMs float64 `json:"main_token_ms"`
	// MainPositionMs is what one more cached position adds to the main
	// node's layer (its attention reads the position's keys and values);
	// ShadowPositionMs the same on the shadow. A decode layer at
	// position n costs MainLayerMs + n * MainPositionMs.
	MainPositionMs   float64 `json:"main_position_ms,omitempty"`
	ShadowPositionMs float64 `json:"shadow_position_ms,omitempty"`
	// ShadowLayerMs is the shadow's whole decode layer (its experts run
	// in place); ShadowTokenMs its output head, when it samples its own
	// token to run ahead.
	ShadowLayerMs float64 `json:"shadow_layer_ms"`
	ShadowTokenMs float64 `json:"shadow_token_ms"`
	// ExpertMs is one expert on one token on a worker; LoadMs and
	// LoadBytesPerS make an expert load (LoadMs + bytes / LoadBytesPerS),
	// or LoadMs and a worker's own link (Options.LoadRates): LoadMs is
	// then what a load costs beyond crossing the link (reading the
	// store, decompressing).
	ExpertMs      float64 `json:"expert_ms"`
	LoadMs        float64 `json:"load_ms"`
	LoadBytesPerS float64 `json:"load_bytes_per_s"`
	// WorkerLinks says LoadMs is a load's cost beyond its worker's own
	// link (WithLinks): the rig's links (Options.LoadRates) are to be
	// given with it.
	WorkerLinks bool `json:"worker_links,omitempty"`
	// HopMs is one message's latency; LinkBytesPerS its links' rate.
	HopMs         float64 `json:"hop_ms"`
	LinkBytesPerS float64 `json:"link_bytes_per_s"`
	// LoadingHopMs, when not 0, is a message's latency in a shadow-driven
	// swarm: on the emulated rig, whose nodes share cores, the shadow's
	// pass and the loads it starts ahead keep the cores busy and a message
	// waits for its node to be scheduled (a reactive swarm's loads run
	// while the main node waits for them: its messages take HopMs, as
	// measured: 1.2-1.5 ms a round trip against the resident's 1.0 and the
	// shadow-driven swarm's 7.6-9.0 on the heterogeneous rig). A rig whose
	// nodes have their own cores leaves it 0: HopMs.
	LoadingHopMs float64 `json:"loading_hop_ms,omitempty"`
	// Prefill: what each prompt token after the first adds to the main
	// node's part of a layer, and to an expert's batch on a worker (the
	// first costs what a decode token does, MainLayerMs and ExpertMs:
	// reading the weights, which the batch's other tokens share).
	MainPrefillTokenMs   float64 `json:"main_prefill_token_ms"`
	ExpertPrefillTokenMs float64 `json:"expert_prefill_token_ms"`
	// MainPrefillLayerMs and ExpertPrefillMs, when not 0, are what a
	// prompt's first token costs instead (0: a decode token's,
	// MainLayerMs and ExpertMs): a prompt's batch runs other kernels than
	// a decode token (tiles that widen the weights once for every row,
	// scratch for every row), whose fixed cost is its own. SplitPrefill
	// sets them; calibrating from two prompt lengths, PrefillLines reads
	// them off the resident runs and FitPrefillCPU lowers
	// ExpertPrefillMs where the shorter prompt took less than it gives.
	MainPrefillLayerMs float64 `json:"main_prefill_layer_ms,omitempty"`
	ExpertPrefillMs    float64 `json:"expert_prefill_ms,omitempty"`
	// PrefillMessageMs is what each of a prompt layer's messages (an
	// activation a worker, a result an expert) holds the main node's link
	// (its way) beyond its bytes: sending it, one after another (on the
	// emulated rig, whose nodes share cores, the layer's messages wait for
	// the main node's turn on them). Calibrate fits it to the calibration
	// run's time to first token (on shared cores, to the shorter prompt's,
	// never below nothing: FitPrefillCPU). Fitted with PrefillBytesPerS it
	// may be negative: a line through a message's cost at two sizes, which
	// grows faster than its bytes (QUIC's window opening over a larger
	// message), meets 0 above no bytes; a message never costs less than
	// nothing.
	PrefillMessageMs float64 `json:"prefill_message_ms,omitempty"`
	// PrefillBytesPerS, when not 0, is the rate a prompt's activations
	// and results move at over the main node's link, each way, instead of
	// LinkBytesPerS: a prompt layer's messages are as large as their
	// tokens, and on the emulated rigs they moved far below the link's
	// rate: 9.7 MB/s on paper.rig's 1 Gbit/s, 45-59 MB/s on loopback
	// (not measured why: QUIC's window opening over a larger message and
	// every node's packets through two shared cores are the likely parts).
	// Calibrate fits it, with PrefillMessageMs, to resident runs' times
	// to first token at two prompt lengths (FitPrefillMessages) where the
	// nodes have cores of their own; on shared cores that slowness is the
	// cores' (PrefillCPUByteNs) and the messages move at the link's rate.
	PrefillBytesPerS float64 `json:"prefill_bytes_per_s,omitempty"`
	// ShadowPromptMs and ShadowPrefillTokenMs are the CPU the shadow's
	// pass over a prompt costs, fixed and a token: where the nodes share
	// cores (Cores) it takes its share of them from the prompt's own
	// pass. Calibrate takes their shape from the local runs' time to
	// first token (the whole model's pass over each prompt, one process)
	// and their size from the calibration's shadow-driven run's.
	ShadowPromptMs       float64 `json:"shadow_prompt_ms,omitempty"`
	ShadowPrefillTokenMs float64 `json:"shadow_prefill_token_ms,omitempty"`
	// ShadowPromptShare, when not 0, is the share of the shared cores
	// the shadow's pass over a prompt takes while the prompt's own pass
	// runs beside it: where the shadow's pass outlasts it, the prompt's
	// pass takes 1/(1 - ShadowPromptShare) times as long, however much
	// longer the shadow's pass would run (processor sharing: the prompt's
	// pass takes min(T + S, T/(1 - share)), T its time alone, S the
	// shadow's CPU over the cores). One case cannot tell S from the
	// share: FitShadowPrefill takes the least of each that explains it,
	// the shadow's pass ending with the prompt's at the calibration's
	// length. On paper.rig's small preset a 16-token prompt and a
	// 128-token one took 1.51 and 1.52 times the reactive swarm's time;
	// added whole, the shadow's pass grew 4.4 times as the local runs do.
	ShadowPromptShare float64 `json:"shadow_prompt_share,omitempty"`
	// PrefillLoadCPUMs, when not 0, is the CPU a prompt's load costs
	// instead of WorkerCPULoadMs (a decode load's): where the nodes share
	// cores, the prompt's loads, all at once, take it from the others.
	// Calibrate fits it to a reactive run's time to first token, where
	// the bench made one.
	PrefillLoadCPUMs float64 `json:"prefill_load_cpu_ms,omitempty"`
	// PrefillCPUTokenMs and PrefillCPUByteNs, when not 0, are the CPU a
	// prompt's pass costs all the nodes together where they share cores
	// (Cores): its compute, a prompt token's over every layer, and its
	// messages (activations, results, a stage's rows), each byte sent and
	// received. The prompt's pass then takes no less than that CPU over
	// the shared cores: on the emulated rig a long prompt's pass is
	// CPU-bound (every worker's experts and every message on two cores),
	// a short one's timeline-bound. Calibrate takes the compute's from
	// local mode's times to first token and fits the bytes' to a resident
	// run at a long prompt; its messages then cross their links at the
	// links' rate.
	PrefillCPUTokenMs float64 `json:"prefill_cpu_token_ms,omitempty"`
	PrefillCPUByteNs  float64 `json:"prefill_cpu_byte_ns,omitempty"`
	// Cores, when not 0, is how many CPU cores all the nodes share (the
	// emulated rig: ten nodes on one machine). Decode then goes no faster
	// than Cores over the CPU a token costs: the main node's, the
	// workers' per expert activation and per load, and the shadow's
	// (the main node's and the shadow's at position 0: their attention
	// adds Layers * *PositionMs a position, on their CPU).
	Cores int `json:"cores,omitempty"`
	// RouteRepeat is the chance that a layer routes the next token to
	// each expert it routed the token before to: the model's routing
	// locality on the prompts it was measured on, not the rig's (0:
	// every token's experts drawn anew). Where the shadow hints an expert
	// the layer kept to the worker that holds it, it is not loaded again.
	// Calibrate fits it to a shadow run's decode loads a token.
	RouteRepeat float64 `json:"route_repeat,omitempty"`
	// PromptSkew is how unevenly a prompt layer's router spreads the
	// prompt's tokens over its experts: its i-th most chosen expert is
	// drawn with weight exp(-PromptSkew * i), each layer's order of
	// experts its own (0: evenly). A skewed model's prompt uses fewer of
	// a layer's experts than an even draw's, so a swarm loads fewer for
	// it (the small preset's 16 tokens used 5.4 of 8 experts a layer, an
	// even draw 7.9). Calibrate fits it to the reactive run's prompt
	// loads. A decode token's routing is RouteRepeat's, fitted to its
	// loads.
	PromptSkew float64 `json:"prompt_skew,omitempty"`
	// CPUEfficiency is the share of the shared cores the nodes keep busy
	// when they bound decode (0: 1), as calibrated from a CPU-bound run.
	CPUEfficiency     float64 `json:"cpu_efficiency,omitempty"`
	MainCPUTokenMs    float64 `json:"main_cpu_token_ms,omitempty"`
	WorkerCPUExpertMs float64 `json:"worker_cpu_expert_ms,omitempty"`
	WorkerCPULoadMs   float64 `json:"worker_cpu_load_ms,omitempty"`
	ShadowCPUTokenMs  float64 `json:"shadow_cpu_token_ms,omitempty"`
	// WorkerCPUHintMs is what a shadow's prediction of an activation
	// costs the workers beyond the load it may start (its message, the
	// placement, a load withdrawn): a shadow-driven swarm's CPU a decode
	// token has one an activation more. SplitLoadCPU sets it, with
	// WorkerCPULoadMs from a reactive run's loads (a shadow-driven load
	// cost the workers 2.8 times a reactive one's on olmoe-tiny, 1.6
	// times on qwen3-moe-tiny).
	WorkerCPUHintMs float64 `json:"worker_cpu_hint_ms,omitempty"`
}

// Validate refuses negative costs and rates that are not positive.
func (p Profile) Validate() error {
	for name, v := range map[string]float64{"main_layer_ms": p.MainLayerMs, "main_token_ms": p.MainTokenMs, "shadow_layer_ms": p.ShadowLayerMs,
		"shadow_token_ms": p.ShadowTokenMs, "expert_ms": p.ExpertMs, "load_ms": p.LoadMs, "hop_ms": p.HopMs,
		"main_prefill_token_ms": p.MainPrefillTokenMs, "expert_prefill_token_ms": p.ExpertPrefillTokenMs, "main_cpu_token_ms": p.MainCPUTokenMs,
		"worker_cpu_expert_ms": p.WorkerCPUExpertMs, "worker_cpu_load_ms": p.WorkerCPULoadMs, "shadow_cpu_token_ms": p.ShadowCPUTokenMs, "worker_cpu_hint_ms": p.WorkerCPUHintMs,
		"main_position_ms": p.MainPositionMs, "shadow_position_ms": p.ShadowPositionMs, "loading_hop_ms": p.LoadingHopMs, "shadow_prompt_ms": p.ShadowPromptMs, "shadow_prefill_token_ms": p.ShadowPrefillTokenMs, "prefill_load_cpu_ms": p.PrefillLoadCPUMs,
		"main_prefill_layer_ms": p.MainPrefillLayerMs, "expert_prefill_ms": p.ExpertPrefillMs, "prefill_bytes_per_s": p.PrefillBytesPerS,
		"prefill_cpu_token_ms": p.PrefillCPUTokenMs, "prefill_cpu_byte_ns": p.PrefillCPUByteNs} {
		if v < 0 {
			return fmt.Errorf("sim: profile %q: %s is %v, must be >= 0", p.Name, name, v)
		}
	}
	if p.RouteRepeat < 0 || p.RouteRepeat >= 1 {
		return fmt.Errorf("sim: profile %q: route_repeat is %v, must be in 0..1 (excluding 1)", p.Name, p.RouteRepeat)
	}
	if p.PromptSkew < 0 {
		return fmt.Errorf("sim: profile %q: prompt_skew is %v, must be >= 0 (0: an even draw)", p.Name, p.PromptSkew)
	}
	if p.ShadowPromptShare < 0 || p.ShadowPromptShare >= 1 {
		return fmt.Errorf("sim: profile %q: shadow_prompt_share is %v, must be in 0..1 (excluding 1; 0: no bound)", p.Name, p.ShadowPromptShare)
	}
	if p.CPUEfficiency < 0 || p.CPUEfficiency > 1 {
		return fmt.Errorf("sim: profile %q: cpu_efficiency is %v, must be in 0..1 (0: 1)", p.Name, p.CPUEfficiency)
	}
	if p.Cores < 0 {
		return fmt.Errorf("sim: profile %q: cores is %d, must be >= 0 (0: every node has its own)", p.Name, p.Cores)
	}
	if p.LoadBytesPerS <= 0 || p.LinkBytesPerS <= 0 {
		return fmt.Errorf("sim: profile %q: load_bytes_per_s (%v) and link_bytes_per_s (%v) must be > 0", p.Name, p.LoadBytesPerS, p.LinkBytesPerS)
	}
	return nil
}

// Shape is what of the model the timeline depends on.
type Shape struct {
	Layers, Experts, TopK int
	// ExpertLayers are the layers with experts (nil: all); the others
	// run on the main node alone.
	ExpertLayers []int
	ExpertBytes  int64 // one expert's weights, as loaded
	HiddenBytes  int64 // one token's hidden state on the wire
	KVBytes      int64 // one position's keys and values, every layer, as the main node sends them to the shadow
	// MainWeights and ExpertWeights are how many weights a token's pass
	// multiplies by in one layer's main part (attention's projections,
	// the router) and in one expert: what a prompt token's compute
	// splits by (SplitPrefill); 0: not known.
	MainWeights, ExpertWeights int64
}

func (s Shape) hasExperts(l int) bool {
	return s.ExpertLayers == nil || slices.Contains(s.ExpertLayers, l)
}

// Mode is how experts reach the workers.
type Mode string

const (
	Resident Mode = "resident" // every expert stays on its owner: no loads
	Reactive Mode = "reactive" // loaded when its activation arrives
	Shadow   Mode = "shadow"   // loaded on the shadow's prediction
)

// Options is one simulated run.
type Options struct {
	Mode   Mode
	Prompt int // prompt tokens (prefill)
	Output int // tokens generated (decode steps = Output - 1)
	// Recall is the share of activations the shadow predicts; Ahead how
	// many passes past its latest alignment it may run (0: it
	// departs on each alignment, OD-MoE's late departure).
	Recall float64
	Ahead  int
	// AlignKV is the shadow's KV alignment period (-align-kv): every
	// AlignKV passes the main node sends it the new positions' keys
	// and values, AlignKV * Shape.KVBytes over its link ahead of that
	// pass's activations (0: never). The token period, and the
	// KV period's own effect on the shadow's routing, show in Recall,
	// measured (odmoe tune-align).
	AlignKV int
	Seed    uint64
	// LoadRates, when set, are the workers' own links (bytes a second,
	// one a worker; 0: unpaced): a heterogeneous rig's -load-bw. A load
	// on worker w then takes Profile.LoadMs + bytes / LoadRates[w].
	LoadRates []float64
	// Stages, when set, are the first layers of the main node's stages
	// (-role stage -layers), ascending: the main node runs the layers
	// before the first (none where it is 0), each stage the layers from
	// its first to the next one's, on a node of the main node's kind
	// with a link of its own. The main node calls each stage in turn
	// (stage.Client): the pass's rows go out over its link and come back
	// over the stage's, with the KV rows the stage wrote where the
	// shadow is aligned with them; each layer's activations and results
	// cross its own node's link.
	Stages []int
	// ShadowStages, when set, are the first layers of the shadow's
	// stages (-role shadow -layers), ascending from 0: the first stage
	// calls each later one in turn, which sends back each layer's routes
	// as it routes them (the first stage predicts from them) and its
	// rows when done.
	ShadowStages []int
	// Accept, when not 0, is the chance the shadow's guess of a token is
	// the main node's own sample (when its guesses before it were): its
	// run ahead on a wrong guess is then wasted, and it departs on the
	// main node's alignment (0: not modelled, its run-ahead taken as
	// right, as Recall was measured with it).
	Accept float64
	// Draft is how many of the shadow's guesses each decode pass checks
	// after the token it feeds (drafting; 0: none): a shadow-driven
	// swarm's, with Accept. The shadow runs each row's token in turn and
	// samples the next guess; a pass checks those it has made by the
	// time the pass starts. A pass of R rows costs the main node
	// R-1 prompt tokens' more a layer (MainPrefillTokenMs) and each row's
	// attention; each expert runs once for the rows routed to it (R-1 of
	// them at ExpertPrefillTokenMs more), its activation as large as
	// they are; the head runs once.
	Draft int
}

// MaxDraft is the most guesses a simulated pass checks: the main node's
// (passloop.MaxDraft; a test holds them equal, the simulator importing
// no node's code).
const MaxDraft = 8

// Result is what the run would measure.
type Result struct {
	TTFTms           float64 `json:"ttft_ms"`
	DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	StallFraction    float64 `json:"stall_fraction"` // decode time spent waiting for loads
	Loads            int     `json:"expert_loads"`
	// WastedLoads are the loads of predictions no activation used (a
	// shadow's wrong guesses), counted in Loads too: a run's figures
	// count a layer's loads only where a request used them.
	WastedLoads int `json:"wasted_loads,omitempty"`
	MissesLate  int `json:"misses_late"`  // predicted, but the prediction came after the activation
	MissesWrong int `json:"misses_wrong"` // not predicted (every load of a reactive swarm)
	// CPUBound: the shared cores, not the timeline, set the decode rate
	// (Profile.Cores).
	CPUBound bool `json:"cpu_bound,omitempty"`
	// Passes are the decode passes; with Draft, Drafted and Accepted the
	// guesses they checked and kept.
	Passes   int `json:"passes"`
	Drafted  int `json:"drafted,omitempty"`
	Accepted int `json:"accepted,omitempty"`
}

// Run simulates the decode of o.Output tokens on a rig of layout's
// workers.
func Run(p Profile, layout sched.Layout, s Shape, o Options) (Result, error) {
	if err := p.Validate(); err != nil {
		return Result{}, err
	}
	if s.Layers < 1 || s.Experts < 1 || s.TopK < 1 || s.TopK > s.Experts {
		return Result{}, fmt.Errorf("sim: shape of %d layers, %d experts, top-%d", s.Layers, s.Experts, s.TopK)
	}
	if layout.Workers < 1 || layout.Group < 1 || layout.Workers%layout.Group != 0 {
		return Result{}, fmt.Errorf("sim: %d workers in groups of %d", layout.Workers, layout.Group)
	}
	switch o.Mode {
	case Resident, Reactive, Shadow:
	default:
		return Result{}, fmt.Errorf("sim: mode %q: want resident, reactive or shadow", o.Mode)
	}
	if o.Prompt < 1 || o.Output < 2 || o.Recall < 0 || o.Recall > 1 || o.Ahead < 0 || o.AlignKV < 0 {
		return Result{}, fmt.Errorf("sim: %d prompt tokens (want >= 1), %d output (>= 2), recall %v (0..1), ahead %d (>= 0), KV alignment period %d (>= 0)", o.Prompt, o.Output, o.Recall, o.Ahead, o.AlignKV)
	}
	if o.Accept < 0 || o.Accept > 1 || o.Draft < 0 || o.Draft > MaxDraft || o.Draft > 0 && (o.Mode != Shadow || o.Accept == 0) {
		return Result{}, fmt.Errorf("sim: drafting %d guesses a pass (0..%d, a shadow's, with -accept) with acceptance %v (0..1) in mode %s", o.Draft, MaxDraft, o.Accept, o.Mode)
	}
	hop := p.HopMs
	if o.Mode == Shadow && p.LoadingHopMs > 0 {
		hop = p.LoadingHopMs
	}
	if o.LoadRates != nil && len(o.LoadRates) != layout.Workers {
		return Result{}, fmt.Errorf("sim: %d workers' load rates for %d workers", len(o.LoadRates), layout.Workers)
	}
	if err := checkStarts("main stages", o.Stages, s.Layers, false); err != nil {
		return Result{}, err
	}
	if err := checkStarts("shadow stages", o.ShadowStages, s.Layers, true); err != nil {
		return Result{}, err
	}
	nodes := 1 + len(o.Stages)
	r := &run{p: p, layout: layout, s: s, o: o, rng: rand.New(rand.NewPCG(o.Seed, 0x0d30e)),
		link: make([]timeline, layout.Workers), cpu: make([]timeline, layout.Workers),
		up: make([]timeline, nodes), down: make([]timeline, nodes), node: make([]int, s.Layers),
		latency: hop, wire: 1000 * float64(s.HiddenBytes) / p.LinkBytesPerS, load: make([]float64, layout.Workers), skew: newSkew(s, p.PromptSkew, o.Seed)}
	for l := range r.node {
		for _, first := range o.Stages {
			if l >= first {
				r.node[l]++
			}
		}
	}
	for w := range r.load {
		r.load[w] = p.LoadMs + 1000*float64(s.ExpertBytes)/p.LoadBytesPerS
		if o.LoadRates != nil {
			r.load[w] = p.LoadMs
			if rate := o.LoadRates[w]; rate > 0 {
				r.load[w] += 1000 * float64(s.ExpertBytes) / rate
			}
		}
	}
	r.res.TTFTms = r.prefill()
	return r.decode(r.res.TTFTms), nil
}

type run struct {
	p         Profile
	layout    sched.Layout
	s         Shape
	o         Options
	rng       *rand.Rand
	link, cpu []timeline // per worker: its load link and its compute
	// up and down are each node's link, each way: the main node's (0)
	// and its stages'
	up, down []timeline
	node     []int     // the node that runs each layer: 0 the main node, i stage i
	latency  float64   // a message's latency in this mode (ms)
	wire     float64   // a hidden state's time on a link (ms)
	load     []float64 // one expert's load on each worker (ms)
	res      Result
	stall    float64
	// kept is, per layer, the experts the last decode pass's
	// predictions loaded and where: a worker hinted one again keeps it
	kept []map[int]prediction
	// rowsRun are the decode passes' rows, guesses taken back included
	rowsRun int
	// promptBytes are the prompt's messages' bytes (prefillMessage)
	promptBytes float64
	skew        *skew // Profile.PromptSkew's draw (nil: even)
}

// prediction is a load the shadow asked of a worker for an expert.
type prediction struct {
	worker         int
	arrive, loaded float64 // when the prediction reached the worker; when its load ends
}

// prefill runs the prompt layer by layer (OD-MoE section 3.3): the main
// node's part for every token, then each used expert on the worker that
// holds its index (sched.Layout.PrefillWorker) for the tokens routed to
// it (routed as PromptSkew draws them), one activation a worker out over
// the main node's link (the tokens of all its experts) and a result an
// expert back; loads (but in a resident swarm) from the moment the
// layer's router has run, as the main node hints every worker its
// experts at once (on shared cores a load's CPU is the layer's lost
// time, and only its link is waited for). On shared cores the pass lasts
// no less than its CPU over the cores (PrefillCPUTokenMs,
// PrefillCPUByteNs, the loads'). It returns the time to the first token.
func (r *run) prefill() float64 {
	now := 0.0
	P := r.o.Prompt
	count := make([]int, r.s.Experts)
	tokens := make([]int, r.layout.Workers)   // each worker's tokens of a layer: its activation's rows
	sent := make([]float64, r.layout.Workers) // when each worker's activation arrives
	allLoadsCPU := 0.0                        // the loads' CPU over the shared cores, every layer's
	on := 0                                   // the node the prompt's rows are on
	for l := range r.s.Layers {
		if n := r.node[l]; n != on {
			now, on = r.goTo(on, n, now, P, 0), n
		}
		need := now + r.p.mainPrefillFirstMs() + float64(P-1)*r.p.MainPrefillTokenMs
		now = need
		if !r.s.hasExperts(l) {
			continue
		}
		clear(count)
		clear(tokens)
		for range P {
			rt := r.route(l, nil, r.skew)
			for i, e := range rt {
				count[e]++
				// the token goes to each worker of its experts once
				if w := r.layout.PrefillWorker(e); !slices.ContainsFunc(rt[:i], func(x int) bool { return r.layout.PrefillWorker(x) == w }) {
					tokens[w]++
				}
			}
		}
		// each worker's activation, its tokens' rows, leaves in turn
		for w, n := range tokens {
			if n > 0 {
				send := r.prefillMessage(n)
				sent[w] = r.up[on].reserve(need, send) + send + r.latency
			}
		}
		// the layer's loads (but in a resident swarm) run at once, one a
		// worker; on shared cores their CPU is the other nodes' lost time
		var loadsCPU float64
		if r.o.Mode != Resident && r.p.Cores > 0 {
			perLoad := r.p.WorkerCPULoadMs
			if r.p.PrefillLoadCPUMs > 0 {
				perLoad = r.p.PrefillLoadCPUMs
			}
			for _, c := range count {
				loadsCPU += float64(min(c, 1)) * perLoad / r.p.sharedCores()
			}
		}
		for e, c := range count {
			if c == 0 {
				continue
			}
			w := r.layout.PrefillWorker(e)
			at := sent[w]
			ready := at
			if r.o.Mode != Resident { // the figures are decode's: not counted
				// every worker is hinted its experts at once; on shared
				// cores a load's own cost is loadsCPU, and its link alone
				// is waited for
				d := r.load[w]
				if r.p.Cores > 0 {
					d -= r.p.LoadMs
				}
				ready = max(at, r.book(w, need+r.latency, d))
			}
			compute := r.p.expertPrefillFirstMs() + float64(c-1)*r.p.ExpertPrefillTokenMs
			done := r.cpu[w].reserve(ready, compute) + compute
			// each expert's result, its rows, comes back on its own
			send := r.prefillMessage(c)
			back := r.down[on].reserve(done+r.latency, send) + send
			now = max(now, back)
		}
		now += loadsCPU
		allLoadsCPU += loadsCPU
	}
	now = r.goTo(on, 0, now, P, 0) // the last stage's rows back to the main node's head
	if r.p.Cores > 0 {             // the prompt's compute and messages on the shared cores, their loads' too
		cpu := float64(P)*r.p.PrefillCPUTokenMs + r.promptBytes*r.p.PrefillCPUByteNs/1e6
		now = max(now, cpu/r.p.sharedCores()+allLoadsCPU)
	}
	if r.o.Mode == Shadow && r.p.Cores > 0 { // the shadow's pass over the prompt takes its share of the cores
		extra := (r.p.ShadowPromptMs + float64(P)*r.p.ShadowPrefillTokenMs) / r.p.sharedCores()
		if share := r.p.ShadowPromptShare; share > 0 {
			extra = min(extra, now*share/(1-share))
		}
		now += extra
	}
	return now + r.p.MainTokenMs
}

// prefillMessage is how long a prompt's message of rows rows holds the
// main node's link (its way): its fixed cost and its bytes, never less
// than nothing.
func (r *run) prefillMessage(rows int) float64 {
	r.promptBytes += float64(rows) * float64(r.s.HiddenBytes)
	return max(0, r.p.PrefillMessageMs+1000*float64(rows)*float64(r.s.HiddenBytes)/cmp.Or(r.p.PrefillBytesPerS, r.p.LinkBytesPerS))
}

// mainPrefillFirstMs is what a prompt's first token costs the main
// node's part of a layer: MainPrefillLayerMs, or a decode token's.
func (p Profile) mainPrefillFirstMs() float64 { return cmp.Or(p.MainPrefillLayerMs, p.MainLayerMs) }

// expertPrefillFirstMs is what an expert's prompt batch of one token
// costs: ExpertPrefillMs, or a decode token's.
func (p Profile) expertPrefillFirstMs() float64 { return cmp.Or(p.ExpertPrefillMs, p.ExpertMs) }

// sharedCores is the cores the nodes keep busy together: Cores times
// CPUEfficiency (0: 1).
func (p Profile) sharedCores() float64 {
	eff := p.CPUEfficiency
	if eff <= 0 {
		eff = 1
	}
	return eff * float64(p.Cores)
}

// decode runs the decode steps from start (the first token's time):
// passes of one row, or with Draft of the row and the guesses the shadow
// has made, until Output tokens are out.
func (r *run) decode(start float64) Result {
	steps := r.o.Output - 1
	var prev [][]int      // the last row's routing, per layer
	var aligned []float64 // when each pass's alignment reached the shadow
	shadowEnd := start    // the shadow's last pass's end
	wrong := false        // the shadow ran the last pass ahead on a wrong guess
	now, made := start, 0
	// the positions whose KV rows the next KV alignment sends: the
	// prompt's last, then each pass's kept (its tokens); AlignKV of them
	// where every pass keeps one
	sinceKV := 1
	for it := 0; made < steps; it++ {
		pos := float64(r.o.Prompt + made) // the cached positions this pass's first row attends to
		align := now                      // the sampled token (a few bytes) leaves at once
		// due at decode passes K, 2K, ... as align.Policy.KVDue says
		if r.o.Mode == Shadow && r.o.AlignKV > 0 && (it+1)%r.o.AlignKV == 0 {
			// with the KV rows of the positions since the last, on the
			// main node's link (its stages handed theirs back with
			// each pass's rows) before this pass's activations
			kv := 1000 * float64(sinceKV) * float64(r.s.KVBytes) / r.p.LinkBytesPerS
			align = r.up[0].reserve(now, kv) + kv
			sinceKV = 0
		}
		aligned = append(aligned, align+r.latency)
		var predicted []map[int]prediction // per layer: expert -> its load
		var routes [][][]int               // per row, per layer
		rows := 1
		if r.o.Mode == Shadow {
			// the shadow departs once it has finished the last pass
			// and the alignment that lets it go has come: this
			// pass's (late), or the one Ahead before it; after a wrong
			// guess, this pass's (its run ahead was on another token)
			depart := shadowEnd
			if a := it - r.o.Ahead; a >= 0 {
				depart = max(depart, aligned[a])
			}
			if wrong {
				depart = max(depart, aligned[it])
			}
			shadowLayer := r.p.ShadowLayerMs + pos*r.p.ShadowPositionMs
			// each row in turn, its token sampled after the row before:
			// the pass checks the guesses made by the time it starts
			var arrives [][]float64
			for j := 0; j <= min(r.o.Draft, steps-made-1); j++ {
				if j > 0 && shadowEnd+r.p.ShadowTokenMs > now {
					break // the guess for row j is not made yet
				}
				if j > 0 {
					depart = shadowEnd + r.p.ShadowTokenMs
				}
				var arrive []float64
				arrive, shadowEnd = r.shadowPass(depart, shadowLayer+float64(j)*r.p.ShadowPositionMs)
				arrives, rows = append(arrives, arrive), j+1
				routes = append(routes, r.routeRows(prev))
				prev = routes[j]
			}
			predicted = r.predict(arrives, routes)
			if r.o.Ahead > 0 || rows > 1 {
				shadowEnd += r.p.ShadowTokenMs
			}
		} else {
			routes = append(routes, r.routeRows(prev))
			prev = routes[0]
		}
		// the guesses kept, each with Accept's chance while those before
		// it were; then whether the shadow's guess of the next pass's
		// token is the main node's sample
		kept := 0
		if r.o.Accept > 0 && r.o.Mode == Shadow {
			for kept < rows-1 && r.rng.Float64() < r.o.Accept {
				kept++
			}
			wrong = kept < rows-1 || r.rng.Float64() >= r.o.Accept
			r.res.Drafted, r.res.Accepted = r.res.Drafted+rows-1, r.res.Accepted+kept
		}
		// a stage's KV rows come back with its rows where the shadow is
		// aligned with them (each pass's: the journal keeps them)
		kvBack := 0.0
		if r.o.Mode == Shadow && r.o.AlignKV > 0 {
			kvBack = float64(r.s.KVBytes) / float64(r.s.Layers)
		}
		on := 0 // the node the pass's rows are on
		R := float64(rows)
		for l := range r.s.Layers {
			if n := r.node[l]; n != on {
				now, on = r.goTo(on, n, now, rows, kvBack*R), n
			}
			need := now + r.p.MainLayerMs + R*pos*r.p.MainPositionMs + (R-1)*r.p.MainPrefillTokenMs
			if !r.s.hasExperts(l) {
				now = need
				continue
			}
			var pl map[int]prediction
			if predicted != nil {
				pl = predicted[l]
			}
			now = r.layer(l, need, routes, pl)
		}
		now = r.goTo(on, 0, now, rows, kvBack*R)
		now += r.p.MainTokenMs
		made += min(kept+1, steps-made)
		sinceKV += kept + 1
		r.res.Passes++
		r.rowsRun += rows
	}
	r.res.DecodeTokensPerS = float64(steps) / ((now - start) / 1000)
	r.res.StallFraction = r.stall / (now - start)
	if r.p.Cores > 0 {
		// the mean decode position: the CPU a token costs grows with it;
		// each row costs a token's, whether its token is kept or not
		pos := float64(r.o.Prompt) + float64(steps-1)/2
		cpu := r.p.tokenCPUMs(r.s, float64(r.res.Loads)/float64(steps), r.o.Mode == Shadow, pos) * float64(r.rowsRun) / float64(steps)
		if bound := r.p.sharedCores() * 1000 / cpu; cpu > 0 && bound < r.res.DecodeTokensPerS {
			r.res.DecodeTokensPerS, r.res.CPUBound = bound, true
		}
	}
	return r.res
}

// routeRows is a row's routing, per layer: k distinct experts each, each
// of the row before's (prev; nil: none) kept with RouteRepeat's chance.
func (r *run) routeRows(prev [][]int) [][]int {
	routes := make([][]int, r.s.Layers)
	for l := range routes {
		var was []int
		if prev != nil {
			was = prev[l]
		}
		routes[l] = r.route(l, was, nil)
	}
	return routes
}

// tokenCPUMs is the CPU a decode token at position pos costs all the
// nodes together: the main node's, the workers' per expert activation
// and per load, and the shadow's when there is one (its predictions'
// on the workers too).
func (p Profile) tokenCPUMs(s Shape, loadsPerToken float64, shadow bool, pos float64) float64 {
	layers := float64(s.Layers)
	acts := float64(moe(s) * s.TopK)
	cpu := p.MainCPUTokenMs + layers*pos*p.MainPositionMs + acts*p.WorkerCPUExpertMs + loadsPerToken*p.WorkerCPULoadMs
	if shadow {
		cpu += p.ShadowCPUTokenMs + layers*pos*p.ShadowPositionMs + acts*p.WorkerCPUHintMs
	}
	return cpu
}

// route is layer l's k distinct experts, in id order: each of was (the
// layer's experts the token before; nil: none) kept with RouteRepeat's
// chance, the rest drawn from the experts not yet chosen (by skew's
// weights where it is set: a prompt's).
func (r *run) route(l int, was []int, skew *skew) []int {
	e := make([]int, 0, r.s.TopK)
	for _, x := range was {
		if r.p.RouteRepeat > 0 && r.rng.Float64() < r.p.RouteRepeat {
			e = append(e, x)
		}
	}
	if skew != nil {
		e = skew.draw(r.rng, l, e, r.s.TopK)
		slices.Sort(e)
		return e
	}
	// the rest uniformly among the experts not yet chosen: a draw of one
	// already chosen is drawn again (k is small beside the experts, so
	// this costs a few draws, where shuffling them all cost one an expert)
	for len(e) < r.s.TopK {
		if x := r.rng.IntN(r.s.Experts); !slices.Contains(e, x) {
			e = append(e, x)
		}
	}
	slices.Sort(e)
	return e
}

// predict sends the shadow's predictions of a pass, row j's layer l
// reaching the workers of the layer's group at arrives[j][l] (shadowPass),
// which load them in turn: each layer's experts over every row, an
// expert two rows predict hinted when the first does.
// An activation is predicted with probability Recall; for one that is
// not, another expert is (and loaded for nothing).
func (r *run) predict(arrives [][]float64, routes [][][]int) []map[int]prediction {
	out, kept := make([]map[int]prediction, r.s.Layers), make([]map[int]prediction, r.s.Layers)
	var guess, wanted []int
	var first []float64 // when each of guess's first prediction arrives
	for l := range out {
		out[l] = map[int]prediction{}
		kept[l] = out[l]
		if !r.s.hasExperts(l) {
			continue
		}
		guess, wanted, first = guess[:0], wanted[:0], first[:0]
		for j, rt := range routes {
			experts := rt[l]
			wanted = append(wanted, experts...)
			for _, e := range experts {
				g := e
				if r.rng.Float64() >= r.o.Recall {
					g = -1 // a wrong expert in its place, where one is left
					for taken(experts, guess) < r.s.Experts {
						if w := r.rng.IntN(r.s.Experts); !slices.Contains(experts, w) && !slices.Contains(guess, w) {
							g = w
							break
						}
					}
				}
				if g >= 0 && !slices.Contains(guess, g) {
					guess, first = append(guess, g), append(first, arrives[j][l])
				}
			}
		}
		for i, e := range slices.Sorted(slices.Values(guess)) {
			w := r.layout.DecodeWorker(l, i)
			arrive := first[slices.Index(guess, e)]
			if k, ok := r.keptOn(l, e); ok && k.worker == w { // still held there: no load
				out[l][e] = prediction{worker: w, arrive: arrive, loaded: k.loaded}
				continue
			}
			r.res.Loads++
			if !slices.Contains(wanted, e) {
				r.res.WastedLoads++
			}
			out[l][e] = prediction{worker: w, arrive: arrive, loaded: r.loadAt(w, arrive)}
		}
		if len(guess) > r.layout.Group {
			kept[l] = lastOnEach(out[l])
		}
	}
	r.kept = kept // the next pass's: this one's reads the last's
	return out
}

// lastOnEach is, of a layer's predictions, the expert each worker loads
// last: a worker keeps it for the next pass, where a pass of several
// rows hinted it more of the layer than a worker's memory holds, loaded
// in turn (with one row, each worker of the group is hinted one).
func lastOnEach(pl map[int]prediction) map[int]prediction {
	last := map[int]int{} // worker -> the expert it loads last
	for e, pr := range pl {
		if k, ok := last[pr.worker]; !ok || pr.loaded > pl[k].loaded || pr.loaded == pl[k].loaded && e > k {
			last[pr.worker] = e
		}
	}
	kept := make(map[int]prediction, len(last))
	for _, e := range last {
		kept[e] = pl[e]
	}
	return kept
}

// taken is how many experts a or b name, each once (a's are distinct).
func taken(a, b []int) int {
	n := len(a)
	for i, x := range b {
		if !slices.Contains(a, x) && !slices.Contains(b[:i], x) {
			n++
		}
	}
	return n
}

// keptOn is where the last pass's predictions loaded expert e of
// layer l, if they did.
func (r *run) keptOn(l, e int) (prediction, bool) {
	if l >= len(r.kept) {
		return prediction{}, false
	}
	k, ok := r.kept[l][e]
	return k, ok
}

// layer runs one decode layer's experts for the pass's rows (routes,
// per row, per layer), whose activations leave the main node at need,
// and returns when the last result is back: each expert once, for the
// rows routed to it, its activation and result as large as they are.
func (r *run) layer(l int, need float64, routes [][][]int, predicted map[int]prediction) float64 {
	experts := routes[0][l]
	var rows map[int]int // expert -> its rows, where the pass has more than one
	if len(routes) > 1 {
		rows = map[int]int{}
		for _, rt := range routes {
			for _, e := range rt[l] {
				rows[e]++
			}
		}
		experts = slices.Sorted(maps.Keys(rows))
	}
	end, stall := need, 0.0
	for i, e := range experts {
		n := 1
		if rows != nil {
			n = rows[e]
		}
		w := r.layout.DecodeWorker(l, i)
		if r.o.Mode == Resident {
			w = r.layout.Owner(l, e)
		}
		// the activation reaches the worker over its node's link
		on := r.node[l]
		wire := float64(n) * r.wire
		at := r.up[on].reserve(need, wire) + wire + r.latency
		ready := at
		switch r.o.Mode {
		case Reactive:
			r.res.MissesWrong++ // nothing is predicted
			ready = r.demand(w, at)
			if r.p.Cores > 0 { // the layer's loads run at once, sharing the cores
				ready = max(ready, at+float64(len(experts))*r.p.WorkerCPULoadMs/r.p.sharedCores())
			}
		case Shadow:
			switch pr, ok := predicted[e]; {
			case !ok:
				r.res.MissesWrong++
				ready = r.demand(w, at)
			case pr.arrive > at:
				r.res.MissesLate++
				ready = r.demand(w, at)
			default:
				w, ready = pr.worker, max(at, pr.loaded)
			}
		}
		stall = max(stall, ready-at) // its wait for the load, as the main node counts it
		compute := r.p.ExpertMs + float64(n-1)*r.p.ExpertPrefillTokenMs
		start := r.cpu[w].reserve(ready, compute)
		back := r.down[on].reserve(start+compute+r.latency, wire) + wire
		end = max(end, back)
	}
	r.stall += stall
	return end
}

// goTo takes a pass's rows from node from to node to (0: the main
// node), leaving at at, and returns when they arrive: the main node calls
// each stage in turn, so rows go back to it from a stage (with kvPerLayer
// bytes of KV rows for each of the stage's layers) and out to the next
// from it. A prompt's rows (rows > 1) move at a prompt message's cost and
// rate.
func (r *run) goTo(from, to int, at float64, rows int, kvPerLayer float64) float64 {
	if from == to {
		return at
	}
	if from != 0 {
		at = r.hop(from, at, rows, kvPerLayer*float64(r.layersOn(from)))
	}
	if to != 0 {
		at = r.hop(0, at, rows, 0)
	}
	return at
}

// hop sends rows rows of hidden states, and extra bytes, over node
// from's link, leaving at at, and returns when they arrive.
func (r *run) hop(from int, at float64, rows int, extra float64) float64 {
	d := r.wire
	if rows > 1 {
		d = r.prefillMessage(rows)
	}
	d += 1000 * extra / r.p.LinkBytesPerS
	return r.up[from].reserve(at, d) + d + r.latency
}

// layersOn is how many layers node n runs.
func (r *run) layersOn(n int) int {
	k := 0
	for _, m := range r.node {
		if m == n {
			k++
		}
	}
	return k
}

// shadowPass times the shadow's pass departing at depart, its layers
// shadowLayer apart: when each layer's predictions reach the workers and
// when the pass ends. Whole, or a first stage's layers: as it routes
// them. A later stage's: the first stage sends it the rows (a hop),
// the stage routes each layer and sends its routes back (a few bytes),
// and the first stage predicts from them; the rows come back when the
// stage is done (a hop), before the next stage is called.
func (r *run) shadowPass(depart, shadowLayer float64) (arrive []float64, end float64) {
	arrive = make([]float64, r.s.Layers)
	hop := r.wire + r.latency
	starts := r.o.ShadowStages // from layer 0 (checkStarts)
	if len(starts) == 0 {
		starts = []int{0} // whole
	}
	t := depart
	for i, first := range starts {
		last := r.s.Layers
		if i+1 < len(starts) {
			last = starts[i+1]
		}
		back := 0.0 // the routes' way back to the first stage
		if first > 0 {
			t += hop
			back = r.latency
		}
		for l := first; l < last; l++ {
			arrive[l] = t + float64(l-first+1)*shadowLayer + back + r.latency
		}
		t += float64(last-first) * shadowLayer
		if first > 0 {
			t += hop
		}
	}
	return arrive, t
}

// checkStarts refuses stages' first layers that are not ascending
// within the model's layers, or (fromZero) whose first is not layer 0.
func checkStarts(what string, starts []int, layers int, fromZero bool) error {
	for i, s := range starts {
		if s < 0 || s >= layers || i > 0 && s <= starts[i-1] {
			return fmt.Errorf("sim: %s beginning at layers %v: want ascending layers in 0..%d", what, starts, layers-1)
		}
	}
	if fromZero && len(starts) > 0 && starts[0] != 0 {
		return fmt.Errorf("sim: %s beginning at layers %v: the first begins at layer 0", what, starts)
	}
	return nil
}

// demand loads an expert on w for a decode activation that arrived at
// at, counted, and returns when it is loaded.
func (r *run) demand(w int, at float64) float64 {
	r.res.Loads++
	return r.loadAt(w, at)
}

// loadAt books a load on w's link from at and returns when it ends.
func (r *run) loadAt(w int, at float64) float64 { return r.book(w, at, r.load[w]) }

// book books d on w's link from at and returns when it ends.
func (r *run) book(w int, at, d float64) float64 { return r.link[w].reserve(at, d) + d }

// tieMs is how near two moments on a timeline are one: a gap that
// fits a task but for a float64's rounding fits it (sums of the same
// costs in another order, or from another start, differ in their last
// bits, and a run's timings must not hang on which way they round).
const tieMs = 1e-9

// timeline is one resource's busy intervals, in start order: a task is
// put in the first gap at or after its ready time that fits it.
type timeline struct{ busy [][2]float64 }

// reserve books dur from the first free moment at or after t and
// returns its start.
func (tl *timeline) reserve(t, dur float64) float64 {
	start := t
	// the intervals do not overlap, so their ends are in order too: those
	// that end by t, of no use to a task from t, are passed at once
	i := sort.Search(len(tl.busy), func(i int) bool { return tl.busy[i][1] > t+tieMs })
	for ; i < len(tl.busy); i++ {
		b := tl.busy[i]
		if b[1] <= start+tieMs {
			continue
		}
		if b[0] >= start+dur-tieMs {
			break // fits before this one
		}
		start = b[1]
	}
	tl.busy = slices.Insert(tl.busy, i, [2]float64{start, start + dur})
	// intervals that ended long before t are of no use to later tasks
	// whose ready times only grow on average: keep the list short
	if len(tl.busy) > 256 {
		tl.busy = tl.busy[len(tl.busy)-128:]
	}
	return start
}

// WithLinks returns p with its load time split for a rig whose workers'
// links move rates bytes a second (-load-bw; 0: unpaced), one a worker:
// LoadMs is then what a load costs beyond its link, the calibrated mean
// load (LoadMs + bytes / LoadBytesPerS, loads spread evenly over the
// workers) less the mean link time; LoadBytesPerS, for a rig of one
// link (a sweep), the rate whose load takes that mean link time.
func (p Profile) WithLinks(s Shape, rates []float64) Profile {
	if len(rates) == 0 {
		return p
	}
	mean := p.LoadMs + 1000*float64(s.ExpertBytes)/p.LoadBytesPerS
	var link float64
	for _, r := range rates {
		if r > 0 {
			link += 1000 * float64(s.ExpertBytes) / r
		}
	}
	link /= float64(len(rates))
	p.LoadMs, p.WorkerLinks = max(0, mean-link), true
	if link > 0 {
		// a rig of one link: the rate whose load takes the mean link time
		p.LoadBytesPerS = 1000 * float64(s.ExpertBytes) / link
	}
	return p
}

// Expect is Run's expectation: the mean of runs runs of o (seeds o.Seed,
// o.Seed+1, ...), since a run draws its routing and its predictions'
// misses: a prompt of 16 tokens' busiest expert, which sets its layer's
// time, varies by a sixth from draw to draw. Loads, misses, passes and
// guesses are the runs' means rounded; CPUBound is the first run's.
func Expect(p Profile, layout sched.Layout, s Shape, o Options, runs int) (Result, error) {
	var mean Result
	var loads, wasted, late, wrong, passes, drafted, accepted int
	for i := range max(runs, 1) {
		q := o
		q.Seed = o.Seed + uint64(i)
		r, err := Run(p, layout, s, q)
		if err != nil {
			return r, err
		}
		if i == 0 {
			mean.CPUBound = r.CPUBound
		}
		mean.TTFTms += r.TTFTms
		mean.DecodeTokensPerS += r.DecodeTokensPerS
		mean.StallFraction += r.StallFraction
		loads, wasted, late, wrong = loads+r.Loads, wasted+r.WastedLoads, late+r.MissesLate, wrong+r.MissesWrong
		passes, drafted, accepted = passes+r.Passes, drafted+r.Drafted, accepted+r.Accepted
	}
	n := float64(max(runs, 1))
	mean.TTFTms /= n
	mean.DecodeTokensPerS /= n
	mean.StallFraction /= n
	mean.Loads, mean.WastedLoads = int(float64(loads)/n+0.5), int(float64(wasted)/n+0.5)
	mean.MissesLate, mean.MissesWrong = int(float64(late)/n+0.5), int(float64(wrong)/n+0.5)
	mean.Passes, mean.Drafted, mean.Accepted = int(float64(passes)/n+0.5), int(float64(drafted)/n+0.5), int(float64(accepted)/n+0.5)
	return mean, nil
}

// ExpectRuns is how many runs Expect averages where odmoe sim predicts.
const ExpectRuns = 8
