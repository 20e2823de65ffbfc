package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/odmoe/odmoe/kernels"
	mainnode "github.com/odmoe/odmoe/main"
	"github.com/odmoe/odmoe/passes"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// The roles `odmoe run -role` takes.
const (
	roleLocal  = "local"
	roleMain   = "main"
	roleWorker = "worker"
	roleShadow = "shadow"
)

// runFlags are `odmoe run`'s flags; each role uses its share.
type runFlags struct {
	role string
	// local and main
	model, prompt, dump, stats string
	n, promptTokens            int
	temp, topP                 float64
	seed                       uint64
	ignoreEOS                  bool
	http, servedName           string
	maxBatch, maxQueue         int
	prefixCache                string
	prefixCacheBytes           int64
	prefillChunk               int
	// main
	workers, prefetch, shadow string
	group, miniBatch          int
	alignToken, alignKV       int
	alignAdaptive             bool
	trace, traceIters         string
	peerTimeout, dialTimeout  time.Duration
	// shadow
	quant string
	ahead int
	// worker
	listen, store, deviceMem, loadBW string
	resident, hostCache              string
	residency, placement             string
	hostCompressed                   string
	hostPreload                      bool
	// all
	threads    int
	kernelPath string
	cpuProfile string
	cluster    clusterFlags
	log        logFlags
}

func runRun(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	var f runFlags
	fs := newFlagSet("run", stderr)
	fs.StringVar(&f.role, "role", roleLocal, "node role: local (the whole model in one process; the reference the swarm must match), main, worker, shadow")
	fs.StringVar(&f.model, "model", "", "local, main: Hugging Face model directory: config.json, *.safetensors, tokenizer.json (required for these roles)")
	fs.StringVar(&f.prompt, "prompt", "The capital of France is", "local, main: prompt text")
	fs.IntVar(&f.n, "n", 64, "local, main: tokens to generate")
	fs.IntVar(&f.promptTokens, "prompt-tokens", 0, "local, main: make the prompt exactly `N` tokens: the prompt's tokens repeated (benchmarks); 0 = the prompt as it encodes")
	fs.Float64Var(&f.temp, "temperature", 0, "local, main: sampling temperature; 0 = greedy")
	fs.Float64Var(&f.topP, "top-p", 1, "local, main: nucleus sampling threshold in (0, 1]; 1 = off")
	fs.Uint64Var(&f.seed, "seed", 1, "local, main: sampling seed")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", false, "local, main: keep generating past an end-of-sequence token (benchmarks)")
	fs.StringVar(&f.dump, "dump", "", "local, main: `DIR` to write tokens.json and logits.npy ([steps, vocab] float32) into")
	fs.StringVar(&f.stats, "stats", "", "local, main: write the run's figures as JSON to `FILE`")
	fs.StringVar(&f.http, "http", "", "local, main: serve the OpenAI-compatible API on TCP `ADDR` (e.g. 127.0.0.1:8080) until interrupted, instead of answering -prompt")
	fs.StringVar(&f.servedName, "served-model-name", "", "local, main: the model's name in the API; default: the -model directory's base name")
	fs.IntVar(&f.maxBatch, "max-batch", 8, "local, main: with -http, requests generating at once")
	fs.IntVar(&f.maxQueue, "max-queue", 64, "local, main: with -http, requests waiting for a place beyond -max-batch; more are refused with 503")
	fs.StringVar(&f.prefixCache, "prefix-cache", "512MiB", "local, main: with -http, memory for finished requests' KV rows, which a request whose prompt starts with the same tokens (a system prompt, a chat's next turn) reuses instead of computing them again (least recently used dropped first); shadow: the same for its copies of the sequences; 0 = off")
	fs.IntVar(&f.prefillChunk, "prefill-chunk", passes.DefaultChunk, "local, main: with -http, the most prompt tokens one forward pass feeds, over all the prompts joining: a long prompt is fed in chunks beside the running requests' decode steps, so none of them waits for all of it; 0 = each prompt in one pass")
	fs.StringVar(&f.workers, "workers", "", "main: worker addresses HOST:PORT,HOST:PORT,... in order (required for this role)")
	fs.IntVar(&f.group, "group", 0, "main, shadow: workers per group G; 0 = the router's top-k, or the largest size below it that the workers split into evenly")
	fs.StringVar(&f.prefetch, "prefetch", "oracle-next", "main: loading policy: shadow (the shadow's predictions, needs -shadow), reactive (load when the activation arrives), oracle-next (hint each layer as soon as it is routed), random (random hints one layer ahead), resident (every worker holds the experts it owns: run the workers with -resident I/W; the fully cached reference)")
	fs.StringVar(&f.residency, "residency", "off", "main: off (OD-MoE's cacheless workers: every expert evicted once computed) or on (every expert runs on the worker that owns it, which keeps it resident while its -device-mem allows, evicting the coldest; the shadow hints owners)")
	fs.StringVar(&f.placement, "placement", "activation", "main, with -residency on: activation (experts spread over the workers by what each can hold, load and compute, then moved as their popularity shows: Prism) or uniform (expert e of layer l on worker (e + l) mod W, for good)")
	fs.IntVar(&f.miniBatch, "mini-batch", 0, "main: prefill tokens per activation; 0 = 16")
	fs.StringVar(&f.shadow, "shadow", "", "main: shadow node `ADDR` (with -prefetch shadow); shadow: its worker list is -workers")
	fs.IntVar(&f.alignToken, "align-token", 1, "main: send the shadow the sampled token every T iterations (0 = never)")
	fs.IntVar(&f.alignKV, "align-kv", 1, "main: send the shadow the new KV rows every K iterations (0 = never)")
	fs.BoolVar(&f.alignAdaptive, "align-adaptive", false, "main: choose the alignment periods online from the shadow's measured recall and rewinds, starting at every iteration, -align-token and -align-kv being the longest allowed (align.Controller)")
	fs.DurationVar(&f.peerTimeout, "peer-timeout", wire.DefaultPeerTimeout, "main, shadow: a worker (or, to the main node, the shadow) silent this long is lost: its work moves to the live workers (without the shadow: reactive loading) and it is dialed again until it answers")
	fs.DurationVar(&f.dialTimeout, "dial-timeout", wire.DefaultStartDialTimeout, "main, shadow: how long to wait at start for the workers (and the shadow) to answer, every few attempts logged; raise it when workers pin or preload experts for longer")
	fs.StringVar(&f.trace, "trace", "", "main: record the whole swarm's timeline (every node's compute, loads and messages) and write it as JSON to `FILE` (testbed draws it)")
	fs.StringVar(&f.traceIters, "trace-iters", "2:4", "main: the iterations -trace records, `FROM:TO` (iteration 1 is the prompt)")
	fs.StringVar(&f.quant, "quant", "int8", "shadow: weight format of the shadow's copy: fp16, int8, nf4")
	fs.IntVar(&f.ahead, "ahead", shadow.DefaultAhead, "shadow: run up to `N` iterations past the main node's latest alignment on the shadow's own sampled tokens, so predictions come an iteration early; an alignment with another token rewinds it (its predictions withdrawn); 0 = wait for every alignment (OD-MoE's late departure)")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:7400", "worker, shadow: UDP `ADDR` to listen on")
	fs.StringVar(&f.store, "store", "", "worker: compressed expert store `DIR` (odmoe convert) (required for this role)")
	fs.StringVar(&f.deviceMem, "device-mem", "1GiB", "worker: device memory budget (bytes; KiB, MiB, GiB suffixes)")
	fs.StringVar(&f.resident, "resident", "", "worker: `I/W`: hold for good the experts worker I (from 0) of W owns in a resident swarm (main: -prefetch resident), loaded at start: the fully cached reference")
	fs.StringVar(&f.hostCache, "host-cache", "0", "worker: keep up to this many bytes of decompressed experts in host memory (the node's CPU RAM of OD-MoE's rig): a load is then a host-to-device transfer paced by -load-bw, with no store read or decompression; 0 = off")
	fs.StringVar(&f.hostCompressed, "host-compressed", "0", "worker: keep up to this many bytes of the store's compressed chunks in host memory (ZipMoE's compressed tier: ~0.66 of an expert's BF16 bytes): a load not in -host-cache then decompresses from RAM instead of reading the store; 0 = off")
	fs.BoolVar(&f.hostPreload, "host-preload", false, "worker: fill -host-cache with the store's experts at start (layer by layer, as far as it holds), as a node holding the model in RAM would")
	fs.StringVar(&f.loadBW, "load-bw", "0", "worker: pace expert loads to this host-to-device rate in bytes/s (e.g. 4GB for PCIe 3.0 x4); 0 = unpaced")
	fs.IntVar(&f.threads, "threads", 0, "goroutines for matrix kernels; 0 = all cores")
	fs.StringVar(&f.kernelPath, "kernels", "", "kernel implementation: "+strings.Join(kernels.Paths(), ", ")+" (default: $ODMOE_KERNELS or the fastest; all give the same bits)")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write the process's CPU profile (go tool pprof) to `FILE` when it ends")
	f.cluster.register(fs)
	f.log.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := f.log.logger(stderr)
	if err != nil {
		return err
	}
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	if f.threads > 0 {
		kernels.SetThreads(f.threads)
	}
	if err := kernels.SetPath(f.kernelPath); err != nil {
		return usagef("-kernels: %v", err)
	}
	switch f.role {
	case roleLocal:
		return runLocal(ctx, &f, stdout, log)
	case roleMain:
		return runMain(ctx, &f, stdout, log)
	case roleWorker:
		return runWorker(ctx, &f, log)
	case roleShadow:
		return runShadow(ctx, &f, log)
	}
	return usagef("-role %q unknown: local, main, worker or shadow", f.role)
}

// startCPUProfile profiles the process's CPU into path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		out.Close()
	}, nil
}

// checkGenerate validates the flags local and main share.
func (f *runFlags) checkGenerate() error {
	if f.model == "" {
		return usagef("-model is required")
	}
	var err error
	if f.prefixCacheBytes, err = parseBytes(f.prefixCache); err != nil || f.prefixCacheBytes < 0 {
		return usagef("-prefix-cache: want a size such as 512MiB or 0, got %q", f.prefixCache)
	}
	switch {
	case f.n < 0:
		return usagef("-n must be >= 0, got %d", f.n)
	case f.temp < 0 || math.IsNaN(f.temp):
		return usagef("-temperature must be >= 0 (0 = greedy), got %v", f.temp)
	case !(f.topP > 0 && f.topP <= 1):
		return usagef("-top-p must be in (0, 1] (1 = off), got %v", f.topP)
	case strings.TrimSpace(f.prompt) == "" && f.promptTokens == 0:
		return usagef("-prompt is empty: give the text to continue")
	case f.promptTokens < 0:
		return usagef("-prompt-tokens must be >= 0, got %d", f.promptTokens)
	case f.maxBatch < 1:
		return usagef("-max-batch must be >= 1, got %d", f.maxBatch)
	case f.maxQueue < 0:
		return usagef("-max-queue must be >= 0, got %d", f.maxQueue)
	case f.prefillChunk < 0:
		return usagef("-prefill-chunk must be >= 0 (0 = each prompt in one pass), got %d", f.prefillChunk)
	}
	return nil
}

// serving is how local and main serve the API (-http).
func (f *runFlags) serving() mainnode.Serving {
	q := f.maxQueue
	if q == 0 {
		q = -1 // no queue: serve's 0 means its default
	}
	chunk := f.prefillChunk
	if chunk == 0 {
		chunk = -1 // each prompt whole: Serving's 0 means the default
	}
	return mainnode.Serving{Addr: f.http, ModelName: f.servedName, MaxBatch: f.maxBatch, MaxQueue: q, PrefixCacheBytes: f.prefixCacheBytes, PrefillChunk: chunk}
}

// text is the prompt and generation settings local and main share.
func (f *runFlags) text() mainnode.Text {
	return mainnode.Text{Prompt: f.prompt, MaxTokens: f.n, PromptTokens: f.promptTokens, Temperature: f.temp, TopP: f.topP,
		Seed: f.seed, IgnoreEOS: f.ignoreEOS, Dump: f.dump, Stats: f.stats}
}

func runLocal(ctx context.Context, f *runFlags, stdout io.Writer, log zerolog.Logger) error {
	if err := f.checkGenerate(); err != nil {
		return err
	}
	return mainnode.RunLocal(ctx, f.model, f.text(), f.serving(), stdout, log)
}
