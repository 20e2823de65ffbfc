package shadow_test

import (
	"slices"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/wire"
)

// TestShadowRunsPassesAheadAndRewindsThem: a shadow allowed one pass
// ahead follows a batch of two sequences whose prompts come in chunks in
// the batch's passes, the second member decoding beside the first's last
// chunk. It predicts no pass that feeds a prompt chunk, and runs no pass
// ahead while a member's prompt has chunks to come. After the last chunk
// it runs the next pass on the tokens its own model sampled for both
// members, predicting the union of their routing under the batch's step
// with those tokens' PassToken. Alignments with the same tokens meet it
// (nothing runs again) and it goes on to the next pass; alignments where
// one member's token differs rewind that member's row only: the main
// node hears at once, for every layer, the other member's routing (its
// row kept), each expert on the worker it was hinted to, then the union
// with the rewound member's routing on the main node's token, no expert
// that stays moved; no pass is withdrawn whole.
func TestShadowRunsPassesAheadAndRewindsThem(t *testing.T) {
	r := newShadowRigAhead(t, 1)
	const batch = 1 << 50
	seqs := []uint64{1<<50 + 1, 1<<50 + 2}
	prompts := [][]int{{5, 200, 7, 300, 11, 90}, {1, 17, 33, 49, 65, 81}}
	member := func(i int, pass int64) *wire.Alignment {
		return &wire.Alignment{Seq: seqs[i], Pass: pass, Token: -1, Batch: batch, BatchPass: pass, BatchSize: len(seqs)}
	}
	noPredictions := func(pass int64) {
		t.Helper()
		got, done := r.readUntilDone(t, batch, pass)
		if done.Ahead != 0 {
			t.Fatalf("pass %d: %+v, want 0 ahead (its alignments departed it)", pass, done)
		}
		for l, p := range got {
			if len(p.experts) > 0 {
				t.Fatalf("pass %d feeds a prompt chunk, yet layer %d was predicted: %v", pass, l, p.experts)
			}
		}
	}
	// pass 1: the first half of member 0's prompt, all of member 1's
	a, b := member(0, 1), member(1, 1)
	a.Chunk, a.PromptLeft = int32s(prompts[0][:3]), 3
	b.Chunk = int32s(prompts[1])
	r.send(t, a)
	r.send(t, b)
	noPredictions(1)
	// pass 2: the rest of member 0's prompt, member 1's first token
	fed := [][]int{{}, {7}} // each member's tokens after its prompt
	a, b = member(0, 2), member(1, 2)
	a.Chunk = int32s(prompts[0][3:])
	b.Token = int32(fed[1][0])
	r.send(t, a)
	r.send(t, b)
	noPredictions(2) // not run ahead: member 0's prompt had a chunk to come

	sendPass := func(pass int64, tokens ...int) {
		for i := range seqs {
			a := member(i, pass)
			a.Token = int32(tokens[i])
			r.send(t, a)
		}
	}
	// want is the union of the members' routing, as the shadow's model
	// routes each alone, when they are fed next after fed (and PassToken
	// of that)
	want := func(next []int) ([][]int, int32) {
		union := make([][]int, r.qm.Config.NumLayers)
		for i := range seqs {
			for l, es := range r.reference(t, prompts[i], next[i], fed[i]...) {
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
	own := func() []int {
		return []int{r.greedy(t, append(slices.Clone(prompts[0]), fed[0]...)), r.greedy(t, append(slices.Clone(prompts[1]), fed[1]...))}
	}
	// pass 3 runs ahead on the shadow's own tokens
	own3 := own()
	got, done := r.readUntilDone(t, batch, 3)
	if done.Ahead != 1 {
		t.Fatalf("pass 3: %+v, want 1 ahead (no alignment for it was sent)", done)
	}
	check("pass 3 ahead", got, own3)
	fed[0], fed[1] = append(fed[0], own3[0]), append(fed[1], own3[1])

	// the main node samples the same tokens: met, and pass 4 runs ahead
	sendPass(3, own3...)
	own4 := own()
	first4, done := r.readUntilDone(t, batch, 4)
	if done.Ahead != 1 || done.Agreed != 2 || done.Rewound != 0 {
		t.Fatalf("pass 4: %+v, want 1 ahead, 2 agreed (both members' rows), 0 rewound", done)
	}
	check("pass 4 ahead", first4, own4)

	// the main node samples another token for the first member: its row
	// is rewound, the second member's kept
	main4 := []int{(own4[0] + 1) % r.qm.Config.VocabSize, own4[1]}
	sendPass(4, main4...)
	got, done = r.readUntilDone(t, batch, 4)
	if done.Ahead != 0 || done.Rewound != 1 || done.Agreed != 3 || !slices.Equal(done.RewoundSeqs, seqs[:1]) {
		t.Fatalf("pass 4 again: %+v, want 0 ahead (it departed on the alignments), 1 rewound (the first member), 3 agreed", done)
	}
	check("pass 4 after the rewind", got, main4)
	kept := r.reference(t, prompts[1], own4[1], fed[1]...)
	for l := range kept {
		if len(kept[l]) == 0 {
			continue
		}
		if len(got[l].all) != 2 || !slices.Equal(got[l].all[0], kept[l]) {
			t.Errorf("pass 4 after the rewind, layer %d: predictions %v, want the kept member's routing %v first, then the union", l, got[l].all, kept[l])
			continue
		}
		// the kept union is partial (placed on, not scored), each expert
		// on the worker it was hinted to ahead; the whole union is not
		if first := got[l].msgs[0]; !first.Partial || got[l].msgs[1].Partial {
			t.Errorf("layer %d: partial flags %v, %v; want the kept union partial, the whole one not", l, first.Partial, got[l].msgs[1].Partial)
		} else {
			for i, e := range first.Experts {
				if j := slices.Index(first4[l].experts, int(e)); j < 0 || first.Workers[i] != first4[l].on[j] {
					t.Errorf("layer %d: kept expert %d told on worker %d, hinted ahead to %v of %v", l, e, first.Workers[i], first4[l].on, first4[l].experts)
				}
			}
		}
		for i, e := range got[l].experts {
			if j := slices.Index(first4[l].experts, e); j >= 0 && got[l].on[i] != first4[l].on[j] {
				t.Errorf("layer %d: expert %d moved from worker %d to %d", l, e, first4[l].on[j], got[l].on[i])
			}
		}
	}
}

// TestShadowReusesAFinishedSequencesRows: a sequence that ends leaves its
// rows in the shadow's prefix cache; the next one, whose pass says it
// starts with all of those tokens (the main node reused them), copies
// them instead of running them (ShadowDone.Reused counts them) and
// predicts what its model routes after the whole history.
func TestShadowReusesAFinishedSequencesRows(t *testing.T) {
	r := newShadowRig(t)
	prompt, first := []int{5, 200, 7, 300, 11, 90}, 100
	const a, b = 1 << 44, 1<<44 + 1
	r.send(t, alone(a, 1, -1, prompt...))
	r.send(t, alone(a, 2, first))
	if _, done := r.readUntilDone(t, batchOf(a), 2); done.Reused != 0 {
		t.Fatalf("the first sequence reports %d reused tokens, want 0", done.Reused)
	}
	r.send(t, &wire.SequenceEnd{Seq: a})
	r.send(t, &wire.SequenceEnd{Seq: batchOf(a)})
	// the next turn: the history, then two new prompt tokens, then a token
	history := append(slices.Clone(prompt), first)
	start := alone(b, 1, -1, 33, 49)
	start.History = int32s(history)
	r.send(t, start)
	r.send(t, alone(b, 2, 7))
	got, done := r.readUntilDone(t, batchOf(b), 2)
	if done.Reused != int64(len(history)) {
		t.Fatalf("the next turn reused %d tokens' rows, want the %d of the history", done.Reused, len(history))
	}
	want := r.reference(t, prompt, 7, first, 33, 49)
	for l := range want {
		if !slices.Equal(got[l].experts, want[l]) {
			t.Errorf("layer %d: predicted %v, the shadow's model routes %v after the history", l, got[l].experts, want[l])
		}
	}
}

// TestShadowRunsAPassWhoseMemberEndedFirst: a member's SequenceEnd can
// overtake its last alignment (they travel on different streams). One
// that names its last pass keeps the member until that pass has run
// with its row: the pass predicts both members' routing. One that does
// not still lets the pass count the alignment and run without the row; a
// pass whose every member has ended is reported done, and the next pass,
// with a new member, runs.
func TestShadowRunsAPassWhoseMemberEndedFirst(t *testing.T) {
	r := newShadowRig(t)
	const batch = 1 << 52
	a, b, c := uint64(1<<52+1), uint64(1<<52+2), uint64(1<<52+3)
	prompt := []int{5, 200, 7, 300, 11, 90}
	member := func(seq uint64, it, pass int64, size int) *wire.Alignment {
		return &wire.Alignment{Seq: seq, Pass: it, Token: -1, Batch: batch, BatchPass: pass, BatchSize: size}
	}
	for _, seq := range []uint64{a, b} {
		m := member(seq, 1, 1, 2)
		m.Chunk = int32s(prompt)
		r.send(t, m)
	}
	r.readUntilDone(t, batch, 1)
	r.send(t, &wire.SequenceEnd{Seq: a, Last: 2}) // before its last alignment
	r.sync(t)
	tokens := map[uint64]int{a: 77, b: 9}
	for _, seq := range []uint64{a, b} {
		m := member(seq, 2, 2, 2)
		m.Token = int32(tokens[seq])
		r.send(t, m)
	}
	got, _ := r.readUntilDone(t, batch, 2)
	ra, rb := r.reference(t, prompt, tokens[a]), r.reference(t, prompt, tokens[b])
	for l := range rb {
		union := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(ra[l]), rb[l]...))))
		if !slices.Equal(got[l].experts, union) {
			t.Errorf("pass 2, layer %d: predicted %v, the members route %v and %v", l, got[l].experts, ra[l], rb[l])
		}
	}
	r.send(t, &wire.SequenceEnd{Seq: b}) // no last pass said
	r.sync(t)
	m := member(b, 3, 3, 1)
	m.Token = 4
	r.send(t, m)
	if got, _ := r.readUntilDone(t, batch, 3); len(got[0].experts) != 0 {
		t.Fatalf("pass 3 of ended members only predicted %v", got[0].experts)
	}
	m = member(c, 1, 4, 1)
	m.Chunk = int32s(prompt)
	r.send(t, m)
	r.readUntilDone(t, batch, 4)
	m = member(c, 2, 5, 1)
	m.Token = 9
	r.send(t, m)
	if got, _ := r.readUntilDone(t, batch, 5); !slices.Equal(got[0].experts, rb[0]) {
		t.Fatalf("pass 5 after a pass of ended members predicted %v, want %v", got[0].experts, rb[0])
	}
}

// sync waits until the shadow has handled every control message sent
// before (a SequenceEnd): it answers a clock request on the same stream.
func (r *shadowRig) sync(t *testing.T) {
	t.Helper()
	r.send(t, &wire.Trace{Clock: true})
	for {
		if _, ok := r.recv(t).(*wire.Trace); ok {
			return
		}
	}
}

// TestShadowRunsNoPassAheadForAMemberLeaving: a member whose alignment
// says it is final (its token limit reached) is left out of the pass the
// shadow runs ahead, so the next pass, without it, meets that pass
// instead of rewinding it.
func TestShadowRunsNoPassAheadForAMemberLeaving(t *testing.T) {
	r := newShadowRigAhead(t, 1)
	const batch = 1 << 53
	a, b, prompts, member := twoMembers(t, r, batch)
	// pass 2 runs ahead on both members' own tokens
	own := map[uint64]int{a: r.greedy(t, prompts[a]), b: r.greedy(t, prompts[b])}
	if _, done := r.readUntilDone(t, batch, 2); done.Ahead != 1 {
		t.Fatalf("pass 2: %+v, want it run ahead", done)
	}
	for _, seq := range []uint64{a, b} {
		m := member(seq, 2, 2)
		m.Token, m.Final = int32(own[seq]), seq == a // a leaves after pass 2
		r.send(t, m)
	}
	// pass 3 runs ahead on b alone, and b's alignment meets it
	ownB := r.greedy(t, append(slices.Clone(prompts[b]), own[b]))
	got, done := r.readUntilDone(t, batch, 3)
	if done.Ahead != 1 {
		t.Fatalf("pass 3: %+v, want it run ahead", done)
	}
	want := r.reference(t, prompts[b], ownB, own[b])
	for l := range want {
		if !slices.Equal(got[l].experts, want[l]) {
			t.Errorf("pass 3 ahead, layer %d: predicted %v, b alone routes %v", l, got[l].experts, want[l])
		}
	}
	r.send(t, &wire.SequenceEnd{Seq: a, Last: 2})
	m := member(b, 3, 1)
	m.Token = int32(ownB)
	r.send(t, m)
	if _, done := r.readUntilDone(t, batch, 4); done.Rewound != 0 || done.Agreed != 3 {
		t.Fatalf("after pass 3's alignment: %+v, want it met (3 rows agreed: 2 of pass 2, 1 of pass 3; 0 rewound)", done)
	}
}

// TestAMemberThatLeavesUnannouncedCostsItsRowOnly: a member that ends
// without a final pass (an end of sequence the main node could not know
// before sampling it) was in the pass the shadow ran ahead. The main
// node's pass holds only the other member, on the token the shadow
// guessed: nothing runs again, nothing is rewound, and that pass's
// predictions become what the remaining member routes, each expert left
// on the worker it was hinted to.
func TestAMemberThatLeavesUnannouncedCostsItsRowOnly(t *testing.T) {
	r := newShadowRigAhead(t, 1)
	const batch = 1 << 54
	a, b, prompts, member := twoMembers(t, r, batch)
	own := map[uint64]int{a: r.greedy(t, prompts[a]), b: r.greedy(t, prompts[b])}
	ahead, done := r.readUntilDone(t, batch, 2)
	if done.Ahead != 1 {
		t.Fatalf("pass 2: %+v, want it run ahead", done)
	}
	r.send(t, &wire.SequenceEnd{Seq: a, Last: 1}) // a ended after pass 1
	m := member(b, 2, 1)
	m.Token = int32(own[b])
	r.send(t, m)
	got, done := r.readUntilDone(t, batch, 2)
	if done.Ahead != 0 || done.Rewound != 0 || done.Agreed != 1 || len(done.RewoundSeqs) != 0 {
		t.Fatalf("pass 2 without a: %+v, want 0 ahead, 0 rewound, 1 agreed (b's row)", done)
	}
	want := r.reference(t, prompts[b], own[b])
	for l := range want {
		if !slices.Equal(got[l].experts, want[l]) || len(got[l].all) != 1 || got[l].token != int32(own[b]) {
			t.Errorf("pass 2 without a, layer %d: predictions %v with token %d, want once b's routing %v with token %d", l, got[l].all, got[l].token, want[l], own[b])
		}
		for i, e := range got[l].experts {
			if j := slices.Index(ahead[l].experts, e); j < 0 || got[l].on[i] != ahead[l].on[j] {
				t.Errorf("layer %d: expert %d on worker %d, hinted ahead to %v", l, e, got[l].on[i], ahead[l].on)
			}
		}
	}
}

// twoMembers starts batch's members batch+1 and batch+2 with their
// prompts in its first pass, and returns them, their prompts and a maker
// of their alignments.
func twoMembers(t *testing.T, r *shadowRig, batch uint64) (a, b uint64, prompts map[uint64][]int, member func(seq uint64, it int64, size int) *wire.Alignment) {
	t.Helper()
	a, b = batch+1, batch+2
	prompts = map[uint64][]int{a: {5, 200, 7, 300, 11, 90}, b: {1, 17, 33, 49, 65, 81}}
	member = func(seq uint64, it int64, size int) *wire.Alignment {
		return &wire.Alignment{Seq: seq, Pass: it, Token: -1, Batch: batch, BatchPass: it, BatchSize: size}
	}
	for _, seq := range []uint64{a, b} {
		m := member(seq, 1, 2)
		m.Chunk = int32s(prompts[seq])
		r.send(t, m)
	}
	r.readUntilDone(t, batch, 1)
	return a, b, prompts, member
}
