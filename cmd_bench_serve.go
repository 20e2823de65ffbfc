package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/odmoe/odmoe/harness/servebench"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/testbed"
)

func runBenchServe(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	var f servebench.Options
	fs := newFlagSet("bench serve", stderr)
	f.Swarm.Register(fs)
	fs.StringVar(&f.Preset, "preset", "small", "model to generate (and cache) when -model is not given: "+strings.Join(synth.PresetNames(), ", "))
	fs.StringVar(&f.Model, "model", "", "Hugging Face model `DIR` to serve instead of a preset")
	fs.StringVar(&f.StoreDir, "store", "", "the model's expert store `DIR` (odmoe convert); default: the preset's in the cache, or -model's converted into a temporary directory")
	fs.StringVar(&f.Cache, "cache", "", "cache `DIR` for the preset's model and store (default: $ODMOE_CACHE or the user cache dir/odmoe)")
	clients := fs.String("clients", "1,2,4,8", "comma-separated counts N of concurrent streaming clients, one measurement each")
	fs.IntVar(&f.Requests, "requests", 2, "requests each client sends, one after another")
	fs.IntVar(&f.MaxTokens, "max-tokens", 64, "tokens each request generates (ignore_eos: always this many)")
	fs.IntVar(&f.PromptTokens, "prompt-tokens", 16, "prompt tokens of each request (random token ids, distinct per request)")
	fs.IntVar(&f.MaxBatch, "max-batch", 0, "the main node's -max-batch; 0 = the largest -clients")
	fs.DurationVar(&f.ReadyTimeout, "ready-timeout", 10*time.Minute, "how long to wait for the swarm to answer /healthz (the shadow quantizes its copy first)")
	fs.StringVar(&f.Out, "out", "", "`DIR` to write report.json and report.md into")
	fs.IntVar(&f.TextRounds, "text-rounds", 0, "after the rows, `N` rounds on the same swarm (its workers and shadow): the API's main node stopped, text mode's (odmoe run -role main -prompt, -prompt-tokens and -max-tokens, ignoring EOS) run, the API's started again and measured at 1 client: its decode tokens/s (1000 / the node's mean inter-token time) against text mode's")
	drafts := fs.String("drafts", "", "comma-separated main node -draft settings (off, auto, K), each measured at every -clients count and kind in turn, every round, on the same workers and shadow (the main node started again with each); empty = -draft's alone")
	kinds := fs.String("kinds", "greedy", "comma-separated kinds of request, each measured at every -clients count on the same swarm, in turn: greedy, tX (temperature X, e.g. t0.7), penalties (t0.7 with presence and frequency penalties of 0.5), greedy-penalties (greedy with those penalties), json (t0.7, a chat completion following a JSON schema)")
	fs.IntVar(&f.Rounds, "rounds", 1, "measure every kind at every -clients count `N` times, in rounds (a drift of the machine's speed weighs on each kind alike); a table of medians by kind follows")
	fs.Uint64Var(&f.Seed, "seed", 1, "the requests' seeds start here (each request its own)")
	fs.StringVar(&f.JoinRate, "join-rate", "", "after the rows, -rounds rounds of a worker joining the serving swarm: the last worker killed and the streams measured at the first -clients count, then it started again on an empty directory filling its share from the main node (-store-listen) at this -fetch-rate (e.g. 20MB) and the streams measured again; empty = none")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	if f.Clients, err = runflags.ParseInts(*clients); err != nil {
		return usagef("-clients: %v", err)
	}
	if *drafts != "" {
		for _, d := range strings.Split(*drafts, ",") {
			if _, err := mainnode.ParseDraft(d); err != nil {
				return usagef("-drafts: %v", err)
			}
			f.Drafts = append(f.Drafts, d)
		}
		if f.Swarm.Prefetch != "shadow" {
			return usagef("-drafts checks the shadow's guesses: it needs -prefetch shadow")
		}
	}
	if f.Kinds, err = servebench.ParseKinds(*kinds); err != nil {
		return usagef("-kinds: %v", err)
	}
	switch p, err := mainnode.ParsePrefetch(f.Swarm.Prefetch); {
	case err != nil:
		return usagef("-prefetch: %v", err)
	case p == mainnode.Resident:
		return usagef("-prefetch resident is not a loading policy bench serve runs")
	}
	if _, err := runflags.ParseQuant(f.Swarm.Quant); err != nil {
		return usagef("-quant: %v", err)
	}
	switch {
	case f.Swarm.Workers < 1 || f.Requests < 1 || f.MaxTokens < 1 || f.PromptTokens < 1:
		return usagef("-workers, -requests, -max-tokens and -prompt-tokens must be >= 1")
	case f.MaxBatch < 0 || f.TextRounds < 0 || f.Rounds < 1:
		return usagef("-max-batch and -text-rounds must be >= 0, -rounds >= 1")
	case f.StoreDir != "" && f.Model == "":
		return usagef("-store needs -model (a preset's store is kept in the cache)")
	}
	if f.JoinRate != "" {
		if r, err := runflags.ParseBytes(f.JoinRate); err != nil || r <= 0 {
			return usagef("-join-rate %q: want bytes a second such as 20MB", f.JoinRate)
		}
		if f.Swarm.Workers < 2 || f.Swarm.Residency == "on" {
			return usagef("-join-rate: a worker joins a swarm of 2 workers or more, without -residency")
		}
	}
	if f.MaxBatch == 0 {
		f.MaxBatch = slices.Max(f.Clients)
	}
	rep := &servebench.Report{Date: time.Now().UTC().Format(time.RFC3339), Command: "odmoe bench serve " + strings.Join(args, " "),
		Machine: testbed.ReadMachine(), LoadBefore: testbed.LoadAvg(), Workers: f.Swarm.Workers, Prefetch: f.Swarm.Prefetch, Residency: f.Swarm.Residency, MaxBatch: f.MaxBatch,
		Requests: f.Requests, PromptTokens: f.PromptTokens, MaxTokens: f.MaxTokens, Rounds: f.Rounds, Seed: f.Seed}
	for _, k := range f.Kinds {
		rep.Kinds = append(rep.Kinds, k.Name)
	}
	if f.Swarm.Prefetch == string(mainnode.Shadow) {
		rep.Quant = f.Swarm.Quant
	}
	if err := servebench.Run(ctx, &f, rep, log); err != nil {
		return err
	}
	rep.LoadAfter = testbed.LoadAvg()
	servebench.WriteMarkdown(stdout, rep)
	if f.Out != "" {
		if err := servebench.WriteReport(f.Out, rep); err != nil {
			return err
		}
		log.Info().Str("dir", f.Out).Msg("report.json and report.md written")
	}
	for _, r := range rep.Rows {
		if r.Failed > 0 {
			return fmt.Errorf("%d of %d requests with %d clients failed", r.Failed, r.Requests, r.Clients)
		}
	}
	return nil
}
