package mainnode_test

import (
	"context"
	"github.com/odmoe/odmoe/passloop"
	"slices"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
)

// batchedGenerations runs prompts on b at once, n tokens each (EOS
// ignored): they join the first pass together, in order, so their decode
// passes overlap in the batch. seen, if set, is told of request i's
// token step as it comes (on the batch's loop).
func batchedGenerations(t *testing.T, b *passloop.Batcher, prompts [][]int, n int, seen func(i, step int)) []generation {
	t.Helper()
	out := make([]generation, len(prompts))
	joined := b.StartTogether(len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() {
			ids, _, err := b.Generate(context.Background(), p, model.GenerateOptions{MaxTokens: n,
				OnToken: func(step, id int, logits []float32) error {
					out[i].logits = append(out[i].logits, slices.Clone(logits))
					if seen != nil {
						seen(i, step)
					}
					return nil
				}})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			out[i].tokens = ids
		})
		<-joined
	}
	wg.Wait()
	return out
}

// eachFamily runs test on each family's tiny preset, generated with seed
// for a swarm of 4 workers, with the whole model and the main node's part
// of it.
func eachFamily(t *testing.T, seed uint64, test func(t *testing.T, preset string, f inproc.Files, local, mainModel *model.Model)) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny", "gpt-oss-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny-fp8"} {
		t.Run(preset, func(t *testing.T) {
			f, err := inproc.Generate(context.Background(), t.TempDir(), preset, seed, 4)
			if err != nil {
				t.Fatal(err)
			}
			local, mainModel := loadModels(t, f)
			test(t, preset, f, local, mainModel)
		})
	}
}

func decodeLoads(st *mainnode.Stats) (loads int64) {
	for _, l := range st.Decode {
		loads += l.Loads
	}
	return loads
}

// TestBatchedRequestsOnTheSwarmAreEachLocalModesAlone: four requests
// decoding together in one batch on the swarm (reactive loading, top-k
// above the group size) each get local mode's tokens and logits alone,
// bit for bit, for every family; and the batch loads fewer experts than
// the same requests one after another, since a layer's expert loads once
// for every sequence that routed to it. With an int8 shadow running the
// same batches, the tokens are the same and its predictions of the
// batches' routing score a recall well above chance.
func TestBatchedRequestsOnTheSwarmAreEachLocalModesAlone(t *testing.T) {
	eachFamily(t, 13, func(t *testing.T, preset string, f inproc.Files, local, mainModel *model.Model) {
		const n = 8
		var prompts [][]int
		for i := range 4 {
			prompts = append(prompts, testPrompt(3+2*i, 11+i, 7+i, local.Config.VocabSize))
		}
		want := make([]generation, len(prompts))
		for i, p := range prompts {
			want[i] = generate(t, local, model.NewResidentExperts(local), p, n)
		}

		sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Reactive}, nil)
		b := sw.Batcher(mainModel)
		got := batchedGenerations(t, b, prompts, n, nil)
		b.Close()
		for i := range prompts {
			if d := diffGenerations(got[i], want[i]); d != "" {
				t.Fatalf("request %d batched on the swarm differs from local mode alone: %s", i, d)
			}
		}
		together := decodeLoads(sw.Stats())

		sw = dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Reactive}, nil)
		b = sw.Batcher(mainModel)
		for i, p := range prompts {
			g := batchedGenerations(t, b, [][]int{p}, n, nil)
			if d := diffGenerations(g[0], want[i]); d != "" {
				t.Fatalf("request %d alone in the batch differs from local mode: %s", i, d)
			}
		}
		b.Close()
		alone := decodeLoads(sw.Stats())
		t.Logf("%s: decode expert loads %d batched, %d one request after another", preset, together, alone)
		if together >= alone {
			t.Fatalf("batched decode loaded %d experts, one after another %d: batching shared no load", together, alone)
		}

		sw = dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.Q8})
		b = sw.Batcher(mainModel)
		got = batchedGenerations(t, b, prompts, n, nil)
		for i := range prompts {
			if d := diffGenerations(got[i], want[i]); d != "" {
				t.Fatalf("request %d batched with a shadow differs from local mode alone: %s", i, d)
			}
		}
		st, ok := sw.ShadowStats(10e9)
		b.Close()
		chance := float64(local.Config.TopK) / float64(local.Config.NumExperts)
		t.Logf("%s: the shadow's recall over batched passes %.4f", preset, st.Recall)
		if !ok || st.Recall < 2*chance {
			t.Fatalf("the shadow's recall over batched passes %.4f (ok %v), not above twice chance %.2f", st.Recall, ok, 2*chance)
		}
	})
}

// TestLocalBatcherIsLocalModeAlone: the local batcher (what -role local
// -http serves) gives every request what model.Generate gives it alone.
func TestLocalBatcherIsLocalModeAlone(t *testing.T) {
	f := newSwarmFixture(t, 1)
	local, _ := loadModels(t, f)
	var prompts [][]int
	for i := range 3 {
		prompts = append(prompts, testPrompt(4+i, 5+i, 3+i, local.Config.VocabSize))
	}
	b := mainnode.NewLocalBatcher(local)
	defer b.Close()
	got := batchedGenerations(t, b, prompts, 10, nil)
	for i, p := range prompts {
		if d := diffGenerations(got[i], generate(t, local, model.NewResidentExperts(local), p, 10)); d != "" {
			t.Fatalf("request %d: %s", i, d)
		}
	}
}

// joinLongPrompt runs short prompts and then long on b at once (they
// share the first pass, in that order), n tokens each. It returns every request's generation
// (the long one last) and how many tokens the short requests were given
// before the long one's first.
func joinLongPrompt(t *testing.T, b *passloop.Batcher, short [][]int, long []int, n int) ([]generation, int) {
	t.Helper()
	tokens, before := 0, 0 // the short requests' tokens so far, and at the long one's first
	out := batchedGenerations(t, b, append(slices.Clone(short), long), n, func(i, step int) {
		switch {
		case i < len(short):
			tokens++
		case step == 0:
			before = tokens
		}
	})
	return out, before
}

// TestChunkedPromptJoinsRunningStreams: a 41-token prompt starts with two
// short ones in passes of at most 8 prompt tokens, so the short requests
// decode a token in every pass that feeds a chunk of the long one once
// their own prompts are in; in local mode and on the swarm (every
// prefetch policy, the shadow's with an int8 shadow that follows the
// chunked passes) every request's tokens and logits are local mode's
// alone, bit for bit, for every family.
func TestChunkedPromptJoinsRunningStreams(t *testing.T) {
	eachFamily(t, 17, func(t *testing.T, preset string, f inproc.Files, local, mainModel *model.Model) {
		const n, chunk = 24, 8
		vocab := local.Config.VocabSize
		short := [][]int{testPrompt(3, 7, 2, vocab), testPrompt(5, 11, 4, vocab)}
		long := testPrompt(41, 13, 5, vocab)
		var want []generation
		for _, p := range append(slices.Clone(short), long) {
			want = append(want, generate(t, local, model.NewResidentExperts(local), p, n))
		}
		check := func(what string, b *passloop.Batcher) {
			t.Helper()
			b.ChunkPrompts(chunk)
			got, before := joinLongPrompt(t, b, short, long, n)
			for i := range got {
				if d := diffGenerations(got[i], want[i]); d != "" {
					t.Fatalf("%s: request %d differs from local mode alone: %s", what, i, d)
				}
			}
			// the long prompt takes at least 41/8 passes; from the second
			// on, the short requests decode beside it
			if min := len(short) * (len(long)/chunk - 1); before < min {
				t.Fatalf("%s: the short requests got %d tokens before the long one's first, want at least %d (one in each pass that fed it a chunk)", what, before, min)
			}
		}
		b := mainnode.NewLocalBatcher(local)
		check("local", b)
		b.Close()
		for _, policy := range mainnode.Prefetches {
			if policy == mainnode.Shadow {
				continue // below, with its shadow
			}
			b = dialSwarm(t, f, 4, mainnode.Options{Prefetch: policy}, nil).Batcher(mainModel)
			check("swarm, "+string(policy), b)
			b.Close()
		}
		sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.Q8})
		b = sw.Batcher(mainModel)
		check("swarm, int8 shadow", b)
		st, ok := sw.ShadowStats(10e9)
		b.Close()
		if !ok || st.Recall <= 0 {
			t.Fatalf("the shadow predicted none of the decode passes (recall %v, ok %v)", st.Recall, ok)
		}
	})
}

// TestEachRequestGetsItsShareOfTheFigures: requests batched on the swarm
// each get their own rows' figures (GenerateStats.Experts). Reactive,
// every expert a row was routed to is loaded on demand in every decode
// step: each request counts top-k x expert layers misses a step, none
// scored against a prediction. With an int8 shadow, each request's rows
// are scored: some of its routed experts predicted, never more than
// routed, its misses late or wrong.
func TestEachRequestGetsItsShareOfTheFigures(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	c := local.Config
	prompts := [][]int{testPrompt(5, 7, 1, c.VocabSize), testPrompt(9, 11, 2, c.VocabSize), testPrompt(3, 13, 3, c.VocabSize)}
	const n = 8
	perStep := int64(c.TopK * len(c.ExpertLayers()))
	run := func(sw *mainnode.Swarm) []model.ExpertFigures {
		b := sw.Batcher(mainModel)
		defer b.Close()
		joined := b.StartTogether(len(prompts))
		figs := make([]model.ExpertFigures, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			wg.Go(func() {
				_, st, err := b.Generate(context.Background(), p, model.GenerateOptions{MaxTokens: n})
				if err != nil {
					t.Error(err)
				}
				figs[i] = st.Experts
			})
			<-joined
		}
		wg.Wait()
		return figs
	}
	for i, e := range run(dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Reactive}, nil)) {
		if e.Steps != n-1 || e.Misses != perStep*e.Steps || e.Routed != 0 || e.MissesLate+e.MissesWrong != 0 {
			t.Errorf("reactive, request %d: %+v, want %d steps and %d misses a step, none scored", i, e, n-1, perStep)
		}
	}
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.Q8})
	for i, e := range run(sw) {
		if e.Steps != n-1 || e.Predicted <= 0 || e.Predicted > e.Routed || e.Routed > perStep*e.Steps || e.MissesLate+e.MissesWrong > e.Misses {
			t.Errorf("with a shadow, request %d: %+v, want %d steps, 0 < predicted <= routed <= %d, late + wrong <= misses", i, e, n-1, perStep*(n-1))
		}
	}
}

// TestEachSequenceAlignsOnItsOwn: with an adaptive alignment policy each
// member sequence has its own controller. A request that has decoded
// long enough for its periods to grow keeps them, while one that joins
// its batch late starts aligned every step (T1_KV1) and ran most of its
// steps so: it does not inherit the other's periods.
func TestEachSequenceAlignsOnItsOwn(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	vocab := local.Config.VocabSize
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 4, KVPeriod: 4, Adaptive: true}}, &shadowSpec{quant: kernels.Q8})
	b := sw.Batcher(mainModel)
	defer b.Close()
	const long, late, joinAt = 200, 20, 150
	var lateFigs model.ExpertFigures
	var wg sync.WaitGroup
	_, st, err := b.Generate(context.Background(), testPrompt(5, 7, 1, vocab), model.GenerateOptions{MaxTokens: long,
		OnToken: func(step, _ int, _ []float32) error {
			if step == joinAt {
				wg.Go(func() {
					_, lst, err := b.Generate(context.Background(), testPrompt(6, 11, 2, vocab), model.GenerateOptions{MaxTokens: late})
					if err != nil {
						t.Error(err)
					}
					lateFigs = lst.Experts
				})
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	first := st.Experts
	t.Logf("the long request ran %d steps mostly at T%d_KV%d, the late one %d steps mostly at T%d_KV%d", first.Steps, first.AlignToken, first.AlignKV, lateFigs.Steps, lateFigs.AlignToken, lateFigs.AlignKV)
	if first.AlignToken == 1 && first.AlignKV == 1 {
		t.Fatalf("the long request's periods never grew (T1_KV1 most): %+v", first)
	}
	if lateFigs.Steps != late-1 || lateFigs.AlignToken != 1 || lateFigs.AlignKV != 1 {
		t.Fatalf("the late request: %+v, want %d steps aligned mostly every step (T1_KV1), as a sequence of its own starts", lateFigs, late-1)
	}
}
