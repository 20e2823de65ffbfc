package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	mainnode "github.com/odmoe/odmoe/main"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
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
	sw, err := mainnode.Dial(ctx, addrs, cfg, mainnode.Options{
		Layout: layout, Prefetch: policy, MiniBatch: f.miniBatch, Hidden: m.Config.HiddenSize, Log: log})
	if err != nil {
		return err
	}
	defer sw.Close()
	log.Info().Msg("all workers connected")
	st, err := generateText(ctx, f, m, sw, stdout)
	if err != nil {
		return err
	}
	rs := runStats(st, sw.Stats())
	rs.addWorkers(sw.WorkerMetrics(ctx, 5*time.Second))
	printSwarmSummary(stdout, rs, sw.Stats())
	return writeStats(f.stats, rs)
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
	eng := worker.NewEngine(st, hidden, arena, worker.NewLink(float64(bw)), log)
	defer eng.Close()
	ln, err := wire.Listen(ctx, f.listen, cfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info().Str("listen", ln.Addr().String()).Str("store", f.store).Str("device_mem", bytesString(budget)).
		Str("load_bw", bytesString(bw)+"/s").Msg("worker ready")
	return worker.NewServer(eng, log).Serve(ctx, ln)
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
