package mainnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
)

// Batcher is continuous batching: each request's prompt runs as its own
// forward pass (a sequence of its own), then the request joins the
// running batch of decode passes at the next iteration boundary and
// leaves it when it is done (EOS, its token limit, a full context, an
// error of its own, or its client gone). A decode pass carries one token
// of every member, and each layer's experts run once for all members
// that routed to them (model.Batch); every member's tokens and logits are
// what it would get alone.
//
// One goroutine, owned by the Batcher and ended by Close, runs the
// passes; Generate is safe for concurrent use.
type Batcher struct {
	m         *model.Model
	batch     *model.Batch
	newRunner func() model.ExpertRunner // a prompt's runner
	hooks     BatcherHooks
	joins     chan *member
	life      context.Context
	stop      context.CancelFunc
	done      chan struct{}
	// the last pass's members, for BeforePass
	steps  []model.Step
	caches []*kvcache.Cache
	// prefixes, if set (KeepPrefixes), are finished sequences' KV rows
	// that a new prompt starting with the same tokens reuses
	prefixes *prefixCache
}

// KeepPrefixes keeps the KV rows of finished requests, up to budget
// bytes (least recently used go first), for later requests whose prompts
// start with the same tokens: those rows are copied, not computed again
// (GenerateStats.CachedTokens). Call it before the first Generate; 0
// keeps none.
func (b *Batcher) KeepPrefixes(budget int64) { b.prefixes = newPrefixCache(budget) }

// keep hands sess's KV rows to the prefix cache, if any: prompt then
// out, as far as they were fed. sess is not used again.
func (b *Batcher) keep(sess *model.Session, prompt, out []int) {
	if b.prefixes == nil {
		return
	}
	fed := slices.Concat(prompt, out) // a new array: prompt is the caller's
	b.prefixes.put(fed[:min(sess.Len(), len(fed))], sess.Cache())
}

// BatcherHooks let the runner follow the batch's sequences (the swarm:
// the shadow's alignments, what workers and the shadow keep per
// sequence). Any may be nil.
type BatcherHooks struct {
	// BeforePrompt comes before a request's prompt runs, as its own
	// forward pass step, with the batch its decode passes will run in.
	BeforePrompt func(ctx context.Context, batch uint64, step model.Step, prompt []int, cache *kvcache.Cache) error
	// BeforePass comes before each batched decode pass step (the batch's):
	// members[i] is member i's own forward pass, feeding tokens[i] after
	// the rows in caches[i].
	BeforePass func(ctx context.Context, step model.Step, members []model.Step, tokens []int, caches []*kvcache.Cache) error
	// EndSequence is told when a sequence is done with: a request's when
	// it leaves the batch, the batch's at Close.
	EndSequence func(ctx context.Context, seq uint64) error
}

// NewBatcher starts a batcher of m's sequences: decode passes run on
// runner, each prompt on a runner newRunner returns (the same one where
// it is safe for concurrent use).
func NewBatcher(m *model.Model, runner model.ExpertRunner, newRunner func() model.ExpertRunner, hooks BatcherHooks) *Batcher {
	b := &Batcher{m: m, batch: model.NewBatch(m, runner), newRunner: newRunner, hooks: hooks,
		joins: make(chan *member), done: make(chan struct{})}
	b.life, b.stop = context.WithCancel(context.Background())
	go b.loop()
	return b
}

// Seq is the sequence id the batch's decode passes run under.
func (b *Batcher) Seq() uint64 { return b.batch.Seq() }

// Close ends the batch: members still generating fail.
func (b *Batcher) Close() {
	b.stop()
	<-b.done
	b.end(b.batch.Seq())
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
	opt     model.GenerateOptions
	sampler *model.Sampler
	out     []int
	st      model.GenerateStats
	err     error
	eos     func(id int) bool
	done    chan struct{}
}

// Generate runs prompt, then decodes in the batch until the request is
// done, as model.Generate does alone (opt.BeforeForward is not called:
// a batched pass is not one sequence's).
func (b *Batcher) Generate(ctx context.Context, prompt []int, opt model.GenerateOptions) ([]int, model.GenerateStats, error) {
	st := model.GenerateStats{PromptTokens: len(prompt), FinishReason: "length"}
	if len(prompt) == 0 {
		return nil, st, fmt.Errorf("model: empty prompt")
	}
	if limit := b.m.Config.MaxPositions; len(prompt) > limit {
		return nil, st, fmt.Errorf("model: a prompt of %d tokens does not fit the model's context of %d (max_position_embeddings)", len(prompt), limit)
	}
	sampler := opt.Sampler
	if sampler == nil {
		sampler = model.NewSampler(0, 0, 0)
	}
	capacity := len(prompt) + min(opt.MaxTokens, kvHint)
	var sess *model.Session
	if cache, n := b.prefixes.take(prompt, capacity); n > 0 {
		resumed, err := model.ResumeSession(b.m, b.newRunner(), cache)
		if err != nil {
			return nil, st, err
		}
		sess, st.CachedTokens = resumed, n
	} else {
		sess = model.NewSession(b.m, b.newRunner(), capacity)
	}
	if b.hooks.BeforePrompt != nil { // the whole prompt: the shadow keeps no prefixes
		if err := b.hooks.BeforePrompt(ctx, b.batch.Seq(), sess.Next(), prompt, sess.Cache()); err != nil {
			b.end(sess.Seq())
			return nil, st, err
		}
	}
	t0 := time.Now()
	logits, err := sess.Forward(ctx, prompt[st.CachedTokens:])
	st.Prefill = time.Since(t0)
	if err != nil {
		b.end(sess.Seq())
		return nil, st, err
	}
	m := &member{ctx: ctx, sess: sess, prompt: prompt, opt: opt, sampler: sampler, st: st, eos: b.m.Config.IsEOS, done: make(chan struct{})}
	t1 := time.Now()
	if opt.MaxTokens <= 0 || m.take(logits) {
		b.end(sess.Seq())
		if m.err == nil {
			b.keep(sess, prompt, m.out)
		}
		return m.out, m.st, m.err
	}
	select {
	case b.joins <- m:
	case <-ctx.Done():
		b.end(sess.Seq())
		return m.out, m.st, ctx.Err()
	case <-b.life.Done():
		b.end(sess.Seq())
		return m.out, m.st, errors.New("mainnode: the batch has stopped")
	}
	<-m.done // the loop has ended the sequence
	m.st.Decode = time.Since(t1)
	return m.out, m.st, m.err
}

// take samples the member's next token from logits and hands it on; it
// reports whether the member is done (and then has said why).
func (m *member) take(logits []float32) bool {
	id := m.sampler.Sample(logits)
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

// loop runs decode passes while there are members, admitting the ones
// that joined before each pass.
func (b *Batcher) loop() {
	defer close(b.done)
	var members []*member
	var sessions []*model.Session
	var tokens []int
	finish := func(m *member, err error) {
		if m.err == nil {
			m.err = err
		}
		b.end(m.sess.Seq())
		if m.err == nil {
			b.keep(m.sess, m.prompt, m.out)
		}
		close(m.done)
	}
	defer func() {
		for _, m := range members {
			finish(m, errors.New("mainnode: the batch has stopped"))
		}
	}()
	for {
		if len(members) == 0 {
			select {
			case m := <-b.joins:
				members = append(members, m)
			case <-b.life.Done():
				return
			}
		}
		for more := true; more; {
			select {
			case m := <-b.joins:
				members = append(members, m)
			default:
				more = false
			}
		}
		live := members[:0]
		for _, m := range members {
			switch {
			case m.ctx.Err() != nil:
				finish(m, m.ctx.Err())
			case m.sess.Len() >= b.m.Config.MaxPositions:
				m.st.ContextFull = true
				finish(m, nil)
			default:
				live = append(live, m)
			}
		}
		members = live
		if len(members) == 0 {
			continue
		}
		sessions, tokens = sessions[:0], tokens[:0]
		b.steps, b.caches = b.steps[:0], b.caches[:0]
		for _, m := range members {
			sessions = append(sessions, m.sess)
			tokens = append(tokens, m.out[len(m.out)-1])
			b.steps = append(b.steps, m.sess.Next())
			b.caches = append(b.caches, m.sess.Cache())
		}
		err := error(nil)
		if b.hooks.BeforePass != nil {
			err = b.hooks.BeforePass(b.life, b.batch.Next(), b.steps, tokens, b.caches)
		}
		if err == nil {
			err = b.batch.Forward(b.life, sessions, tokens)
		}
		if err == nil {
			err = b.batch.Logits(sessions) // the output head once for every row
		}
		if err != nil {
			for _, m := range members {
				finish(m, err)
			}
			members = members[:0]
			continue
		}
		live = members[:0]
		for _, m := range members {
			if m.take(m.sess.Logits()) {
				finish(m, nil)
			} else {
				live = append(live, m)
			}
		}
		members = live
	}
}
