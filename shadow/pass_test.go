package shadow_test

import (
	"slices"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/wire"
)

// TestShadowRunsPassesAheadAndRewindsThem: a shadow allowed one pass
// ahead follows a batch of two sequences (their prompts said they would
// decode in it) and runs none of them ahead alone. After the first pass
// it runs the second on the tokens its own model sampled for both
// members, predicting the union of their routing under the batch's step
// with those tokens' PassToken. Alignments with the same tokens meet it
// (nothing runs again) and it goes on to pass 3; alignments where one
// member's token differs rewind it: it withdraws pass 3's predictions and
// predicts pass 3 again as its model routes after the main node's
// tokens.
func TestShadowRunsPassesAheadAndRewindsThem(t *testing.T) {
	r := newShadowRigAhead(t, 1)
	const batch = 1 << 50
	seqs := []uint64{1<<50 + 1, 1<<50 + 2}
	prompts := [][]int{{5, 200, 7, 300, 11, 90}, {1, 17, 33, 49, 65, 81}}
	for i, seq := range seqs {
		r.send(t, &wire.Alignment{Seq: seq, Iteration: 1, Token: -1, Prompt: int32s(prompts[i]), Batch: batch})
	}
	fed := [][]int{{100}, {7}} // each member's tokens after its prompt
	sendPass := func(pass int64, tokens ...int) {
		for i, seq := range seqs {
			r.send(t, &wire.Alignment{Seq: seq, Iteration: pass + 1, Token: int32(tokens[i]), Batch: batch, BatchIteration: pass, BatchSize: len(seqs)})
		}
	}
	// want is the union of the members' routing, as the shadow's model
	// routes each alone, when they are fed next (and PassToken of that)
	want := func(next []int) ([][]int, int32) {
		union := make([][]int, r.qm.Config.NumLayers)
		for i := range seqs {
			for l, es := range r.reference(t, prompts[i], next[i], fed[i][:len(fed[i])-1]...) {
				for _, e := range es {
					if !slices.Contains(union[l], e) {
						union[l] = append(union[l], e)
					}
				}
				slices.Sort(union[l])
			}
		}
		return union, align.PassToken(seqs, next)
	}
	check := func(what string, got []layerPrediction, next []int) {
		t.Helper()
		union, token := want(next)
		for l := range union {
			if !slices.Equal(got[l].experts, union[l]) || got[l].token != token {
				t.Errorf("%s, layer %d: predicted %v with token %d, the members' routing is %v with token %d", what, l, got[l].experts, got[l].token, union[l], token)
			}
		}
	}
	sendPass(1, fed[0][0], fed[1][0])
	got, done := r.readUntilDone(t, batch, 1)
	if done.Ahead != 0 {
		t.Fatalf("pass 1: %+v, want 0 ahead (its alignments departed it)", done)
	}
	check("pass 1", got, []int{fed[0][0], fed[1][0]})

	// pass 2 runs ahead on the shadow's own tokens
	own := func() []int {
		return []int{r.greedy(t, append(slices.Clone(prompts[0]), fed[0]...)), r.greedy(t, append(slices.Clone(prompts[1]), fed[1]...))}
	}
	own2 := own()
	fed[0], fed[1] = append(fed[0], own2[0]), append(fed[1], own2[1])
	got, done = r.readUntilDone(t, batch, 2)
	if done.Ahead != 1 {
		t.Fatalf("pass 2: %+v, want 1 ahead (no alignment for it was sent)", done)
	}
	check("pass 2 ahead", got, own2)

	// the main node samples the same tokens: met, and pass 3 runs ahead
	sendPass(2, own2...)
	own3 := own()
	first3, done := r.readUntilDone(t, batch, 3)
	if done.Ahead != 1 || done.Agreed != 1 || done.Rewound != 0 {
		t.Fatalf("pass 3: %+v, want 1 ahead, 1 agreed, 0 rewound", done)
	}
	fed[0], fed[1] = append(fed[0], own3[0]), append(fed[1], own3[1])
	check("pass 3 ahead", first3, own3)

	// the main node samples another token for the first member: a rewind
	main3 := []int{(own3[0] + 1) % r.qm.Config.VocabSize, own3[1]}
	sendPass(3, main3...)
	r.awaitWithdraw(t, batch, 3)
	got, done = r.readUntilDone(t, batch, 3)
	if done.Ahead != 0 || done.Rewound != 1 {
		t.Fatalf("pass 3 again: %+v, want 0 ahead (it departed on the alignments), 1 rewound", done)
	}
	fed[0][len(fed[0])-1] = main3[0]
	check("pass 3 after the rewind", got, main3)
}
