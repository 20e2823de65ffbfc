// Package demo is `odmoe demo`: a whole swarm on this machine (workers,
// an int8 shadow and the main node as separate processes on loopback QUIC
// with mutual TLS) on a generated model cached in the user cache
// directory, answering one prompt or serving the OpenAI-compatible API.
// The command line (cmd_demo.go) only parses flags into Options.
package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/odmoe/odmoe/serve"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/harness/procswarm"
	"github.com/odmoe/odmoe/harness/servebench"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/testbed"
	"github.com/rs/zerolog"
)

// DefaultHTTP is where the demo serves the API unless told otherwise.
const DefaultHTTP = "127.0.0.1:8080"

// Options are a demo's settings.
type Options struct {
	Swarm  procswarm.Options
	Preset string // the model to generate (synth.PresetNames)
	// Prompt, when set, is answered once (N tokens) and the demo exits;
	// else the main node serves the API on HTTP until ctx ends.
	Prompt string
	N      int
	HTTP   string
	// HTTPChosen says HTTP was the user's: taken, it is an error rather
	// than a reason to serve on a free port.
	HTTPChosen          bool
	AlignToken, AlignKV int
	Cache               string // the model's, store's and certificates' directory; "" = synth.CacheDir()
	Stats               string // the main node's figures as JSON to this file
	Log                 runflags.Log
	// APIKey ("": $ODMOE_API_KEY) and CORSOrigin are the main node's
	// -api-key and -cors-origin when it serves
	APIKey, CORSOrigin string
	// Serving holds the main node's ServingFlags when it serves
	Serving runflags.Flags
}

// ServingFlags are run's serving flags the demo passes on to its main
// node.
var ServingFlags = []string{"served-model-name", "max-batch", "max-queue", "max-stops", "prefix-cache", "prefill-chunk", "no-console"}

// Run prepares the model, its store and the certificates (cached), starts
// the swarm's processes and runs the main node as o says; stdout gets the
// answer (or how to call the API), stderr the nodes' logs if one fails.
func Run(ctx context.Context, o Options, log zerolog.Logger, stdout, stderr io.Writer) error {
	if o.Prompt == "" {
		addr, err := HTTPAddr(o.HTTP, o.HTTPChosen)
		if err != nil {
			return err
		}
		if addr != o.HTTP && !o.HTTPChosen {
			log.Warn().Str("taken", o.HTTP).Str("addr", addr).Msg("the default API port is taken: serving on a free one (-http ADDR to choose)")
		}
		o.HTTP = addr
	}
	var err error
	if o.Cache == "" {
		if o.Cache, err = synth.CacheDir(); err != nil {
			return err
		}
	}
	update, finish := progress.Reporter("model")
	modelDir, err := synth.Cached(o.Cache, o.Preset, 1, update) // shared with the benchmarks
	finish()
	if err != nil {
		return err
	}
	base := filepath.Join(o.Cache, "demo", o.Preset+"-seed1")
	storeDir, certDir := filepath.Join(base, "store"), filepath.Join(base, "certs")
	if err := testbed.EnsureStore(ctx, modelDir, storeDir, log); err != nil {
		return err
	}
	if err := inproc.EnsureCerts(certDir, o.Swarm.Workers); err != nil {
		return err
	}
	sw, err := procswarm.Start(ctx, inproc.Files{Model: modelDir, Store: storeDir, Certs: certDir}, o.Swarm)
	if err != nil {
		return err
	}
	defer sw.Close()
	log.Info().Int("workers", o.Swarm.Workers).Str("preset", o.Preset).Str("prefetch", o.Swarm.Prefetch).Bool("shadow", sw.Shadow() != "").
		Msg("swarm started: every node a separate process on loopback QUIC with mutual TLS")

	m := sw.MainFlags(o.Swarm.Prefetch, o.AlignToken, o.AlignKV)
	m.Log = o.Log
	if o.Prompt == "" {
		m.HTTP, m.ServedName, m.CORSOrigin = o.HTTP, cmp.Or(o.Serving.ServedName, o.Preset), o.CORSOrigin
		if o.Serving.Role != "" {
			m.MaxBatch, m.MaxQueue, m.MaxStops, m.PrefixCache, m.PrefillChunk, m.NoConsole =
				o.Serving.MaxBatch, o.Serving.MaxQueue, o.Serving.MaxStops, o.Serving.PrefixCache, o.Serving.PrefillChunk, o.Serving.NoConsole
		}
		key := cmp.Or(o.APIKey, os.Getenv("ODMOE_API_KEY"))
		if key != "" {
			// to the main node through its environment: a flag would
			// show in the process list
			if err := os.Setenv("ODMOE_API_KEY", key); err != nil {
				return err
			}
		}
		return serveSwarm(ctx, sw, m.Args(), o.HTTP, m.ServedName, key != "", stdout, stderr)
	}
	m.Prompt, m.N, m.Stats = o.Prompt, o.N, o.Stats
	self, err := os.Executable()
	if err != nil {
		return err
	}
	mainCmd := exec.CommandContext(ctx, self, m.Args()...)
	mainCmd.Stdout, mainCmd.Stderr = stdout, stderr
	if err := mainCmd.Run(); err != nil {
		sw.PrintLogs(stderr)
		return fmt.Errorf("main node: %w", err)
	}
	fmt.Fprintf(stdout, "(the %s model has random weights, so its text is gibberish by design; `odmoe run -role local -model %s` with the same prompt prints the same text: the swarm is lossless)\n", o.Preset, modelDir)
	return nil
}

// HTTPAddr checks that the API's address can be listened on and returns
// it with its port resolved (":0" becomes the free port the kernel picks).
// When the port is taken the default gives way to a free port; an address
// the user chose is an error.
func HTTPAddr(addr string, chosen bool) (string, error) {
	l, err := serve.Listen(addr)
	if err == nil {
		defer l.Close()
		return l.Addr().String(), nil
	}
	if chosen {
		return "", err
	}
	if addr, err = procswarm.FreeTCPAddr(); err != nil {
		return "", err
	}
	return addr, nil
}

// serveSwarm runs the main node with margs (-http addr) on sw, prints how to
// call the API once it is ready, and keeps the swarm up until ctx ends
// (Ctrl-C, SIGTERM): then the main node stops first, the workers and the
// shadow after it (the caller's sw.Close).
func serveSwarm(ctx context.Context, sw *procswarm.Swarm, margs []string, addr, model string, keyed bool, stdout, stderr io.Writer) error {
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
	logs := "removed when the swarm stops; -logs DIR keeps them"
	if sw.KeepsLogs() {
		logs = "kept"
	}
	fmt.Fprintf(stdout, "Each node logs to %s (%s).\n", filepath.Join(sw.LogDir(), "NAME.log"), logs)
	fmt.Fprintf(stdout, "Open the swarm's console (chat, and a tile per node) in a browser: %s/\n", c.Base())
	auth := ""
	if keyed {
		fmt.Fprintf(stdout, "The API asks for its key (-api-key): the console asks for it once; curl sends it from $ODMOE_API_KEY.\n")
		auth = ` -H "Authorization: Bearer $ODMOE_API_KEY"`
	}
	fmt.Fprintf(stdout, "Ctrl-C stops every node. Try, in another terminal, a streaming chat completion:\n\n")
	fmt.Fprintf(stdout, "  curl -N %s/chat/completions%s -H 'Content-Type: application/json' -d '{\"model\": %q, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 32, \"stream\": true}'\n\n", api, auth, model)
	fmt.Fprintf(stdout, "and a completion:\n\n")
	fmt.Fprintf(stdout, "  curl %s/completions%s -H 'Content-Type: application/json' -d '{\"model\": %q, \"prompt\": \"The quick brown fox\", \"max_tokens\": 32}'\n\n", api, auth, model)
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
