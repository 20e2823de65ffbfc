package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/odmoe/odmoe/harness/kernelbench"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/runflags"
)

// benchTargets are what `odmoe bench TARGET` measures; each parses its own
// flags.
var benchTargets = map[string]command{
	"kernels": {"DRAM bandwidth, matvec GB/s against it, prefill GFLOP/s, local decode pure Go vs SIMD", runBenchKernels},
	"rig":     {"run local, resident, reactive and shadow-driven modes on a rig (testbed/bench); report.md, timeline.svg", runBenchRig},
	"serve":   {"serve the OpenAI API from a swarm of processes; N streaming clients: tokens/s, TTFT, inter-token latency, expert bytes per token", runBenchServe},
}

func runBench(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		w := stdout // asked for: on stdout; a mistake (no target): with the error, on stderr
		if len(args) == 0 {
			w = stderr
		}
		fmt.Fprintln(w, "Usage: odmoe bench TARGET [flags]   (odmoe bench TARGET -h for its flags)\n\nTargets:")
		for _, name := range slices.Sorted(maps.Keys(benchTargets)) {
			fmt.Fprintf(w, "  %-9s %s\n", name, benchTargets[name].summary)
		}
		if len(args) == 0 {
			return usagef("bench needs a target")
		}
		return flag.ErrHelp
	}
	t, ok := benchTargets[args[0]]
	if !ok {
		return usagef("unknown bench target %q", args[0])
	}
	return t.run(ctx, args[1:], stdin, stdout, stderr)
}

func runBenchKernels(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench kernels", stderr)
	jsonOut := fs.String("json", "", "also write the results as JSON to this file")
	path := fs.String("kernels", "", "SIMD path to measure against pure Go: "+strings.Join(kernels.Paths(), ", ")+" (default: $ODMOE_KERNELS or the fastest)")
	setMiB := fs.Int("set-mib", 512, "least MiB of weights per dtype a matvec rotates through (more than the L3 cache)")
	dramMiB := fs.Int("dram-mib", 1024, "MiB read to measure DRAM bandwidth")
	rounds := fs.Int("rounds", 7, "rounds of the bandwidth and matvec measurements, interleaved so that all see the same machine load")
	threadList := fs.String("threads", "1,2", "comma-separated thread counts")
	dtypeList := fs.String("dtypes", "BF16,F16,F32", "comma-separated weight dtypes for matvec (BF16P: BF16 packed, as -weights packed holds it; its GB/s are of its own bytes, 0.81 of the weights' BF16)")
	tokenList := fs.String("prefill-tokens", "4,16,64", "comma-separated tokens per prefill matmul")
	decodeTokens := fs.Int("decode-tokens", 32, "decode steps timed per path on the small preset; 0 skips decode")
	llamaTimes := fs.String("llama-times", "", "`BIN`: testbed/llama/token_times.cpp built against llama.cpp (testbed/decode-spread builds it beside the llama-side-by-side tool's llama.cpp build): its steps run between the side-by-side run's blocks; needs -llama-gguf")
	llamaGGUF := fs.String("llama-gguf", "", "`FILE`: a GGUF of the small preset (llama-side-by-side's) for -llama-times")
	cache := fs.String("cache", "", "`DIR` holding models/small-seed1, generated there if absent, ~1.5 GB (default: $ODMOE_CACHE or the user cache dir/odmoe)")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	if err := kernels.SetPath(*path); err != nil {
		return usagef("-kernels: %v", err)
	}
	threads, err := runflags.ParseInts(*threadList)
	if err != nil {
		return usagef("-threads: %v", err)
	}
	var dtypes []kernels.DType
	for _, name := range strings.Split(*dtypeList, ",") {
		name = strings.TrimSpace(name)
		if name == kernels.BF16P.String() { // odmoe's own, not a checkpoint's
			dtypes = append(dtypes, kernels.BF16P)
			continue
		}
		dt, err := kernels.ParseDType(name)
		if err != nil {
			return usagef("-dtypes: %v (or BF16P: BF16 packed as -weights packed holds it)", err)
		}
		dtypes = append(dtypes, dt)
	}
	tokens, err := runflags.ParseInts(*tokenList)
	if err != nil {
		return usagef("-prefill-tokens: %v", err)
	}
	if (*llamaTimes == "") != (*llamaGGUF == "") {
		return usagef("-llama-times and -llama-gguf go together")
	}
	if *rounds < 1 || *setMiB < 1 || *dramMiB < 1 || *decodeTokens < 0 {
		return usagef("-rounds, -set-mib and -dram-mib must be >= 1, -decode-tokens >= 0")
	}
	if *cache == "" {
		if *cache, err = synth.CacheDir(); err != nil {
			return err
		}
	}
	rep, err := kernelbench.Run(ctx, kernelbench.Options{SetMiB: *setMiB, DRAMMiB: *dramMiB, Rounds: *rounds, Threads: threads, DTypes: dtypes,
		PrefillTokens: tokens, DecodeTokens: *decodeTokens, ModelDir: filepath.Join(*cache, "models", "small-seed1"),
		Llama: kernelbench.LlamaOptions{Times: *llamaTimes, GGUF: *llamaGGUF}}, log)
	if err != nil {
		return err
	}
	kernelbench.PrintReport(stdout, rep)
	if *jsonOut != "" {
		if err := rep.WriteJSON(*jsonOut); err != nil {
			return err
		}
	}
	return rep.Check()
}
