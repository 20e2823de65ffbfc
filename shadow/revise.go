package shadow

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// revise runs pass it of batch b, which the shadow ran ahead (bf's
// oldest pass ahead) and whose alignments, members, did not all meet it,
// at the cost of the rows that differ only: a row whose member the main
// node's pass fed the token the shadow guessed is kept as it ran; a row
// whose member was fed another token, or left, is taken back; a member
// fed another token, or new to the pass, runs its row now. The pass's
// predictions are revised the same way: each layer's experts still wanted
// stay on the workers that load them; those only the rows taken back
// wanted are withdrawn from their workers, and the new rows' experts are
// hinted as each layer routes them. The main node is told each layer's
// union of the kept rows at once (the pass is already running there),
// then each layer's whole union. A pass with no row kept is run again
// whole (rewindPasses); passes run further ahead (-ahead above 1) are
// run again whole too.
func (n *Node) revise(ctx context.Context, b uint64, bf *passFollow, members []*wire.Alignment, seqs map[uint64]*follow) error {
	start := time.Now()
	if len(bf.ahead) > 1 {
		n.rewindPasses(ctx, b, bf, bf.ahead[1].it, seqs)
	}
	p := bf.ahead[0]
	kept := n.keptRows(bf.kept[:0], p, members)
	bf.kept = kept
	if !slices.Contains(kept, true) {
		n.rewindPasses(ctx, b, bf, p.it, seqs)
		bf.it = p.it
		return n.pass(ctx, b, bf, members, seqs)
	}
	n.log.Debug().Uint64("batch", b).Int64("pass", p.it).Int("kept", count(kept)).Int("rows", len(kept)).Msg("shadow: revising a pass run ahead: some of its rows differ from the main node's")
	for i, seq := range p.seqs { // the rows not kept are forgotten
		if f := seqs[seq]; !kept[i] && f != nil && f.sess != nil {
			f.takeBack(p.rows(i))
			f.next, f.headDue = p.tokens[i], false
		}
	}
	// a kept member's guesses the main node's pass did not check, too
	bf.keptRows = bf.keptRows[:0]
	for i, seq := range p.seqs {
		n := 0
		if kept[i] {
			a := members[slices.IndexFunc(members, func(a *wire.Alignment) bool { return a.Seq == seq })]
			trimGuesses(seqs[seq], p, i, a)
			n = 1 + len(a.Guesses)
		}
		bf.keptRows = append(bf.keptRows, n)
	}
	bf.ahead = bf.ahead[1:]
	defer bf.retire(p) // its hints are read until the pass has run
	bf.it, bf.aligned = p.it, p.it
	bf.reset()
	// every member, kept or run (the next pass's to run ahead), and the
	// token each is fed
	all, allTokens := bf.last[:0], bf.lastTokens[:0]
	for _, a := range members {
		if i := slices.Index(p.seqs, a.Seq); i >= 0 && kept[i] {
			if err := n.apply(ctx, seqs[a.Seq], a); err != nil {
				return err
			}
			all, allTokens = append(all, a.Seq), append(allTokens, p.tokens[i])
			continue
		}
		f, token, err := n.member(ctx, seqs, a)
		if err != nil {
			return fmt.Errorf("shadow: batch %d pass %d: %w", b, p.it, err)
		}
		bf.add(f, token, ints(a.Chunk), ints(a.Guesses))
		all, allTokens = append(all, a.Seq), append(allTokens, bf.tokens[len(bf.tokens)-1])
	}
	bf.seal()
	bf.last, bf.lastTokens = all, allTokens
	fed := int(align.PassToken(all, allTokens))
	late := time.Since(start)
	n.trace.Span(trace.Align, p.it, 0, -1, start, start.Add(late))
	t0 := time.Now()
	var hook func(model.Step, int, []float32, []model.Route)
	if !bf.prompt { // a prefill pass loads every expert: predictions are moot
		keptUnion := bf.keptUnion[:0]
		for l, lh := range p.layers {
			if l == len(keptUnion) {
				keptUnion = append(keptUnion, nil)
			}
			keptUnion[l] = keptUnion[l][:0]
			if len(lh.rows) == 0 { // a layer without experts
				continue
			}
			bf.keepRow = lh.kept(bf.keepRow[:0], bf.keptRows)
			keptUnion[l] = union(keptUnion[l], lh.rows, bf.keepRow, nil)
			if len(bf.rows) == 0 { // nothing to run: the kept rows' union is the pass's
				n.hint(ctx, b, p.it, fed, l, keptUnion[l], &p.layers[l])
			} else {
				n.tellKept(ctx, b, p.it, fed, l, keptUnion[l], &p.layers[l])
			}
		}
		bf.keptUnion = keptUnion
		hook = func(_ model.Step, l int, _ []float32, routes []model.Route) {
			now := time.Now()
			n.trace.Span(trace.Shadow, p.it, l, -1, n.mark, now)
			n.mark = now
			if l < len(keptUnion) && len(keptUnion[l]) > 0 {
				n.experts = union(n.experts[:0], keptUnion[l], nil, rowExperts(n.on[:0], routes))
				n.hint(ctx, b, p.it, fed, l, n.experts, &p.layers[l])
			} else {
				n.predict(ctx, b, p.it, fed, l, routes, nil)
			}
		}
	}
	if len(bf.rows) > 0 {
		if err := n.forwardRows(ctx, b, bf, p.it, hook); err != nil {
			return err
		}
	}
	return n.done(ctx, b, p.it, t0, late, 0)
}

// keptRows reports which rows of p, a pass run ahead, the main node's
// pass (members' alignments) fed as p did: the same member, neither
// restarted nor fed a prompt chunk, fed the same token (or one the
// alignment leaves to the shadow). It counts them as agreed, and the
// rows of members fed another token as rewound (n.rewoundSeqs). The
// verdicts go in dst's storage.
func (n *Node) keptRows(dst []bool, p aheadPass, members []*wire.Alignment) []bool {
	kept := slices.Grow(dst[:0], len(p.seqs))[:len(p.seqs)]
	clear(kept)
	for _, a := range members {
		i := slices.Index(p.seqs, a.Seq)
		if i < 0 || starts(a) || len(a.Chunk) > 0 {
			continue
		}
		if !fedAs(p, i, a) {
			n.rewound++
			n.rewoundSeqs = append(n.rewoundSeqs, a.Seq)
			continue
		}
		kept[i] = true
		n.agreed++
		n.agreedSeqs = append(n.agreedSeqs, a.Seq)
	}
	return kept
}

// tellKept tells the main node that layer l of step (seq, it) uses at
// least experts (the kept rows' union, a subset of what was hinted,
// was), each on the worker it was hinted to: the main node's pass is
// already running, and may reach the layer before the rows still to run
// do.
func (n *Node) tellKept(ctx context.Context, seq uint64, it int64, token, l int, experts []int, was *layerHints) {
	on := make([]int32, len(experts))
	for i, e := range experts {
		j, _ := slices.BinarySearch(was.experts, e)
		on[i] = int32(was.on[j])
	}
	_ = n.queue(ctx, outgoing{worker: -1, it: it, layer: l, msg: &wire.Prediction{Seq: seq, Pass: it, Layer: l, Experts: int32s(experts), Workers: on, Token: int32(token), Partial: true}})
}

// count is how many of bs are set.
func count(bs []bool) int {
	c := 0
	for _, b := range bs {
		if b {
			c++
		}
	}
	return c
}
