package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/harness/procswarm"
	"github.com/odmoe/odmoe/harness/servebench"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/testbed"
)

// runDemo starts a whole swarm on this machine — workers and the main node
// as separate processes on loopback with generated certificates — on a
// generated model cached in the user cache directory. With -prompt it
// streams the answer with the main node's summary and exits; without, the
// main node serves the OpenAI-compatible API until interrupted.
func runDemo(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	var o procswarm.Options
	o.Register(fs)
	preset := fs.String("preset", "tiny", "model to generate (and cache): "+strings.Join(synth.PresetNames(), ", "))
	prompt := fs.String("prompt", "", "answer this prompt once, print the run's summary and exit; without it the swarm serves the API (-http) until interrupted")
	n := fs.Int("n", 32, "with -prompt: tokens to generate")
	httpAddr := fs.String("http", defaultDemoHTTP, "without -prompt: serve the OpenAI-compatible API on TCP `ADDR`; when the default's port is taken, a free one is used")
	alignToken := fs.Int("align-token", 1, "align the shadow's token every T iterations (0 = never)")
	alignKV := fs.Int("align-kv", 1, "align the shadow's KV cache every K iterations (0 = never)")
	cache := fs.String("cache", "", "cache `DIR` for the model, store and certificates (default: $ODMOE_CACHE or the user cache dir/odmoe)")
	stats := fs.String("stats", "", "write the main node's figures as JSON to `FILE`")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	if o.Workers < 1 {
		return usagef("-workers must be >= 1")
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "http" })
	if *prompt != "" && explicit {
		return usagef("-prompt answers once and exits, -http serves: give one of them")
	}
	if *prompt == "" {
		addr, err := demoHTTPAddr(*httpAddr, explicit)
		if err != nil {
			return err
		}
		if addr != *httpAddr && !explicit {
			log.Warn().Str("taken", *httpAddr).Str("addr", addr).Msg("the default API port is taken: serving on a free one (-http ADDR to choose)")
		}
		*httpAddr = addr
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
	if err := testbed.EnsureStore(ctx, modelDir, storeDir, log); err != nil {
		return err
	}
	if err := inproc.EnsureCerts(certDir, o.Workers); err != nil {
		return err
	}
	sw, err := procswarm.Start(ctx, inproc.Files{Model: modelDir, Store: storeDir, Certs: certDir}, o)
	if err != nil {
		return err
	}
	defer sw.Close()
	log.Info().Int("workers", o.Workers).Str("preset", *preset).Str("prefetch", o.Prefetch).Bool("shadow", sw.Shadow() != "").
		Msg("swarm started: every node a separate process on loopback QUIC with mutual TLS")

	if *prompt == "" {
		m := sw.MainFlags(o.Prefetch, *alignToken, *alignKV)
		m.HTTP, m.ServedName, m.Log = *httpAddr, *preset, lf
		return serveDemo(ctx, sw, m.Args(), *httpAddr, *preset, stdout, stderr)
	}
	m := sw.MainFlags(o.Prefetch, *alignToken, *alignKV)
	m.Prompt, m.N, m.Stats, m.Log = *prompt, *n, *stats, lf
	margs := m.Args()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	mainCmd := exec.CommandContext(ctx, self, margs...)
	mainCmd.Stdout, mainCmd.Stderr = stdout, stderr
	if err := mainCmd.Run(); err != nil {
		sw.PrintLogs(stderr)
		return fmt.Errorf("main node: %w", err)
	}
	fmt.Fprintf(stdout, "(the %s model has random weights, so its text is gibberish by design; `odmoe run -role local -model %s` with the same prompt prints the same text: the swarm is lossless)\n", *preset, modelDir)
	return nil
}

// defaultDemoHTTP is where `odmoe demo` serves the API by default.
const defaultDemoHTTP = "127.0.0.1:8080"

// demoHTTPAddr checks that the API's address can be listened on and
// returns it with its port resolved (":0" becomes the free port the kernel
// picks). When the port is taken the default gives way to a free port;
// an address the user chose is an error.
func demoHTTPAddr(addr string, explicit bool) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err == nil {
		defer l.Close()
		return l.Addr().String(), nil
	}
	if explicit {
		return "", fmt.Errorf("-http %s: cannot serve there (%w): choose another ADDR, or port 0 for any free one", addr, err)
	}
	if addr, err = procswarm.FreeTCPAddr(); err != nil {
		return "", err
	}
	return addr, nil
}

// serveDemo runs the main node with margs (-http addr) on sw, prints how
// to call the API once it is ready, and keeps the swarm up until ctx
// ends (Ctrl-C, SIGTERM): then the main node stops first, the workers and
// the shadow after it (the caller's sw.Close).
func serveDemo(ctx context.Context, sw *procswarm.Swarm, margs []string, addr, model string, stdout, stderr io.Writer) error {
	mainNode, err := sw.RunNode(ctx, "main", margs...)
	if err != nil {
		return err
	}
	defer mainNode.Stop()
	c := servebench.NewClient("http://"+addr, &http.Client{Timeout: 5 * time.Second})
	if err := c.WaitReady(ctx, mainNode.Exited(), 10*time.Minute); err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting
		}
		sw.PrintLogs(stderr)
		return fmt.Errorf("main node: %w", err)
	}
	api := c.Base() + "/v1"
	fmt.Fprintf(stdout, "The swarm serves the OpenAI-compatible API on %s (model %q; its weights are random, so its text is gibberish by design).\n", api, model)
	fmt.Fprintf(stdout, "Ctrl-C stops every node. Try, in another terminal, a streaming chat completion:\n\n")
	fmt.Fprintf(stdout, "  curl -N %s/chat/completions -H 'Content-Type: application/json' -d '{\"model\": %q, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 32, \"stream\": true}'\n\n", api, model)
	fmt.Fprintf(stdout, "and a completion:\n\n")
	fmt.Fprintf(stdout, "  curl %s/completions -H 'Content-Type: application/json' -d '{\"model\": %q, \"prompt\": \"The quick brown fox\", \"max_tokens\": 32}'\n\n", api, model)
	select {
	case <-ctx.Done():
		fmt.Fprintln(stdout, "stopping the swarm")
		if err := mainNode.Stop(); err != nil {
			sw.PrintLogs(stderr)
			return fmt.Errorf("main node: %w", err)
		}
		return nil
	case <-mainNode.Exited():
		sw.PrintLogs(stderr)
		if mainNode.Err() == nil {
			return errors.New("main node: exited while serving")
		}
		return fmt.Errorf("main node: %w", mainNode.Err())
	}
}
