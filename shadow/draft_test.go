package shadow_test

import (
	"slices"
	"testing"

	"github.com/odmoe/odmoe/wire"
)

// TestATokenlessAlignmentAfterDraftingKeepsOneRow: after a pass aligned
// with Draft 2, the shadow runs the next pass ahead with 2 guesses (3
// rows). The main node's next alignment carries no token (Token -1, not
// due) and, no longer drafting, fed 1 row: the shadow keeps 1 row, and
// its next pass ahead predicts what its model routes after the prompt,
// the token and its own next token, at the position after them.
func TestATokenlessAlignmentAfterDraftingKeepsOneRow(t *testing.T) {
	r := newShadowRigAhead(t, 1)
	const seq = 1 << 45
	b := batchOf(seq)
	prompt := []int{5, 200, 7, 300, 11, 90}
	L := len(prompt)
	r.send(t, alone(seq, 1, 0, prompt...))
	tok := 17
	a := alone(seq, 2, tok)
	a.Pos, a.Draft = L, 2
	r.send(t, a)
	// pass 2 aligned, then pass 3 ahead with 2 guesses (under load the
	// shadow may have run pass 2 ahead on its own guess before pass 2's
	// alignment came, and run it again once it did)
	r.readUntilDone(t, b, 2)
	_, done := r.readPassAfterRewinds(t, b, 3)
	if done.Ahead != 1 {
		t.Fatalf("pass 3: %+v, want run ahead", done)
	}
	own3 := r.greedy(t, append(slices.Clone(prompt), tok))
	a = alone(seq, 3, -1)
	a.Token, a.Pos, a.Draft = -1, L+1, 0
	r.send(t, a)
	got, done := r.readUntilDone(t, b, 4)
	if done.Ahead != 1 {
		t.Fatalf("pass 4: %+v, want run ahead", done)
	}
	own4 := r.greedy(t, append(slices.Clone(prompt), tok, own3))
	want := r.reference(t, prompt, own4, tok, own3)
	for l := range want {
		if !slices.Equal(got[l].experts, want[l]) {
			t.Errorf("pass 4 ahead, layer %d: predicted %v, the model routes %v after prompt, %d, %d then %d", l, got[l].experts, want[l], tok, own3, own4)
		}
	}
}

// TestAMetPassTakesBackItsOwnGuessesNotTheNextPasss: with Ahead 2, a
// met pass whose guesses the main node fed only in part takes back its
// own guess rows, not those of the pass run after it: every token the
// shadow guesses afterwards, at every position, is its model's greedy
// continuation of what the main node fed (here the shadow's own greedy
// tokens).
func TestAMetPassTakesBackItsOwnGuessesNotTheNextPasss(t *testing.T) {
	r := newShadowRigAhead(t, 2)
	const seq = 1 << 46
	prompt := []int{5, 200, 7, 300, 11, 90}
	L := len(prompt)
	ref := append(slices.Clone(prompt), 17)
	for len(ref) < L+24 {
		ref = append(ref, r.greedy(t, ref))
	}
	r.send(t, alone(seq, 1, 0, prompt...))
	a := alone(seq, 2, 17)
	a.Pos, a.Draft = L, 3
	r.send(t, a)
	drafts := map[int64]*wire.Drafts{}
	readTo := func(pass int64) {
		for {
			switch m := r.recv(t).(type) {
			case *wire.Drafts:
				drafts[m.Pass] = m
			case *wire.ShadowDone:
				if m.Pass == pass {
					return
				}
			}
		}
	}
	readTo(4) // pass 2 aligned, 3 and 4 ahead, each with 3 guesses
	d3 := drafts[3]
	if d3 == nil || len(d3.Tokens[0]) != 4 || d3.Pos[0] != L+1 {
		t.Fatalf("pass 3's drafts %+v", d3)
	}
	own3, g1 := d3.Tokens[0][0], d3.Tokens[0][1]
	// the main node fed own3 and the first guess only (the rest had not come)
	a = alone(seq, 3, int(own3))
	a.Pos, a.Draft, a.Guesses = L+1, 3, []int32{g1}
	r.send(t, a)
	clear(drafts)
	readTo(5)
	for p, d := range drafts {
		t.Logf("after the alignment: pass %d pos %v tokens %v; the model's: %v", p, d.Pos, d.Tokens, ref[d.Pos[0]:d.Pos[0]+len(d.Tokens[0])])
		for j, tok := range d.Tokens[0] {
			if int(tok) != ref[d.Pos[0]+j] {
				t.Errorf("pass %d: token %d at position %d, the shadow's model continues with %d there", p, tok, d.Pos[0]+j, ref[d.Pos[0]+j])
			}
		}
	}
}
