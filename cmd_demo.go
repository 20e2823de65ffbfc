package main

import (
	"context"
	"io"
	"strings"

	"github.com/odmoe/odmoe/harness/demo"
	"github.com/odmoe/odmoe/model/synth"
)

// runDemo starts a whole swarm on this machine — workers and the main node
// as separate processes on loopback with generated certificates — on a
// generated model cached in the user cache directory. With -prompt it
// streams the answer with the main node's summary and exits; without, the
// main node serves the OpenAI-compatible API until interrupted.
func runDemo(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	var o demo.Options
	o.Swarm.Register(fs)
	fs.StringVar(&o.Preset, "preset", "tiny", "model to generate (and cache): "+strings.Join(synth.PresetNames(), ", "))
	fs.StringVar(&o.Prompt, "prompt", "", "answer this prompt once, print the run's summary and exit; without it the swarm serves the API (-http) until interrupted")
	fs.IntVar(&o.N, "n", 32, "with -prompt: tokens to generate")
	fs.StringVar(&o.HTTP, "http", demo.DefaultHTTP, "without -prompt: serve the OpenAI-compatible API on TCP `ADDR`; when the default's port is taken, a free one is used")
	fs.IntVar(&o.AlignToken, "align-token", 1, "align the shadow's token every T iterations (0 = never)")
	fs.IntVar(&o.AlignKV, "align-kv", 1, "align the shadow's KV cache every K iterations (0 = never)")
	fs.StringVar(&o.Cache, "cache", "", "cache `DIR` for the model, store and certificates (default: $ODMOE_CACHE or the user cache dir/odmoe)")
	fs.StringVar(&o.Stats, "stats", "", "write the main node's figures as JSON to `FILE`")
	o.Log.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(o.Log, stderr)
	if err != nil {
		return err
	}
	if o.Swarm.Workers < 1 {
		return usagef("-workers must be >= 1")
	}
	o.HTTPChosen = flagGiven(fs, "http")
	if o.Prompt != "" && o.HTTPChosen {
		return usagef("-prompt answers once and exits, -http serves: give one of them")
	}
	return demo.Run(ctx, o, log, stdout, stderr)
}
