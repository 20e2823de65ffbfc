package main

import (
	"context"
	"io"
	"strconv"
	"strings"

	"github.com/odmoe/odmoe/harness/tunealign"
	"github.com/odmoe/odmoe/runflags"
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
	repeat := fs.Int("repeat", 3, "runs of each (T, K) pair, interleaved with the other pairs': the table shows their median and spread")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if !flagGiven(fs, "log-level") {
		lf.Level = "warn" // the nodes' connect and disconnect lines would bury the table
	}
	if *repeat < 1 {
		return usagef("-repeat must be >= 1, got %d", *repeat)
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	if *dir == "" {
		return usagef("-model is required")
	}
	dt, err := runflags.ParseQuant(*quant)
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
	bw, err := runflags.ParseBytes(*loadBW)
	if err != nil || bw < 0 {
		return usagef("-load-bw %q: want bytes per second", *loadBW)
	}
	return tunealign.Run(ctx, tunealign.Options{ModelDir: *dir, StoreDir: *storeDir, Quant: dt, QuantName: *quant, Periods: periods, Workers: *workers, Group: *group,
		LoadBytesSec: float64(bw), Prompt: *prompt, N: *n, Repeat: *repeat}, stdout, log)
}
