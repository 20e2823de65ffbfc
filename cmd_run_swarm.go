package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/kernels"
	mainnode "github.com/odmoe/odmoe/main"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/odmoe/odmoe/worker"
	"github.com/rs/zerolog"
)

func runMain(ctx context.Context, f *runFlags, stdout io.Writer, log zerolog.Logger) error {
	if err := f.checkGenerate(); err != nil {
		return err
	}
	if f.workers == "" {
		return usagef("-workers is required for -role main")
	}
	policy, err := mainnode.ParsePrefetch(f.prefetch)
	if err != nil {
		return usagef("-prefetch: %v", err)
	}
	cfg, err := f.cluster.config(wire.RoleMain, log)
	if err != nil {
		return err
	}
	t0 := time.Now()
	m, err := model.Load(f.model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		return err
	}
	defer m.Close()
	addrs := strings.Split(f.workers, ",")
	group := f.group
	if group == 0 {
		group = m.Config.TopK
	}
	layout, err := sched.NewLayout(len(addrs), group)
	if err != nil {
		return usagef("-workers/-group: %v", err)
	}
	log.Info().Str("model", f.model).Str("holds", bytesString(m.NonExpertBytes())).Int("workers", len(addrs)).
		Int("groups", layout.Groups()).Str("prefetch", string(policy)).Dur("load", time.Since(t0)).
		Msg("main node: non-expert weights mapped")
	opt := mainnode.Options{
		Layout: layout, Prefetch: policy, MiniBatch: f.miniBatch, Hidden: m.Config.HiddenSize, Log: log,
		Align:  align.Policy{TokenPeriod: f.alignToken, KVPeriod: f.alignKV},
		Layers: m.Config.NumLayers, Experts: m.Config.NumExperts, TopK: m.Config.TopK, Seed: f.seed,
	}
	switch {
	case policy == mainnode.Shadow && f.shadow == "":
		return usagef("-prefetch shadow needs -shadow ADDR")
	case policy != mainnode.Shadow && f.shadow != "":
		return usagef("-shadow is only used with -prefetch shadow")
	case policy == mainnode.Shadow:
		if err := opt.Align.Validate(); err != nil {
			return usagef("%v", err)
		}
		scfg := *cfg
		scfg.PeerRoles = []wire.Role{wire.RoleShadow}
		scfg.DialAttempts, scfg.MaxDialBackoff = 120, time.Second // the shadow may still be quantizing
		if opt.Shadow, err = wire.Dial(ctx, f.shadow, &scfg); err != nil {
			return fmt.Errorf("dialing the shadow: %w", err)
		}
		defer opt.Shadow.Close()
	}
	var traceFrom, traceTo int64
	if f.trace != "" {
		if traceFrom, traceTo, err = parseIters(f.traceIters); err != nil {
			return usagef("-trace-iters: %v", err)
		}
		name := cfg.Name
		if cfg.Certs != nil {
			name = cfg.Certs.Identity.Name
		}
		opt.Trace = trace.NewRecorder(name)
	}
	wcfg := *cfg
	wcfg.DialAttempts, wcfg.MaxDialBackoff = 90, time.Second // workers may still be pinning or preloading experts
	sw, err := mainnode.Dial(ctx, addrs, &wcfg, opt)
	if err != nil {
		return err
	}
	defer sw.Close()
	log.Info().Str("align", opt.Align.String()).Msg("all workers connected")
	if f.trace != "" {
		if err := sw.StartTrace(ctx, traceFrom, traceTo); err != nil {
			return err
		}
	}
	var seq uint64
	st, err := generateText(ctx, f, m, sw, func(s *model.Session, step model.Step, tokens []int) error {
		seq = step.Seq
		return sw.BeforeForward(ctx, step, tokens, s.Cache())
	}, stdout)
	if err != nil {
		return err
	}
	rs := runStats(st, sw.Stats())
	rs.addWorkers(sw.WorkerMetrics(ctx, 5*time.Second))
	if sh, ok := sw.ShadowStats(10 * time.Second); ok {
		rs.addShadow(sh)
	}
	if f.trace != "" {
		tf, err := sw.CollectTrace(ctx, 10*time.Second, m.Config.NumLayers)
		if err != nil {
			return err
		}
		if err := tf.WriteFile(f.trace); err != nil {
			return err
		}
		log.Info().Str("file", f.trace).Int("events", len(tf.Events)).Int64("from", tf.From).Int64("to", tf.To).Msg("swarm trace written")
	}
	if err := sw.EndSequence(ctx, seq); err != nil {
		return err
	}
	printSwarmSummary(stdout, rs, sw.Stats())
	return writeStats(f.stats, rs)
}

func runShadow(ctx context.Context, f *runFlags, log zerolog.Logger) error {
	if f.model == "" {
		return usagef("-model is required for -role shadow")
	}
	if f.workers == "" {
		return usagef("-workers is required for -role shadow (the same list, in the same order, as the main node's)")
	}
	dt, err := parseQuant(f.quant)
	if err != nil {
		return usagef("-quant: %v", err)
	}
	cfg, err := f.cluster.config(wire.RoleShadow, log)
	if err != nil {
		return err
	}
	full, err := model.Load(f.model, model.LoadOptions{})
	if err != nil {
		return err
	}
	defer full.Close()
	addrs := strings.Split(f.workers, ",")
	group := f.group
	if group == 0 {
		group = full.Config.TopK
	}
	layout, err := sched.NewLayout(len(addrs), group)
	if err != nil {
		return usagef("-workers/-group: %v", err)
	}
	t0 := time.Now()
	bar := progress.New("quantize "+f.quant, full.NonExpertBytes()+full.ExpertBytes())
	qm, err := full.Quantized(dt, func(done, total int64) { bar.Set(done) })
	bar.Finish()
	if err != nil {
		return err
	}
	log.Info().Str("quant", f.quant).Str("holds", bytesString(qm.NonExpertBytes()+qm.ExpertBytes())).
		Dur("quantize", time.Since(t0)).Msg("shadow model ready")
	wcfg := *cfg
	wcfg.PeerRoles = []wire.Role{wire.RoleWorker}
	wcfg.DialAttempts, wcfg.MaxDialBackoff = 90, time.Second // workers may still be pinning or preloading experts
	var peers []*wire.Peer
	for _, a := range addrs {
		p, err := wire.Dial(ctx, a, &wcfg)
		if err != nil {
			return fmt.Errorf("dialing worker %s: %w", a, err)
		}
		defer p.Close()
		peers = append(peers, p)
	}
	node, err := shadow.NewNode(qm, peers, layout, log)
	if err != nil {
		return err
	}
	mcfg := *cfg
	mcfg.PeerRoles = []wire.Role{wire.RoleMain}
	ln, err := wire.Listen(ctx, f.listen, &mcfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info().Str("listen", ln.Addr().String()).Int("workers", len(peers)).Msg("shadow ready")
	for {
		p, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		err = node.ServeMain(ctx, p)
		p.Close()
		if ctx.Err() != nil {
			return nil
		}
		log.Info().Err(err).Msg("main node gone; waiting for the next")
	}
}

// parseQuant maps -quant onto a weight format.
func parseQuant(s string) (kernels.DType, error) {
	switch s {
	case "fp16":
		return kernels.F16, nil
	case "int8":
		return kernels.Q8, nil
	case "nf4":
		return kernels.NF4, nil
	}
	return 0, fmt.Errorf("%q unknown: fp16, int8 or nf4", s)
}

func runWorker(ctx context.Context, f *runFlags, log zerolog.Logger) error {
	if f.store == "" {
		return usagef("-store is required for -role worker")
	}
	budget, err := parseBytes(f.deviceMem)
	if err != nil || budget <= 0 {
		return usagef("-device-mem %q: want a positive size such as 1GiB", f.deviceMem)
	}
	bw, err := parseBytes(f.loadBW)
	if err != nil || bw < 0 {
		return usagef("-load-bw %q: want bytes per second such as 4GB, or 0", f.loadBW)
	}
	cfg, err := f.cluster.config(wire.RoleWorker, log)
	if err != nil {
		return err
	}
	cfg.PeerRoles = []wire.Role{wire.RoleMain, wire.RoleShadow}
	cfg.Hello.DeviceMemBytes = budget
	st, err := store.Open(f.store, store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	hidden, err := storeHidden(st)
	if err != nil {
		return err
	}
	arena, err := worker.NewArena(budget)
	if err != nil {
		return err
	}
	hostCache, err := parseBytes(f.hostCache)
	if err != nil || hostCache < 0 {
		return usagef("-host-cache %q: want a size such as 2GiB, or 0", f.hostCache)
	}
	eng := worker.NewEngine(st, hidden, arena, worker.NewLink(float64(bw)), log)
	defer eng.Close()
	if hostCache > 0 {
		eng.Host = worker.NewHostCache(hostCache)
	}
	if f.hostPreload {
		if eng.Host == nil {
			return usagef("-host-preload needs -host-cache SIZE")
		}
		t0 := time.Now()
		bar := progress.New("host cache", min(hostCache, expertBytes(st)))
		n, err := eng.Host.Preload(ctx, st, st.Layers(), st.Experts(), bar.Set)
		bar.Finish()
		if err != nil {
			return err
		}
		_, _, used := eng.Host.Stats()
		log.Info().Int("experts", n).Str("bytes", bytesString(used)).Dur("took", time.Since(t0)).Msg("host cache preloaded")
	}
	if f.resident != "" {
		if err := pinResident(ctx, eng, st, f.resident, log); err != nil {
			return err
		}
	}
	ln, err := wire.Listen(ctx, f.listen, cfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info().Str("listen", ln.Addr().String()).Str("store", f.store).Str("device_mem", bytesString(budget)).
		Str("load_bw", bytesString(bw)+"/s").Str("host_cache", bytesString(hostCache)).Msg("worker ready")
	return worker.NewServer(eng, log).Serve(ctx, ln)
}

// pinResident loads and pins the experts worker I of W owns ("I/W") in
// a resident swarm, with a progress bar.
func pinResident(ctx context.Context, eng *worker.Engine, st *store.Store, spec string, log zerolog.Logger) error {
	var idx, n int
	if _, err := fmt.Sscanf(spec, "%d/%d", &idx, &n); err != nil || n < 1 || idx < 0 || idx >= n {
		return usagef("-resident %q: want I/W with 0 <= I < W, e.g. 3/8", spec)
	}
	var total int64 // what this worker owns
	layout := sched.Layout{Workers: n, Group: 1}
	for l := range st.Layers() {
		for _, e := range layout.Owned(idx, l, st.Experts()) {
			b, _ := st.ExpertBytes(l, e)
			total += int64(b)
		}
	}
	t0 := time.Now()
	bar := progress.New("pin resident experts", total)
	err := eng.PinOwned(ctx, st.Layers(), st.Experts(), idx, n, bar.Set)
	bar.Finish()
	if err != nil {
		return fmt.Errorf("-resident %s: %w", spec, err)
	}
	log.Info().Str("resident", spec).Int("experts", eng.Resident()).Str("device_in_use", bytesString(eng.Arena().InUse())).
		Dur("took", time.Since(t0)).Msg("resident experts pinned")
	return nil
}

// parseIters reads "FROM:TO" (inclusive, FROM >= 1).
func parseIters(s string) (from, to int64, err error) {
	if _, err := fmt.Sscanf(s, "%d:%d", &from, &to); err != nil || from < 1 || to < from {
		return 0, 0, fmt.Errorf("%q: want FROM:TO with 1 <= FROM <= TO, e.g. 2:4", s)
	}
	return from, to, nil
}

// expertBytes is the decompressed size of every expert in st.
func expertBytes(st *store.Store) int64 {
	var total int64
	for l := range st.Layers() {
		for e := range st.Experts() {
			if b, err := st.ExpertBytes(l, e); err == nil {
				total += int64(b)
			}
		}
	}
	return total
}

// storeHidden reads the hidden size off the store's first expert.
func storeHidden(st *store.Store) (int, error) {
	if st.Layers() == 0 || st.Experts() == 0 {
		return 0, fmt.Errorf("store holds no experts")
	}
	hidden, _, err := st.ExpertShape(0, 0)
	return hidden, err
}

// parseBytes reads a size: a number with an optional unit (B, KB, MB, GB,
// TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	return int64(v * mult), nil
}
