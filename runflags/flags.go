// Package runflags is the one typed description of `odmoe run`'s flags:
// the command registers them (Register), and whoever launches a node (the
// demo, bench serve, the testbed) fills the same fields and renders the
// node's command line (Args), so a launcher cannot name a flag the node
// does not have.
package runflags

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/passes"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/wire"
)

// The roles `odmoe run -role` takes.
const (
	RoleLocal  = "local"
	RoleMain   = "main"
	RoleWorker = "worker"
	RoleShadow = "shadow"
	RoleStage  = "stage"
)

// Flags are `odmoe run`'s flags; each role uses its share (their usage
// says which).
type Flags struct {
	Role string
	// local and main
	Model, Prompt, Dump, Stats string
	N, PromptTokens            int
	Temperature, TopP          float64
	Seed                       uint64
	IgnoreEOS                  bool
	HTTP, ServedName           string
	APIKey                     string
	CORSOrigin                 string
	NoConsole                  bool
	MaxBatch, MaxQueue         int
	MaxStops                   int
	PrefixCache                string
	PrefillChunk               int
	// main
	Workers, Prefetch, Shadow string
	Group, MiniBatch          int
	AlignToken, AlignKV       int
	AlignAdaptive             bool
	Draft                     string
	Trace, TraceIters         string
	PeerTimeout, DialTimeout  time.Duration
	Residency, Placement      string
	// shadow
	Quant          string
	Ahead          int
	Layers, Stages string
	Mem            string
	Weights        string
	Context        int
	// worker
	Listen, Store, DeviceMem, LoadBW string
	Device                           string
	Resident, HostCache              string
	HostCompressed                   string
	FetchFrom                        string
	FetchRate                        string
	StoreListen, StoreRelays         string
	HostPreload                      bool
	// all
	Threads    int
	Kernels    string
	CPUProfile string
	Cluster    Cluster
	Log        Log
}

// Cluster are a node's flags for its place in the cluster, which every
// networked command shares.
type Cluster struct {
	Certs, Name string
	Insecure    bool
	NetDelay    time.Duration
}

// Log are the logging flags every command shares.
type Log struct {
	JSON  bool
	Level string
}

// Register registers f's flags on fs, each field set to its default.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Role, "role", "local", "node role: local (the whole model in one process; the reference the swarm must match), main, worker, shadow, stage (a range of the main node's layers, -layers, their experts on -workers)")
	fs.StringVar(&f.Model, "model", "", "local, main: Hugging Face model directory: config.json, *.safetensors, tokenizer.json (required for these roles)")
	fs.StringVar(&f.Prompt, "prompt", "The capital of France is", "local, main: prompt text")
	fs.IntVar(&f.N, "n", 64, "local, main: tokens to generate")
	fs.IntVar(&f.PromptTokens, "prompt-tokens", 0, "local, main: make the prompt exactly `N` tokens: the prompt's tokens repeated (benchmarks); 0 = the prompt as it encodes")
	fs.Float64Var(&f.Temperature, "temperature", 0, "local, main: sampling temperature; 0 = greedy")
	fs.Float64Var(&f.TopP, "top-p", 1, "local, main: nucleus sampling threshold in (0, 1]; 1 = off")
	fs.Uint64Var(&f.Seed, "seed", 1, "local, main: sampling seed")
	fs.BoolVar(&f.IgnoreEOS, "ignore-eos", false, "local, main: keep generating past an end-of-sequence token (benchmarks)")
	fs.StringVar(&f.Dump, "dump", "", "local, main: `DIR` to write tokens.json and logits.npy ([steps, vocab] float32) into")
	fs.StringVar(&f.Stats, "stats", "", "local, main: write the run's figures as JSON to `FILE`")
	fs.StringVar(&f.HTTP, "http", "", "local, main: serve the OpenAI-compatible API on TCP `ADDR` (e.g. 127.0.0.1:8080) until interrupted, instead of answering -prompt")
	fs.StringVar(&f.ServedName, "served-model-name", "", "local, main: the model's name in the API; default: the -model directory's base name")
	fs.IntVar(&f.MaxBatch, "max-batch", 8, "local, main: with -http, requests generating at once")
	fs.IntVar(&f.MaxStops, "max-stops", 4, "local, main: with -http, the most stop strings a request may give (OpenAI's 4; each at most 1 KiB)")
	fs.IntVar(&f.MaxQueue, "max-queue", 64, "local, main: with -http, requests waiting for a place beyond -max-batch; more are refused with 503")
	fs.StringVar(&f.PrefixCache, "prefix-cache", "512MiB", "local, main: with -http, memory for finished requests' KV rows, which a request whose prompt starts with the same tokens (a system prompt, a chat's next turn) reuses instead of computing them again (least recently used dropped first); shadow: the same for its copies of the sequences; 0 = off")
	fs.IntVar(&f.PrefillChunk, "prefill-chunk", passes.DefaultChunk, "local, main: with -http, the most prompt tokens one forward pass feeds, over all the prompts joining: a long prompt is fed in chunks beside the running requests' decode steps, so none of them waits for all of it; 0 = each prompt in one pass")
	fs.StringVar(&f.CORSOrigin, "cors-origin", "", "local, main: with -http, let browser pages of these `ORIGINS` (comma-separated, e.g. http://localhost:3000; * for any) call the API (default: none)")
	fs.BoolVar(&f.NoConsole, "no-console", false, "local, main: with -http, do not serve the swarm's console page at / (chat and a tile per node, in a browser)")
	fs.StringVar(&f.APIKey, "api-key", "", "local, main: with -http, require `KEY` as \"Authorization: Bearer KEY\" on every route but /healthz (default $ODMOE_API_KEY; a flag shows in the process list, the variable does not)")
	fs.StringVar(&f.Workers, "workers", "", "main, stage: worker addresses HOST:PORT,HOST:PORT,... in order (required for these roles; a stage gives the main node's list)")
	fs.IntVar(&f.Group, "group", 0, "main, shadow, stage: workers per group G; 0 = the router's top-k, or the largest size below it that the workers split into evenly")
	fs.StringVar(&f.Prefetch, "prefetch", "oracle-next", "main, stage: loading policy (a stage's as its main node's; a stage's shadow predictions come through the main node): shadow (the shadow's predictions, needs -shadow), reactive (load when the activation arrives), oracle-next (hint each layer as soon as it is routed), random (random hints one layer ahead), resident (every worker holds the experts it owns: run the workers with -resident I/W; the fully cached reference)")
	fs.StringVar(&f.Residency, "residency", "off", "main: off (OD-MoE's cacheless workers: every expert evicted once computed) or on (every expert runs on the worker that owns it, which keeps it resident while its -device-mem allows, evicting the coldest; the shadow hints owners)")
	fs.StringVar(&f.Placement, "placement", "activation", "main, with -residency on: activation (experts spread over the workers by what each can hold, load and compute, then moved as their popularity shows: Prism) or uniform (expert e of layer l on worker (e + l) mod W, for good)")
	fs.IntVar(&f.MiniBatch, "mini-batch", 0, "main, stage: prefill tokens per activation; 0 = 16")
	fs.StringVar(&f.Shadow, "shadow", "", "main: shadow node `ADDR` (with -prefetch shadow; with -prefetch resident it runs beside the resident swarm, its hints landing on pinned experts: the baseline that pays the shadow's CPU); shadow: its worker list is -workers")
	fs.IntVar(&f.AlignToken, "align-token", 1, "main: send the shadow the sampled token every T passes (0 = never)")
	fs.IntVar(&f.AlignKV, "align-kv", 1, "main: send the shadow the new KV rows every K passes (0 = never)")
	fs.StringVar(&f.Draft, "draft", "off", "main, with a shadow: speculative decoding, bit-identical to one token a pass: each pass checks up to `K` of the tokens the shadow guessed come after each decoding request's last, keeping those its own draws agree with. off; auto (how many, request by request, from the measured share kept and pass times: none where the loads a guessed row adds cost more than the passes it saves); or K, 1 to 8")
	fs.BoolVar(&f.AlignAdaptive, "align-adaptive", false, "main: choose the alignment periods online from the shadow's measured recall and rewinds, starting at every pass, -align-token and -align-kv being the longest allowed (align.Controller)")
	fs.DurationVar(&f.PeerTimeout, "peer-timeout", wire.DefaultPeerTimeout, "main, shadow, stage: a worker (or, to the main node, the shadow) silent this long is lost: its work moves to the live workers (without the shadow: reactive loading) and it is dialed again until it answers")
	fs.DurationVar(&f.DialTimeout, "dial-timeout", wire.DefaultStartDialTimeout, "main, shadow, stage: how long to wait at start for the workers (and the shadow, and the stages) to answer, every few attempts logged; raise it when workers pin or preload experts for longer; left at its default, 10m on a main node with -store-listen and a shadow with -fetch-from, where the nodes dialed may be fetching their weights first")
	fs.StringVar(&f.Trace, "trace", "", "main: record the whole swarm's timeline (every node's compute, loads and messages) and write it as JSON to `FILE` (testbed draws it)")
	fs.StringVar(&f.TraceIters, "trace-iters", "2:4", "main: the passes -trace records, `FROM:TO` (pass 1 is the prompt)")
	fs.StringVar(&f.Quant, "quant", "int8", "shadow: weight format of the shadow's copy: fp16, int8, nf4")
	fs.IntVar(&f.Ahead, "ahead", shadow.DefaultAhead, "shadow: run up to `N` passes past the main node's latest alignment on the tokens the shadow guessed (each member's as the main node draws it), so predictions come a pass early; where the main node's pass differs, only the rows that differ run again or are taken back (their predictions revised, those no longer wanted withdrawn); 0 = wait for every alignment (OD-MoE's late departure)")
	fs.StringVar(&f.Layers, "layers", "", "shadow, stage: the layers `A-B` (0-based, inclusive; A- to the last) this node holds. A shadow's of a staged shadow, whose nodes each hold a share of the quantized copy: the first stage (0-B) follows the main node and dials -stages; a later stage serves the first its layers, and needs no -workers (default: every layer). A stage's of the main node's (required): their attention and KV rows, their experts run on its -workers")
	fs.StringVar(&f.Mem, "mem", "", "local, main, shadow, stage: the node's memory budget (bytes; KiB, MiB, GiB suffixes): it refuses to start, saying what does not fit, when its weights (a shadow's quantized; a shadow also says how many stages, -layers, would fit), the KV cache of one sequence of -context and, serving, -prefix-cache pass it (default: none)")
	fs.StringVar(&f.Weights, "weights", "auto", "local, main, stage: where the node's weights live: memory (copied into memory of its own: they stream at full speed whatever the page cache holds of the checkpoint, and cannot be paged out), mapped (the checkpoint's file mapping: the kernel may page them out, and they stream as fast only where the page cache holds the file in large pieces), packed (memory, with every BF16 weight that only multiplies vectors packed losslessly into 13 bits a weight: a decode reads 0.81 of their bytes; fast only on CPUs with AVX-512 VBMI, pure Go elsewhere) or auto (packed where the CPU has the packed kernel and memory elsewhere, where they take at most three quarters of the memory available; else mapped). The token embedding stays mapped unless it is also the output head; the -mem check counts packed weights at their BF16 size")
	fs.IntVar(&f.Context, "context", 0, "local, main, shadow, stage: the longest sequence, prompt and answer, this node serves, in `TOKENS`: its KV cache, and what -mem counts, are sized to it, and longer requests are refused; a shadow and every stage need at least the main node's, which it checks when they connect (default: the model's max_position_embeddings)")
	fs.StringVar(&f.Stages, "stages", "", "main, shadow: the `ADDRS` (HOST:PORT,...) of the stages holding the layers after this node's, in order. A main node's (-role stage) hold its layers from the first stage's on: the main node keeps the embedding, the layers before (perhaps none) and the output head. A shadow's (with -layers 0-B) are the shadow stages holding the layers after B")
	fs.StringVar(&f.Listen, "listen", "127.0.0.1:7400", "worker, shadow, stage: UDP `ADDR` to listen on (a worker, and a shadow given -store, also listen on its TCP port, where workers fetch their share of its store)")
	fs.StringVar(&f.Store, "store", "", "worker, main, shadow: compressed expert store `DIR`. A worker's (odmoe convert; or a share of it, or an empty directory, with -fetch-from) (required for a worker); the main node's, with -store-listen: the model's store, served to nodes fetching their share (made from -model, once, if the directory holds none); a shadow's: its layers' experts are read from it and quantized, and a -model fetched with -fetch-from holds none of them (their share of the store is fetched into it: a third fewer bytes than their bf16 tensors)")
	fs.StringVar(&f.StoreRelays, "store-relays", "", "main, stage: `ADDRS` (comma-separated) of the nodes that serve the store as they fill theirs, told to the workers filling their shares, which ask them before the main node: a stage's, the shadow and its stages; the main node's, a staged shadow's later stages (its -shadow is one already)")
	fs.StringVar(&f.StoreListen, "store-listen", "", "main: serve the -model checkpoint (and -store, if given) on this TCP `ADDR` to nodes fetching their share (workers' -fetch-from and odmoe fetch -from: their experts; stages' and shadows' -fetch-from: their layers' tensors): a swarm's weights start at the main node (default: not served)")
	fs.StringVar(&f.DeviceMem, "device-mem", "1GiB", "worker: device memory budget (bytes; KiB, MiB, GiB suffixes)")
	fs.StringVar(&f.Device, "device", "cpu", "worker: what experts run on: cpu (host memory and this CPU's kernels), or cuda:N (GPU N, in a binary built with -tags cuda: -device-mem is then GPU memory); every device gives the same bits")
	fs.StringVar(&f.Resident, "resident", "", "worker: `I/W`: hold for good the experts worker I (from 0) of W owns in a resident swarm (main: -prefetch resident), loaded at start: the fully cached reference")
	fs.StringVar(&f.HostCache, "host-cache", "0", "worker: keep up to this many bytes of decompressed experts in host memory (the node's CPU RAM of OD-MoE's rig): a load is then a host-to-device transfer paced by -load-bw, with no store read or decompression; 0 = off")
	fs.StringVar(&f.FetchFrom, "fetch-from", "", "worker: nodes holding the store (workers' `ADDRS`, comma-separated): a chunk -store lacks (its share from odmoe fetch, or an empty directory) comes from them when first needed, checked against the store's index, and is kept in -store (default: -store holds every expert); stage, shadow: the main node's -store-listen, from which the node fills -model (an empty directory, or what it fetched before) with its layers' tensors before it loads, each piece checked against the main node's manifest")
	fs.StringVar(&f.FetchRate, "fetch-rate", "0", "with -fetch-from: cap the bytes a second the node fetches (a worker: in the background, to fill its share of the store once the main node has told it its place; e.g. 50MB: the swarm's requests keep the links they need); 0 = no cap")
	fs.StringVar(&f.HostCompressed, "host-compressed", "0", "worker: keep up to this many bytes of the store's compressed chunks in host memory (ZipMoE's compressed tier: ~0.66 of an expert's BF16 bytes): a load not in -host-cache then decompresses from RAM instead of reading the store; 0 = off")
	fs.BoolVar(&f.HostPreload, "host-preload", false, "worker: fill -host-cache with the store's experts at start (layer by layer, as far as it holds), as a node holding the model in RAM would")
	fs.StringVar(&f.LoadBW, "load-bw", "0", "worker: pace expert loads to this host-to-device rate in bytes/s (e.g. 4GB for PCIe 3.0 x4); 0 = unpaced")
	fs.IntVar(&f.Threads, "threads", 0, "goroutines for matrix kernels; 0 = all cores")
	fs.StringVar(&f.Kernels, "kernels", "", "kernel implementation: "+strings.Join(kernels.Paths(), ", ")+" (default: $ODMOE_KERNELS or the fastest; all give the same bits)")
	fs.StringVar(&f.CPUProfile, "cpuprofile", "", "write the process's CPU profile (go tool pprof) to `FILE` when it ends")
	f.Cluster.Register(fs)
	f.Log.Register(fs)
}

// Register registers c's flags on fs.
func (c *Cluster) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.Certs, "certs", "", "cluster certificate `DIR` made by odmoe certs (needs ca.pem, NAME.pem, NAME-key.pem)")
	fs.StringVar(&c.Name, "name", "", "this node's `NAME` in the cluster (default: the role's name for main and shadow)")
	fs.DurationVar(&c.NetDelay, "net-delay", 0, "delay every datagram this node sends by `D` (an emulated rig's link latency where the kernel has no netem; testbed/rig); below the timer grain (~1 ms here) it is not applied")
	fs.BoolVar(&c.Insecure, "insecure", false, "no certificates: peers are NOT authenticated (quick local experiments only)")
}

// Register registers l's flags on fs.
func (l *Log) Register(fs *flag.FlagSet) {
	fs.BoolVar(&l.JSON, "log-json", false, "log JSON lines instead of the human console format")
	fs.StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn, error")
}

// For is the flags of a node in role, every other flag at its default:
// what a launcher fills in before Args.
func For(role string) Flags {
	var f Flags
	f.Register(flag.NewFlagSet("", flag.ContinueOnError))
	f.Role = role
	return f
}

// Parse sets the flags args name (`-flag value` or `-flag=value`, as the
// command line takes them) on f: a rig's extra flags for a node, say.
func (f *Flags) Parse(args []string) error {
	d, fs := bound(*f)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("runflags: %q is not a flag", fs.Arg(0))
	}
	*f = *d
	return nil
}

// Args renders f as the arguments of `odmoe run`: "run", -role=ROLE, then
// every other flag whose value differs from its default, in name order,
// as -name=value.
func (f Flags) Args() []string {
	_, fs := bound(f)
	args := []string{"run", "-role=" + f.Role}
	fs.VisitAll(func(fl *flag.Flag) {
		if v := fl.Value.String(); v != fl.DefValue && fl.Name != "role" {
			args = append(args, "-"+fl.Name+"="+v)
		}
	})
	return args
}

// bound is a copy of f and a flag set over it (each flag's default its
// own, its value f's), whose messages go nowhere: the caller returns them.
func bound(f Flags) (*Flags, *flag.FlagSet) {
	d := new(Flags)
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	d.Register(fs)
	*d = f // the flags point into d: they hold f's values now
	return d, fs
}
