package mainnode

import (
	"context"
	"slices"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/passloop"
)

// TestTheLinksHistoryHoldsTheGuessesAPassKept: the link's record of a
// sequence's tokens (what a shadow that attaches is sent as History)
// holds the guesses a pass kept, and not those it turned down.
func TestTheLinksHistoryHoldsTheGuessesAPassKept(t *testing.T) {
	sl := newShadowLink(nil, align.Policy{TokenPeriod: 1, KVPeriod: 1}, 2, []int{0}, nil)
	const seq = 7
	c := kvcache.New(1, 1, 4, 64)
	bp := batchPass{seq: 99, iter: 1, size: 1}
	// pass 1: the prompt
	if _, err := sl.startIn(context.Background(), passloop.Row{Step: model.Step{Seq: seq, Pass: 1}, Tokens: []int{1, 2, 3}, Prompt: true, Cache: c}, bp); err != nil {
		t.Fatal(err)
	}
	c.Commit(3)
	// pass 2: token 10 and guesses 11, 12, both kept by the main node
	bp.iter = 2
	if _, err := sl.startIn(context.Background(), passloop.Row{Step: model.Step{Seq: seq, Pass: 2}, Tokens: []int{10, 11, 12}, Drafted: 2, Cache: c}, bp); err != nil {
		t.Fatal(err)
	}
	c.Commit(6)
	// pass 3: token 13 and guesses 14, 15, the second turned down
	bp.iter = 3
	if _, err := sl.startIn(context.Background(), passloop.Row{Step: model.Step{Seq: seq, Pass: 3}, Tokens: []int{13, 14, 15}, Drafted: 2, Cache: c}, bp); err != nil {
		t.Fatal(err)
	}
	c.Commit(8)
	// pass 4: token 16
	bp.iter = 4
	if _, err := sl.startIn(context.Background(), passloop.Row{Step: model.Step{Seq: seq, Pass: 4}, Tokens: []int{16}, Cache: c}, bp); err != nil {
		t.Fatal(err)
	}
	got := sl.seqs[seq].hist
	want := []int32{1, 2, 3, 10, 11, 12, 13, 14, 16}
	if !slices.Equal(got, want) {
		t.Fatalf("hist %v, want %v", got, want)
	}
}
