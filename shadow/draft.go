package shadow

import (
	"context"
	"fmt"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/par"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// guessesFor is how many tokens member f guesses after its row in a pass
// run ahead: as many as the main node asked for (Alignment.Draft),
// within the context.
func (n *Node) guessesFor(f *follow) int {
	return max(0, min(f.draft, wire.MaxGuesses, n.m.Config.MaxPositions-f.sess.Len()-1))
}

// drafting reports whether a member of bf's next pass, about to run
// ahead, guesses tokens after its row.
func (n *Node) drafting(bf *passFollow) bool {
	for _, f := range bf.rows {
		if n.guessesFor(f) > 0 {
			return true
		}
	}
	return false
}

// forwardDrafting runs pass it of batch b ahead over bf's rows (each
// member's token, recorded in bf's last pass ahead) and then each
// member's guesses, one step a guess: step i feeds every member that
// guesses i tokens or more the token its own model drew from its last
// row, as the main node would draw it (follow.ownToken), so a member's
// rows are the tokens one-at-a-time decoding would feed if every guess
// were right. The guesses go to the main node as soon as each step has
// drawn them (wire.Drafts), so its pass, which checks them, can start
// with those that have come. Each layer's union grows with each step's
// rows: the new experts are hinted to the workers at once, and the main
// node hears each union, partial until the last step.
func (n *Node) forwardDrafting(ctx context.Context, b uint64, bf *passFollow, it int64) error {
	p := &bf.ahead[len(bf.ahead)-1]
	fed := int(align.PassToken(bf.seqs, bf.tokens))
	k := make([]int, len(bf.rows))
	most := 0
	for i, f := range bf.rows {
		k[i] = n.guessesFor(f)
		most = max(most, k[i])
	}
	t0 := time.Now()
	var (
		members  []int
		sessions []*model.Session
		feeds    [][]int
		tokens   = make([]int, len(bf.rows))
	)
	copy(tokens, bf.tokens)
	for s := 0; s <= most; s++ {
		members, sessions = members[:0], sessions[:0]
		for i, f := range bf.rows {
			if k[i] >= s {
				members, sessions = append(members, i), append(sessions, f.sess)
			}
		}
		if s > 0 {
			if err := bf.batch.Logits(sessions); err != nil {
				return fmt.Errorf("shadow: batch %d pass %d guess %d: %w", b, it, s, err)
			}
			par.Each(len(members), func(j int) { tokens[members[j]] = bf.rows[members[j]].ownToken() })
			d := &wire.Drafts{Batch: b, Pass: it}
			for _, i := range members {
				p.guesses[i] = append(p.guesses[i], tokens[i])
				d.Seqs, d.Pos = append(d.Seqs, bf.seqs[i]), append(d.Pos, p.pos[i])
				row := append(make([]int32, 0, 1+len(p.guesses[i])), int32(p.tokens[i]))
				for _, g := range p.guesses[i] {
					row = append(row, int32(g))
				}
				d.Tokens = append(d.Tokens, row)
			}
			if err := n.queue(ctx, outgoing{worker: -1, it: it, msg: d}); err != nil {
				return err
			}
		}
		feeds = feeds[:0]
		for _, i := range members {
			feeds = append(feeds, tokens[i:i+1])
		}
		bf.batch.SetOnRoute(func(_ model.Step, l int, _ []float32, routes []model.Route) {
			n.predictDrafted(ctx, b, it, fed, l, routes, p, members, s, s < most)
		})
		n.mark = time.Now()
		err := bf.batch.Forward(ctx, sessions, feeds)
		bf.batch.SetOnRoute(nil)
		if err != nil {
			return fmt.Errorf("shadow: batch %d pass %d guess %d: %w", b, it, s, err)
		}
		for j, i := range members {
			f := bf.rows[i]
			f.headDue = true
			f.fed = append(f.fed, feeds[j]...)
		}
	}
	bf.last = append(bf.last[:0], bf.seqs...)
	return n.done(ctx, b, it, t0, 0, it-bf.aligned)
}
