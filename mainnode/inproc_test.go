package mainnode_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// TestAnInProcessWorkerOfAnotherModelIsRefused: an in-process worker
// whose store was converted from another model (another seed) refuses a
// main node of this model with the message a worker process gives
// (TestNodesOfAnotherModelOrLayoutAreRefused runs the processes), naming
// both nodes and both models, even when the main node itself does not
// check: the in-process worker is built as the process is.
//
// A store converted from a checkpoint that differs only in one expert's
// weights (same config and routers: what answered wrong with rc 0 before
// the identity covered the experts) is another model too.
func TestAnInProcessWorkerOfAnotherModelIsRefused(t *testing.T) {
	f := newSwarmFixture(t, 1)
	seed12, err := inproc.Generate(context.Background(), t.TempDir(), "tiny", 12, 1)
	if err != nil {
		t.Fatal(err)
	}
	otherExperts, err := inproc.OtherExperts(context.Background(), t.TempDir(), f, 1, 6)
	if err != nil {
		t.Fatal(err)
	}
	for name, other := range map[string]inproc.Files{"another seed": seed12, "other weights of one expert": otherExperts} {
		t.Run(name, func(t *testing.T) { refusedAsAnotherModel(t, f, other) })
	}
}

// refusedAsAnotherModel checks that a worker on other's store refuses,
// and is refused by, a main node of f's model.
func refusedAsAnotherModel(t *testing.T, f, other inproc.Files) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, stop, err := inproc.StartWorkerOn(ctx, other.Store, f.Certs, 0, "127.0.0.1:0", inproc.WorkerOptions{Count: 1, BudgetBytes: 64 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	otherID, err := other.Identity()
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	id, err := store.IdentityOf(f.Model, m)
	if err != nil {
		t.Fatal(err)
	}
	certs, _ := wire.LoadCerts(f.Certs, "main")
	layout, _ := sched.NewLayout(1, 1)
	for _, check := range []func(self, peer *wire.Hello) error{wire.SameModel(true), nil} {
		cfg := &wire.Config{Certs: certs, Log: zerolog.Nop(), DialAttempts: 1, CheckHello: check}
		cfg.Hello.Model = id.String()
		_, err := mainnode.Dial(ctx, []string{addr}, cfg, mainnode.Options{Layout: layout, Hidden: m.Config.HiddenSize})
		for _, w := range []string{"w1 refuses main", "main (main) serves model " + id.String()[:12], "w1 (worker) model " + otherID[:12]} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Fatalf("main node checking %v: err = %v, want it to say %q", check != nil, err, w)
			}
		}
	}
}

// TestInProcessWorkersTellThePlacerTheirCapacity: in-process workers are
// built as worker processes build themselves (worker.New), so their
// Hellos carry their device budget and load bandwidth, and the main
// node's placer (-residency on) sees each worker's, as it does a
// process's.
func TestInProcessWorkersTellThePlacerTheirCapacity(t *testing.T) {
	f := newSwarmFixture(t, 2)
	cfg, err := model.LoadConfig(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	budgets, bandwidths := []int64{4 << 20, 16 << 20}, []float64{1 << 30, 3 << 30}
	var addrs []string
	for i := range 2 {
		addr, stop, err := inproc.StartWorker(ctx, f, i, "127.0.0.1:0", inproc.WorkerOptions{Count: 2, BudgetBytes: budgets[i], LoadBytesSec: bandwidths[i], Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		addrs = append(addrs, addr)
	}
	certs, _ := wire.LoadCerts(f.Certs, "main")
	layout, _ := sched.NewLayout(2, 2)
	opt := mainnode.Options{Layout: layout, Prefetch: mainnode.Reactive, Residency: true, MiniBatch: 4, Hidden: cfg.HiddenSize, Intermediate: cfg.IntermediateSize,
		Layers: cfg.ExpertLayers(), Experts: cfg.NumExperts, TopK: cfg.TopK, Seed: 1, Log: zerolog.Nop()}
	sw, err := mainnode.Dial(ctx, addrs, &wire.Config{Certs: certs, Log: zerolog.Nop()}, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	caps := sw.PlacerCapacities()
	expert := int64(3 * cfg.HiddenSize * cfg.IntermediateSize * 2)
	for i, c := range caps {
		if want := budgets[i] - 2*expert; c.CacheBytes != want || c.LoadBytesSec != bandwidths[i] {
			t.Errorf("worker %d: the placer sees %d cache bytes at %.0f B/s, want %d at %.0f (its budget less two experts' compute room)", i, c.CacheBytes, c.LoadBytesSec, want, bandwidths[i])
		}
	}
	if len(caps) != 2 {
		t.Fatalf("the placer sees %d workers, want 2", len(caps))
	}
}

// TestAnInProcessShadowSaysWhatAProcessSays: an in-process shadow is
// built as a shadow process is (shadow.New): it refuses a main node that
// does not say its model, and its Hello names its workers, in the order
// it was given them, its group and its context: what the main node's
// layout and context checks read (TestNodesOfAnotherModelOrLayoutAreRefused runs that check on
// processes).
func TestAnInProcessShadowSaysWhatAProcessSays(t *testing.T) {
	f := newSwarmFixture(t, 2)
	local, _ := loadModels(t, f)
	qm, err := local.Quantized(kernels.Q8, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := f.Identity()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := startWorkers(t, ctx, f, 2, 64<<20, false)
	layout, _ := sched.NewLayout(2, 2)
	certs, _ := wire.LoadCerts(f.Certs, "main")
	dialShadow := func(workers []string, model string) (*wire.Peer, error) {
		saddr, stop, err := inproc.StartShadow(ctx, inproc.ShadowOptions{Model: qm, Identity: id, Certs: f.Certs, Workers: workers, Layout: layout, Ahead: 1, Listen: "127.0.0.1:0", Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		cfg := &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleShadow}, Log: zerolog.Nop(), DialAttempts: 1}
		cfg.Hello.Model = model
		return wire.Dial(ctx, saddr, cfg)
	}
	if _, err := dialShadow(addrs, ""); err == nil || !strings.Contains(err.Error(), "main (main) does not say which model it serves") {
		t.Fatalf("a main node without a model: err = %v", err)
	}
	sp, err := dialShadow([]string{addrs[1], addrs[0]}, id)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if h := sp.Hello(); !slices.Equal(h.Layout, []string{"w2", "w1"}) || h.Group != 2 || h.Model != id || h.Context != qm.Config.MaxPositions {
		t.Fatalf("the shadow's Hello says workers %v in groups of %d, model %.12s, context %d; want [w2 w1], 2, %.12s, %d", h.Layout, h.Group, h.Model, h.Context, id, qm.Config.MaxPositions)
	}
}

// TestAWorkerRestartedOnOtherExpertWeightsIsRefusedOnRedial: a worker
// lost mid-run that comes back on the same address serving a store of
// other expert weights is refused each time the main node dials it again
// (its Hello names another model), never rejoins, and the run goes on
// without it with local mode's tokens and logits.
func TestAWorkerRestartedOnOtherExpertWeightsIsRefusedOnRedial(t *testing.T) {
	f := newSwarmFixture(t, 2)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(24, 37, 5, local.Config.VocabSize)
	const steps, swapAt = 8, 2
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	tuned, err := inproc.OtherExperts(context.Background(), t.TempDir(), f, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := inproc.WorkerOptions{Count: 2, BudgetBytes: 64 << 20, Log: zerolog.Nop()}
	rw := startRestartable(t, ctx, f, o)
	cfg, _ := model.LoadConfig(f.Model)
	certs, _ := wire.LoadCerts(f.Certs, "main")
	id, err := f.Identity()
	if err != nil {
		t.Fatal(err)
	}
	layout, _ := sched.NewLayout(2, 2)
	mcfg := &wire.Config{Certs: certs, Log: zerolog.Nop(), HandshakeTimeout: time.Second, CheckHello: wire.SameModel(true)}
	mcfg.Hello.Model = id
	sw, err := mainnode.Dial(ctx, rw.addrs, mcfg, mainnode.Options{Layout: layout, Prefetch: mainnode.Reactive, MiniBatch: 4, Hidden: cfg.HiddenSize,
		Log: zerolog.Nop(), Layers: cfg.ExpertLayers(), Experts: cfg.NumExperts, TopK: cfg.TopK, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	tunedStats := new(wire.Stats) // the impostor refuses the main node's Hello first: it counts
	var got generation
	ids, _, err := alone(ctx, sw, mainModel, prompt, model.GenerateOptions{MaxTokens: steps,
		OnToken: func(step, _ int, logits []float32) error {
			got.logits = append(got.logits, append([]float32(nil), logits...))
			switch step {
			case swapAt:
				rw.stop(1)
				to := o
				to.Stats = tunedStats
				_, stop, err := inproc.StartWorkerOn(ctx, tuned.Store, f.Certs, 1, rw.addrs[1], to)
				if err != nil {
					return err
				}
				t.Cleanup(stop)
			case swapAt + 2: // the loss was seen on the pass between: the main node redials it every 2 s at most
				for deadline := time.Now().Add(15 * time.Second); tunedStats.Refused.Load() == 0; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						return fmt.Errorf("the main node did not dial the worker of other expert weights again within 15 s")
					}
				}
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	got.tokens = ids
	if d := diffGenerations(got, want); d != "" {
		t.Fatalf("the swarm differs from local mode: %s", d)
	}
	if fs := sw.Stats().Faults; fs.WorkersLost != 1 || fs.Rejoins != 0 || sw.RejoinReady() {
		t.Fatalf("faults %+v, rejoin ready %v: want the worker lost and never taken back", fs, sw.RejoinReady())
	}
}
