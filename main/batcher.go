package mainnode

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	// endSeq, if set, is told when a sequence is done with: a prompt's
	// once it has run (its decode passes run as the batch's), the batch's
	// at Close.
	endSeq func(ctx context.Context, seq uint64) error
	joins  chan *member
	life   context.Context
	stop   context.CancelFunc
	done   chan struct{}
}

// NewBatcher starts a batcher of m's sequences: decode passes run on
// runner, each prompt on a runner newRunner returns (the same one where
// it is safe for concurrent use).
func NewBatcher(m *model.Model, runner model.ExpertRunner, newRunner func() model.ExpertRunner, endSeq func(ctx context.Context, seq uint64) error) *Batcher {
	b := &Batcher{m: m, batch: model.NewBatch(m, runner), newRunner: newRunner, endSeq: endSeq,
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
	if b.endSeq != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b.endSeq(ctx, b.batch.Seq())
	}
}

// member is one request in the batch.
type member struct {
	ctx     context.Context
	sess    *model.Session
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
	sess := model.NewSession(b.m, b.newRunner(), len(prompt)+min(opt.MaxTokens, kvHint))
	t0 := time.Now()
	logits, err := sess.Forward(ctx, prompt)
	st.Prefill = time.Since(t0)
	if b.endSeq != nil {
		if endErr := b.endSeq(ctx, sess.Seq()); err == nil && ctx.Err() == nil {
			err = endErr
		}
	}
	if err != nil {
		return nil, st, err
	}
	m := &member{ctx: ctx, sess: sess, opt: opt, sampler: sampler, st: st, eos: b.m.Config.IsEOS, done: make(chan struct{})}
	t1 := time.Now()
	if opt.MaxTokens <= 0 || m.take(logits) {
		return m.out, m.st, m.err
	}
	select {
	case b.joins <- m:
	case <-ctx.Done():
		return m.out, m.st, ctx.Err()
	case <-b.life.Done():
		return m.out, m.st, errors.New("mainnode: the batch has stopped")
	}
	<-m.done
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
		for _, m := range members {
			sessions = append(sessions, m.sess)
			tokens = append(tokens, m.out[len(m.out)-1])
		}
		if err := b.batch.Forward(b.life, sessions, tokens); err != nil {
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
