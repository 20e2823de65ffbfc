package model

import (
	"context"
	"fmt"
	"slices"

	"github.com/odmoe/odmoe/kernels"
)

// Batch runs forward passes of several sequences as one (continuous
// batching): each session feeds its own rows (a decode step's token, or a
// chunk of its prompt), attention runs per row over its own session's KV
// cache, then each layer's feed-forward block runs once over all the
// pass's rows, so a layer's experts run once for every row that routed to
// them. A session's logits after Forward are bit-identical to those of a
// Forward of its rows alone, and a prompt fed in chunks over several
// passes gives the logits of the whole prompt fed at once: every kernel
// computes a row of a batch exactly as it computes that row alone, each
// row attends over exactly the positions before it, and each row's
// experts are mixed in the same fixed order.
//
// The batch is a sequence of its own to the ExpertRunner: its passes are
// steps Seq(), 1, 2, ..., whichever sessions they carry. Not safe for
// concurrent use.
type Batch struct {
	m       *Model
	seq     uint64
	iter    int64
	ffn     *Session // the pass's rows and buffers; no KV cache of its own
	rowSeqs []*Session
	rowPos  []int
	starts  []int
	spans   []RowSpan
	experts ExpertRunner
}

// NewBatch returns a batch of m's sessions whose experts run on experts.
func NewBatch(m *Model, experts ExpertRunner) *Batch {
	b := &Batch{m: m, seq: nextSeq(), experts: experts, ffn: &Session{m: m, experts: experts}}
	b.ffn.invFreq, b.ffn.ropeMul = m.Config.ropeTables(m.Config.HeadDim)
	return b
}

// Seq is the batch's sequence id (its steps' Seq).
func (b *Batch) Seq() uint64 { return b.seq }

// Next is the step the next Forward will run.
func (b *Batch) Next() Step { return Step{Seq: b.seq, Pass: b.iter + 1} }

// RunAgain makes the next pass run as the last one ran, for the batch
// and each of sessions (the last pass's): it failed past its first layer
// (its LayerRunner lost what it held) and runs again under the same
// steps.
func (b *Batch) RunAgain(sessions []*Session) {
	b.iter--
	for _, s := range sessions {
		s.iter--
	}
}

// RunAs makes the next pass run as step, the passes after it going on
// from there: a stage's batch runs each pass as its first stage's batch
// ran it, so that its experts run under the same step on the workers.
func (b *Batch) RunAs(step Step) { b.seq, b.iter = step.Seq, step.Pass-1 }

// SetOnRoute sets the hook that sees every layer's routing of the pass's
// rows (sessions[0]'s rows first, in the order Forward was given them).
func (b *Batch) SetOnRoute(f func(step Step, layer int, routerLogits []float32, routes []Route)) {
	b.ffn.OnRoute = f
}

// Forward appends feeds[i] (one token or more) to sessions[i], for every
// i, in one pass; then sessions[i].Logits() are the logits after its last
// row. Each session counts the pass as one of its own. If it fails before
// its last layer, no session has the rows in its cache.
//
// A model that holds only its first layers (a staged model's first
// stage) runs them, then has its LayerRunner run the rest; a failure
// there leaves the pass's rows in its own layers' caches (the caller
// starts over: the shadow drops every sequence with its main node; a
// main node runs its sequences again from their first tokens, RunAgain).
func (b *Batch) Forward(ctx context.Context, sessions []*Session, feeds [][]int) error {
	m := b.m
	out, err := b.ForwardLayers(ctx, sessions, feeds, m.held, nil)
	if err != nil || m.held.End == m.Config.NumLayers {
		return err
	}
	b.spans = b.spans[:0]
	for i, s := range sessions {
		b.spans = append(b.spans, RowSpan{Seq: s.seq, Start: b.starts[i], Count: len(feeds[i])})
	}
	if err := m.runRest(ctx, Step{Seq: b.seq, Pass: b.iter}, b.spans, out, b.ffn.OnRoute); err != nil {
		return err
	}
	b.setLast(sessions, feeds, out)
	return nil
}

// ForwardLayers runs layers r of one pass (one stage of a staged model):
// the rows of feeds[i] for sessions[i], embedded from their tokens where
// in is nil (r must then begin at the first layer), else in, the rows'
// hidden state after layer r.First-1 as the node before handed it on (a
// stage whose layers begin at 0 is handed the embedding by a main node
// that holds none). It returns the rows'
// hidden state after layer r.End-1, [rows, hidden], valid until the next
// pass; where r ends at the last layer, sessions' Logits are then those
// after their last rows. Every session must hold r's layers. The stages
// of one pass, run in turn on each one's returned rows, compute exactly
// what Forward computes: the rows between them are the same floats.
func (b *Batch) ForwardLayers(ctx context.Context, sessions []*Session, feeds [][]int, r LayerRange, in []float32) ([]float32, error) {
	c := b.m.Config
	h := c.HiddenSize
	if len(sessions) == 0 || len(feeds) != len(sessions) {
		return nil, fmt.Errorf("model: a batch of %d sessions and %d feeds", len(sessions), len(feeds))
	}
	if err := r.heldOf(c.NumLayers); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	b.starts, b.rowSeqs, b.rowPos = b.starts[:0], b.rowSeqs[:0], b.rowPos[:0]
	for i, s := range sessions {
		if s.m != b.m {
			return nil, fmt.Errorf("model: batch row %d is a session of another model", i)
		}
		if !s.layers.Covers(r) {
			return nil, fmt.Errorf("model: batch member %d holds layers %s, not %s", i, s.layers, r)
		}
		if len(feeds[i]) == 0 {
			return nil, fmt.Errorf("model: batch member %d feeds no tokens", i)
		}
		if slices.Index(sessions[:i], s) >= 0 {
			return nil, fmt.Errorf("model: batch member %d is also an earlier member", i)
		}
		start := s.cache.Len()
		if end := start + len(feeds[i]); end > c.MaxPositions {
			return nil, fmt.Errorf("model: batch member %d: position %d exceeds the context of %d positions (max_position_embeddings, or -context)", i, end-1, c.MaxPositions)
		}
		for _, id := range feeds[i] {
			if id < 0 || id >= c.VocabSize {
				return nil, fmt.Errorf("model: batch member %d: token id %d outside the vocabulary of %d", i, id, c.VocabSize)
			}
		}
		b.starts = append(b.starts, start)
		for j := range feeds[i] {
			b.rowSeqs, b.rowPos = append(b.rowSeqs, s), append(b.rowPos, start+j)
		}
	}
	n := len(b.rowSeqs)
	embed := in == nil
	switch {
	case embed && r.First > 0:
		return nil, fmt.Errorf("model: layers %s of %d rows given no hidden state to begin from", r, n)
	case !embed && len(in) != n*h:
		return nil, fmt.Errorf("model: layers %s of %d rows given %d floats of hidden state, want %d", r, n, len(in), n*h)
	}
	b.iter++
	step := Step{Seq: b.seq, Pass: b.iter}
	f := b.ffn
	f.x = grow(f.x, n*h)
	if !embed {
		copy(f.x[:n*h], in)
	}
	t := 0
	for i, s := range sessions {
		for _, id := range feeds[i] {
			if embed {
				b.m.embed(f.x[t*h:(t+1)*h], id)
			}
			t++
		}
		s.iter++
		s.cache.Reserve(b.starts[i] + len(feeds[i]))
		s.kept, s.headDone = 0, false
	}
	rows := kvRows{seqs: b.rowSeqs, starts: b.rowPos}
	for l := r.First; l < r.End; l++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		L := &b.m.Layers[l]
		if err := L.Attention.forward(f, l, n, rows); err != nil {
			return nil, fmt.Errorf("model: layer %d: %w", l, err)
		}
		if err := L.ffn().forward(ctx, f, step, l, n); err != nil {
			return nil, fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	for i, s := range sessions {
		if err := s.cache.Commit(b.starts[i] + len(feeds[i])); err != nil {
			return nil, err
		}
	}
	if r.End == c.NumLayers {
		b.setLast(sessions, feeds, f.x[:n*h])
	}
	return f.x[:n*h], nil
}

// setLast keeps each session's last rows of rows (one, or as many as
// its KeepRows asks of those it fed), the pass's hidden state after the
// last layer, for its Logits and LogitsOf.
func (b *Batch) setLast(sessions []*Session, feeds [][]int, rows []float32) {
	h := b.m.Config.HiddenSize
	end := 0
	for i, s := range sessions {
		end += len(feeds[i])
		n := min(max(s.keep, 1), len(feeds[i]))
		s.x = grow(s.x, n*h)
		copy(s.x[:n*h], rows[(end-n)*h:end*h])
		s.kept = n
	}
}

// Logits computes the output head of every session's kept hidden states
// (its last row, or as many as its KeepRows asks: what each session's
// Logits and LogitsOf would compute) in one pass over its weights; each
// session's Logits and LogitsOf then return their rows without computing
// them again. Every session must have run a pass.
func (b *Batch) Logits(sessions []*Session) error {
	c := b.m.Config
	h, V := c.HiddenSize, c.VocabSize
	n := 0
	for i, s := range sessions {
		if s.m != b.m || s.kept == 0 {
			return fmt.Errorf("model: batch row %d has no pass to compute logits for", i)
		}
		n += s.kept
	}
	f := b.ffn
	f.hn = grow(f.hn, n*h)
	r := 0
	for _, s := range sessions {
		for j := range s.kept {
			kernels.RMSNorm(f.hn[r*h:(r+1)*h], s.x[j*h:(j+1)*h], b.m.FinalNorm, float32(c.RMSNormEps))
			r++
		}
	}
	f.logits = grow(f.logits, n*V)
	kernels.MatMul(f.logits, b.m.LMHead, f.hn, n)
	r = 0
	for _, s := range sessions {
		s.logits = grow(s.logits, s.kept*V)
		copy(s.logits[:s.kept*V], f.logits[r*V:(r+s.kept)*V])
		r += s.kept
		s.headDone = true
	}
	return nil
}
