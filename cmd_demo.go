package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/odmoe/odmoe/runflags"
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
	fs.IntVar(&o.AlignToken, "align-token", 1, "align the shadow's token every T passes (0 = never)")
	fs.IntVar(&o.AlignKV, "align-kv", 1, "align the shadow's KV cache every K passes (0 = never)")
	fs.StringVar(&o.Cache, "cache", "", "cache `DIR` for the model, store and certificates (default: $ODMOE_CACHE or the user cache dir/odmoe)")
	fs.StringVar(&o.Stats, "stats", "", "write the main node's figures as JSON to `FILE`")
	fs.StringVar(&o.APIKey, "api-key", "", "without -prompt: require `KEY` as \"Authorization: Bearer KEY\" (default $ODMOE_API_KEY)")
	fs.StringVar(&o.CORSOrigin, "cors-origin", "", "without -prompt: let browser pages of these `ORIGINS` (comma-separated; * for any) call the API")
	fs.IntVar(&o.Swarm.ListenBase, "listen-base", 0, "serve the API on `PORT` and put the workers and the shadow on the ports after it (loopback UDP PORT+1, +2, ...); 0: -http, and free ports")
	o.Log.Register(fs)
	// run's serving flags, passed on to the main node as given
	o.Serving = runflags.For(runflags.RoleMain)
	served := flag.NewFlagSet("run", flag.ContinueOnError)
	o.Serving.Register(served)
	for _, name := range demo.ServingFlags {
		f := served.Lookup(name)
		usage := strings.TrimPrefix(f.Usage, "local, main: ")
		usage = strings.TrimPrefix(usage, "with -http, ")
		fs.Var(f.Value, name, "without -prompt: the main node's -"+name+": "+usage)
	}
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
	if base := o.Swarm.ListenBase; base != 0 {
		if base < 1024 || base > 65535-o.Swarm.Workers-8 {
			return usagef("-listen-base %d: a port from 1024 with room for the nodes after it", base)
		}
		if o.HTTPChosen {
			return usagef("-listen-base puts the API on its PORT: give it or -http, not both")
		}
		if o.Prompt == "" {
			o.HTTP, o.HTTPChosen = fmt.Sprintf("127.0.0.1:%d", base), true
		}
	}
	if o.Prompt != "" && o.HTTPChosen {
		return usagef("-prompt answers once and exits, -http serves: give one of them")
	}
	return demo.Run(ctx, o, log, stdout, stderr)
}
