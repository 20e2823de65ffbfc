package model

import (
	"context"
	"fmt"

	"github.com/odmoe/odmoe/kernels"
)

// Batch runs decode steps of several sequences as one forward pass
// (continuous batching): each session's attention over its own KV cache,
// then each layer's feed-forward block once over all their rows, so a
// layer's experts run once for every sequence that routed to them. A
// session's logits after Forward are bit-identical to those of a Forward
// of its token alone: every kernel computes a row of a batch exactly as
// it computes that row alone, and each row's experts are mixed in the
// same fixed order.
//
// The batch is a sequence of its own to the ExpertRunner: its passes are
// steps Seq(), 1, 2, ..., whichever sessions they carry. Not safe for
// concurrent use.
type Batch struct {
	m       *Model
	seq     uint64
	iter    int64
	ffn     *Session // the pass's rows and buffers; no KV cache of its own
	starts  []int
	experts ExpertRunner
}

// NewBatch returns a batch of m's sessions whose experts run on experts.
func NewBatch(m *Model, experts ExpertRunner) *Batch {
	return &Batch{m: m, seq: nextSeq(), experts: experts,
		ffn: &Session{m: m, experts: experts, lastRow: -1, invFreq: kernels.RoPEFreqs(m.Config.HeadDim, m.Config.RopeTheta)}}
}

// Seq is the batch's sequence id (its steps' Seq).
func (b *Batch) Seq() uint64 { return b.seq }

// Next is the step the next Forward will run.
func (b *Batch) Next() Step { return Step{Seq: b.seq, Iter: b.iter + 1} }

// SetOnRoute sets the hook that sees every layer's routing of the batch's
// rows (row i is sessions[i] of that Forward).
func (b *Batch) SetOnRoute(f func(step Step, layer int, routerLogits []float32, routes []Route)) {
	b.ffn.OnRoute = f
}

// Forward appends tokens[i] to sessions[i], for every i, in one pass;
// then sessions[i].Logits() are the logits after it. Each session counts
// the pass as one of its own. If it fails before its last layer, no
// session has the token in its cache.
func (b *Batch) Forward(ctx context.Context, sessions []*Session, tokens []int) error {
	c := b.m.Config
	n, h := len(sessions), c.HiddenSize
	if n == 0 || len(tokens) != n {
		return fmt.Errorf("model: a batch of %d sessions and %d tokens", n, len(tokens))
	}
	b.starts = b.starts[:0]
	for i, s := range sessions {
		if s.m != b.m {
			return fmt.Errorf("model: batch row %d is a session of another model", i)
		}
		start := s.cache.Len()
		if start+1 > c.MaxPositions {
			return fmt.Errorf("model: batch row %d: position %d exceeds max_position_embeddings %d", i, start, c.MaxPositions)
		}
		if id := tokens[i]; id < 0 || id >= c.VocabSize {
			return fmt.Errorf("model: batch row %d: token id %d outside the vocabulary of %d", i, id, c.VocabSize)
		}
		b.starts = append(b.starts, start)
	}
	b.iter++
	step := Step{Seq: b.seq, Iter: b.iter}
	f := b.ffn
	f.x = grow(f.x, n*h)
	for i, s := range sessions {
		s.iter++
		s.cache.Reserve(b.starts[i] + 1)
		s.lastRow, s.headDone = -1, false
		b.m.embed(f.x[i*h:(i+1)*h], tokens[i])
	}
	rows := kvRows{seqs: sessions, starts: b.starts}
	for l := range b.m.Layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		L := &b.m.Layers[l]
		if err := L.Attention.forward(f, l, n, rows); err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
		if err := L.ffn().forward(ctx, f, step, l, n); err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	for i, s := range sessions {
		s.x = grow(s.x, h)
		copy(s.x[:h], f.x[i*h:(i+1)*h])
	}
	for i, s := range sessions {
		if err := s.cache.Commit(b.starts[i] + 1); err != nil {
			return err
		}
		s.lastRow = 0
	}
	return nil
}

// Logits computes the output head of every session's last hidden state
// (what each session's Logits would compute) in one pass over its
// weights; each session's Logits then returns its row without computing
// it again. Every session must have run a pass.
func (b *Batch) Logits(sessions []*Session) error {
	c := b.m.Config
	n, h, V := len(sessions), c.HiddenSize, c.VocabSize
	f := b.ffn
	f.hn = grow(f.hn, n*h)
	for i, s := range sessions {
		if s.m != b.m || s.lastRow < 0 {
			return fmt.Errorf("model: batch row %d has no pass to compute logits for", i)
		}
		kernels.RMSNorm(f.hn[i*h:(i+1)*h], s.x[s.lastRow*h:(s.lastRow+1)*h], b.m.FinalNorm, float32(c.RMSNormEps))
	}
	f.logits = grow(f.logits, n*V)
	kernels.MatMul(f.logits, b.m.LMHead, f.hn, n)
	for i, s := range sessions {
		copy(s.logits, f.logits[i*V:(i+1)*V])
		s.headDone = true
	}
	return nil
}
