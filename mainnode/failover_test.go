package mainnode_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// restartableWorkers runs n workers one by one, so that a test can stop
// one and start it again on the same address.
type restartableWorkers struct {
	t     *testing.T
	ctx   context.Context
	f     inproc.Files
	o     inproc.WorkerOptions
	mu    sync.Mutex
	addrs []string
	stops []func()
}

func startRestartable(t *testing.T, ctx context.Context, f inproc.Files, o inproc.WorkerOptions) *restartableWorkers {
	t.Helper()
	rw := &restartableWorkers{t: t, ctx: ctx, f: f, o: o}
	for i := range o.Count {
		addr, stop, err := inproc.StartWorker(ctx, f, i, "127.0.0.1:0", o)
		if err != nil {
			t.Fatal(err)
		}
		rw.addrs, rw.stops = append(rw.addrs, addr), append(rw.stops, stop)
	}
	t.Cleanup(func() {
		rw.mu.Lock()
		defer rw.mu.Unlock()
		for _, s := range rw.stops {
			if s != nil {
				s()
			}
		}
	})
	return rw
}

func (rw *restartableWorkers) stop(i int) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.stops[i]()
	rw.stops[i] = nil
}

func (rw *restartableWorkers) restart(i int) error {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	_, stop, err := inproc.StartWorker(rw.ctx, rw.f, i, rw.addrs[i], rw.o)
	rw.stops[i] = stop
	return err
}

func (rw *restartableWorkers) dial(t *testing.T, policy mainnode.Prefetch) *mainnode.Swarm {
	t.Helper()
	cfg, err := model.LoadConfig(rw.f.Model)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := wire.LoadCerts(rw.f.Certs, "main")
	if err != nil {
		t.Fatal(err)
	}
	layout, _ := sched.NewLayout(len(rw.addrs), min(2, len(rw.addrs)))
	opt := mainnode.Options{Layout: layout, Prefetch: policy, MiniBatch: 4, Hidden: cfg.HiddenSize, Log: zerolog.Nop(),
		Layers: cfg.ExpertLayers(), Experts: cfg.NumExperts, TopK: cfg.TopK, Seed: 1}
	sw, err := mainnode.Dial(rw.ctx, rw.addrs, &wire.Config{Certs: certs, Log: zerolog.Nop(), HandshakeTimeout: time.Second}, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	return sw
}

// TestSwarmSurvivesALostWorker: a worker stopped in the middle of prefill
// (requests in flight to it) loses nothing: its requests are re-sent to
// the other worker of its group, decode goes on without it, it is dialed
// again once it restarts on the same address and rejoins, and every token
// and logit is local mode's, bit for bit.
func TestSwarmSurvivesALostWorker(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(40, 37, 5, local.Config.VocabSize)
	const steps, restartAt = 14, 3
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	policies := []mainnode.Prefetch{mainnode.Reactive, mainnode.OracleNext}
	if testing.Short() {
		policies = policies[:1] // -short: one policy (6 s a policy: paced loads and a redial)
	}
	for _, policy := range policies {
		t.Run(string(policy), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// loads of ~80 ms keep requests in flight long enough
			// to lose some
			rw := startRestartable(t, ctx, f, inproc.WorkerOptions{Count: 4, BudgetBytes: 64 << 20, LoadBytesSec: 2.5e6, Log: zerolog.Nop()})
			sw := rw.dial(t, policy)
			killed := make(chan struct{})
			go func() {
				defer close(killed)
				// stop it while it loads the prompt's experts (its device
				// memory is taken at a load's start; the requests for them
				// wait behind loads of 20 ms each): a fixed delay missed
				// the prefill on a busy machine
				deadline := time.Now().Add(10 * time.Second)
				for time.Now().Before(deadline) {
					if ws := sw.WorkerStats(ctx, time.Second); ws[1] != nil && ws[1].DeviceInUse > 0 {
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
				rw.stop(1)
			}()
			var got generation
			var restartErr error
			ids, _, err := alone(ctx, sw, mainModel, prompt, model.GenerateOptions{MaxTokens: steps,
				OnToken: func(step, id int, logits []float32) error {
					got.logits = append(got.logits, append([]float32(nil), logits...))
					if step == restartAt {
						<-killed
						restartErr = rw.restart(1)
					}
					if step == restartAt+1 {
						waitRejoin(t, sw)
					}
					return nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			if restartErr != nil {
				t.Fatal(restartErr)
			}
			got.tokens = ids
			if d := diffGenerations(got, want); d != "" {
				t.Fatalf("swarm with a lost worker differs from local: %s", d)
			}
			fs := sw.Stats().Faults
			if fs.WorkersLost != 1 || fs.Resent == 0 || fs.Rejoins != 1 {
				t.Errorf("faults %+v: want 1 worker lost, requests re-sent, 1 rejoin", fs)
			}
			// the restarted worker (fresh counters) has run experts since it rejoined
			ws := sw.WorkerStats(ctx, 5*time.Second)
			if ws[1] == nil || ws[1].Hits+ws[1].Misses == 0 {
				t.Errorf("the restarted worker ran nothing after it rejoined: %+v", ws[1])
			}
		})
	}
}

// waitRejoin waits until the lost worker's new connection is ready to
// rejoin (the Swarm dials it again in the background every 2 s at most),
// so that the next forward pass takes it back.
func waitRejoin(t *testing.T, sw *mainnode.Swarm) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !sw.RejoinReady() {
		if time.Now().After(deadline) {
			t.Fatal("the restarted worker was not dialed again within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSwarmWithNoLiveWorkerFailsSayingSo: with its only worker gone the
// swarm cannot go on, and the error says why.
func TestSwarmWithNoLiveWorkerFailsSayingSo(t *testing.T) {
	f := newSwarmFixture(t, 1)
	_, mainModel := loadModels(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rw := startRestartable(t, ctx, f, inproc.WorkerOptions{Count: 1, BudgetBytes: 64 << 20, Log: zerolog.Nop()})
	sw := rw.dial(t, mainnode.Reactive)
	rw.stop(0)
	_, _, err := alone(ctx, sw, mainModel, []int{1, 2, 3}, model.GenerateOptions{MaxTokens: 4})
	if err == nil || !(strings.Contains(err.Error(), "every worker is lost") || strings.Contains(err.Error(), "no live worker left")) {
		t.Fatalf("err = %v, want one that says no worker is live", err)
	}
}

// TestALoneWorkerBackIsTakenInAtOnce: with no other worker live, a worker
// that comes back is taken into the layout at once (its share-in answer
// is not waited for: the pass needs it), and the next generation runs;
// one that is back but still filling its share shows in /healthz and in
// odmoe_worker_filling.
func TestALoneWorkerBackIsTakenInAtOnce(t *testing.T) {
	f := newSwarmFixture(t, 1)
	_, mainModel := loadModels(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rw := startRestartable(t, ctx, f, inproc.WorkerOptions{Count: 1, BudgetBytes: 64 << 20, Log: zerolog.Nop()})
	sw := rw.dial(t, mainnode.Reactive)
	rw.stop(0)
	if _, _, err := alone(ctx, sw, mainModel, []int{1, 2, 3}, model.GenerateOptions{MaxTokens: 2}); err == nil {
		t.Fatal("a generation with its one worker stopped succeeded")
	}
	if err := rw.restart(0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !sw.RejoinReady() {
		if time.Now().After(deadline) {
			t.Fatal("the worker was not dialed again within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, err := alone(ctx, sw, mainModel, []int{1, 2, 3}, model.GenerateOptions{MaxTokens: 4}); err != nil {
		t.Fatalf("the generation after the lone worker came back: %v", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(sw.Collector(1))
	const filling = `odmoe_worker_filling{worker="w1"}`
	if got, ok := gather(t, reg)[filling]; !ok || got != 0 {
		t.Errorf("%s = %v (present %v) before it fills, want 0", filling, got, ok)
	}
	sw.Filling(0)
	if h := sw.Health(); len(h.Degraded) != 1 || !strings.Contains(h.Degraded[0], "w1: back, filling its share of the store") || len(h.Down) != 0 {
		t.Fatalf("health of a worker back but filling: %+v", h)
	}
	if got := gather(t, reg)[filling]; got != 1 {
		t.Errorf("%s = %v while it fills, want 1", filling, got)
	}
}

// TestSwarmSurvivesALostShadow: the shadow stopped mid-generation only
// costs speed: the main node loads reactively, dials it again, and once
// it restarts on the same address attaches it, sending each sequence
// whole, after which it predicts again. Bit-identical to local throughout;
// a swarm whose shadow is not up at start begins reactive the same way.
func TestSwarmSurvivesALostShadow(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(12, 53, 7, local.Config.VocabSize)
	const steps = 16
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	qm, err := local.Quantized(kernels.F16, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := f.Identity()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name              string
		upAtStart         bool
		stopAt, restartAt int // output steps; -1: never
	}{
		{"lost and back", true, 3, 6},
		{"unreachable at start", false, -1, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			addrs := startWorkers(t, ctx, f, 4, 64<<20, false)
			layout, _ := sched.NewLayout(4, 2)
			shadowAddr := freeUDPAddr(t)
			var stopShadow func()
			startShadow := func() error {
				_, stop, err := inproc.StartShadow(ctx, inproc.ShadowOptions{Model: qm, Identity: id, Certs: f.Certs, Workers: addrs, Layout: layout, Ahead: shadow.DefaultAhead, Listen: shadowAddr, Log: zerolog.Nop()})
				stopShadow = stop
				return err
			}
			t.Cleanup(func() {
				if stopShadow != nil {
					stopShadow()
				}
			})
			certs, err := wire.LoadCerts(f.Certs, "main")
			if err != nil {
				t.Fatal(err)
			}
			scfg := &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleShadow}, Log: zerolog.Nop(), DialAttempts: 1, HandshakeTimeout: time.Second}
			scfg.Hello.Model = id
			opt := mainnode.Options{Layout: layout, Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}, MiniBatch: 4,
				Hidden: local.Config.HiddenSize, Log: zerolog.Nop(), Layers: local.Config.ExpertLayers(), Experts: local.Config.NumExperts, TopK: local.Config.TopK,
				RedialShadow: func(ctx context.Context) (*wire.Peer, error) { return wire.Dial(ctx, shadowAddr, scfg) }}
			if c.upAtStart {
				if err := startShadow(); err != nil {
					t.Fatal(err)
				}
				if opt.Shadow, err = wire.Dial(ctx, shadowAddr, scfg); err != nil {
					t.Fatal(err)
				}
			}
			sw, err := mainnode.Dial(ctx, addrs, &wire.Config{Certs: certs, Log: zerolog.Nop()}, opt)
			if err != nil {
				t.Fatal(err)
			}
			defer sw.Close()
			var got generation
			var hookErr error
			ids, _, err := alone(ctx, sw, mainModel, prompt, model.GenerateOptions{MaxTokens: steps,
				OnToken: func(step, id int, logits []float32) error {
					got.logits = append(got.logits, append([]float32(nil), logits...))
					switch step {
					case c.stopAt:
						stopShadow()
						stopShadow = nil
					case c.restartAt:
						hookErr = startShadow()
						deadline := time.Now().Add(10 * time.Second)
						for !sw.ShadowReady() && time.Now().Before(deadline) {
							time.Sleep(5 * time.Millisecond)
						}
					}
					return nil
				}})
			if err != nil || hookErr != nil {
				t.Fatal(err, hookErr)
			}
			got.tokens = ids
			if d := diffGenerations(got, want); d != "" {
				t.Fatalf("swarm with a lost shadow differs from local: %s", d)
			}
			fs := sw.Stats().Faults
			wantLost := int64(0)
			if c.upAtStart {
				wantLost = 1
			}
			if fs.ShadowLost != wantLost || fs.ShadowReattached != 1 || fs.ReactivePasses == 0 || fs.ReactivePasses >= steps-2 {
				t.Errorf("faults %+v: want the shadow lost %d time(s), attached once, some passes reactive", fs, wantLost)
			}
			st, ok := sw.ShadowStats(10 * time.Second)
			t.Logf("faults %+v, recall %.3f by token %.2f", fs, st.Recall, st.RecallByToken)
			if !ok || st.Recall < 0.5 {
				t.Errorf("after it attached the shadow predicted with recall %.3f (ok %v)", st.Recall, ok)
			}
		})
	}
}

// freeUDPAddr is a loopback UDP address nothing listens on.
func freeUDPAddr(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

// TestAWorkerWithADamagedStoreCostsOnlyItsLoads: one of two workers
// serves from a store whose chunk file is damaged under it, as a failing
// disk would. With a flipped byte every 384 KiB (about one expert in three
// fails its checksum), each expert it cannot load is quarantined there and
// its request goes to the other worker; the damaged worker still runs the
// experts it can, and the swarm reports it degraded, naming it, while
// ready. With the file cut to 60% the whole store fails its check: the
// worker goes out of service, the main node loses it and plans without
// it, reports it degraded (lost, saying why) while ready, and takes it
// back once a good copy of the file is put back. Every generation (the
// second meeting the quarantined experts at once) gives local mode's
// tokens and logits bit for bit.
func TestAWorkerWithADamagedStoreCostsOnlyItsLoads(t *testing.T) {
	f := newSwarmFixture(t, 2)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(40, 37, 5, local.Config.VocabSize)
	const steps = 6
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	for _, c := range []struct {
		name, says   string
		damage       func(b []byte) []byte
		outOfService bool
	}{
		{"flipped bytes", "w2: ", func(b []byte) []byte {
			for i := 1000; i < len(b); i += 384 << 10 {
				b[i] ^= 0x10
			}
			return b
		}, false},
		{"truncated", "w2: lost: ", func(b []byte) []byte { return b[:len(b)*6/10] }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			damaged := filepath.Join(t.TempDir(), "store")
			if err := os.MkdirAll(damaged, 0o755); err != nil {
				t.Fatal(err)
			}
			entries, err := os.ReadDir(f.Store)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				b, err := os.ReadFile(filepath.Join(f.Store, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(damaged, e.Name()), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			o := inproc.WorkerOptions{Count: 2, BudgetBytes: 64 << 20, Log: zerolog.Nop()}
			good, stop0, err := inproc.StartWorker(ctx, f, 0, "127.0.0.1:0", o)
			if err != nil {
				t.Fatal(err)
			}
			defer stop0()
			bad, stop1, err := inproc.StartWorkerOn(ctx, damaged, f.Certs, 1, "127.0.0.1:0", o)
			if err != nil {
				t.Fatal(err)
			}
			defer stop1()
			// the disk fails under the running worker
			chunks := filepath.Join(damaged, "chunks.bin")
			b, err := os.ReadFile(chunks)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(chunks, c.damage(slices.Clone(b)), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, _ := model.LoadConfig(f.Model)
			certs, _ := wire.LoadCerts(f.Certs, "main")
			layout, _ := sched.NewLayout(2, 2)
			sw, err := mainnode.Dial(ctx, []string{good, bad}, &wire.Config{Certs: certs, Log: zerolog.Nop()}, mainnode.Options{Layout: layout,
				Prefetch: mainnode.Reactive, MiniBatch: 4, Hidden: cfg.HiddenSize, Log: zerolog.Nop(), Layers: cfg.ExpertLayers(), Experts: cfg.NumExperts, TopK: cfg.TopK, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer sw.Close()
			for run := range 2 {
				if d := diffGenerations(generate(t, mainModel, sw, prompt, steps), want); d != "" {
					t.Fatalf("run %d with a damaged worker differs from local: %s", run+1, d)
				}
			}
			fs, h := sw.Stats().Faults, sw.Health()
			if len(h.Degraded) == 0 || !h.Ready || !strings.HasPrefix(h.Degraded[0], c.says) {
				t.Fatalf("faults %+v, health %+v: want w2 degraded (%q...) while ready", fs, h, c.says)
			}
			if c.outOfService {
				t.Logf("w2 out of service: %d lost, %d requests re-sent; degraded %q", fs.WorkersLost, fs.Resent, h.Degraded[0])
				if fs.WorkersLost != 1 || !strings.Contains(h.Degraded[0], "store reads again") || !strings.Contains(h.Degraded[0], "truncated") {
					t.Fatalf("faults %+v, health %+v: want w2 lost once, saying its store is truncated", fs, h)
				}
				// a good copy renamed over the chunk file: w2 serves again
				good := filepath.Join(damaged, "chunks.good")
				if err := os.WriteFile(good, b, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(good, chunks); err != nil {
					t.Fatal(err)
				}
				for deadline := time.Now().Add(30 * time.Second); sw.Stats().Faults.Rejoins == 0; {
					if time.Now().After(deadline) {
						t.Fatalf("w2 did not rejoin within 30 s of its store's repair: %+v", sw.Health())
					}
					if d := diffGenerations(generate(t, mainModel, sw, prompt, steps), want); d != "" { // a pass takes back what answers
						t.Fatalf("a run while w2 is repaired differs from local: %s", d)
					}
				}
				if d := diffGenerations(generate(t, mainModel, sw, prompt, steps), want); d != "" {
					t.Fatalf("the run after w2 rejoined differs from local: %s", d)
				}
				if h := sw.Health(); len(h.Down) != 0 || len(h.Degraded) != 0 || !h.Ready {
					t.Fatalf("health after w2 rejoined on its repaired store: %+v", h)
				}
				return
			}
			ws := sw.WorkerStats(ctx, 5*time.Second)
			if ws[1] == nil || ws[1].Hits+ws[1].Misses == 0 {
				t.Fatalf("the damaged worker ran nothing: %+v", ws[1])
			}
			t.Logf("%d requests re-sent after %d load failures; degraded %q; the workers ran %d and %d requests",
				fs.Resent, fs.LoadFailures, h.Degraded, ws[0].Hits+ws[0].Misses, ws[1].Hits+ws[1].Misses)
			if fs.LoadFailures == 0 || fs.WorkersLost != 0 || !strings.Contains(h.Degraded[0], "checksum") {
				t.Fatalf("faults %+v, health %+v: want load failures counted, no worker lost, w2 degraded by a checksum", fs, h)
			}
		})
	}
}
