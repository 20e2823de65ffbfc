package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/inproc"
	"github.com/odmoe/odmoe/internal/progress"
	mainnode "github.com/odmoe/odmoe/main"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// runTuneAlign runs the same prompt with every token/KV alignment period
// pair on a swarm in this process (workers, a shadow and the main node
// over loopback QUIC with mutual TLS) and prints recall, misses, late
// departure and decode speed for each, then the fastest pair: what
// OD-MoE's figures 9 and 10 show, for this machine.
func runTuneAlign(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("tune-align", stderr)
	dir := fs.String("model", "", "Hugging Face model directory (required)")
	storeDir := fs.String("store", "", "its compressed expert store (default: convert into a temporary directory)")
	quant := fs.String("quant", "int8", "the shadow's weight format: fp16, int8, nf4")
	periodsFlag := fs.String("periods", "1,2,4,8,16", "alignment periods to try for T and K (0 = never)")
	workers := fs.Int("workers", 8, "workers")
	group := fs.Int("group", 0, "workers per group; 0 = the router's top-k")
	loadBW := fs.String("load-bw", "4GB", "pace worker loads (bytes/s); 0 = unpaced")
	prompt := fs.String("prompt", "The quick brown fox jumps over the lazy dog.", "prompt text")
	n := fs.Int("n", 32, "tokens to generate per run")
	var lf logFlags
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	if *dir == "" {
		return usagef("-model is required")
	}
	dt, err := parseQuant(*quant)
	if err != nil {
		return usagef("-quant: %v", err)
	}
	var periods []int
	for _, p := range strings.Split(*periodsFlag, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || v < 0 {
			return usagef("-periods %q: want non-negative integers", *periodsFlag)
		}
		periods = append(periods, v)
	}
	bw, err := parseBytes(*loadBW)
	if err != nil || bw < 0 {
		return usagef("-load-bw %q: want bytes per second", *loadBW)
	}
	tmp, err := os.MkdirTemp("", "odmoe-tune-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if *storeDir == "" {
		*storeDir = filepath.Join(tmp, "store")
		log.Info().Msg("converting the experts into a temporary store")
		if err := store.Convert(ctx, *dir, *storeDir, store.ConvertOptions{}); err != nil {
			return err
		}
	}
	certDir := filepath.Join(tmp, "certs")
	if err := inproc.EnsureCerts(certDir, *workers); err != nil {
		return err
	}
	full, err := model.Load(*dir, model.LoadOptions{})
	if err != nil {
		return err
	}
	defer full.Close()
	c := full.Config
	if *group == 0 {
		*group = c.TopK
	}
	layout, err := sched.NewLayout(*workers, *group)
	if err != nil {
		return usagef("-workers/-group: %v", err)
	}
	tok, err := tokenizer.LoadDir(*dir)
	if err != nil {
		return err
	}
	ids := tok.Encode(*prompt, true)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	files := inproc.Files{Model: *dir, Store: *storeDir, Certs: certDir}
	addrs, stopWorkers, err := inproc.StartWorkers(ctx, files, inproc.WorkerOptions{Count: *workers, BudgetBytes: 1 << 30, LoadBytesSec: float64(bw), Log: log})
	if err != nil {
		return err
	}
	defer stopWorkers()
	qm, err := full.Quantized(dt, nil)
	if err != nil {
		return err
	}
	shadowAddr, stopShadow, err := inproc.StartShadow(ctx, qm, certDir, addrs, layout, "127.0.0.1:0", log)
	if err != nil {
		return err
	}
	defer stopShadow()
	mainModel, err := model.Load(*dir, model.LoadOptions{SkipExperts: true})
	if err != nil {
		return err
	}
	defer mainModel.Close()
	certs, err := wire.LoadCerts(certDir, "main")
	if err != nil {
		return err
	}
	mcfg := &wire.Config{Certs: certs, Log: zerolog.Nop()}
	scfg := *mcfg
	scfg.PeerRoles = []wire.Role{wire.RoleShadow}

	fmt.Fprintf(stdout, "tune-align: %s shadow, %d workers in groups of %d, loads paced to %s/s, %d prompt + %d generated tokens\n\n",
		*quant, *workers, *group, progress.Bytes(bw), len(ids), *n)
	fmt.Fprintf(stdout, "%-10s %9s %7s %12s %10s\n", "periods", "recall", "misses", "late ms/it", "tokens/s")
	best, bestRate := "", 0.0
	for _, tp := range periods {
		for _, kp := range periods {
			pol := align.Policy{TokenPeriod: tp, KVPeriod: kp}
			sp, err := wire.Dial(ctx, shadowAddr, &scfg)
			if err != nil {
				return err
			}
			sw, err := mainnode.Dial(ctx, addrs, mcfg, mainnode.Options{Layout: layout, Prefetch: mainnode.Shadow, Shadow: sp, Align: pol,
				Hidden: c.HiddenSize, Layers: c.NumLayers, Experts: c.NumExperts, TopK: c.TopK, Log: zerolog.Nop()})
			if err != nil {
				sp.Close()
				return err
			}
			s := model.NewSession(mainModel, sw, len(ids)+*n)
			_, st, err := sw.Generate(ctx, s, ids, model.GenerateOptions{MaxTokens: *n})
			if err != nil {
				sw.Close()
				sp.Close()
				return fmt.Errorf("%v: %w", pol, err)
			}
			sh, _ := sw.ShadowStats(30 * time.Second)
			var late float64
			for _, l := range sh.LateDepartureMs {
				late += l / float64(len(sh.LateDepartureMs))
			}
			dec := mainnode.Total(sw.Stats().Decode)
			rate := st.DecodeTokensPerSec()
			fmt.Fprintf(stdout, "%-10s %8.2f%% %7d %12.3f %10.2f\n", pol, 100*sh.Recall, dec.Misses, late, rate)
			if rate > bestRate {
				best, bestRate = pol.String(), rate
			}
			sw.Close()
			sp.Close()
		}
	}
	fmt.Fprintf(stdout, "\nbest: %s (%.2f tokens/s): run the main node with its -align-token and -align-kv\n", best, bestRate)
	return nil
}
