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
	mainnode "github.com/odmoe/odmoe/main"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/odmoe/odmoe/worker"
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
	if err := ensureCerts(certDir, *workers); err != nil {
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
	addrs, stopWorkers, err := startLocalWorkers(ctx, *storeDir, certDir, *workers, 1<<30, float64(bw), false, log)
	if err != nil {
		return err
	}
	defer stopWorkers()
	qm, err := full.Quantized(dt, nil)
	if err != nil {
		return err
	}
	shadowAddr, stopShadow, err := startLocalShadow(ctx, qm, certDir, addrs, layout, log)
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
		*quant, *workers, *group, bytesString(bw), len(ids), *n)
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
			_, st, err := model.Generate(ctx, s, ids, model.GenerateOptions{MaxTokens: *n,
				BeforeForward: func(step model.Step, toks []int) error { return sw.BeforeForward(ctx, step, toks, s.Cache()) }})
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

// startLocalWorkers runs n workers (w1..wN of certDir) in this process on
// loopback, each with a budget-byte arena and loads paced to loadBW, and
// with resident, each holding for good the experts it owns in a resident
// swarm; stop ends them and waits.
func startLocalWorkers(ctx context.Context, storeDir, certDir string, n int, budget int64, loadBW float64, resident bool, log zerolog.Logger) (addrs []string, stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, n)
	started := 0
	stop = func() {
		cancel()
		for range started {
			<-done
		}
	}
	for i := range n {
		st, err := store.Open(storeDir, store.Options{})
		if err != nil {
			stop()
			return nil, nil, err
		}
		hidden, _, err := st.ExpertShape(0, 0)
		arena, aerr := worker.NewArena(budget)
		name := fmt.Sprintf("w%d", i+1)
		certs, cerr := wire.LoadCerts(certDir, name)
		if err = firstErr(err, aerr, cerr); err != nil {
			st.Close()
			stop()
			return nil, nil, err
		}
		eng := worker.NewEngine(st, hidden, arena, worker.NewLink(loadBW), log)
		if resident {
			err = pinOwned(ctx, eng, st, i, n, nil)
		}
		var ln *wire.Listener
		if err == nil {
			ln, err = wire.Listen(ctx, "127.0.0.1:0", &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleMain, wire.RoleShadow}, Log: zerolog.Nop()})
		}
		if err != nil {
			eng.Close()
			st.Close()
			stop()
			return nil, nil, err
		}
		addrs = append(addrs, ln.Addr().String())
		started++
		go func() {
			worker.NewServer(eng, log).Serve(ctx, ln)
			ln.Close()
			eng.Close()
			st.Close()
			done <- struct{}{}
		}()
	}
	return addrs, stop, nil
}

// startLocalShadow runs a shadow over qm in this process, serving one
// main node connection after another.
func startLocalShadow(ctx context.Context, qm *model.Model, certDir string, workerAddrs []string, layout sched.Layout, log zerolog.Logger) (string, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	certs, err := wire.LoadCerts(certDir, "shadow")
	if err != nil {
		cancel()
		return "", nil, err
	}
	var peers []*wire.Peer
	closeAll := func() {
		for _, p := range peers {
			p.Close()
		}
	}
	for _, a := range workerAddrs {
		p, err := wire.Dial(ctx, a, &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop()})
		if err != nil {
			closeAll()
			cancel()
			return "", nil, err
		}
		peers = append(peers, p)
	}
	node, err := shadow.NewNode(qm, peers, layout, log)
	if err == nil {
		var ln *wire.Listener
		ln, err = wire.Listen(ctx, "127.0.0.1:0", &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleMain}, Log: zerolog.Nop()})
		if err == nil {
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer ln.Close()
				for {
					p, err := ln.Accept(ctx)
					if err != nil {
						return
					}
					node.ServeMain(ctx, p)
					p.Close()
				}
			}()
			return ln.Addr().String(), func() { cancel(); <-done; closeAll() }, nil
		}
	}
	closeAll()
	cancel()
	return "", nil, err
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
