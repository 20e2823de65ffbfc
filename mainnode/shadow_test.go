package mainnode_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/grammar"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

type shadowSpec struct {
	quant kernels.DType
	// late: the shadow waits for every alignment (OD-MoE's late
	// departure) instead of running ahead (shadow.DefaultAhead)
	late bool
	// passesAhead, when above 0, is the shadow's Ahead instead
	passesAhead int
}

// ahead is the shadow's Ahead for spec.
func (spec shadowSpec) ahead() int {
	switch {
	case spec.late:
		return 0
	case spec.passesAhead > 0:
		return spec.passesAhead
	}
	return shadow.DefaultAhead
}

// startShadow runs a shadow node in this process: the model quantized to
// quant, connected to the workers, running up to ahead passes ahead,
// listening for the main node.
func startShadow(t testing.TB, ctx context.Context, f inproc.Files, quant kernels.DType, ahead int, workerAddrs []string, layout sched.Layout) string {
	t.Helper()
	full, err := model.Load(f.Model, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { full.Close() })
	qm, err := full.Quantized(quant, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := f.Identity()
	if err != nil {
		t.Fatal(err)
	}
	addr, stop, err := inproc.StartShadow(ctx, inproc.ShadowOptions{Model: qm, Identity: id, Certs: f.Certs, Workers: workerAddrs, Layout: layout, Ahead: ahead, Listen: "127.0.0.1:0", Dir: f.Model, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr
}

// TestSwarmWithShadowIsBitIdenticalToLocal: with the shadow driving the
// loads — fp16, int8 or nf4, aligned every pass, every 4th, or never,
// running ahead or departing late — the output is still local mode's bit
// for bit: the shadow changes speed, never the output.
func TestSwarmWithShadowIsBitIdenticalToLocal(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(12, 53, 7, local.Config.VocabSize)
	const steps = 10
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	for _, q := range []kernels.DType{kernels.F16, kernels.Q8, kernels.NF4} {
		for _, c := range []struct {
			period   int
			late     bool
			adaptive bool
		}{{1, false, false}, {4, false, false}, {0, false, false}, {1, true, false}, {4, false, true}} {
			pol := align.Policy{TokenPeriod: c.period, KVPeriod: c.period, Adaptive: c.adaptive}
			spec := shadowSpec{quant: q, late: c.late}
			t.Run(fmt.Sprintf("%v/%v/ahead%d", q, pol, spec.ahead()), func(t *testing.T) {
				sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: pol}, &spec)
				got := generate(t, mainModel, sw, prompt, steps)
				if d := diffGenerations(got, want); d != "" {
					t.Fatalf("swarm with a %v shadow (%v) differs from local: %s", q, pol, d)
				}
				checkSwarmStats(t, sw, mainnode.Shadow, steps, len(mainModel.Config.ExpertLayers()))
				st, ok := sw.ShadowStats(10e9)
				if !ok || len(st.RecallByToken) != steps-1 || len(st.LateDepartureMs) != steps-1 {
					t.Fatalf("shadow stats: ok=%v, %d recall tokens, %d late departures, want %d", ok, len(st.RecallByToken), len(st.LateDepartureMs), steps-1)
				}
				dec := mainnode.Total(sw.Stats().Decode)
				if dec.MissesLate+dec.MissesWrong != dec.Misses {
					t.Errorf("decode misses %d are not late %d + wrong %d", dec.Misses, dec.MissesLate, dec.MissesWrong)
				}
				t.Logf("recall %.4f, misses %d (late %d, wrong %d)", st.Recall, dec.Misses, dec.MissesLate, dec.MissesWrong)
			})
		}
	}
}

// TestFP16ShadowAlignedEveryPassPredictsAbove99 is the paper's
// headline for SEP: an fp16 shadow aligned every pass (T1, K1)
// predicts over 99% of the experts (eq. 3) on the tiny model.
func TestFP16ShadowAlignedEveryPassPredictsAbove99(t *testing.T) {
	f := newSwarmFixture(t, 2)
	mainModel, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mainModel.Close()
	prompt := testPrompt(16, 101, 3, mainModel.Config.VocabSize)
	sw := dialSwarm(t, f, 2, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.F16})
	generate(t, mainModel, sw, prompt, 32)
	st, _ := sw.ShadowStats(10e9)
	t.Logf("fp16 T1_KV1 recall %.5f over %d tokens", st.Recall, len(st.RecallByToken))
	if st.Recall <= 0.99 {
		t.Fatalf("recall %.4f, want > 0.99", st.Recall)
	}
}

// TestTwoSequencesWithTheShadow: two sequences at once through one Swarm
// driven by one shadow, which follows both; each is bit-identical to its
// local run, and the shadow's predictions are scored for both.
func TestTwoSequencesWithTheShadow(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompts := [][]int{{3, 40, 77, 9, 12}, {5, 6, 7, 8, 9, 10, 11}}
	const steps = 8
	var want [2]generation
	for i, p := range prompts {
		want[i] = generate(t, local, model.NewResidentExperts(local), p, steps)
	}
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.F16})
	checkConcurrent(t, sw, mainModel, prompts, steps, want, true)
	st, ok := sw.ShadowStats(10e9)
	if !ok || st.Recall < 0.9 {
		t.Fatalf("shadow recall %.3f over two sequences (ok=%v), want >= 0.9 for an fp16 shadow aligned every step", st.Recall, ok)
	}
}

// TestResidentSwarmWithTheShadow: the resident swarm may run the shadow
// beside it (bench rig's resident-shadow, the baseline that pays the
// shadow's CPU): aligned every pass, the shadow predicts as in shadow
// mode, its hints go to the experts' owners, which pinned them at start
// (and a resident worker loads on no prediction), so nothing but the pins
// is ever loaded, and the output is still local mode's bit for bit.
func TestResidentSwarmWithTheShadow(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(12, 53, 7, local.Config.VocabSize)
	const steps = 10
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Resident, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.F16})
	got := generate(t, mainModel, sw, prompt, steps)
	if d := diffGenerations(got, want); d != "" {
		t.Fatalf("resident swarm with a shadow differs from local: %s", d)
	}
	checkSwarmStats(t, sw, mainnode.Resident, steps, len(mainModel.Config.ExpertLayers()))
	st, ok := sw.ShadowStats(10e9)
	if !ok || len(st.RecallByToken) != steps-1 || st.Recall < 0.9 {
		t.Fatalf("shadow stats: ok=%v, %d recall tokens (want %d), recall %.3f (want >= 0.9 for an fp16 shadow aligned every step)", ok, len(st.RecallByToken), steps-1, st.Recall)
	}
}

// TestShadowGuessesASampledRequestAsTheMainNodeSamples: a request drawn
// at temperature 0.8 with penalties and a logit bias, seeded, gives local
// mode's tokens and logits on a swarm driven by the shadow, and the
// shadow, told how the request samples, guesses its tokens as often as
// it guesses a greedy request's: its passes run ahead met the main
// node's token on at least 80% of the rows (the fp16 shadow's logits
// differ from the main node's by its rounding). Guessing greedily, as
// before the shadow was told, it met none of 36 here.
func TestShadowGuessesASampledRequestAsTheMainNodeSamples(t *testing.T) {
	f := newSwarmFixture(t, 4)
	sampler := func() *model.Sampler {
		return model.NewSampler(0.8, 0.95, 1234).WithPenalties(0.3, 0.2).WithBias(map[int]float64{7: 1.5})
	}
	local, mainModel := loadModels(t, f)
	checkShadowGuesses(t, f, local, mainModel, testPrompt(12, 71, 5, local.Config.VocabSize), 40, sampler, mainnode.KindSampled, 0.8)
}

// TestShadowGuessesMinPAndRepeatPenalty: llama-server's min_p and
// repeat_penalty travel to the shadow with the rest of a request's
// sampling (the penalty's window reaching back into the prompt): the
// swarm gives local mode's tokens, and the shadow meets them as it meets
// other sampled requests' (all 36 here; not told them, it met 29 of 37).
func TestShadowGuessesMinPAndRepeatPenalty(t *testing.T) {
	if model.MaxRepeatN != wire.MaxRepeatN {
		t.Fatalf("model.MaxRepeatN %d, wire.MaxRepeatN %d: a window the wire refuses", model.MaxRepeatN, wire.MaxRepeatN)
	}
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(12, 19, 5, local.Config.VocabSize)
	sampler := func() *model.Sampler {
		return model.NewSampler(1.5, 1, 77).WithMinP(0.6).WithRepeatPenalty(4, 64, prompt)
	}
	checkShadowGuesses(t, f, local, mainModel, prompt, 40, sampler, mainnode.KindSampled, 0.9)
}

// checkShadowGuesses runs prompt for steps tokens, each request choosing
// with a sampler of newSampler's, in local mode (local) and on a swarm of
// f (mainModel) driven by an fp16 shadow: the swarm gives local mode's tokens and logits, and the
// shadow's passes run ahead met the main node's token on at least atLeast
// of their rows (at least steps/2 rows), every guess counted under kind.
// It returns the swarm's generation.
func checkShadowGuesses(t *testing.T, f inproc.Files, local, mainModel *model.Model, prompt []int, steps int, newSampler func() *model.Sampler, kind string, atLeast float64) generation {
	t.Helper()
	want := generateWith(t, local, model.NewResidentExperts(local), prompt, steps, newSampler())
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.F16})
	got := generateWith(t, mainModel, sw, prompt, steps, newSampler())
	if d := diffGenerations(got, want); d != "" {
		t.Fatalf("a seeded %s request on the swarm differs from local mode: %s", kind, d)
	}
	st, ok := sw.ShadowStats(10e9)
	met := float64(st.Agreed) / float64(max(1, st.Agreed+st.Rewound))
	dec := mainnode.Total(sw.Stats().Decode)
	t.Logf("the shadow's guesses: %d met, %d rewound (%.3f); recall %.4f; decode misses %d of %d loads", st.Agreed, st.Rewound, met, st.Recall, dec.Misses, dec.Loads)
	if !ok || st.Agreed+st.Rewound < int64(steps/2) || met < atLeast {
		t.Fatalf("the shadow met the %s tokens on %.3f of %d rows run ahead (ok=%v), want >= %v", kind, met, st.Agreed+st.Rewound, ok, atLeast)
	}
	if g := st.Guesses[kind]; g.Met != st.Agreed || g.Rewound != st.Rewound {
		t.Errorf("the guesses by kind %v: all %d met and %d rewound are the %s request's", st.Guesses, st.Agreed, st.Rewound, kind)
	}
	return got
}

// TestShadowKeepsAConstrainedRequestsGuessesInItsGrammar: a sampled
// request whose answer follows a JSON schema (response_format) gives local
// mode's tokens on the swarm, and the shadow, sent the request's grammar
// with its sampling, guesses inside it: its passes run ahead met the main
// node's token on at least 90% of the rows. Told the sampling but not
// the grammar, as before, it met 24 of 44 (the unconstrained draw lands
// outside the grammar whenever the text may not go that way).
func TestShadowKeepsAConstrainedRequestsGuessesInItsGrammar(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	tok, err := tokenizer.LoadDir(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	node, err := grammar.FromSchema([]byte(`{"type": "object", "properties": {"name": {"type": "string"}, "count": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "count", "tags"], "additionalProperties": false}`))
	if err != nil {
		t.Fatal(err)
	}
	g, err := grammar.New(node)
	if err != nil {
		t.Fatal(err)
	}
	cs := grammar.For(g, grammar.NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.EOS()), grammar.NewMaskCache(grammar.MaskCacheBytes))
	sampler := func() *model.Sampler {
		c, err := cs.New()
		if err != nil {
			t.Fatal(err)
		}
		return model.NewSampler(0.7, 1, 99).WithConstraint(c)
	}
	got := checkShadowGuesses(t, f, local, mainModel, testPrompt(10, 33, 4, local.Config.VocabSize), 48, sampler, mainnode.KindConstrained, 0.9)
	t.Logf("answer %q", tok.Decode(got.tokens, true))
}

// TestAOneTokenPromptChunkIsPrefill: a prompt of 9 tokens in chunks of 4
// ends with a pass whose only row is one prompt token. It is prefill, as
// the pass says, not decode: its layers count as prefill's, the shadow
// (which predicts no prompt pass) is not asked for a prediction of it,
// and every decode pass's layers are scored against the shadow's.
func TestAOneTokenPromptChunkIsPrefill(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(9, 41, 3, local.Config.VocabSize)
	const steps = 6
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.F16})
	b := sw.Batcher(mainModel)
	b.ChunkPrompts(4)
	var got generation
	ids, _, err := b.Generate(context.Background(), prompt, model.GenerateOptions{MaxTokens: steps, OnToken: func(_, _ int, logits []float32) error {
		got.logits = append(got.logits, append([]float32(nil), logits...))
		return nil
	}})
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	got.tokens = ids
	if d := diffGenerations(got, want); d != "" {
		t.Fatalf("differs from local mode: %s", d)
	}
	layers := int64(len(mainModel.Config.ExpertLayers()))
	st := sw.Stats()
	if pre, dec := mainnode.Total(st.Prefill).Calls, mainnode.Total(st.Decode).Calls; pre != 3*layers || dec != (steps-1)*layers {
		t.Fatalf("%d prefill and %d decode layer passes, want %d (three chunks: 4, 4, 1) and %d", pre, dec, 3*layers, (steps-1)*layers)
	}
	if sh, ok := sw.ShadowStats(10e9); !ok || sh.Recall < 0.9 {
		t.Fatalf("shadow: ok=%v, recall %.3f", ok, sh.Recall)
	}
	if dec := mainnode.Total(st.Decode); dec.MissesLate+dec.MissesWrong != dec.Misses {
		t.Fatalf("decode misses %d are not late %d + wrong %d: a pass was scored that the shadow never predicted", dec.Misses, dec.MissesLate, dec.MissesWrong)
	}
}
