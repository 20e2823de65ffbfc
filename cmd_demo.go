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
	"syscall"
	"time"

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
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logDir, err := os.MkdirTemp("", "odmoe-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(logDir)

	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var addrs []string
	var procs []*exec.Cmd
	for i := range *workers {
		addr, err := freeUDPAddr()
		if err != nil {
			return err
		}
		name := fmt.Sprintf("w%d", i+1)
		lf, err := os.Create(filepath.Join(logDir, name+".log"))
		if err != nil {
			return err
		}
		defer lf.Close()
		cmd := exec.CommandContext(wctx, self, "run", "-role", "worker", "-listen", addr, "-store", storeDir,
			"-certs", certDir, "-name", name, "-device-mem", *deviceMem, "-load-bw", *loadBW, "-log-level", "warn")
		cmd.Stdout, cmd.Stderr = lf, lf
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting worker %s: %w", name, err)
		}
		procs = append(procs, cmd)
		addrs = append(addrs, addr)
	}
	defer func() {
		stopWorkers()
		for _, p := range procs {
			p.Wait()
		}
	}()
	var shadowAddr string
	if *prefetch == "shadow" {
		if shadowAddr, err = freeUDPAddr(); err != nil {
			return err
		}
		lf, err := os.Create(filepath.Join(logDir, "shadow.log"))
		if err != nil {
			return err
		}
		defer lf.Close()
		cmd := exec.CommandContext(wctx, self, "run", "-role", "shadow", "-model", modelDir, "-quant", *quant,
			"-listen", shadowAddr, "-workers", strings.Join(addrs, ","), "-group", strconv.Itoa(*group),
			"-certs", certDir, "-name", "shadow", "-log-level", "warn")
		cmd.Stdout, cmd.Stderr = lf, lf
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting the shadow: %w", err)
		}
		procs = append(procs, cmd)
	}
	log.Info().Int("workers", *workers).Str("preset", *preset).Str("prefetch", *prefetch).Bool("shadow", shadowAddr != "").
		Msg("swarm started: every node a separate process on loopback QUIC with mutual TLS")

	margs := []string{"run", "-role", "main", "-model", modelDir, "-workers", strings.Join(addrs, ","),
		"-certs", certDir, "-name", "main", "-prompt", *prompt, "-n", strconv.Itoa(*n), "-prefetch", *prefetch,
		"-group", strconv.Itoa(*group), "-log-level", lf.level}
	if *stats != "" {
		margs = append(margs, "-stats", *stats)
	}
	if shadowAddr != "" {
		margs = append(margs, "-shadow", shadowAddr, "-align-token", strconv.Itoa(*alignToken), "-align-kv", strconv.Itoa(*alignKV))
	}
	if lf.json {
		margs = append(margs, "-log-json")
	}
	mainCmd := exec.CommandContext(ctx, self, margs...)
	mainCmd.Stdout, mainCmd.Stderr = stdout, stderr
	if err := mainCmd.Run(); err != nil {
		logs, _ := filepath.Glob(filepath.Join(logDir, "*.log"))
		for _, l := range logs {
			if b, rerr := os.ReadFile(l); rerr == nil && len(b) > 0 {
				fmt.Fprintf(stderr, "--- %s ---\n%s", filepath.Base(l), b)
			}
		}
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
