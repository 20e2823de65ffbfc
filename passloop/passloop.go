// Package passloop is the main node's pass loop and head: one goroutine
// runs every forward pass of the requests it batches (continuous
// batching, prompts fed in chunks), samples each request's next token
// from its own rows' logits with its own draw, and hands each request
// its tokens, its logits and its share of the figures. Its layers may
// run in this process or on stages, and its experts wherever its
// runner sends them (package mainnode's Swarm: the wire's workers).
//
// It does not own the transformer (model), which rows a pass carries
// (passes), or where layers and experts run (the runner it is given).
package passloop

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/odmoe/odmoe/internal/par"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/passes"
)

// kvHint caps the KV rows a new sequence reserves up front: a request
// that may run to the model's whole context grows its cache as it goes.
const kvHint = 512

// Batcher is the main node's pass loop (continuous batching, with
// prompts fed in chunks): one goroutine, owned by the Batcher and ended by
// Close, runs every forward pass. A request joins at the next pass
// boundary; each pass carries every running request's next decode token
// (and the guesses after it, DraftUpTo) and chunks of the prompts still
// being fed, up to the chunk budget
// (passes.Next), so no running stream waits for a whole long prompt and
// the experts see one stream of passes. Each layer's experts run once for
// all the pass's rows that routed to them (model.Batch); every request's
// tokens and logits are what it would get alone. A request leaves when it
// is done: EOS, its token limit, a full context, an error of its own, or
// its client gone.
//
// Generate is safe for concurrent use.
type Batcher struct {
	m       *model.Model
	batch   *model.Batch
	runner  model.ExpertRunner
	hooks   Hooks
	budget  passes.Budget
	joins   chan *member
	life    context.Context
	stop    context.CancelFunc
	done    chan struct{}
	closing sync.Once
	// prefixes, if set (KeepPrefixes), are finished sequences' KV rows
	// that a new prompt starting with the same tokens reuses
	prefixes *kvcache.Prefixes
	// the first pass waits for gather requests, telling gathered as each
	// joins (tests)
	gather   int
	gathered chan struct{}
	// draftUpTo is how many guesses (hooks.Draft's) a decoding member's
	// pass feeds at most; 0: none
	draftUpTo int
}

// MaxDraft is the most guesses one pass checks for a member. The rows
// past the last one kept are taken back, which a sliding window's layer
// can do only within kvcache.WindowSlack: the blank constant below does
// not compile where MaxDraft passes it.
const MaxDraft = 8

const _ = uint(kvcache.WindowSlack - MaxDraft)

// DraftUpTo has each pass feed, after each decoding member's last token,
// up to k tokens Hooks.Draft guesses come next (at most MaxDraft; 0, the
// default, none), and keep those its own samples agree with: a member
// gets the tokens and logits it would get one token a pass, in fewer
// passes where the guesses are right. Call it before the first Generate.
func (b *Batcher) DraftUpTo(k int) { b.draftUpTo = min(max(k, 0), MaxDraft) }

// KeepPrefixes keeps the KV rows of finished requests, up to budget
// bytes (least recently used go first), for later requests whose prompts
// start with the same tokens: those rows are copied, not computed again
// (GenerateStats.CachedTokens). Call it before the first Generate; 0
// keeps none.
func (b *Batcher) KeepPrefixes(budget int64) { b.prefixes = kvcache.NewPrefixes(budget) }

// ChunkPrompts sets the most prompt tokens one pass carries, over all
// the prompts being fed (passes.Budget.Chunk; 0: every prompt in one
// pass). Call it before the first Generate.
func (b *Batcher) ChunkPrompts(tokens int) { b.budget.Chunk = tokens }

// keep hands sess's KV rows to the prefix cache, if any: prompt then
// out, as far as they were fed. sess is not used again.
func (b *Batcher) keep(sess *model.Session, prompt, out []int) {
	if b.prefixes == nil {
		return
	}
	fed := slices.Concat(prompt, out) // a new array: prompt is the caller's
	b.prefixes.Put(fed[:min(sess.Len(), len(fed))], sess.Cache())
}

// Hooks let the runner follow the batch's sequences (the swarm:
// the shadow's alignments, what workers and the shadow keep per
// sequence). Either may be nil.
type Hooks struct {
	// BeforePass comes before each pass (step is the batch's): rows are
	// its members' parts, in the pass's row order.
	BeforePass func(ctx context.Context, step model.Step, rows []Row) error
	// EndSequence is told when a sequence is done with: a request's when
	// it leaves the batch, the batch's at Close.
	EndSequence func(ctx context.Context, seq uint64) error
	// Figures, if set, is asked for a request's share of the runner's
	// figures (GenerateStats.Experts) just before its EndSequence.
	Figures func(seq uint64) model.ExpertFigures
	// OnRoute, if set, sees every layer's routing of each pass's rows
	// (model.Batch.SetOnRoute), the layers its stages run too.
	OnRoute func(step model.Step, layer int, routes []model.Route)
	// Draft, if set (and DraftUpTo above 0), is asked before each pass
	// for up to max tokens it guesses come after position pos of
	// sequence seq, whose token there, last, is the one the pass feeds
	// (on the swarm: the shadow's guesses, mainnode's -draft). A guess outside the
	// vocabulary ends them. Wrong guesses cost rows, never a token: the
	// pass keeps only those the member's own samples agree with.
	Draft func(seq uint64, pos, last, max int) []int
	// Recover, if set, is asked when pass step fails with err whether the
	// runner has brought back what it lost and every sequence is to run
	// again from its first token (a stage restarted holds no rows): then
	// the pass runs again under the same step, each member's tokens so
	// far before its rows, and gives what it would have given (refills
	// counted, one a member). The runner takes the pass for a prompt's
	// then (its rows are mostly history).
	Recover func(ctx context.Context, step model.Step, err error, refills int) bool
}

// Row is one member's part of a pass.
type Row struct {
	Step   model.Step // the member's own forward pass
	Tokens []int      // what it feeds: its last sampled token (then its guesses), or a chunk of its prompt
	// Drafted are the last of Tokens that are guesses (Hooks.Draft) of
	// the tokens after its last sampled one, checked by this pass
	Drafted int
	// Prompt says Tokens are prompt tokens; PromptLeft are those still to
	// feed after this pass.
	Prompt     bool
	PromptLeft int
	// Reused, on a member's first pass, are the tokens whose KV rows
	// its cache already holds from an earlier sequence (the prefix
	// cache), which no pass fed.
	Reused []int
	// Final says the member leaves after this pass, whatever it samples:
	// its token limit, or the model's context, is reached.
	Final bool
	Cache *kvcache.Cache // the member's KV rows before the pass
	// Sampling is how the member chooses its tokens, nil when greedily
	// and from the logits alone (model.Sampling.Plain); PromptLen is its
	// prompt's length (its k-th choice is the token at PromptLen+k).
	Sampling  *model.Sampling
	PromptLen int
}

// New starts a pass loop over m's sequences whose experts run on
// runner.
func New(m *model.Model, runner model.ExpertRunner, hooks Hooks) *Batcher {
	b := &Batcher{m: m, batch: model.NewBatch(m, runner), runner: runner, hooks: hooks,
		budget: passes.Budget{Chunk: passes.DefaultChunk}, joins: make(chan *member), done: make(chan struct{})}
	if hooks.OnRoute != nil {
		b.batch.SetOnRoute(func(step model.Step, layer int, _ []float32, routes []model.Route) {
			hooks.OnRoute(step, layer, routes)
		})
	}
	b.life, b.stop = context.WithCancel(context.Background())
	go b.loop()
	return b
}

// Seq is the sequence id the batch's passes run under.
func (b *Batcher) Seq() uint64 { return b.batch.Seq() }

// Close ends the batch: members still generating fail. Calls after the
// first do nothing.
func (b *Batcher) Close() {
	b.closing.Do(func() {
		b.stop()
		<-b.done
		b.end(b.batch.Seq())
	})
}

// end tells the hooks that sequence seq is done with.
func (b *Batcher) end(seq uint64) {
	if b.hooks.EndSequence == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.hooks.EndSequence(ctx, seq) // a node it cannot reach forgets with the connection
}

// member is one request in the batch.
type member struct {
	ctx     context.Context
	sess    *model.Session
	prompt  []int
	fed     int // prompt tokens in sess's cache
	opt     model.GenerateOptions
	sampler *model.Sampler
	// sampling is sampler's, for the shadow; nil when plain (greedy)
	sampling *model.Sampling
	out      []int
	st       model.GenerateStats
	err      error
	eos      func(id int) bool
	joined   time.Time // when it asked to join
	first    time.Time // when its first token came; zero before
	lastPass time.Time // when its latest pass's token came
	left     bool      // the loop has finished it
	done     chan struct{}
	// the token draw sampled from the latest pass's logits (those after
	// its row at: 0, or the guess kept before it), or why not
	next    int
	drawErr error
	at      int
	// guesses are what the pass feeds after its last token (Hooks.Draft)
	guesses []int
	// refill says the runner lost the sequence's rows (Recover): its
	// next pass feeds its tokens so far again, from the first
	refill bool
}

// history is the member's first n tokens: its prompt as fed, then what
// it generated.
func (m *member) history(n int) []int {
	return append(slices.Clone(m.prompt[:m.fed]), m.out...)[:n]
}

// Generate feeds prompt and decodes until the request is done, in the
// batch's passes, getting the tokens and logits model.Generate gives it
// alone. Its Prefill is the time from the call to the first token,
// Decode the time after.
func (b *Batcher) Generate(ctx context.Context, prompt []int, opt model.GenerateOptions) ([]int, model.GenerateStats, error) {
	st := model.GenerateStats{PromptTokens: len(prompt), FinishReason: "length"}
	if len(prompt) == 0 {
		return nil, st, fmt.Errorf("model: empty prompt")
	}
	if limit := b.m.Config.MaxPositions; len(prompt) > limit {
		return nil, st, fmt.Errorf("model: a prompt of %d tokens does not fit the context of %d (max_position_embeddings, or -context)", len(prompt), limit)
	}
	vocab := b.m.Config.VocabSize
	if i := slices.IndexFunc(prompt, func(id int) bool { return id < 0 || id >= vocab }); i >= 0 {
		return nil, st, fmt.Errorf("model: token id %d outside the vocabulary of %d", prompt[i], vocab)
	}
	sampler := opt.Sampler
	if sampler == nil {
		sampler = model.NewSampler(0, 0, 0)
	}
	joined := time.Now()
	capacity := min(len(prompt)+min(opt.MaxTokens, kvHint), b.m.Config.MaxPositions) // never past the context the node holds
	var sess *model.Session
	// the prompt's last token runs, for its logits
	if cache, n := b.prefixes.Take(prompt[:len(prompt)-1], capacity); n > 0 {
		resumed, err := model.ResumeSession(b.m, b.runner, cache)
		if err != nil {
			return nil, st, err
		}
		sess, st.CachedTokens = resumed, n
	} else {
		sess = model.NewSession(b.m, b.runner, capacity)
	}
	m := &member{ctx: ctx, sess: sess, prompt: prompt, fed: st.CachedTokens, opt: opt, sampler: sampler, st: st,
		eos: b.m.Config.IsEOS, joined: joined, done: make(chan struct{})}
	if p := sampler.Sampling(); !p.Plain() {
		m.sampling = &p
	}
	select {
	case b.joins <- m:
	case <-ctx.Done():
		return nil, st, ctx.Err()
	case <-b.life.Done():
		return nil, st, errors.New("mainnode: the batch has stopped")
	}
	<-m.done // the loop has ended the sequence
	return m.out, m.st, m.err
}

// draw samples the member's next token from its logits after its row
// at, for take.
func (m *member) draw() {
	m.next, m.drawErr = m.sampler.Sample(m.sess.LogitsOf(m.at))
}

// take hands on the token draw sampled; it reports whether the member
// is done (and then has said why).
func (m *member) take() bool {
	id, err, logits := m.next, m.drawErr, m.sess.LogitsOf(m.at)
	if err != nil {
		m.err = err
		return true
	}
	m.out = append(m.out, id)
	m.st.GeneratedTokens = len(m.out)
	if m.opt.OnToken != nil {
		if err := m.opt.OnToken(len(m.out)-1, id, logits); err != nil {
			m.err = err
			return true
		}
	}
	if m.opt.StopAtEOS && m.eos(id) {
		m.st.StoppedAtEOS, m.st.FinishReason = true, "stop"
		return true
	}
	return len(m.out) >= m.opt.MaxTokens
}

// takeChecked hands on the member's tokens of a pass that fed its
// guesses: the token its first row's logits gave (drawn), then while
// that token is the guess the pass fed next, the token sampled from that
// guess's row, exactly as a pass each would. The rows past the last
// guess kept are taken back from its cache (before is its length before
// the pass). It reports whether the member is done.
func (m *member) takeChecked(before int) bool {
	done := m.take()
	for !done && m.at < len(m.guesses) && m.out[len(m.out)-1] == m.guesses[m.at] {
		m.at++
		m.draw()
		done = m.take()
	}
	if len(m.guesses) > 0 {
		m.st.Drafted += len(m.guesses)
		m.st.Accepted += m.at
		m.sess.Cache().Truncate(before + m.at + 1)
	}
	return done
}

// guess asks the hooks' drafter for up to k tokens after the member's
// last sampled one, within its token limit and the context, and keeps
// them, up to the first outside the vocabulary, for its next pass.
func (m *member) guess(draft func(seq uint64, pos, last, max int) []int, k, vocab, context int) {
	m.guesses, m.at = m.guesses[:0], 0
	k = min(k, m.opt.MaxTokens-len(m.out)-1, context-m.sess.Len()-1)
	if draft == nil || k <= 0 {
		return
	}
	g := draft(m.sess.Seq(), m.sess.Len(), m.out[len(m.out)-1], k)
	g = g[:min(len(g), k)]
	if i := slices.IndexFunc(g, func(id int) bool { return id < 0 || id >= vocab }); i >= 0 {
		g = g[:i]
	}
	m.guesses = append(m.guesses, g...)
}

// refeed puts the tokens so far of each member of the pass (plan) whose
// rows the runner lost (refill) before its tokens (rows[i].Tokens) in
// feeds, its KV rows forgotten: it runs again from its first token, and
// its tokens' rows come out as they would have. lens are the sessions'
// lengths before the pass.
func (b *Batcher) refeed(plan []passes.Row, members []*member, rows []Row, feeds [][]int, lens []int) {
	for i, r := range plan {
		m := members[r.Seq]
		if !m.refill {
			continue
		}
		feeds[i] = append(m.history(lens[i]), rows[i].Tokens...)
		m.sess.Cache().Reset()
		m.refill = false
	}
}

// drawAll samples each member's next token, the members side by side
// on the machine's cores: a draw over a large vocabulary (151,936 logits)
// costs a decode step of a small model, and each member's sampler is its
// own, so the order changes nothing.
func drawAll(ms []*member) { par.Each(len(ms), func(i int) { ms[i].draw() }) }

// loop runs passes while there are members, admitting the ones that
// joined before each pass.
func (b *Batcher) loop() {
	defer close(b.done)
	var (
		members  []*member
		seqs     []passes.Seq
		plan     []passes.Row
		rows     []Row
		sessions []*model.Session
		feeds    [][]int
		heads    []*model.Session
		toks     []int // the decode rows' tokens, one each
		drawing  []*member
		lens     []int // each row's session's length before the pass
	)
	finish := func(m *member, err error) {
		if m.err == nil {
			m.err = err
		}
		now := time.Now()
		if m.first.IsZero() {
			m.st.Prefill = now.Sub(m.joined)
		} else {
			m.st.Decode = now.Sub(m.first)
		}
		if b.hooks.Figures != nil {
			m.st.Experts = b.hooks.Figures(m.sess.Seq())
		}
		b.end(m.sess.Seq())
		if m.err == nil {
			b.keep(m.sess, m.prompt, m.out)
		}
		m.left = true
		close(m.done)
	}
	gone := func(m *member) bool { return m.left }
	defer func() {
		for _, m := range members {
			finish(m, errors.New("mainnode: the batch has stopped"))
		}
	}()
	for {
		for len(members) == 0 || len(members) < b.gather {
			select {
			case m := <-b.joins:
				members = append(members, m)
				if b.gathered != nil {
					b.gathered <- struct{}{}
				}
			case <-b.life.Done():
				return
			}
		}
		b.gather, b.gathered = 0, nil
		for more := true; more; {
			select {
			case m := <-b.joins:
				members = append(members, m)
			default:
				more = false
			}
		}
		for _, m := range members {
			switch {
			case m.ctx.Err() != nil:
				finish(m, m.ctx.Err())
			case m.fed == len(m.prompt) && m.sess.Len() >= b.m.Config.MaxPositions:
				m.st.ContextFull = true
				finish(m, nil)
			}
		}
		members = slices.DeleteFunc(members, gone)
		if len(members) == 0 {
			continue
		}
		seqs = seqs[:0]
		for _, m := range members {
			seqs = append(seqs, passes.Seq{PromptLeft: len(m.prompt) - m.fed})
		}
		plan = passes.Next(plan[:0], seqs, b.budget)
		rows, sessions, feeds, heads = rows[:0], sessions[:0], feeds[:0], heads[:0]
		toks = slices.Grow(toks[:0], len(plan)*(1+b.draftUpTo)) // rows point into it: it must not move
		for _, r := range plan {
			m := members[r.Seq]
			row := Row{Step: m.sess.Next(), Prompt: r.Prompt, Cache: m.sess.Cache(), Sampling: m.sampling, PromptLen: len(m.prompt)}
			if r.Prompt {
				row.Tokens, row.PromptLeft = m.prompt[m.fed:m.fed+r.Tokens], len(m.prompt)-m.fed-r.Tokens
				if row.Step.Pass == 1 && m.fed > 0 {
					row.Reused = m.prompt[:m.fed]
				}
			} else {
				m.guess(b.hooks.Draft, b.draftUpTo, b.m.Config.VocabSize, b.m.Config.MaxPositions)
				toks = append(append(toks, m.out[len(m.out)-1]), m.guesses...)
				row.Tokens, row.Drafted = toks[len(toks)-1-len(m.guesses):], len(m.guesses)
			}
			m.sess.KeepRows(1 + row.Drafted)
			if !r.Prompt || r.Last {
				heads = append(heads, m.sess)
				// the first token this pass samples is its len(m.out)+1-th;
				// the guesses are checked only up to the limits
				row.Final = len(m.out)+1 >= m.opt.MaxTokens || m.sess.Len()+1 >= b.m.Config.MaxPositions
			}
			rows, sessions, feeds = append(rows, row), append(sessions, m.sess), append(feeds, row.Tokens)
		}
		lens = lens[:0]
		for _, s := range sessions {
			lens = append(lens, s.Len())
		}
		err := error(nil)
		if b.hooks.BeforePass != nil {
			err = b.hooks.BeforePass(b.life, b.batch.Next(), rows)
		}
		for again := false; err == nil; again = true {
			step := b.batch.Next()
			b.refeed(plan, members, rows, feeds, lens)
			err = b.batch.Forward(b.life, sessions, feeds)
			if err == nil && len(heads) > 0 {
				err = b.batch.Logits(heads) // the output head once for every row that samples
			}
			if err == nil || again || b.hooks.Recover == nil || !b.hooks.Recover(b.life, step, err, len(members)) {
				break
			}
			b.batch.RunAgain(sessions)
			for _, m := range members { // their rows are gone: each runs again from its first token
				m.refill, err = true, nil
			}
		}
		if err != nil {
			for _, r := range plan {
				finish(members[r.Seq], err)
			}
			members = slices.DeleteFunc(members, gone)
			continue
		}
		drawing = drawing[:0]
		for _, r := range plan {
			if m := members[r.Seq]; (!r.Prompt || r.Last) && m.opt.MaxTokens > 0 {
				drawing = append(drawing, m)
			}
		}
		drawAll(drawing)
		now := time.Now()
		for i, r := range plan {
			m := members[r.Seq]
			if r.Prompt {
				m.fed += r.Tokens
				if !r.Last {
					continue
				}
				m.first, m.st.Prefill = now, now.Sub(m.joined)
				if m.opt.MaxTokens <= 0 {
					finish(m, nil)
					continue
				}
			} else {
				m.st.PassTimes = append(m.st.PassTimes, now.Sub(m.lastPass))
			}
			m.lastPass = now
			if m.takeChecked(lens[i]) {
				finish(m, nil)
			}
		}
		members = slices.DeleteFunc(members, gone)
	}
}

// StartTogether makes b's first pass wait until n requests have joined,
// so that a test knows which requests share it and in what order they
// came: the channel gets a value as each joins. Call it before the first
// Generate; it is for tests.
func (b *Batcher) StartTogether(n int) <-chan struct{} {
	b.gather, b.gathered = n, make(chan struct{}, n)
	return b.gathered
}
