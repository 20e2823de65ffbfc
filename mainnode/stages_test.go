package mainnode_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/odmoe/odmoe/passloop"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/stage"
	"github.com/odmoe/odmoe/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// stagedSwarm is a main node that holds no layer (the embedding and the
// head alone), its layers on stages that run in this process as a stage
// process does (RunStage), each meeting the workers over loopback QUIC.
type stagedSwarm struct {
	head   *model.Model
	sw     *mainnode.Swarm
	stages *stage.Client
}

// startStagedSwarm starts stages holding layers[i] each ("A-B") under
// policy, on the workers at addrs, and the main node's Swarm over the
// same workers, whose model's LayerRunner they are.
func startStagedSwarm(t *testing.T, f inproc.Files, addrs []string, policy mainnode.Prefetch, layers ...string) *stagedSwarm {
	return startStagedSwarmOn(t, f, addrs, addrs, policy, layers...)
}

// startStagedSwarmOn is startStagedSwarm with the stages given their
// workers in stageAddrs' order.
func startStagedSwarmOn(t *testing.T, f inproc.Files, addrs, stageAddrs []string, policy mainnode.Prefetch, layers ...string) *stagedSwarm {
	t.Helper()
	return dialStagedSwarm(t, f, addrs, startStages(t, f, stageAddrs, policy, layers...), policy)
}

// startStages starts stages holding layers[i] each ("A-B") under policy,
// on the workers at stageAddrs, in this process as a stage process does
// (RunStage), and returns their addresses.
func startStages(t *testing.T, f inproc.Files, stageAddrs []string, policy mainnode.Prefetch, layers ...string) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stages []string
	done := make(chan error, len(layers))
	t.Cleanup(func() {
		cancel()
		for range layers {
			if err := <-done; err != nil {
				t.Errorf("a stage ended: %v", err)
			}
		}
	})
	for i, r := range layers {
		name := fmt.Sprintf("stage%d", i+1)
		if err := inproc.EnsureNodes(f.Certs, name); err != nil {
			t.Fatal(err)
		}
		certs, err := wire.LoadCerts(f.Certs, name)
		if err != nil {
			t.Fatal(err)
		}
		ready := make(chan string, 1)
		go func() {
			done <- mainnode.RunStage(ctx, mainnode.StageConfig{Model: f.Model, Layers: r, Listen: "127.0.0.1:0", Workers: stageAddrs, Group: 2, Prefetch: policy,
				MiniBatch: 4, Wire: &wire.Config{Certs: certs, Log: zerolog.Nop()}, Log: zerolog.Nop(), Ready: func(a string) { ready <- a }})
		}()
		select {
		case a := <-ready:
			stages = append(stages, a)
		case err := <-done:
			t.Fatalf("stage %s: %v", r, err)
		}
	}
	return stages
}

// dialStagedSwarm is a main node that holds no layer, its layers on the
// stages at stages, its Swarm on the workers at addrs.
func dialStagedSwarm(t *testing.T, f inproc.Files, addrs, stages []string, policy mainnode.Prefetch) *stagedSwarm {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	head, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true, Layers: &model.NoLayers, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close() })
	id, err := f.Identity()
	if err != nil {
		t.Fatal(err)
	}
	certs, err := wire.LoadCerts(f.Certs, "main")
	if err != nil {
		t.Fatal(err)
	}
	mcfg := &wire.Config{Certs: certs, Log: zerolog.Nop(), CheckHello: wire.SameModel(true)}
	mcfg.Hello.Model = id
	client, first, err := mainnode.DialStages(ctx, stages, mcfg, head.Config.NumLayers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	if first != 0 {
		t.Fatalf("the first stage holds layers from %d", first)
	}
	if err := head.SetLayerRunner(client); err != nil {
		t.Fatal(err)
	}
	c := head.Config
	layout, _ := sched.NewLayout(len(addrs), 2)
	sw, err := mainnode.Dial(ctx, addrs, mcfg, mainnode.Options{Layout: layout, Prefetch: policy, MiniBatch: 4, Hidden: c.HiddenSize, Intermediate: c.IntermediateSize,
		Layers: c.ExpertLayers(), Experts: c.NumExperts, TopK: c.TopK, Seed: 1, Stages: client, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	return &stagedSwarm{head: head, sw: sw, stages: client}
}

// TestAStagedMainNodeIsLocalModeAloneAndBatched: every family's tiny
// preset on a main node that holds no layer, its layers on two stages
// (layers 0-1 and the rest) that each run their experts on the same four
// workers, under a policy each (reactive, oracle-next, random, reactive:
// every policy on some family, the test's time kept to CI's): two seeded
// sampled requests (penalties, a logit bias), each alone and the two
// batched, give local mode's tokens and logits bit for bit, and the
// stages' layers' figures reach the main node's and its /metrics
// (experts loaded for them, by worker too).
func TestAStagedMainNodeIsLocalModeAloneAndBatched(t *testing.T) {
	policies := map[string]mainnode.Prefetch{"tiny": mainnode.Reactive, "qwen3-moe-tiny": mainnode.OracleNext, "deepseek-v3-tiny-fp8": mainnode.Random, "gpt-oss-tiny-mxfp4": mainnode.Reactive}
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "deepseek-v3-tiny-fp8", "gpt-oss-tiny-mxfp4"} {
		t.Run(preset, func(t *testing.T) {
			f, err := inproc.Generate(context.Background(), t.TempDir(), preset, 24, 4)
			if err != nil {
				t.Fatal(err)
			}
			local, _ := loadModels(t, f)
			prompts := [][]int{testPrompt(9, 31, 3, local.Config.VocabSize), testPrompt(14, 17, 5, local.Config.VocabSize)}
			samplers := func() []*model.Sampler {
				return []*model.Sampler{model.NewSampler(0.9, 0.95, 601).WithPenalties(0.2, 0.1), model.NewSampler(1.2, 1, 602).WithBias(map[int]float64{1: 3})}
			}
			const steps = 8
			var want [2]generation
			for i, s := range samplers() {
				want[i] = generateWith(t, local, model.NewResidentExperts(local), prompts[i], steps, s)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			addrs := startWorkers(t, ctx, f, 4, 64<<20, false)
			for _, policy := range []mainnode.Prefetch{policies[preset]} {
				s := startStagedSwarm(t, f, addrs, policy, "0-1", "2-")
				var alone [2]generation
				for i, smp := range samplers() {
					alone[i] = generateWith(t, s.head, s.sw, prompts[i], steps, smp)
				}
				b := s.sw.Batcher(s.head)
				together := batched(t, b, prompts, steps, samplers())
				b.Close()
				for i := range want {
					if d := diffGenerations(alone[i], want[i]); d != "" {
						t.Fatalf("%s: request %d alone differs from local mode: %s", policy, i, d)
					}
					if d := diffGenerations(together[i], want[i]); d != "" {
						t.Fatalf("%s: request %d batched differs from local mode: %s", policy, i, d)
					}
				}
				loads := mainnode.Total(s.sw.Stats().Decode).Loads
				if loads == 0 {
					t.Fatalf("%s: the main node's figures count no expert loaded on the stages' layers", policy)
				}
				reg := prometheus.NewRegistry()
				reg.MustRegister(s.sw.Collector(mainnode.ExpertBytes(local.Config)))
				samples := gather(t, reg)
				if got := samples[`odmoe_expert_loads_total{phase="decode"}`]; got != float64(loads) {
					t.Fatalf("%s: /metrics counts %v decode loads, the figures %d", policy, got, loads)
				}
				all := loads + mainnode.Total(s.sw.Stats().Prefill).Loads
				byWorker := 0.0
				for w := range addrs {
					byWorker += samples[fmt.Sprintf(`odmoe_worker_loads_total{worker="w%d"}`, w+1)]
				}
				if byWorker != float64(all) {
					t.Fatalf("%s: /metrics counts %v loads by worker, the figures %d", policy, byWorker, all)
				}
				if err := mainnode.CheckStages(s.stages, []string{"w1", "w2", "w3", "w4"}, 2, 0); err != nil {
					t.Fatalf("%s: the stages' layouts: %v", policy, err)
				}
			}
		})
	}
}

// TestAMainNodeConnectingLaterIsToldItsOwnPassesFigures: stages outlive
// a main node (bench rig runs a main node a request against the same
// stages); a second main node's figures of the stages' layers count its
// own passes alone, as the first's did, not the stages' since they
// started.
func TestAMainNodeConnectingLaterIsToldItsOwnPassesFigures(t *testing.T) {
	f, err := inproc.Generate(context.Background(), t.TempDir(), "tiny", 24, 4)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := startWorkers(t, ctx, f, 4, 64<<20, false)
	stages := startStages(t, f, addrs, mainnode.Reactive, "0-1", "2-")
	const steps = 6
	prompt := testPrompt(9, 31, 3, 100)
	var calls [2][]int64 // each main node's calls of each layer, decode and prompt
	for i := range calls {
		s := dialStagedSwarm(t, f, addrs, stages, mainnode.Reactive)
		generateWith(t, s.head, s.sw, prompt, steps, model.NewSampler(0, 1, 7))
		st := s.sw.Stats()
		for _, l := range append(st.Decode, st.Prefill...) {
			calls[i] = append(calls[i], l.Calls)
		}
		s.sw.Close()
		s.stages.Close()
	}
	if len(calls[0]) == 0 || fmt.Sprint(calls[0]) != fmt.Sprint(calls[1]) {
		t.Fatalf("the same request's calls by layer (decode, then prompt): %v on the first main node, %v on the second", calls[0], calls[1])
	}
	for _, c := range calls[0][:len(calls[0])/2] {
		if c != steps-1 {
			t.Fatalf("decode calls by layer %v, want %d each (a pass a token after the first)", calls[0], steps-1)
		}
	}
}

// flakyStages runs a model's later layers in process and, at the calls
// fail names (1-based), first forgets every sequence (a stage
// restarted) and fails as a lost stage does.
type flakyStages struct {
	*stage.Layers
	calls int
	fail  map[int]bool
}

func (f *flakyStages) RunLayers(ctx context.Context, step model.Step, r model.LayerRange, spans []model.RowSpan, hidden []float32, onRoute func(int, []model.Route)) ([]float32, error) {
	f.calls++
	if f.fail[f.calls] {
		f.EndAll(ctx)
		return nil, fmt.Errorf("stage: s2 (layers %s): %w", r, stage.ErrLost)
	}
	return f.Layers.RunLayers(ctx, step, r, spans, hidden, onRoute)
}

// TestAPassWhoseStageIsLostRunsAgainFromEveryFirstToken: gpt-oss-tiny
// (windowed layers: their caches reset too), the first layer and the head
// in the pass loop's model, the rest on stages that are lost three times
// (their rows gone): twice while one member's prompt is fed a token a
// pass and the other waits (its second pass, and the pass after the
// first recovery), once when one member decodes beside the other's
// prompt tokens. Each time the pass loop's Recover runs the pass again
// with every member's tokens so far: both seeded sampled requests give
// local mode's tokens and logits.
func TestAPassWhoseStageIsLostRunsAgainFromEveryFirstToken(t *testing.T) {
	f, err := inproc.Generate(context.Background(), t.TempDir(), "gpt-oss-tiny", 25, 1)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := loadModels(t, f)
	L := local.Config.NumLayers
	first, err := model.Load(f.Model, model.LoadOptions{Layers: &model.LayerRange{First: 0, End: 1}, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	rest, err := model.Load(f.Model, model.LoadOptions{Layers: &model.LayerRange{First: 1, End: L}})
	if err != nil {
		t.Fatal(err)
	}
	defer rest.Close()
	flaky := &flakyStages{Layers: stage.NewLayers(rest), fail: map[int]bool{2: true, 4: true, 9: true}}
	if err := first.SetLayerRunner(flaky); err != nil {
		t.Fatal(err)
	}
	prompts := [][]int{testPrompt(5, 31, 3, local.Config.VocabSize), testPrompt(3, 17, 5, local.Config.VocabSize)}
	samplers := func() []*model.Sampler {
		return []*model.Sampler{model.NewSampler(0.9, 0.95, 701), model.NewSampler(1.1, 1, 702)}
	}
	const steps = 8
	var want [2]generation
	for i, s := range samplers() {
		want[i] = generateWith(t, local, model.NewResidentExperts(local), prompts[i], steps, s)
	}
	recovered := 0
	b := passloop.New(first, model.NewResidentExperts(first), passloop.Hooks{Recover: func(_ context.Context, _ model.Step, err error, _ int) bool {
		recovered++
		return errors.Is(err, stage.ErrLost)
	}})
	defer b.Close()
	b.ChunkPrompts(1) // a prompt token a pass: one member's prompt waits while the other's is fed
	got := batched(t, b, prompts, steps, samplers())
	for i := range want {
		if d := diffGenerations(got[i], want[i]); d != "" {
			t.Fatalf("request %d differs from local mode: %s", i, d)
		}
	}
	if recovered != 3 {
		t.Fatalf("the pass loop recovered %d times, want 3 (%d runs of the stages)", recovered, flaky.calls)
	}
}

// TestAStageOfOtherWorkersIsRefused: a stage given the main node's workers
// in another order says so in its Hello, and the main node's check
// refuses it, naming both lists (its experts would run elsewhere than the
// shadow hints, and its figures count under other workers' names); a
// stage holding rows for shorter sequences than the main node serves
// (-context) is refused too, naming the context.
func TestAStageOfOtherWorkersIsRefused(t *testing.T) {
	f, err := inproc.Generate(context.Background(), t.TempDir(), "tiny", 26, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := startWorkers(t, ctx, f, 2, 64<<20, false)
	s := startStagedSwarmOn(t, f, addrs, []string{addrs[1], addrs[0]}, mainnode.Reactive, "0-")
	err = mainnode.CheckStages(s.stages, []string{"w1", "w2"}, 2, 4096)
	if err == nil || !strings.Contains(err.Error(), "[w2 w1]") || !strings.Contains(err.Error(), "[w1 w2]") {
		t.Fatalf("a stage of the workers in another order: %v", err)
	}
	// a main node serving longer sequences than the stage holds rows for
	err = mainnode.CheckStages(s.stages, []string{"w2", "w1"}, 2, 8192)
	if err == nil || !strings.Contains(err.Error(), "at most 4096 positions") || !strings.Contains(err.Error(), "-context") {
		t.Fatalf("a stage of a shorter context: %v", err)
	}
	if err := mainnode.CheckStages(s.stages, []string{"w2", "w1"}, 2, 4096); err != nil {
		t.Fatalf("a stage of the main node's workers and context: %v", err)
	}
}
