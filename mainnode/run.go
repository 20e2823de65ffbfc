package mainnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/stage"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Config is what the main node runs on (`odmoe run -role main`).
type Config struct {
	Model     string   // Hugging Face model directory
	Text      Text     // the prompt and what to do with it
	Serve     Serving  // serve the API instead (Serve.Addr set)
	Workers   []string // worker addresses, in layout order
	Group     int      // workers per group; 0: the router's top-k
	Prefetch  Prefetch
	Residency bool // experts stay resident on their owners (Options.Residency)
	// UniformPlacement keeps residency's owners fixed (Options.UniformPlacement)
	UniformPlacement bool
	MiniBatch        int    // prefill tokens per activation; 0: DefaultMiniBatch
	Shadow           string // the shadow node's address (Prefetch Shadow, or Resident to run it beside the resident swarm)
	// Stages are the addresses of the stages that hold the layers after
	// the main node's, in order (-stages); the main node then holds the
	// layers before the first stage's, perhaps none
	Stages []string
	Align  align.Policy
	// Draft is -draft: how many of the shadow's guesses a pass checks.
	Draft Drafting
	// TraceFile, if set, receives the swarm's timeline of passes
	// TraceFrom..TraceTo.
	TraceFile          string
	TraceFrom, TraceTo int64
	// PeerTimeout is how long a worker or the shadow may stay silent
	// before it is lost (0: wire.DefaultPeerTimeout).
	PeerTimeout time.Duration
	// DialTimeout bounds the wait for the workers (and the shadow) to
	// answer at start (0: wire.DefaultStartDialTimeout).
	DialTimeout time.Duration
	Wire        *wire.Config // this node's identity and transport settings
	// Mem, when set, is the node's memory budget in bytes: it refuses to
	// start when what it will hold passes it (holds).
	Mem int64
	// Weights is where the node's weights live: mapped, or copied into
	// memory of its own (model.LoadOptions.Weights)
	Weights model.Weights
	// Context, when positive, is the longest sequence served instead of
	// the model's (-context: model.LoadOptions.Context).
	Context int
	// ShadowDialTimeout, if set, is how long the node waits at start for
	// the shadow instead of DialTimeout: it starts without its
	// predictions after that, and the shadow attaches when it answers.
	ShadowDialTimeout time.Duration
	// StoreListen, if set, is where the node serves the model's
	// checkpoint and its expert store Store (if set) to nodes fetching
	// their share of them (package fetch): where a swarm's weights start.
	Store, StoreListen string
	// StoreRelays are other nodes that serve the store as they fill
	// theirs (a staged shadow's later stages): told to the workers with
	// the shadow (wire.Place.Holders).
	StoreRelays []string
	Log         zerolog.Logger
}

// Run loads the non-expert weights, connects to the workers (and the
// shadow, and the stages), answers cfg.Text on the swarm and prints what
// it cost.
func Run(ctx context.Context, cfg Config, stdout io.Writer) error {
	log := cfg.Log
	t0 := time.Now()
	var storeServed *atomic.Int64
	fetching := func(wire.Role) bool { return false }
	if cfg.StoreListen != "" { // first: the workers, stages and shadow dialed next may be waiting for their weights
		stop, served, f, err := serveStore(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer stop()
		storeServed, fetching = served, f
	}
	if len(cfg.Stages) > 0 && cfg.Serve.PrefixCacheBytes > 0 {
		// a prefix's rows on the stages are not kept with the main node's
		log.Info().Msg("main node: the prefix cache is off with -stages")
		cfg.Serve.PrefixCacheBytes = 0
	}
	m, stages, d, err := loadMain(ctx, cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	if stages != nil {
		defer stages.Close()
	}
	opt, err := swarmOptions(m, len(cfg.Workers), cfg.Group, Options{Prefetch: cfg.Prefetch, MiniBatch: cfg.MiniBatch, Log: log, Align: cfg.Align, Draft: cfg.Draft,
		Seed: cfg.Text.Seed, Residency: cfg.Residency, UniformPlacement: cfg.UniformPlacement, Stages: stages, StoreServed: storeServed})
	if err != nil {
		return err
	}
	log.Info().Str("model", cfg.Model).Str("holds", progress.Bytes(m.NonExpertBytes())).Stringer("layers", m.HeldLayers()).Int("workers", len(cfg.Workers)).
		Int("groups", opt.Layout.Groups()).Str("prefetch", string(cfg.Prefetch)).Bool("residency", cfg.Residency).Str("weights", weightsWhere(m)).Dur("load", time.Since(t0)).
		Msg("main node: non-expert weights loaded")
	if cfg.TraceFile != "" {
		name := cfg.Wire.Name
		if cfg.Wire.Certs != nil {
			name = cfg.Wire.Certs.Identity.Name
		}
		opt.Trace = trace.NewRecorder(name)
	}
	peers, err := d.dialWorkers(ctx, cfg.Workers, &opt)
	if err != nil {
		return err
	}
	if stages != nil {
		names := make([]string, len(peers))
		for i, p := range peers {
			names[i] = p.Identity().Name
		}
		if err := checkStages(stages, names, opt.Layout.Group, m.Config.MaxPositions); err != nil {
			for _, p := range peers {
				p.Close()
			}
			return err
		}
	}
	opt.Holders = cfg.StoreRelays
	if cfg.Shadow != "" {
		opt.Holders = append([]string{cfg.Shadow}, cfg.StoreRelays...) // a shadow with a store relays it as it fetches it
		sd := d
		if cfg.ShadowDialTimeout > 0 {
			sd.start.DialTimeout = cfg.ShadowDialTimeout
		}
		if fetching(wire.RoleShadow) && cfg.ShadowDialTimeout > 0 {
			// still fetching its copy (then it quantizes it): the swarm
			// serves without its predictions until it attaches
			log.Info().Msg("main node: the shadow is fetching its weights from this node; serving without its predictions until it attaches")
			sd.start.DialTimeout = shadowFetchingDial
		}
		if opt.Shadow, opt.RedialShadow, err = dialShadow(ctx, cfg.Shadow, sd, peers, opt.Layout, m.Config.MaxPositions, log); err != nil {
			for _, p := range peers {
				p.Close()
			}
			return err
		}
	}
	sw, err := newSwarm(peers, opt)
	if err != nil {
		return err
	}
	defer sw.Close()
	log.Info().Str("align", opt.Align.String()).Msg("all workers connected")
	if cfg.TraceFile != "" {
		if err := sw.StartTrace(ctx, cfg.TraceFrom, cfg.TraceTo); err != nil {
			return err
		}
	}
	if cfg.Serve.Addr != "" {
		b := sw.Batcher(m) // requests decode together (continuous batching)
		defer b.Close()
		cfg.Serve.configure(b)
		reg := prometheus.NewRegistry()
		reg.MustRegister(sw.Collector(ExpertBytes(m.Config))) // the swarm's figures beside the API's
		poll, stopPolling := context.WithCancel(ctx)
		defer stopPolling()
		go sw.PollWorkers(poll, time.Second) // the workers' memory and resident experts, for the metrics
		cfg.Serve.Timeline = func() any { return sw.RecentPasses() }
		return serveAPI(ctx, cfg.Model, m, b, sw.Health, reg, cfg.Serve, log)
	}
	cpu := decodeCPU{sw: sw}
	st, err := generateText(ctx, cfg.Model, cfg.Text, m, sw.Batcher(m), stdout, func() { cpu.start(ctx) })
	if err != nil {
		return err
	}
	main, stagesCPU, workersAtStart := cpu.end()
	rs := runStats(st, sw.Stats())
	rs.addWorkers(sw.WorkerStats(ctx, 5*time.Second))
	sw.logStoreTraffic(rs.Workers)
	var shadowCPU time.Duration
	if sh, ok := sw.ShadowStats(10 * time.Second); ok {
		rs.addShadow(sh)
		shadowCPU = sh.DecodeCPU
	}
	rs.addDecodeCPU(main, stagesCPU, workersAtStart, shadowCPU)
	if cfg.TraceFile != "" {
		tf, err := sw.CollectTrace(ctx, 10*time.Second, m.Config.NumLayers)
		if err != nil {
			return err
		}
		if err := tf.WriteFile(cfg.TraceFile); err != nil {
			return err
		}
		log.Info().Str("file", cfg.TraceFile).Int("events", len(tf.Events)).Int64("from", tf.From).Int64("to", tf.To).Msg("swarm trace written")
	}
	printSwarmSummary(stdout, rs, sw.Stats())
	return writeStats(cfg.Text.Stats, rs)
}

// RunLocal answers t with the whole model in this process (`odmoe run
// -role local`): the reference the swarm must match bit for bit. With
// sv.Addr set it serves the API instead.
func RunLocal(ctx context.Context, modelDir string, t Text, sv Serving, mem int64, weights model.Weights, contextLen int, stdout io.Writer, log zerolog.Logger) error {
	t0 := time.Now()
	m, err := model.Load(modelDir, nodeLoad(model.LoadOptions{Context: contextLen}, weights, "local", sv, mem, log))
	if err != nil {
		return err
	}
	defer m.Close()
	c := m.Config
	log.Info().Str("model", modelDir).Str("arch", c.Architecture).Int("layers", c.NumLayers).
		Int("experts", c.NumExperts).Int("top_k", c.TopK).
		Str("non_expert", progress.Bytes(m.NonExpertBytes())).Str("experts_bytes", progress.Bytes(m.ExpertBytes())).Str("weights", weightsWhere(m)).
		Int("threads", kernels.Threads()).Str("kernels", kernels.Path()).Dur("load", time.Since(t0)).Msg("model loaded")
	if sv.Addr != "" {
		b := NewLocalBatcher(m)
		defer b.Close()
		sv.configure(b)
		return serveAPI(ctx, modelDir, m, b, nil, prometheus.NewRegistry(), sv, log)
	}
	var cpu0 time.Duration
	st, err := generateText(ctx, modelDir, t, m, NewLocalBatcher(m), stdout, func() { cpu0 = procmem.CPUTime() })
	if err != nil {
		return err
	}
	rs := runStats(st, nil)
	if cpu0 > 0 {
		rs.DecodeCPU = map[string]float64{"local": (procmem.CPUTime() - cpu0).Seconds()}
	}
	return writeStats(t.Stats, rs)
}

// decodeCPU measures the CPU text mode's decode costs the main node and
// the workers: their figures when decode starts (the workers' asked off
// the decode path) and when it has ended.
type decodeCPU struct {
	sw             *Swarm
	main0, stages0 time.Duration
	workers        chan []*wire.WorkerStats
}

// start records the main node's CPU and its stages' (as their last rows
// said) and asks the workers for theirs.
func (c *decodeCPU) start(ctx context.Context) {
	c.main0 = procmem.CPUTime()
	if st := c.sw.opt.Stages; st != nil {
		c.stages0 = st.CPU()
	}
	c.workers = make(chan []*wire.WorkerStats, 1)
	go func() { c.workers <- c.sw.WorkerStats(ctx, 5*time.Second) }()
}

// end returns the main node's CPU since start, its stages' (0 where it
// has none, or they did not say) and the workers' figures at start (nil
// if decode never started).
func (c *decodeCPU) end() (main, stages time.Duration, workersAtStart []*wire.WorkerStats) {
	if c.workers == nil {
		return 0, 0, nil
	}
	main = procmem.CPUTime() - c.main0
	if c.main0 <= 0 {
		main = 0
	}
	if st := c.sw.opt.Stages; st != nil && c.stages0 > 0 {
		stages = max(0, st.CPU()-c.stages0)
	}
	return main, stages, <-c.workers
}

// holds says what this node will hold of m (its weights as bound, its
// experts where it has them, the KV cache of one sequence at its context
// and, serving, the prefix cache's budget) and refuses, naming the
// shortfall, where that passes mem (0: no budget).
func holds(m *model.Model, role string, sv Serving, mem int64, log zerolog.Logger) error {
	f, err := m.FootprintOf(m.HeldLayers(), model.FootprintOptions{Experts: m.ExpertBytes() > 0, Head: true})
	if err != nil {
		return err
	}
	var prefix int64
	if sv.Addr != "" {
		prefix = sv.PrefixCacheBytes
	}
	log.Info().Str("holds", f.String()).Str("prefix_cache", progress.Bytes(prefix)).Msg(role + ": what this node will hold")
	if need := f.Total() + prefix; mem > 0 && need > mem {
		return fmt.Errorf("%s: needs %s (weights %s, KV cache of one sequence at the node's context (-context) %s, prefix cache %s: -prefix-cache), -mem allows %s: %s short",
			role, progress.Bytes(need), progress.Bytes(f.Weights()), progress.Bytes(f.KV), progress.Bytes(prefix), progress.Bytes(mem), progress.Bytes(need-mem))
	}
	return nil
}

// nodeLoad is opt as a node of role loads its share: its weights where
// weights says, checked against its budget (holds) before any is copied
// into memory, with a progress bar where the copy is long.
func nodeLoad(opt model.LoadOptions, weights model.Weights, role string, sv Serving, mem int64, log zerolog.Logger) model.LoadOptions {
	opt.Weights = weights
	opt.Check = func(m *model.Model) error { return holds(m, role, sv, mem, log) }
	var bar *progress.Bar
	opt.Progress = func(done, total int64) {
		if total < 1<<30 {
			return
		}
		if bar == nil {
			bar = progress.New(role+": weights into memory", total)
		}
		if bar.Set(done); done == total {
			bar.Finish()
		}
	}
	return opt
}

// weightsWhere says where m's weights live, for the node's log.
func weightsWhere(m *model.Model) string {
	if n := m.WeightsInMemory(); n > 0 {
		if from, to := m.WeightsPacked(); from > 0 {
			slow := ""
			if !kernels.PackedNative() {
				slow = "; this CPU has no packed kernel: their products run in pure Go, slowly"
			}
			return fmt.Sprintf("%s in memory (%s of BF16 packed into %s%s)", progress.Bytes(n), progress.Bytes(from), progress.Bytes(to), slow)
		}
		return progress.Bytes(n) + " in memory"
	}
	return "mapped"
}

// shadowFetchingDial is how long a main node waits at start for a
// shadow that is fetching its weights from it (ShadowDialTimeout set):
// one try, then it serves without the shadow, which attaches later.
const shadowFetchingDial = 2 * time.Second

// dialShadow dials the shadow at addr, which must hint the workers of
// peers in layout's groups, waiting for it a while (it may still be
// quantizing): one that does not answer by then attaches when it does
// (the redial), one that refuses is an error.
func dialShadow(ctx context.Context, addr string, d workerDialing, peers []*wire.Peer, layout sched.Layout, contextLen int, log zerolog.Logger) (*wire.Peer, func(context.Context) (*wire.Peer, error), error) {
	names := make([]string, len(peers))
	for i, p := range peers {
		names[i] = p.Identity().Name
	}
	scfg := d.base
	scfg.PeerRoles = []wire.Role{wire.RoleShadow}
	scfg.DialAttempts, scfg.MaxDialBackoff = 1, time.Second
	scfg.CheckHello = func(self, h *wire.Hello) error {
		if err := d.base.CheckHello(self, h); err != nil {
			return err
		}
		if !slices.Equal(h.Layout, names) || h.Group != layout.Group {
			return fmt.Errorf("the shadow hints workers %v in groups of %d, the main node runs %v in groups of %d: give both the same -workers, in the same order, and the same -group",
				h.Layout, h.Group, names, layout.Group)
		}
		if h.Context < contextLen {
			return fmt.Errorf("the shadow follows sequences of at most %d positions (-context), the main node serves %d: give the shadow at least the main node's -context", h.Context, contextLen)
		}
		return nil
	}
	redial := func(ctx context.Context) (*wire.Peer, error) { return wire.Dial(ctx, addr, &scfg) }
	first := scfg
	first.DialAttempts, first.DialTimeout = 1<<20, d.start.DialTimeout
	p, err := wire.Dial(ctx, addr, &first)
	if err != nil {
		if ce := (*wire.ConnError)(nil); ctx.Err() != nil || errors.As(err, &ce) {
			return nil, nil, fmt.Errorf("dialing the shadow: %w", err) // refused, not unreachable
		}
		log.Warn().Str("shadow", addr).Err(err).Msg("main node: the shadow does not answer; starting without its predictions, it attaches when it does")
	}
	return p, redial, nil
}

// loadMain loads the main node's share of cfg.Model: every non-expert
// weight, or, with cfg.Stages, the embedding, the layers before the first
// stage's and the output head, and the client that runs the stages'
// layers (its model's LayerRunner), nil without stages; and how the node
// dials, its model's identity said (what the workers, the shadow and the
// stages check).
func loadMain(ctx context.Context, cfg Config) (*model.Model, *stage.Client, workerDialing, error) {
	if len(cfg.Stages) == 0 {
		m, err := model.Load(cfg.Model, nodeLoad(model.LoadOptions{SkipExperts: true, Context: cfg.Context}, cfg.Weights, "main", cfg.Serve, cfg.Mem, cfg.Log))
		if err != nil {
			return nil, nil, workerDialing{}, err
		}
		id, err := store.IdentityOf(cfg.Model, m)
		if err != nil {
			m.Close()
			return nil, nil, workerDialing{}, err
		}
		return m, nil, dialing(id, cfg.Wire, cfg.PeerTimeout, cfg.DialTimeout), nil
	}
	id, err := store.ModelIdentity(cfg.Model) // every router's, which this node does not hold
	if err != nil {
		return nil, nil, workerDialing{}, err
	}
	d := dialing(id, cfg.Wire, cfg.PeerTimeout, cfg.DialTimeout)
	m, stages, err := loadStaged(ctx, cfg, d)
	return m, stages, d, err
}

// loadStaged loads a staged main node's share and dials its stages.
func loadStaged(ctx context.Context, cfg Config, d workerDialing) (*model.Model, *stage.Client, error) {
	if cfg.Residency {
		return nil, nil, fmt.Errorf("mainnode: -stages with -residency on: each stage would place its layers' experts on its own")
	}
	c, err := model.LoadConfig(cfg.Model)
	if err != nil {
		return nil, nil, err
	}
	stages, first, err := DialStages(ctx, cfg.Stages, &d.start, c.NumLayers) // waiting for them while they load
	if err != nil {
		return nil, nil, err
	}
	m, err := model.Load(cfg.Model, nodeLoad(model.LoadOptions{SkipExperts: true, Layers: &model.LayerRange{First: 0, End: first}, Head: true, Context: cfg.Context},
		cfg.Weights, "main", cfg.Serve, cfg.Mem, cfg.Log))
	if err != nil {
		stages.Close()
		return nil, nil, err
	}
	if err := m.SetLayerRunner(stages); err != nil {
		m.Close()
		stages.Close()
		return nil, nil, err
	}
	return m, stages, nil
}
