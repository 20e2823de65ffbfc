package mainnode_test

import (
	"context"
	"github.com/odmoe/odmoe/passloop"
	"slices"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
)

// TestPrefixCacheIsBitIdenticalToPrefillingAgain: with the prefix cache
// on, a chat's next turn (the first turn's prompt and answer, then new
// tokens) and a request sharing only the first turn's start (a system
// prompt) reuse the rows the first turn left, report them as cached, and
// get exactly the tokens and logits of a solo run that computes every
// row, for every family, in local mode and on a swarm driven by an int8
// shadow.
func TestPrefixCacheIsBitIdenticalToPrefillingAgain(t *testing.T) {
	eachFamily(t, 17, func(t *testing.T, _ string, f inproc.Files, local, mainModel *model.Model) {
		const n = 6
		first := testPrompt(12, 5, 3, local.Config.VocabSize)
		answer := generate(t, local, model.NewResidentExperts(local), first, n).tokens
		next := append(append(slices.Clone(first), answer[:n-1]...), testPrompt(4, 77, 5, local.Config.VocabSize)...)
		system := append(slices.Clone(first[:7]), testPrompt(5, 31, 2, local.Config.VocabSize)...)
		cases := []struct {
			prompt []int
			cached int
		}{
			{first, 0},
			{next, len(first) + n - 1}, // the last answer token was never fed
			{system, 7},
		}
		want := make([]generation, len(cases))
		for i, c := range cases {
			want[i] = generate(t, local, model.NewResidentExperts(local), c.prompt, n)
		}
		run := func(name string, b *passloop.Batcher) {
			t.Helper()
			b.KeepPrefixes(64 << 20)
			for i, c := range cases {
				var g generation
				ids, st, err := b.Generate(context.Background(), c.prompt, model.GenerateOptions{MaxTokens: n,
					OnToken: func(_, _ int, logits []float32) error {
						g.logits = append(g.logits, slices.Clone(logits))
						return nil
					}})
				if err != nil {
					t.Fatal(err)
				}
				g.tokens = ids
				if d := diffGenerations(g, want[i]); d != "" {
					t.Fatalf("%s, request %d (%d cached tokens): %s", name, i, st.CachedTokens, d)
				}
				if st.CachedTokens != c.cached || st.PromptTokens != len(c.prompt) {
					t.Fatalf("%s, request %d: %d of %d prompt tokens cached, want %d of %d", name, i, st.CachedTokens, st.PromptTokens, c.cached, len(c.prompt))
				}
			}
		}
		lb := mainnode.NewLocalBatcher(local)
		run("local", lb)
		lb.Close()
		sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.Q8})
		sb := sw.Batcher(mainModel)
		run("swarm", sb)
		st, _ := sw.ShadowStats(10e9)
		sb.Close()
		if st.Reused == 0 {
			t.Fatal("the shadow ran every reused prefix again: its prefix cache reused no token")
		}
	})
}
