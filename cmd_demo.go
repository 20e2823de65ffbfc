package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/odmoe/odmoe/internal/inproc"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model/synth"
)

// runDemo starts a whole swarm on this machine — workers and the main node
// as separate processes on loopback with generated certificates — on a
// generated model cached in the user cache directory, and streams the
// answer with the main node's summary.
func runDemo(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	preset := fs.String("preset", "tiny", "model to generate (and cache): "+strings.Join(synth.PresetNames(), ", "))
	workers := fs.Int("workers", 8, "worker processes")
	group := fs.Int("group", 0, "workers per group; 0 = the router's top-k, or the largest size below it that the workers split into evenly")
	prompt := fs.String("prompt", "The quick brown fox", "prompt text")
	n := fs.Int("n", 32, "tokens to generate")
	prefetch := fs.String("prefetch", "shadow", "loading policy: shadow (a quantized shadow node predicts), reactive, oracle-next, random")
	quant := fs.String("quant", "int8", "the shadow's weight format: fp16, int8, nf4")
	alignToken := fs.Int("align-token", 1, "align the shadow's token every T iterations (0 = never)")
	alignKV := fs.Int("align-kv", 1, "align the shadow's KV cache every K iterations (0 = never)")
	deviceMem := fs.String("device-mem", "1GiB", "each worker's device memory budget")
	loadBW := fs.String("load-bw", "0", "pace each worker's expert loads (bytes/s, e.g. 4GB); 0 = unpaced")
	cache := fs.String("cache", "", "cache `DIR` for the model, store and certificates (default: $ODMOE_CACHE or the user cache dir/odmoe)")
	stats := fs.String("stats", "", "write the main node's figures as JSON to `FILE`")
	var lf logFlags
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	if *workers < 1 {
		return usagef("-workers must be >= 1")
	}
	if *cache == "" {
		if *cache, err = synth.CacheDir(); err != nil {
			return err
		}
	}
	update, finish := progress.Reporter("model")
	modelDir, err := synth.Cached(*cache, *preset, 1, update) // shared with the benchmarks
	finish()
	if err != nil {
		return err
	}
	base := filepath.Join(*cache, "demo", *preset+"-seed1")
	storeDir, certDir := filepath.Join(base, "store"), filepath.Join(base, "certs")
	if err := inproc.EnsureStore(ctx, modelDir, storeDir, log); err != nil {
		return err
	}
	if err := inproc.EnsureCerts(certDir, *workers); err != nil {
		return err
	}
	sw, err := startProcSwarm(ctx, inproc.Files{Model: modelDir, Store: storeDir, Certs: certDir}, procSwarmOptions{
		Workers: *workers, Group: *group, Shadow: *prefetch == "shadow", Quant: *quant, DeviceMem: *deviceMem, LoadBW: *loadBW})
	if err != nil {
		return err
	}
	defer sw.Close()
	log.Info().Int("workers", *workers).Str("preset", *preset).Str("prefetch", *prefetch).Bool("shadow", sw.shadow != "").
		Msg("swarm started: every node a separate process on loopback QUIC with mutual TLS")

	margs := append(sw.mainArgs(*prefetch, *alignToken, *alignKV), "-prompt", *prompt, "-n", strconv.Itoa(*n), "-log-level", lf.level)
	if *stats != "" {
		margs = append(margs, "-stats", *stats)
	}
	if lf.json {
		margs = append(margs, "-log-json")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	mainCmd := exec.CommandContext(ctx, self, margs...)
	mainCmd.Stdout, mainCmd.Stderr = stdout, stderr
	if err := mainCmd.Run(); err != nil {
		sw.printLogs(stderr)
		return fmt.Errorf("main node: %w", err)
	}
	fmt.Fprintf(stdout, "(the %s model has random weights, so its text is gibberish by design; `odmoe run -role local -model %s` with the same prompt prints the same text: the swarm is lossless)\n", *preset, modelDir)
	return nil
}

// freeUDPAddr asks the kernel for a free loopback UDP port.
func freeUDPAddr() (string, error) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.LocalAddr().String(), nil
}
