package shadow

import (
	"context"
	"fmt"
	"github.com/odmoe/odmoe/internal/par"
	"slices"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// seqIter is one pass of one sequence (or pass of a batch).
type seqIter struct {
	seq uint64
	it  int64
}

// passFollow is the shadow's copy of one of the main node's batches of
// passes, each of which feeds every member a decode token or a chunk of
// its prompt (text mode: a batch of one). It runs ahead: once a pass is
// done it runs the next on the tokens its own model sampled for every
// member of the last pass (when none of them has prompt tokens still to
// come), up to Ahead passes past the latest alignment, so the next pass's
// predictions come a pass early. The main
// node's alignments for a pass it ran ahead are met when the pass has the
// same members fed the same tokens; otherwise it rewinds the pass (and
// any run after it) and runs it again as the alignments say.
type passFollow struct {
	batch   *model.Batch
	it      int64 // the last pass run, aligned or ahead; 0: none yet
	aligned int64 // the last pass whose alignments have all been applied
	// last are the members of pass it, which the next pass run ahead
	// feeds again
	last []uint64
	// a revision's scratch (revise): the rows it keeps, the tokens its
	// members are fed, and each layer's union of the kept rows
	kept       []bool
	lastTokens []int
	keptUnion  [][]int
	// and how many rows of each member it keeps, and which of a layer's
	// rows those are
	keptRows []int
	keepRow  []bool
	// ahead are the passes run ahead of their alignments, oldest first
	// (passes aligned+1 .. it); spare are records no longer ahead, whose
	// buffers the next pass run ahead reuses (no allocation a layer)
	ahead, spare []aheadPass
	// a pass's members: their sequences and sessions, what each feeds
	// (its decode token, or a chunk of its prompt) and its last token
	// (PassToken's), whether any feeds prompt tokens, and the sessions
	// whose output head is due, reused pass after pass
	rows     []*follow
	seqs     []uint64
	sessions []*model.Session
	feeds    [][]int
	tokens   []int
	prompt   bool
	heads    []*model.Session
}

// reset empties bf's rows for the next pass.
func (bf *passFollow) reset() {
	bf.rows, bf.seqs, bf.sessions, bf.feeds, bf.tokens = bf.rows[:0], bf.seqs[:0], bf.sessions[:0], bf.feeds[:0], bf.tokens[:0]
	bf.prompt = false
}

// add makes f a member of the next pass: fed chunk (prompt tokens) if it
// has any, else token and then guesses (the main node's pass checks
// them: drafting).
func (bf *passFollow) add(f *follow, token int, chunk, guesses []int) {
	feed := chunk
	if len(chunk) > 0 {
		token, bf.prompt = chunk[len(chunk)-1], true
	} else if len(guesses) > 0 {
		feed = append([]int{token}, guesses...)
	}
	bf.rows, bf.seqs = append(bf.rows, f), append(bf.seqs, f.seq)
	bf.sessions, bf.tokens, bf.feeds = append(bf.sessions, f.sess), append(bf.tokens, token), append(bf.feeds, feed)
}

// seal points each decode member's feed at its token, once every member
// is in.
func (bf *passFollow) seal() {
	for i := range bf.feeds {
		if len(bf.feeds[i]) == 0 {
			bf.feeds[i] = bf.tokens[i : i+1]
		}
	}
}

// aheadPass is a pass run ahead: which sequences it fed which tokens
// (each member's first row's), from which position, the guesses it fed
// each after that token (drafting), and what it hinted for each layer
// (indexed by layer; a layer without experts has no rows).
type aheadPass struct {
	it      int64
	seqs    []uint64
	tokens  []int
	pos     []int
	guesses [][]int
	layers  []layerHints
}

// rows is how many rows member i fed.
func (p *aheadPass) rows(i int) int { return 1 + len(p.guesses[i]) }

// pushAhead records pass it, run ahead on bf's rows, reusing a spare
// record's buffers when there is one.
func (bf *passFollow) pushAhead(it int64, layers int) {
	var p aheadPass
	if k := len(bf.spare); k > 0 {
		p, bf.spare = bf.spare[k-1], bf.spare[:k-1]
	}
	p.it, p.seqs, p.tokens = it, append(p.seqs[:0], bf.seqs...), append(p.tokens[:0], bf.tokens...)
	p.pos = p.pos[:0]
	for _, s := range bf.sessions {
		p.pos = append(p.pos, s.Len())
	}
	p.guesses = slices.Grow(p.guesses[:0], len(bf.seqs))[:len(bf.seqs)]
	for i := range p.guesses {
		p.guesses[i] = p.guesses[i][:0]
	}
	if len(p.layers) != layers {
		p.layers = make([]layerHints, layers)
	}
	for l := range p.layers {
		lh := &p.layers[l]
		lh.rows, lh.member, lh.step, lh.experts, lh.on = lh.rows[:0], lh.member[:0], lh.step[:0], lh.experts[:0], lh.on[:0]
	}
	bf.ahead = append(bf.ahead, p)
}

// retire keeps p, no longer ahead, for its buffers (a few at most).
func (bf *passFollow) retire(p aheadPass) {
	if len(bf.spare) < 4 {
		bf.spare = append(bf.spare, p)
	}
}

// runPasses runs batch b's passes that are ready, in order: a pass is
// ready when all its members' alignments have come, each is its
// sequence's next pass (or starts it), and the batch's previous pass
// has run. The first pass the shadow sees of a batch starts it (it may
// attach mid-batch). A pass run ahead is met or rewound instead of run
// again. A member that has ended (its SequenceEnd overtook its last
// alignment) counts for the pass but runs no row.
func (n *Node) runPasses(ctx context.Context, b uint64, st *mainState) error {
	passes, batches, seqs := st.passes, st.batches, st.seqs
	for {
		bf := batches[b]
		var k seqIter
		if bf != nil {
			k = seqIter{b, bf.aligned + 1}
		} else {
			first := int64(0) // the earliest pass waiting
			for pk := range passes {
				if pk.seq == b && (first == 0 || pk.it < first) {
					first = pk.it
				}
			}
			if first == 0 {
				return nil
			}
			k = seqIter{b, first}
		}
		members := passes[k]
		if len(members) == 0 || len(members) < members[0].BatchSize {
			return nil
		}
		for _, a := range members {
			f := seqs[a.Seq]
			if !slices.Contains(st.ended, a.Seq) && !starts(a) && (f == nil || f.aligned+1 != a.Pass) {
				return nil // the member's previous pass has not run
			}
		}
		delete(passes, k)
		members = slices.DeleteFunc(members, func(a *wire.Alignment) bool { return slices.Contains(st.ended, a.Seq) })
		if bf == nil {
			bf = &passFollow{batch: model.NewBatch(n.m, model.NewResidentExperts(n.m))}
			batches[b] = bf
		}
		if len(members) == 0 { // every member has ended
			if len(bf.ahead) > 0 && bf.ahead[0].it == k.it {
				n.rewindPasses(ctx, b, bf, k.it, seqs)
			}
			bf.it, bf.aligned, bf.last = k.it, k.it, bf.last[:0]
			if err := n.done(ctx, b, k.it, time.Now(), 0, 0); err != nil {
				return err
			}
			n.settle(ctx, st)
			continue
		}
		if len(bf.ahead) > 0 && bf.ahead[0].it == k.it {
			if n.meets(bf.ahead[0], members) {
				start := time.Now()
				if err := n.meet(ctx, b, bf, members, seqs); err != nil {
					return err
				}
				n.trace.Span(trace.Align, k.it, 0, -1, start, time.Now())
			} else if err := n.revise(ctx, b, bf, members, seqs); err != nil {
				return err
			}
			n.settle(ctx, st)
			continue
		}
		bf.it = k.it
		if err := n.pass(ctx, b, bf, members, seqs); err != nil {
			return err
		}
		n.settle(ctx, st)
	}
}

// starts reports whether alignment a (in a pass) starts its sequence.
func starts(a *wire.Alignment) bool { return a.Pass == 1 || len(a.History) > 0 }

// meets reports whether pass p, run ahead, fed what the main node's
// alignments of that pass say: the same sequences (none restarted, none
// fed a prompt chunk), each the token its alignment carries (or any, if
// it carries none).
func (n *Node) meets(p aheadPass, members []*wire.Alignment) bool {
	if len(members) != len(p.seqs) {
		return false
	}
	for _, a := range members {
		if i := slices.Index(p.seqs, a.Seq); i < 0 || !fedAs(p, i, a) {
			return false
		}
	}
	return true
}

// fedAs reports whether member i of p, a pass run ahead, was fed what its
// alignment a says: neither restarted nor fed a prompt chunk, the token a
// carries (or any, if it carries none) at the position a says, then the
// first of the guesses p fed, as many as the main node's pass checked.
func fedAs(p aheadPass, i int, a *wire.Alignment) bool {
	switch {
	case starts(a) || len(a.Chunk) > 0 || a.Pos > 0 && a.Pos != p.pos[i]:
		return false
	case a.Token < 0:
		return true
	case int(a.Token) != p.tokens[i] || len(a.Guesses) > len(p.guesses[i]):
		return false
	}
	for j, g := range a.Guesses {
		if int(g) != p.guesses[i][j] {
			return false
		}
	}
	return true
}

// trimGuesses takes back the rows of member i of p, a pass run ahead,
// past those its alignment a has the main node's pass feed (the guesses
// the main node did not check): f's next token is again the first guess
// taken back.
func trimGuesses(f *follow, p aheadPass, i int, a *wire.Alignment) {
	keep := 1 + len(a.Guesses) // (none where a carries no token)
	if f == nil || f.sess == nil || keep >= p.rows(i) {
		return
	}
	f.takeBack(p.rows(i) - keep)
	f.next, f.headDue = p.guesses[i][keep-1], false
}

// meet applies the alignments of bf's oldest pass run ahead, which it
// met: their KV rows; nothing runs again.
func (n *Node) meet(ctx context.Context, b uint64, bf *passFollow, members []*wire.Alignment, seqs map[uint64]*follow) error {
	p := bf.ahead[0]
	if len(bf.ahead) > 1 && slices.ContainsFunc(members, func(a *wire.Alignment) bool { return 1+len(a.Guesses) < p.rows(slices.Index(p.seqs, a.Seq)) }) {
		// the rows to take back are under those of the passes run after
		// it, which ran on them: those go first
		n.rewindPasses(ctx, b, bf, bf.ahead[1].it, seqs)
	}
	for _, a := range members {
		f := seqs[a.Seq]
		trimGuesses(f, p, slices.Index(p.seqs, a.Seq), a)
		if err := n.apply(ctx, f, a); err != nil {
			return err
		}
		n.agreedSeqs = append(n.agreedSeqs, a.Seq)
	}
	n.agreed += int64(len(members))
	bf.aligned = bf.ahead[0].it
	bf.retire(bf.ahead[0])
	bf.ahead = bf.ahead[1:]
	return nil
}

// rewindPasses takes bf back to just before pass it, which (with every
// pass after it) ran ahead on members or tokens the main node's pass did
// not have: their predictions are withdrawn (from the workers, which drop
// their loads, and the main node) and each row they added to a member's
// KV cache is forgotten; each member's own token is again the one it fed
// pass it.
func (n *Node) rewindPasses(ctx context.Context, b uint64, bf *passFollow, it int64, seqs map[uint64]*follow) {
	n.log.Debug().Uint64("batch", b).Int64("pass", it).Int64("ran", bf.it).Msg("shadow: rewinding a pass: the main node's differs")
	n.withdraw(ctx, b, it)
	for i := len(bf.ahead) - 1; i >= 0 && bf.ahead[i].it >= it; i-- {
		p := bf.ahead[i]
		for j, seq := range p.seqs {
			f := seqs[seq]
			if f == nil || f.sess == nil {
				continue // ended, or restarted since
			}
			f.takeBack(p.rows(j))
			f.next, f.headDue = p.tokens[j], false
		}
		bf.retire(p)
		bf.ahead = bf.ahead[:i]
	}
	bf.it = it - 1
}

// passDueAhead is a batch that may run its next pass ahead of the main
// node's alignments (the one furthest behind), nil if none may: it has
// run an aligned pass, is less than Ahead passes past it, and every
// member of its last pass that is still live and not leaving (final) has
// fed all its prompt and has room for a token.
func (n *Node) passDueAhead(batches map[uint64]*passFollow, seqs map[uint64]*follow) (uint64, *passFollow) {
	var due *passFollow
	var b uint64
	for id, bf := range batches {
		if n.Ahead <= 0 || bf.aligned < 1 || bf.it >= bf.aligned+int64(n.Ahead) || due != nil && bf.it-bf.aligned >= due.it-due.aligned {
			continue
		}
		live, full := 0, false // (full: no room for a row; drafting takes what room there is)
		for _, seq := range bf.last {
			if f := seqs[seq]; f != nil && f.sess != nil && !f.final {
				live++
				full = full || f.promptLeft > 0 || f.sess.Len() >= n.m.Config.MaxPositions
			}
		}
		if live > 0 && !full {
			due, b = bf, id
		}
	}
	return b, due
}

// runPassAhead runs bf's next pass on the tokens its own model sampled
// for the members of its last pass that are still live and not leaving.
func (n *Node) runPassAhead(ctx context.Context, b uint64, bf *passFollow, seqs map[uint64]*follow) error {
	bf.reset()
	bf.heads = bf.heads[:0]
	for _, seq := range bf.last {
		if f := seqs[seq]; f != nil && f.sess != nil && !f.final { // else it ended, or leaves
			if f.headDue {
				bf.heads = append(bf.heads, f.sess)
			}
			bf.add(f, -1, nil, nil)
		}
	}
	if len(bf.heads) > 0 { // the output heads of every row at once
		if err := bf.batch.Logits(bf.heads); err != nil {
			return fmt.Errorf("shadow: batch %d pass %d: %w", b, bf.it+1, err)
		}
	}
	// the guesses side by side (each row's sampler and grammar its own):
	// a sampled guess over a large vocabulary costs what a small model's
	// pass does
	par.Each(len(bf.rows), func(i int) { bf.tokens[i] = bf.rows[i].ownToken() })
	bf.seal()
	it := bf.it + 1
	bf.pushAhead(it, n.m.Config.NumLayers)
	bf.it = it
	if n.drafting(bf) {
		return n.forwardDrafting(ctx, b, bf, it)
	}
	return n.forwardPass(ctx, b, bf, it, 0)
}

// pass runs pass bf.it of batch b as its members' alignments say: each
// member's alignment, then one forward pass over all of them whose
// routing, the union over the members, is predicted for step (b, pass)
// when it is a decode pass (no prompt chunk: prefill loads every expert
// anyway).
func (n *Node) pass(ctx context.Context, b uint64, bf *passFollow, members []*wire.Alignment, seqs map[uint64]*follow) error {
	start := time.Now()
	bf.reset()
	for _, a := range members {
		f, token, err := n.member(ctx, seqs, a)
		if err != nil {
			return fmt.Errorf("shadow: batch %d pass %d: %w", b, bf.it, err)
		}
		bf.add(f, token, ints(a.Chunk), ints(a.Guesses))
	}
	bf.seal()
	bf.aligned = bf.it
	late := time.Since(start)
	n.trace.Span(trace.Align, bf.it, 0, -1, start, start.Add(late))
	return n.forwardPass(ctx, b, bf, bf.it, late)
}

// forwardPass runs pass it of batch b over bf's rows, predicting each
// layer's routing for step (b, it) (recorded in bf's last pass run ahead
// when it is one), and reports it done; late is what applying its
// alignments cost (0 when it runs ahead).
func (n *Node) forwardPass(ctx context.Context, b uint64, bf *passFollow, it int64, late time.Duration) error {
	fed := align.PassToken(bf.seqs, bf.tokens)
	var rec *aheadPass
	if len(bf.ahead) > 0 && bf.ahead[len(bf.ahead)-1].it == it {
		rec = &bf.ahead[len(bf.ahead)-1]
	}
	var hook func(model.Step, int, []float32, []model.Route)
	if !bf.prompt {
		hook = func(_ model.Step, l int, _ []float32, routes []model.Route) {
			n.predict(ctx, b, it, int(fed), l, routes, rec)
		}
	}
	t0 := time.Now()
	if err := n.forwardRows(ctx, b, bf, it, hook); err != nil {
		return err
	}
	bf.last = append(bf.last[:0], bf.seqs...)
	return n.done(ctx, b, it, t0, late, it-bf.aligned)
}

// forwardRows runs bf's rows through one forward pass of pass it, with
// hook (if set) as its routing hook.
func (n *Node) forwardRows(ctx context.Context, b uint64, bf *passFollow, it int64, hook func(model.Step, int, []float32, []model.Route)) error {
	bf.batch.SetOnRoute(hook)
	n.mark = time.Now()
	err := bf.batch.Forward(ctx, bf.sessions, bf.feeds)
	bf.batch.SetOnRoute(nil)
	if err != nil {
		return fmt.Errorf("shadow: batch %d pass %d: %w", b, it, err)
	}
	for i, f := range bf.rows {
		f.headDue = true
		f.fed = append(f.fed, bf.feeds[i]...)
	}
	return nil
}

// member applies alignment a of a pass to its sequence, starting it
// first (the tokens it holds before the pass, if any, copied from a
// finished or live sequence or run), and returns the sequence and the
// decode token it feeds when a carries no prompt chunk: the main node's,
// or its own when a carries none.
func (n *Node) member(ctx context.Context, seqs map[uint64]*follow, a *wire.Alignment) (*follow, int, error) {
	f := seqs[a.Seq]
	if starts(a) {
		f = &follow{seq: a.Seq, fed: ints(a.History)}
		f.sampler, f.promptLen = samplerOf(a.Sampling)
		if a.Sampling != nil {
			f.grammar = n.grammarOf(a.Sampling.Grammar)
		}
		capacity := len(a.History) + len(a.Chunk) + a.PromptLeft + 256
		cache, reused := n.reuse(f.fed, capacity, seqs)
		n.reused += int64(reused)
		if reused > 0 {
			sess, err := model.ResumeSession(n.m, model.NewResidentExperts(n.m), cache)
			if err != nil {
				return nil, 0, err
			}
			f.sess = sess
		} else {
			f.sess = model.NewSession(n.m, model.NewResidentExperts(n.m), capacity)
		}
		if old := seqs[a.Seq]; old != nil && old.sess != nil && n.Stages != nil { // started again: its old rows go
			if err := n.Stages.End(ctx, old.sess.Seq()); err != nil {
				return nil, 0, err
			}
		}
		seqs[a.Seq] = f
		if len(f.fed) > reused {
			if err := f.sess.ForwardHidden(ctx, f.fed[reused:]); err != nil {
				return nil, 0, fmt.Errorf("sequence %d: the tokens before pass %d: %w", f.seq, a.Pass, err)
			}
		}
		if a.Pass > 1 {
			n.log.Info().Uint64("seq", f.seq).Int64("pass", a.Pass).Int("tokens", len(a.History)).Int("reused", reused).Bool("kv", len(a.Keys) > 0).
				Msg("shadow: following a sequence from the middle")
		}
		if len(a.Chunk) == 0 && a.Token < 0 {
			return nil, 0, fmt.Errorf("sequence %d started at pass %d without a chunk or a token to feed", f.seq, a.Pass)
		}
	} else if f == nil || f.sess == nil {
		return nil, 0, fmt.Errorf("sequence %d pass %d before its start", a.Seq, a.Pass)
	}
	if extra := f.sess.Len() - a.Pos; a.Pos > 0 && extra > 0 { // guesses the main node's last pass turned down
		// its own token at Pos (a carries none: the shadow's stands) is
		// the one it fed there
		if a.Pos < len(f.fed) {
			f.next = f.fed[a.Pos]
		}
		f.takeBack(extra)
		f.headDue = false
	}
	if err := n.apply(ctx, f, a); err != nil {
		return nil, 0, err
	}
	if len(a.Chunk) > 0 || a.Token >= 0 {
		return f, int(a.Token), nil
	}
	return f, f.ownToken(), nil
}

// ints widens wire token ids (nil for none).
func ints(ids []int32) []int {
	if len(ids) == 0 {
		return nil
	}
	out := make([]int, len(ids))
	for i, t := range ids {
		out[i] = int(t)
	}
	return out
}

// reuse is a copy of the longest run of rows that a finished sequence
// (the prefix cache) or a live one shares with tokens, in a cache with
// room for capacity positions, and how many rows it holds (nil, 0: none).
// A live one counts because the main node may reuse a sequence whose end
// has not reached this node yet: messages on different streams have no
// order.
func (n *Node) reuse(tokens []int, capacity int, seqs map[uint64]*follow) (*kvcache.Cache, int) {
	if n.Prefixes == nil {
		return nil, 0
	}
	cache, reused := n.Prefixes.Take(tokens, capacity)
	var from *follow
	best := reused
	for _, f := range seqs {
		if f.sess == nil {
			continue
		}
		if k := min(kvcache.CommonPrefix(f.fed, tokens), f.sess.Len()); k > best {
			from, best = f, k
		}
	}
	if from == nil {
		return cache, reused
	}
	c, err := from.sess.Cache().Prefix(best, capacity)
	if err != nil {
		return cache, reused // cannot be: best is within its rows
	}
	return c, best
}
