package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/passloop"
	"github.com/odmoe/odmoe/sched"
)

// a rig in the proportions of the emulated one: 8 workers in groups of
// 2, layers of ~1 ms on the main node, loads of ~6 ms
func testRig(t *testing.T) (Profile, sched.Layout, Shape) {
	t.Helper()
	layout, err := sched.NewLayout(8, 2)
	if err != nil {
		t.Fatal(err)
	}
	p := Profile{Name: "test", MainLayerMs: 1, MainTokenMs: 2, ShadowLayerMs: 0.8, ShadowTokenMs: 1,
		ExpertMs: 0.5, LoadMs: 0.2, LoadBytesPerS: 4e9, HopMs: 0.1, LinkBytesPerS: 125e6,
		MainPrefillTokenMs: 0.1, ExpertPrefillTokenMs: 0.05}
	s := Shape{Layers: 8, Experts: 8, TopK: 2, ExpertBytes: 22 << 20, HiddenBytes: 4 << 10}
	return p, layout, s
}

func mustRun(t *testing.T, p Profile, l sched.Layout, s Shape, o Options) Result {
	t.Helper()
	r, err := Run(p, l, s, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRunIsDeterministicForASeed: the same seed gives the same run, bit
// for bit; another seed routes differently.
func TestRunIsDeterministicForASeed(t *testing.T) {
	p, l, s := testRig(t)
	o := Options{Mode: Shadow, Prompt: 16, Output: 64, Recall: 0.95, Ahead: 1, Seed: 7}
	a, b := mustRun(t, p, l, s, o), mustRun(t, p, l, s, o)
	if a != b {
		t.Fatalf("two runs of seed 7: %+v and %+v", a, b)
	}
	o.Seed = 8
	if c := mustRun(t, p, l, s, o); c == a {
		t.Fatalf("seeds 7 and 8 gave the same run %+v", c)
	}
}

// TestModesOrderAsOnARig: no loads beats loads on predictions, which
// beats loads on demand; a resident swarm has neither loads nor stall, a
// reactive one loads every activation on demand and stalls on it.
func TestModesOrderAsOnARig(t *testing.T) {
	p, l, s := testRig(t)
	run := func(m Mode) Result {
		return mustRun(t, p, l, s, Options{Mode: m, Prompt: 16, Output: 64, Recall: 1, Ahead: 1, Seed: 1})
	}
	res, sh, re := run(Resident), run(Shadow), run(Reactive)
	if !(res.DecodeTokensPerS > sh.DecodeTokensPerS && sh.DecodeTokensPerS > re.DecodeTokensPerS) {
		t.Fatalf("tokens/s resident %.2f, shadow %.2f, reactive %.2f: want that order", res.DecodeTokensPerS, sh.DecodeTokensPerS, re.DecodeTokensPerS)
	}
	if res.Loads != 0 || res.StallFraction != 0 {
		t.Fatalf("resident: %+v, want no loads and no stall", res)
	}
	if want := 63 * 8 * 2; re.Loads != want || re.StallFraction < 0.5 {
		t.Fatalf("reactive: %d loads (want %d, one per activation), stall %.2f (want most of decode)", re.Loads, want, re.StallFraction)
	}
	if sh.MissesWrong != 0 {
		t.Fatalf("shadow at recall 1: %d wrong misses", sh.MissesWrong)
	}
}

// TestLoadsHideWhenThePredictionLeadCoversThem is OD-MoE's eq. (1): a
// shadow departing late leads layer l's activation by about (l+1) x the
// main node's and the shadow's layer time difference; loads shorter than
// the first layer's lead hide entirely, longer ones stall decode.
func TestLoadsHideWhenThePredictionLeadCoversThem(t *testing.T) {
	p, l, s := testRig(t)
	p.MainLayerMs, p.ShadowLayerMs = 3, 0.5 // the first layer's lead: ~2.5 ms
	o := Options{Mode: Shadow, Prompt: 16, Output: 32, Recall: 1, Ahead: 0, Seed: 3}
	p.LoadBytesPerS = float64(s.ExpertBytes) / 1e-3 // ~1 ms a load
	short := mustRun(t, p, l, s, o)
	p.LoadBytesPerS = float64(s.ExpertBytes) / 30e-3 // ~30 ms a load
	long := mustRun(t, p, l, s, o)
	if short.StallFraction > 1e-9 || short.MissesLate != 0 {
		t.Fatalf("1 ms loads against a 2.5 ms lead: stall %.4f, %d late misses; want none", short.StallFraction, short.MissesLate)
	}
	if long.StallFraction < 0.3 {
		t.Fatalf("30 ms loads against a 2.5-20 ms lead: stall %.4f, want most of decode", long.StallFraction)
	}
	// running ahead leads by a whole pass: the long loads hide better
	o.Ahead = 1
	if ahead := mustRun(t, p, l, s, o); ahead.StallFraction >= long.StallFraction {
		t.Fatalf("running ahead: stall %.3f, late departure %.3f; want less", ahead.StallFraction, long.StallFraction)
	}
}

// TestWrongMissesFollowRecall: each activation is missed with
// probability 1 - recall: the count over many is within four standard
// deviations of its expectation.
func TestWrongMissesFollowRecall(t *testing.T) {
	p, l, s := testRig(t)
	const recall, out = 0.9, 201
	r := mustRun(t, p, l, s, Options{Mode: Shadow, Prompt: 16, Output: out, Recall: recall, Ahead: 1, Seed: 5})
	n := float64((out - 1) * s.Layers * s.TopK)
	mean, sd := n*(1-recall), math.Sqrt(n*recall*(1-recall))
	if got := float64(r.MissesWrong); math.Abs(got-mean) > 4*sd {
		t.Fatalf("%v wrong misses over %v activations at recall %v: want %v +- %v", got, n, recall, mean, 4*sd)
	}
}

// TestRunRefusesBadInput names what is wrong.
func TestRunRefusesBadInput(t *testing.T) {
	p, l, s := testRig(t)
	o := Options{Mode: Shadow, Prompt: 16, Output: 8, Recall: 1}
	bad := p
	bad.LoadBytesPerS = 0
	if _, err := Run(bad, l, s, o); err == nil {
		t.Error("a profile with no load rate accepted")
	}
	if _, err := Run(p, l, s, Options{Mode: "cached", Prompt: 16, Output: 8}); err == nil {
		t.Error("an unknown mode accepted")
	}
	for _, d := range []Options{
		{Mode: Shadow, Prompt: 16, Output: 8, Recall: 1, Draft: 2},                       // no acceptance
		{Mode: Resident, Prompt: 16, Output: 8, Recall: 1, Draft: 2, Accept: 0.8},        // no shadow to guess
		{Mode: Shadow, Prompt: 16, Output: 8, Recall: 1, Draft: MaxDraft + 1, Accept: 1}, // more than a pass checks
		{Mode: Shadow, Prompt: 16, Output: 8, Recall: 1, Accept: 1.5},
	} {
		if _, err := Run(p, l, s, d); err == nil || !strings.Contains(err.Error(), "drafting") {
			t.Errorf("drafting %+v: %v, want it refused by name", d, err)
		}
	}
	s.TopK = 9
	if _, err := Run(p, l, s, o); err == nil {
		t.Error("top-9 of 8 experts accepted")
	}
}

func TestTimelineFillsTheFirstGapThatFits(t *testing.T) {
	var tl timeline
	if s := tl.reserve(10, 5); s != 10 { // [10,15)
		t.Fatalf("first task at %v", s)
	}
	if s := tl.reserve(0, 4); s != 0 { // [0,4): before it
		t.Fatalf("a task that fits before at %v", s)
	}
	if s := tl.reserve(3, 4); s != 4 { // [4,8): after [0,4)
		t.Fatalf("a task overlapping [0,4) at %v, want 4", s)
	}
	if s := tl.reserve(7, 3); s != 15 { // does not fit in [8,10): after [10,15)
		t.Fatalf("a task that fits no gap at %v, want 15", s)
	}
}

// TestPrefillTimeToFirstToken: the first token comes later with a longer
// prompt and with experts to load than with experts resident, and a
// prompt's main-node part alone bounds it from below.
func TestPrefillTimeToFirstToken(t *testing.T) {
	p, l, s := testRig(t)
	ttft := func(m Mode, prompt int) float64 {
		return mustRun(t, p, l, s, Options{Mode: m, Prompt: prompt, Output: 2, Recall: 1, Seed: 9}).TTFTms
	}
	if a, b := ttft(Resident, 16), ttft(Resident, 128); !(a < b) {
		t.Fatalf("resident TTFT %v ms for 16 tokens, %v for 128: want it to grow", a, b)
	}
	if a, b := ttft(Resident, 128), ttft(Reactive, 128); !(a < b) {
		t.Fatalf("TTFT resident %v, with loads %v: want loads to cost", a, b)
	}
	if got, floor := ttft(Resident, 128), 128*p.MainPrefillTokenMs*float64(s.Layers); got < floor {
		t.Fatalf("TTFT %v ms under the main node's own %v", got, floor)
	}
}

// TestDenseLayersRunOnTheMainNode: a model whose layers 0 and 1 have no
// experts loads none for them.
func TestDenseLayersRunOnTheMainNode(t *testing.T) {
	p, l, s := testRig(t)
	all := mustRun(t, p, l, s, Options{Mode: Reactive, Prompt: 4, Output: 9, Seed: 2})
	s.ExpertLayers = []int{2, 3, 4, 5, 6, 7}
	some := mustRun(t, p, l, s, Options{Mode: Reactive, Prompt: 4, Output: 9, Seed: 2})
	if all.Loads != 8*8*2 || some.Loads != 8*6*2 {
		t.Fatalf("loads: %d with 8 MoE layers (want %d), %d with 6 (want %d)", all.Loads, 8*8*2, some.Loads, 8*6*2)
	}
}

// TestLongerContextsCostTheMainNodesAttention: with a cost per cached
// position, a resident decode after a longer prompt takes exactly the
// extra positions' cost more in every layer of every step (the resident
// timeline adds the main node's layer to the experts' round trip), and
// the shared cores' bound charges it as CPU.
func TestLongerContextsCostTheMainNodesAttention(t *testing.T) {
	p, l, s := testRig(t)
	p.MainPositionMs = 0.002
	const out = 65
	decodeMs := func(p Profile, prompt int) float64 {
		r := mustRun(t, p, l, s, Options{Mode: Resident, Prompt: prompt, Output: out, Recall: 1, Seed: 3})
		return (out - 1) / r.DecodeTokensPerS * 1000
	}
	short, long := decodeMs(p, 16), decodeMs(p, 128)
	want := float64((out-1)*s.Layers) * 112 * p.MainPositionMs
	if got := long - short; math.Abs(got-want) > 1e-6*long {
		t.Fatalf("128-token prompt decodes %v ms longer than a 16-token one, want %v (64 steps x 8 layers x 112 positions x %v ms)", got, want, p.MainPositionMs)
	}
	flat := p
	flat.MainPositionMs = 0
	if a, b := decodeMs(flat, 16), decodeMs(flat, 128); !near(a, b) {
		t.Fatalf("without a position cost the prompt's length changed decode: %v and %v ms", a, b)
	}
	// on shared cores: the bound at the mean position 128 + 63/2
	p.Cores, p.CPUEfficiency, p.MainCPUTokenMs, p.WorkerCPUExpertMs = 1, 1, 200, 1
	r := mustRun(t, p, l, s, Options{Mode: Resident, Prompt: 128, Output: out, Recall: 1, Seed: 3})
	cpu := 200 + float64(s.Layers)*(128+31.5)*p.MainPositionMs + float64(s.Layers*s.TopK)*1
	if !r.CPUBound || !near(r.DecodeTokensPerS, 1000/cpu) {
		t.Fatalf("shared core: %+v, want CPU-bound at %v tok/s", r, 1000/cpu)
	}
}

// TestKVAlignmentTakesTheMainNodesLink: the KV rows sent to the shadow
// share the main node's link with the activations and delay them: sent
// every pass, each costs up to its bytes' time (less what overlaps
// the main node's first layer, or what the delay lets loads finish); in
// bursts every 8th pass too; never, nothing; without a shadow they
// are not sent.
func TestKVAlignmentTakesTheMainNodesLink(t *testing.T) {
	p, l, s := testRig(t)
	s.KVBytes = 256 << 10 // 2.1 ms a position at 125 MB/s
	const out = 65
	stepMs := func(m Mode, k int) float64 {
		r := mustRun(t, p, l, s, Options{Mode: m, Prompt: 16, Output: out, Recall: 1, Ahead: 1, AlignKV: k, Seed: 5})
		return 1000 / r.DecodeTokensPerS
	}
	never, every, eighth := stepMs(Shadow, 0), stepMs(Shadow, 1), stepMs(Shadow, 8)
	kv := 1000 * float64(s.KVBytes) / p.LinkBytesPerS
	if cost := every - never; cost > kv+1e-9 || cost < kv/4 {
		t.Errorf("KV rows every pass cost %.3f ms a step, want at most their %.3f ms on the link and more than a quarter of it", cost, kv)
	}
	if !(eighth > never) {
		t.Errorf("KV rows every 8th pass: %.3f ms a step, not above never's %.3f", eighth, never)
	}
	if a, b := stepMs(Resident, 0), stepMs(Resident, 1); a != b {
		t.Errorf("a resident swarm (no shadow) took %v ms a step with KV alignment, %v without", b, a)
	}
}

// TestStagesAddAHopAtEachBoundary: a resident decode on stages takes, a
// step, exactly two hidden states' hops more for each stage (the main
// node calls each in turn: out over its link, back over the stage's),
// whether or not the main node keeps the first layers, and its prompt
// two prompt-sized hops a stage (a stage hands every row back); the
// routing drawn is the same, and the layers' activations, each on its
// own node's link, never queue behind one another's.
func TestStagesAddAHopAtEachBoundary(t *testing.T) {
	p, l, s := testRig(t)
	const out = 33
	run := func(stages []int) Result {
		return mustRun(t, p, l, s, Options{Mode: Resident, Prompt: 16, Output: out, Recall: 1, Seed: 4, Stages: stages})
	}
	hop := 1000*float64(s.HiddenBytes)/p.LinkBytesPerS + p.HopMs
	prompt := p.PrefillMessageMs + 1000*16*float64(s.HiddenBytes)/p.LinkBytesPerS + p.HopMs
	whole := run(nil)
	for _, c := range []struct {
		stages []int
		hops   int
	}{{[]int{3, 6}, 4}, {[]int{0, 4}, 4}, {[]int{5}, 2}, {[]int{0}, 2}} {
		staged := run(c.stages)
		stepMs := (1000/staged.DecodeTokensPerS - 1000/whole.DecodeTokensPerS)
		if want := float64(c.hops) * hop; math.Abs(stepMs-want) > 1e-9 {
			t.Errorf("stages from %v: %.6f ms a step more than unstaged, want %d hops of %.6f", c.stages, stepMs, c.hops, hop)
		}
		if got, want := staged.TTFTms-whole.TTFTms, float64(c.hops)*prompt; math.Abs(got-want) > 1e-9 {
			t.Errorf("stages from %v: TTFT %.6f ms more, want %d prompt hops of %.6f", c.stages, got, c.hops, prompt)
		}
	}
	if _, err := Run(p, l, s, Options{Mode: Resident, Prompt: 16, Output: out, Stages: []int{4, 2}}); err == nil {
		t.Error("stages from layers 4 then 2 were taken")
	}
	if _, err := Run(p, l, s, Options{Mode: Shadow, Prompt: 16, Output: out, ShadowStages: []int{2, 5}}); err == nil {
		t.Error("shadow stages from layer 2 (none from 0) were taken")
	}
}

// TestShadowStagesDelayTheirPredictions: a shadow in stages predicts a
// first stage's layers as a whole shadow does, a later stage's a hop (the
// rows out) and a latency (its routes back) later for each later stage
// called so far, and ends its pass two hops later for each later stage;
// running a pass ahead covers that as it covers the shadow's layers.
func TestShadowStagesDelayTheirPredictions(t *testing.T) {
	p, l, s := testRig(t)
	p.HopMs = 0.6 // hops that show
	timing := func(stages []int) ([]float64, float64) {
		r := &run{p: p, s: s, o: Options{ShadowStages: stages}, latency: p.HopMs, wire: 1000 * float64(s.HiddenBytes) / p.LinkBytesPerS}
		return r.shadowPass(100, 2)
	}
	hop := p.HopMs + 1000*float64(s.HiddenBytes)/p.LinkBytesPerS
	whole, wholeEnd := timing(nil)
	staged, stagedEnd := timing([]int{0, 2, 5})
	for l := range s.Layers {
		later := 0.0 // stages after the first, called by layer l's
		switch {
		case l >= 5:
			later = 2*hop + hop + p.HopMs // stage 2-4 there and back, then out to 5-7 and its routes back
		case l >= 2:
			later = hop + p.HopMs
		}
		if math.Abs(staged[l]-whole[l]-later) > 1e-9 {
			t.Errorf("layer %d's predictions: %.4f ms staged, %.4f whole: want %.4f later", l, staged[l], whole[l], later)
		}
	}
	if math.Abs(stagedEnd-wholeEnd-4*hop) > 1e-9 {
		t.Errorf("the pass ends at %.4f staged, %.4f whole: want 4 hops later", stagedEnd, wholeEnd)
	}
	run := func(stages []int) Result {
		return mustRun(t, p, l, s, Options{Mode: Shadow, Prompt: 16, Output: 64, Recall: 1, Ahead: 1, Seed: 6, ShadowStages: stages})
	}
	if a, b := run(nil), run([]int{0, 2, 5}); b.MissesLate > a.MissesLate || b.DecodeTokensPerS < 0.99*a.DecodeTokensPerS {
		t.Fatalf("a pass ahead: whole shadow %d late misses at %.2f tok/s, in 3 stages %d at %.2f: want the lead to cover the hops", a.MissesLate, a.DecodeTokensPerS, b.MissesLate, b.DecodeTokensPerS)
	}
}

// lanRig is testRig on a LAN's round trips (0.5 ms each way) with
// experts in host memory (cheap loads) and a fast shadow: where a pass's
// round trips, not its loads, are its time.
func lanRig(t *testing.T) (Profile, sched.Layout, Shape) {
	p, l, s := testRig(t)
	p.HopMs, p.LoadMs, p.LoadBytesPerS = 0.5, 0.02, 20e9
	p.MainLayerMs, p.MainTokenMs, p.ShadowLayerMs, p.ShadowTokenMs, p.ExpertMs = 0.2, 0.3, 0.05, 0.1, 0.1
	p.MainPrefillTokenMs, p.ExpertPrefillTokenMs = 0.02, 0.01
	return p, l, s
}

// TestDraftingChecksTheGuessesMade: with every guess kept and a shadow
// that makes them in time, each pass gives Draft+1 tokens; a shadow too
// slow to have made a guess when the pass starts leaves the pass one
// row.
func TestDraftingChecksTheGuessesMade(t *testing.T) {
	p, l, s := lanRig(t)
	o := Options{Mode: Shadow, Prompt: 16, Output: 65, Recall: 1, Ahead: 1, Seed: 3, Accept: 1, Draft: 3}
	r := mustRun(t, p, l, s, o)
	// the first pass has no guess (the shadow ran the prompt, not ahead
	// of it); then 63 tokens four a pass
	if r.Passes != 17 || r.Drafted != 47 || r.Accepted != 47 {
		t.Fatalf("64 tokens, every guess kept, 3 a pass: %d passes, %d of %d guesses kept; want 17, 47 of 47", r.Passes, r.Accepted, r.Drafted)
	}
	slow := p
	slow.ShadowLayerMs = 10 // a token's pass takes the shadow 80 ms, the main node's ~10
	r = mustRun(t, slow, l, s, o)
	if r.Drafted > r.Passes/4 {
		t.Fatalf("a shadow 8 times slower than the main node: %d guesses over %d passes, want next to none", r.Drafted, r.Passes)
	}
}

// TestDraftingPaysWhereRoundTripsDominate: on LAN round trips with host
// caches, four guesses a pass decode at least 1.5x one row a pass with
// greedy's acceptance (0.85) and 1.3x with a sampled request's (0.7);
// where a fine-grained MoE's rows route to experts of their own, loaded
// from a slow store, the rows' loads cost more than the round trips they
// save.
func TestDraftingPaysWhereRoundTripsDominate(t *testing.T) {
	p, l, s := lanRig(t)
	rate := func(p Profile, accept float64, draft int) float64 {
		var sum float64
		for seed := range uint64(8) {
			sum += mustRun(t, p, l, s, Options{Mode: Shadow, Prompt: 16, Output: 64, Recall: 0.95, Ahead: 1, Seed: seed, Accept: accept, Draft: draft}).DecodeTokensPerS
		}
		return sum / 8
	}
	for _, c := range []struct {
		accept, want float64
	}{{0.85, 1.5}, {0.7, 1.3}} {
		got := rate(p, c.accept, 4) / rate(p, c.accept, 0)
		t.Logf("LAN, host caches, acceptance %v: %.2fx", c.accept, got)
		if got < c.want {
			t.Errorf("LAN, host caches, acceptance %v: drafting decodes %.2fx, want %.2fx", c.accept, got, c.want)
		}
	}
	slowStore := p
	slowStore.LoadMs, slowStore.LoadBytesPerS, slowStore.HopMs = 8, 1e9, 0.05
	s = Shape{Layers: 8, Experts: 128, TopK: 8, ExpertBytes: 9 << 20, HiddenBytes: 4 << 10} // Qwen3-30B-A3B's routing
	var err error
	if l, err = sched.NewLayout(16, 8); err != nil {
		t.Fatal(err)
	}
	got := rate(slowStore, 0.85, 4) / rate(slowStore, 0.85, 0)
	t.Logf("a fine-grained MoE's loads from a slow store: %.2fx", got)
	if got >= 1 {
		t.Errorf("loads from a slow store: drafting decodes %.2fx, want below 1x", got)
	}
}

// TestFewExpertsEndTheirWrongGuesses: where a layer has no expert left
// that is neither routed nor guessed (5 experts, top-3), a missed
// prediction guesses nothing in its place instead of drawing for ever;
// with four rows a pass the rows' experts cover the layer.
func TestFewExpertsEndTheirWrongGuesses(t *testing.T) {
	p, _, _ := testRig(t)
	l, err := sched.NewLayout(3, 3)
	if err != nil {
		t.Fatal(err)
	}
	s := Shape{Layers: 4, Experts: 5, TopK: 3, ExpertBytes: 1 << 20, HiddenBytes: 4 << 10}
	for _, draft := range []int{0, 3} {
		r := mustRun(t, p, l, s, Options{Mode: Shadow, Prompt: 4, Output: 32, Recall: 0.5, Ahead: 1, Seed: 2, Accept: 0.9, Draft: draft})
		if r.MissesWrong == 0 {
			t.Fatalf("draft %d: recall 0.5 missed nothing: %+v", draft, r)
		}
	}
}

// TestMaxDraftIsTheMainNodes: the simulator checks no more guesses a pass
// than the main node's pass loop can.
func TestMaxDraftIsTheMainNodes(t *testing.T) {
	if MaxDraft != passloop.MaxDraft {
		t.Fatalf("sim.MaxDraft %d, passloop.MaxDraft %d", MaxDraft, passloop.MaxDraft)
	}
}
