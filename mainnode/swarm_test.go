package mainnode_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// newSwarmFixture generates a tiny model, its store and certificates for
// workers workers.
func newSwarmFixture(t *testing.T, workers int) inproc.Files {
	t.Helper()
	f, err := inproc.Generate(context.Background(), t.TempDir(), "tiny", 11, workers)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// loadModels loads f's model twice: whole (local mode, the reference)
// and without its experts (the main node's view); the test closes both.
func loadModels(t *testing.T, f inproc.Files) (local, mainModel *model.Model) {
	t.Helper()
	local, err := model.Load(f.Model, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Close() })
	mainModel, err = model.Load(f.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mainModel.Close() })
	return local, mainModel
}

// startWorkers runs n worker servers in this process on loopback QUIC with
// mutual TLS; it returns their addresses.
func startWorkers(t *testing.T, ctx context.Context, f inproc.Files, n int, budget int64, resident bool) []string {
	t.Helper()
	addrs, stop, err := inproc.StartWorkers(ctx, f, inproc.WorkerOptions{Count: n, BudgetBytes: budget, Resident: resident, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addrs
}

// generation is what a run produced: tokens and every step's logits.
type generation struct {
	tokens []int
	logits [][]float32
}

// testPrompt is n token ids spread over the vocabulary: (i*mul + add) mod
// vocab.
func testPrompt(n, mul, add, vocab int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = (i*mul + add) % vocab
	}
	return p
}

// generate runs prompt, n tokens, as text mode does: on a swarm a batch
// of one in its pass loop (its prompt whole); otherwise model.Generate,
// the reference.
func generate(t *testing.T, m *model.Model, runner model.ExpertRunner, prompt []int, n int) generation {
	t.Helper()
	return generateWith(t, m, runner, prompt, n, nil)
}

// generateWith is generate choosing with sampler (nil: greedy).
func generateWith(t *testing.T, m *model.Model, runner model.ExpertRunner, prompt []int, n int, sampler *model.Sampler) generation {
	t.Helper()
	var g generation
	opt := model.GenerateOptions{
		Sampler:   sampler,
		MaxTokens: n,
		OnToken: func(step, id int, logits []float32) error {
			g.logits = append(g.logits, append([]float32(nil), logits...))
			return nil
		},
	}
	var ids []int
	var err error
	if sw, ok := runner.(*mainnode.Swarm); ok {
		ids, _, err = alone(context.Background(), sw, m, prompt, opt)
	} else {
		ids, _, err = model.Generate(context.Background(), model.NewSession(m, runner, len(prompt)+n), prompt, opt)
	}
	if err != nil {
		t.Fatal(err)
	}
	g.tokens = ids
	return g
}

// alone runs prompt on sw as text mode does: a batch of one in its pass
// loop, the prompt whole.
func alone(ctx context.Context, sw *mainnode.Swarm, m *model.Model, prompt []int, opt model.GenerateOptions) ([]int, model.GenerateStats, error) {
	b := sw.Batcher(m)
	defer b.Close()
	b.ChunkPrompts(0)
	return b.Generate(ctx, prompt, opt)
}

func diffGenerations(a, b generation) string {
	if len(a.tokens) != len(b.tokens) {
		return fmt.Sprintf("%d vs %d tokens", len(a.tokens), len(b.tokens))
	}
	for i := range a.tokens {
		if a.tokens[i] != b.tokens[i] {
			return fmt.Sprintf("token %d: %d vs %d", i, a.tokens[i], b.tokens[i])
		}
		for j := range a.logits[i] {
			if math.Float32bits(a.logits[i][j]) != math.Float32bits(b.logits[i][j]) {
				return fmt.Sprintf("step %d logit %d: %v vs %v", i, j, a.logits[i][j], b.logits[i][j])
			}
		}
	}
	return ""
}

// TestSwarmIsBitIdenticalToLocal is the lossless invariant end to end: main
// node and workers over real loopback QUIC with mutual TLS produce local
// mode's tokens and logits bit for bit, for every prefetch policy and
// worker count, with a prompt long enough that prefill uses several
// mini-batches.
func TestSwarmIsBitIdenticalToLocal(t *testing.T) {
	f := newSwarmFixture(t, 8)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(40, 37, 5, local.Config.VocabSize)
	const steps = 6
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)

	for _, workers := range []int{2, 4, 8} {
		for _, policy := range []mainnode.Prefetch{mainnode.Reactive, mainnode.OracleNext, mainnode.Random, mainnode.Resident} {
			t.Run(fmt.Sprintf("%dworkers/%s", workers, policy), func(t *testing.T) {
				sw := dialSwarm(t, f, workers, mainnode.Options{Prefetch: policy}, nil)
				got := generate(t, mainModel, sw, prompt, steps)
				if d := diffGenerations(got, want); d != "" {
					t.Fatalf("swarm differs from local: %s", d)
				}
				checkSwarmStats(t, sw, policy, steps, len(mainModel.Config.ExpertLayers()))
			})
		}
	}
}

// dialSwarm starts workers in this process and dials them as the main
// node; sh, if set, is a shadow to connect. Options' layout (groups of 2),
// sizes and logger are filled in.
func dialSwarm(t *testing.T, f inproc.Files, workers int, opt mainnode.Options, sh *shadowSpec) *mainnode.Swarm {
	t.Helper()
	return dialSwarmWithBudget(t, f, workers, 64<<20, opt, sh)
}

// dialSwarmWithBudget is dialSwarm with workers of budget bytes of device
// memory each.
func dialSwarmWithBudget(t *testing.T, f inproc.Files, workers int, budget int64, opt mainnode.Options, sh *shadowSpec) *mainnode.Swarm {
	t.Helper()
	return dialSwarmOn(t, f, workers, budget, nil, opt, sh)
}

// dialSwarmOn is dialSwarmWithBudget with worker i on devices[i]
// (worker.OpenDevice; the CPU where absent).
func dialSwarmOn(t *testing.T, f inproc.Files, workers int, budget int64, devices []string, opt mainnode.Options, sh *shadowSpec) *mainnode.Swarm {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addrs, stop, err := inproc.StartWorkers(ctx, f, inproc.WorkerOptions{Count: workers, BudgetBytes: budget, Resident: opt.Prefetch == mainnode.Resident,
		Devices: devices, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	cfg, err := model.LoadConfig(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := wire.LoadCerts(f.Certs, "main")
	if err != nil {
		t.Fatal(err)
	}
	opt.Layout, _ = sched.NewLayout(workers, 2)
	opt.MiniBatch, opt.Hidden, opt.Log = 4, cfg.HiddenSize, zerolog.Nop()
	opt.Layers, opt.Experts, opt.TopK, opt.Seed, opt.Intermediate = cfg.ExpertLayers(), cfg.NumExperts, cfg.TopK, 1, cfg.IntermediateSize
	id, err := f.Identity()
	if err != nil {
		t.Fatal(err)
	}
	mcfg := &wire.Config{Certs: certs, Log: zerolog.Nop(), CheckHello: wire.SameModel(true)} // as main.Run: its model said and checked
	mcfg.Hello.Model = id
	if sh != nil {
		saddr := startShadow(t, ctx, f, sh.quant, sh.ahead(), addrs, opt.Layout)
		scfg := *mcfg
		scfg.PeerRoles = []wire.Role{wire.RoleShadow}
		if opt.Shadow, err = wire.Dial(ctx, saddr, &scfg); err != nil {
			t.Fatal(err)
		}
	}
	sw, err := mainnode.Dial(ctx, addrs, mcfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	return sw
}

// checkSwarmStats checks the figures a run must have produced.
func checkSwarmStats(t *testing.T, sw *mainnode.Swarm, policy mainnode.Prefetch, steps, layers int) {
	t.Helper()
	dec := mainnode.Total(sw.Stats().Decode)
	if policy == mainnode.Resident {
		// the fully cached reference: nothing is ever loaded
		pre := mainnode.Total(sw.Stats().Prefill)
		if dec.Results == 0 || dec.Loads != 0 || dec.Misses != 0 || pre.Loads != 0 || pre.Misses != 0 {
			t.Fatalf("resident swarm loaded experts: decode %+v, prefill %+v", dec, pre)
		}
		// the only loads are the pins at start: every expert once, over all workers
		var pinned int64
		for i, m := range sw.WorkerStats(context.Background(), 5e9) {
			if m == nil || m.Misses != 0 || m.DeviceInUse == 0 {
				t.Errorf("resident worker %d metrics %v", i, m)
			}
			pinned += m.Loads
		}
		if want := int64(layers * synth.Presets["tiny"].Experts); pinned != want {
			t.Errorf("resident workers loaded %v experts, want each of %v once", pinned, want)
		}
		return
	}
	if dec.Results == 0 || dec.Loads == 0 {
		t.Fatalf("decode stats empty: %+v", dec)
	}
	// reactive: nothing is hinted in decode, every load is a miss;
	// oracle-next: every expert is hinted before it is needed
	switch policy {
	case mainnode.Reactive:
		if dec.Misses != dec.Results {
			t.Errorf("reactive: %d misses of %d results", dec.Misses, dec.Results)
		}
	case mainnode.OracleNext:
		if dec.Misses != 0 {
			t.Errorf("oracle-next: %d misses", dec.Misses)
		}
	}
	if its := sw.Stats().Passes; len(its) != steps || its[0].Calls != int64(layers) {
		t.Errorf("%d passes recorded (want %d), first with %d layer calls", len(its), steps, its[0].Calls)
	}
	if pre := mainnode.Total(sw.Stats().Prefill); pre.Misses != 0 || pre.Results == 0 {
		t.Errorf("prefill: %d misses, %d results", pre.Misses, pre.Results)
	}
	waitWorkersEmpty(t, sw)
}

// waitWorkersEmpty: the budget is never exceeded, and once the sequences
// have ended every expert is gone, hints for passes that never came
// (random, shadow) included; a load still in flight at the end is freed
// when it lands.
func waitWorkersEmpty(t *testing.T, sw *mainnode.Swarm) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var held []int
		for i, m := range sw.WorkerStats(context.Background(), 5e9) {
			if m == nil || m.DevicePeak > m.DeviceBudget {
				t.Fatalf("worker %d metrics %v", i, m)
			}
			if m.DeviceInUse != 0 {
				held = append(held, i)
			}
		}
		if len(held) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers %v still hold device memory 5 s after the sequence ended", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSwarmRefusesAWorkerOfAnotherCluster: a worker whose certificate comes
// from another CA is refused at the handshake; the main node says which.
func TestSwarmRefusesAWorkerOfAnotherCluster(t *testing.T) {
	f := newSwarmFixture(t, 1)
	other := newSwarmFixture(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := startWorkers(t, ctx, other, 1, 64<<20, false)
	certs, _ := wire.LoadCerts(f.Certs, "main")
	layout, _ := sched.NewLayout(1, 1)
	_, err := mainnode.Dial(ctx, addrs, &wire.Config{Certs: certs, Log: zerolog.Nop(), DialAttempts: 1}, mainnode.Options{Layout: layout, Hidden: 128})
	if err == nil || !strings.Contains(err.Error(), "dialing workers") || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("err = %v", err)
	}
}

// TestTwoSequencesAtOnceAreEachBitIdenticalToLocal: two Sessions decode
// different prompts through one Swarm at the same time; each gets its own
// local run's tokens and logits bit for bit, for every policy, and the
// workers hold nothing once both have ended.
func TestTwoSequencesAtOnceAreEachBitIdenticalToLocal(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompts := [][]int{testPrompt(24, 37, 5, local.Config.VocabSize), testPrompt(9, 91, 2, local.Config.VocabSize)}
	const steps = 8
	var want [2]generation
	for i, p := range prompts {
		want[i] = generate(t, local, model.NewResidentExperts(local), p, steps)
	}
	for _, policy := range mainnode.Prefetches {
		if policy == mainnode.Shadow {
			continue // TestTwoSequencesWithTheShadow
		}
		t.Run(string(policy), func(t *testing.T) {
			sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: policy}, nil)
			checkConcurrent(t, sw, mainModel, prompts, steps, want, policy != mainnode.Resident)
		})
	}
}

// checkConcurrent runs the prompts on sw at once and compares each with
// want; with loads, the workers must hold nothing afterwards.
func checkConcurrent(t *testing.T, sw *mainnode.Swarm, m *model.Model, prompts [][]int, steps int, want [2]generation, loads bool) {
	t.Helper()
	var got [2]generation
	var wg sync.WaitGroup
	errs := make([]error, len(prompts))
	for i, p := range prompts {
		wg.Go(func() {
			ids, _, err := alone(context.Background(), sw, m, p, model.GenerateOptions{MaxTokens: steps,
				OnToken: func(step, id int, logits []float32) error {
					got[i].logits = append(got[i].logits, append([]float32(nil), logits...))
					return nil
				}})
			got[i].tokens, errs[i] = ids, err
		})
	}
	wg.Wait()
	for i := range prompts {
		if errs[i] != nil {
			t.Fatalf("sequence %d: %v", i, errs[i])
		}
		if d := diffGenerations(got[i], want[i]); d != "" {
			t.Errorf("sequence %d differs from its local run: %s", i, d)
		}
	}
	if its := sw.Stats().Passes; len(its) != steps {
		t.Errorf("%d passes recorded, want %d (both sequences summed per pass)", len(its), steps)
	}
	if loads {
		waitWorkersEmpty(t, sw)
	}
}
