// Package shadow is the shadow node role: a quantized copy of the whole
// model that decodes the same sequence as the main node, started by it
// each iteration, and as soon as its router has chosen a layer's experts
// tells that layer's worker group to load them (and the main node, which
// scores the prediction and places the real experts on the workers that
// loaded them). Before departing on an iteration it takes the main node's
// alignment: the token to feed and KV rows to overwrite (OD-MoE section
// 3.2, "late departure").
//
// It does not own the alignment policy (align; the main node applies it),
// the placement rule (sched) or the transport (wire).
package shadow

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// Node runs the shadow model for one main node at a time, following
// every sequence that main node runs.
type Node struct {
	m       *model.Model // quantized
	workers []*workerLink
	layout  sched.Layout
	log     zerolog.Logger
	trace   *trace.Recorder
	redial  func(ctx context.Context, w int) (*wire.Peer, error)

	// the watchers of the worker connections: Close ends life and waits
	life     context.Context
	stop     context.CancelFunc
	watchers sync.WaitGroup

	// while a forward pass runs (one at a time, on ServeMain's goroutine)
	out     chan<- outgoing // to the sender
	mainP   *wire.Peer
	experts []int
	buf     []int // scratch for sched.PredictionHints
	// owners, once the main node has sent one, is who owns each expert
	// (-residency on): a predicted expert is hinted to its owner
	owners *sched.Placement
	mark   time.Time // the end of the last traced piece of the forward pass
}

// follow is the shadow's copy of one of the main node's sequences.
type follow struct {
	seq     uint64 // the main node's id for it
	sess    *model.Session
	it      int64 // the last iteration run
	next    int   // the token the shadow itself sampled last (valid unless headDue)
	headDue bool  // the last forward pass's head has not run yet (see iterate)
}

// outgoing is a message for the sender to send, with what the trace
// records of it.
type outgoing struct {
	worker int // the worker it goes to, or -1: the main node
	msg    wire.Message
	it     int64
	layer  int
}

// workerLink is the shadow's connection to one worker, replaced when the
// worker comes back after it was lost.
type workerLink struct {
	name string
	peer atomic.Pointer[wire.Peer]
	up   atomic.Bool
}

// NewNode returns a shadow over the quantized model m that hints workers
// (in layout order). When a worker's connection ends its hints are
// dropped, and redial (if set) is called in the background until it
// answers again. Close the node when done.
func NewNode(m *model.Model, workers []*wire.Peer, layout sched.Layout, redial func(ctx context.Context, w int) (*wire.Peer, error), log zerolog.Logger) (*Node, error) {
	if len(workers) != layout.Workers {
		return nil, fmt.Errorf("shadow: %d worker connections for a layout of %d", len(workers), layout.Workers)
	}
	n := &Node{m: m, layout: layout, log: log, trace: trace.NewRecorder("shadow"), redial: redial}
	n.life, n.stop = context.WithCancel(context.Background())
	for w, p := range workers {
		l := &workerLink{name: p.Identity().Name}
		l.peer.Store(p)
		l.up.Store(true)
		n.workers = append(n.workers, l)
		n.watchers.Go(func() { n.watch(w, l) })
	}
	return n, nil
}

// Close stops dialing lost workers and closes the worker connections.
func (n *Node) Close() {
	n.stop()
	n.watchers.Wait()
	for _, l := range n.workers {
		l.peer.Load().Close()
	}
}

// watch waits for worker w's connection to end, then dials the worker
// until it answers, and again, until the node closes.
func (n *Node) watch(w int, l *workerLink) {
	for {
		p := l.peer.Load()
		select {
		case <-p.Done():
		case <-n.life.Done():
			return
		}
		l.up.Store(false)
		n.log.Warn().Str("worker", l.name).Err(p.Err()).Msg("shadow: worker lost; its hints are dropped until it answers again")
		if n.redial == nil {
			return
		}
		np, attempt, err := wire.Redial(n.life, func(ctx context.Context) (*wire.Peer, error) { return n.redial(ctx, w) },
			func(id wire.Identity) error {
				if id.Name != l.name {
					return fmt.Errorf("not %s", l.name)
				}
				return nil
			},
			func(attempt int, err error) {
				n.log.Warn().Str("worker", l.name).Int("attempt", attempt).Err(err).Msg("shadow: lost worker still unreachable; dialing again")
			})
		if err != nil {
			return // the node closed
		}
		l.peer.Store(np)
		l.up.Store(true)
		n.log.Info().Str("worker", l.name).Int("attempt", attempt).Msg("shadow: worker back")
	}
}

// sendQueue is how many messages the forward pass may run ahead of the
// network: two iterations' predictions of a 32-layer model to a group.
const sendQueue = 256

// ServeMain follows one main node until its connection ends, and says why
// it ended. Its alignments start iterations, run on this goroutine in each
// sequence's iteration order; a sender goroutine carries the predictions
// to the workers and the main node, so the forward pass never waits on
// the network. Both end before ServeMain returns.
func (n *Node) ServeMain(ctx context.Context, p *wire.Peer) error {
	n.owners = nil // a placement is one main node's: the next may run without residency, or number its own from 0
	g, ctx := errgroup.WithContext(ctx)
	out := make(chan outgoing, sendQueue)
	g.Go(func() error { return n.send(ctx, out) })
	n.out, n.mainP = out, p
	err := n.receive(ctx, p)
	close(out)
	if serr := g.Wait(); serr != nil && errors.Is(err, context.Canceled) {
		err = serr // the sender failed first, and cancelled the receive
	}
	n.log.Info().Str("main", p.Identity().Name).Err(err).Msg("shadow: stopped following the main node")
	return err
}

// send sends what the forward passes queue, in order, until out is
// closed. Failing to reach the main node ends it; failing to reach a
// worker only drops the hint (the worker's watcher sees the loss).
func (n *Node) send(ctx context.Context, out <-chan outgoing) error {
	for o := range out {
		to := n.mainP
		if o.worker >= 0 {
			to = n.workers[o.worker].peer.Load()
		}
		if n.trace.Active(o.it) {
			n.trace.Message(trace.Send, trace.MsgPrediction, to.Identity().Name, o.it, o.layer, -1, 0, time.Now())
		}
		err := to.Send(ctx, o.msg)
		switch {
		case err == nil:
		case o.worker < 0 || ctx.Err() != nil:
			return fmt.Errorf("shadow: sending a %v to %s: %w", o.msg.Type(), to.Identity().Name, err)
		default:
			n.log.Debug().Str("worker", to.Identity().Name).Err(err).Msg("shadow: hint not sent")
		}
	}
	return nil
}

// receive reads the main node's messages and runs the iterations they
// start until the connection or ctx ends.
func (n *Node) receive(ctx context.Context, p *wire.Peer) error {
	// Alignments travel on bulk streams and may arrive out of order: each
	// waits here until its iteration is next in its sequence.
	pending := map[seqIter]*wire.Alignment{}
	seqs := map[uint64]*follow{}
	var ended []uint64 // sequences the main node ended, most recent last
	// batched decode passes: the member alignments of each pass, and each
	// batch's state
	passes := map[seqIter][]*wire.Alignment{}
	batches := map[uint64]*batchFollow{}
	for {
		m, err := p.Recv(ctx)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *wire.Trace:
			if err := wire.AnswerTrace(ctx, p, n.trace, m); err != nil {
				return err
			}
		case *wire.Placement:
			n.setPlacement(m)
		case *wire.SequenceEnd:
			delete(seqs, m.Seq)
			delete(batches, m.Seq)
			maps.DeleteFunc(pending, func(k seqIter, _ *wire.Alignment) bool { return k.seq == m.Seq })
			maps.DeleteFunc(passes, func(k seqIter, _ []*wire.Alignment) bool { return k.seq == m.Seq })
			ended = append(ended[max(0, len(ended)-63):], m.Seq)
		case *wire.Alignment:
			n.trace.Message(trace.Recv, trace.MsgAlignment, p.Identity().Name, m.Iteration, 0, -1, 0, time.Now())
			if slices.Contains(ended, m.Seq) {
				n.log.Warn().Uint64("seq", m.Seq).Int64("iteration", m.Iteration).Msg("alignment for a sequence that has ended: dropped")
				continue
			}
			if len(m.Prompt) > 0 { // the sequence starts here: its prompt, or all of it so far
				seqs[m.Seq] = &follow{seq: m.Seq, it: m.Iteration - 1}
			}
			if m.Batch != 0 {
				k := seqIter{m.Batch, m.BatchIteration}
				passes[k] = append(passes[k], m)
				if err := n.runPasses(ctx, m.Batch, passes, batches, seqs); err != nil {
					return err
				}
				continue
			}
			pending[seqIter{m.Seq, m.Iteration}] = m
			f := seqs[m.Seq]
			if f == nil {
				continue // its prompt has not arrived yet
			}
			for {
				k := seqIter{f.seq, f.it + 1}
				a, ok := pending[k]
				if !ok {
					break
				}
				delete(pending, k)
				if err := n.iterate(ctx, f, a); err != nil {
					return err
				}
			}
			// a member's prompt may be what a batched pass waited for
			for b := range batches {
				if err := n.runPasses(ctx, b, passes, batches, seqs); err != nil {
					return err
				}
			}
		default:
			n.log.Warn().Str("type", m.Type().String()).Msg("ignoring a message the shadow does not handle")
		}
	}
}

// iterate runs one iteration of f: the prompt (no predictions: prefill
// loads every expert anyway) or one decode step after applying the
// alignment. A sequence the shadow joins late (it attached, or came
// back, mid-sequence) starts with every token so far as its prompt and
// goes on with the decode step at once.
func (n *Node) iterate(ctx context.Context, f *follow, a *wire.Alignment) error {
	start := time.Now()
	token, decode, err := n.prepare(ctx, f, a)
	if err != nil || !decode {
		return err
	}
	late := time.Since(start) // late departure: the alignment's own cost here
	n.trace.Span(trace.Align, a.Iteration, 0, -1, start, start.Add(late))
	f.sess.OnRoute = func(_ model.Step, l int, _ []float32, routes []model.Route) { n.predict(ctx, f.seq, f.it, l, routes) }
	t0 := time.Now()
	n.mark = t0
	err = f.sess.ForwardHidden(ctx, []int{token})
	forward := time.Since(t0)
	n.trace.Span(trace.Shadow, a.Iteration, n.m.Config.NumLayers, -1, n.mark, t0.Add(forward))
	f.sess.OnRoute = nil
	if err != nil {
		return fmt.Errorf("shadow: sequence %d iteration %d: %w", f.seq, a.Iteration, err)
	}
	f.headDue = true
	return n.queue(ctx, outgoing{worker: -1, it: -1, msg: &wire.ShadowDone{Seq: f.seq, Iteration: a.Iteration,
		LateDeparture: late, Forward: forward, RSSPeak: procmem.PeakRSS()}})
}

// prepare applies a to f: its prompt (starting or restarting f), its KV
// rows, its token. It returns the token f's decode step feeds, and
// whether there is one (not after a sequence's first prompt).
func (n *Node) prepare(ctx context.Context, f *follow, a *wire.Alignment) (token int, decode bool, err error) {
	f.it = a.Iteration
	if len(a.Prompt) > 0 {
		toks := make([]int, len(a.Prompt))
		for i, t := range a.Prompt {
			toks[i] = int(t)
		}
		f.sess = model.NewSession(n.m, model.NewResidentExperts(n.m), len(toks)+256)
		if err := f.sess.ForwardHidden(ctx, toks); err != nil {
			return 0, false, fmt.Errorf("shadow: sequence %d prompt: %w", f.seq, err)
		}
		f.headDue = true
		if a.Iteration == 1 {
			return 0, false, nil
		}
		if a.Token < 0 {
			return 0, false, fmt.Errorf("shadow: sequence %d joined at iteration %d without the token to feed", f.seq, a.Iteration)
		}
		n.log.Info().Uint64("seq", f.seq).Int64("iteration", a.Iteration).Int("tokens", len(toks)).Bool("kv", len(a.Keys) > 0).
			Msg("shadow: following a sequence from the middle")
	} else if f.sess == nil {
		return 0, false, fmt.Errorf("shadow: sequence %d iteration %d before its prompt", f.seq, a.Iteration)
	}
	if len(a.Keys) > 0 {
		kv, err := kvRows(a)
		if err == nil {
			err = kv.Apply(f.sess.Cache())
		}
		if err != nil {
			return 0, false, fmt.Errorf("shadow: sequence %d iteration %d KV alignment: %w", f.seq, a.Iteration, err)
		}
	}
	// The output head (the vocabulary-sized matvec) only gives the shadow
	// its own next token, which it needs only when the main node does not
	// send one: run it lazily, here, when it is due and the alignment has
	// no token, so with token alignment it never delays a departure.
	token = int(a.Token)
	if a.Token < 0 {
		if f.headDue {
			f.next = model.Argmax(f.sess.Logits())
		}
		token = f.next
	}
	f.headDue = false
	return token, true, nil
}

// seqIter is one iteration of one sequence (or batch).
type seqIter struct {
	seq uint64
	it  int64
}

// batchFollow is the shadow's copy of one of the main node's decode
// batches.
type batchFollow struct {
	batch *model.Batch
	it    int64 // the last pass run; 0: none yet
	// a pass's sessions and tokens, reused pass after pass
	sessions []*model.Session
	tokens   []int
}

// runPasses runs batch b's passes that are ready, in order: a pass is
// ready when all its members' alignments have come, each is its
// sequence's next iteration (or restarts it with its prompt), and the
// batch's previous pass has run. The first pass the shadow sees of a
// batch starts it (it may attach mid-batch).
func (n *Node) runPasses(ctx context.Context, b uint64, passes map[seqIter][]*wire.Alignment, batches map[uint64]*batchFollow, seqs map[uint64]*follow) error {
	for {
		bf := batches[b]
		var k seqIter
		if bf != nil {
			k = seqIter{b, bf.it + 1}
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
			if len(a.Prompt) == 0 && (f == nil || f.it+1 != a.Iteration) {
				return nil // the member's previous iteration has not run
			}
		}
		delete(passes, k)
		if bf == nil {
			bf = &batchFollow{batch: model.NewBatch(n.m, model.NewResidentExperts(n.m))}
			batches[b] = bf
		}
		bf.it = k.it
		if err := n.pass(ctx, b, bf, members, seqs); err != nil {
			return err
		}
	}
}

// pass runs one batched decode pass of batch b: each member's alignment,
// then one forward pass over all of them whose routing, the union over
// the members, is predicted for step (b, pass).
func (n *Node) pass(ctx context.Context, b uint64, bf *batchFollow, members []*wire.Alignment, seqs map[uint64]*follow) error {
	start := time.Now()
	sessions, tokens := bf.sessions[:0], bf.tokens[:0]
	for _, a := range members {
		f := seqs[a.Seq]
		if f == nil { // restarted by its prompt
			f = &follow{seq: a.Seq}
			seqs[a.Seq] = f
		}
		token, decode, err := n.prepare(ctx, f, a)
		if err != nil {
			return err
		}
		if !decode {
			return fmt.Errorf("shadow: batch %d pass %d: sequence %d has no decode step", b, bf.it, a.Seq)
		}
		sessions = append(sessions, f.sess)
		tokens = append(tokens, token)
	}
	bf.sessions, bf.tokens = sessions, tokens
	late := time.Since(start)
	n.trace.Span(trace.Align, bf.it, 0, -1, start, start.Add(late))
	it := bf.it
	bf.batch.SetOnRoute(func(_ model.Step, l int, _ []float32, routes []model.Route) { n.predict(ctx, b, it, l, routes) })
	t0 := time.Now()
	n.mark = t0
	err := bf.batch.Forward(ctx, sessions, tokens)
	forward := time.Since(t0)
	n.trace.Span(trace.Shadow, it, n.m.Config.NumLayers, -1, n.mark, t0.Add(forward))
	bf.batch.SetOnRoute(nil)
	if err != nil {
		return fmt.Errorf("shadow: batch %d pass %d: %w", b, it, err)
	}
	for _, a := range members {
		seqs[a.Seq].headDue = true
	}
	return n.queue(ctx, outgoing{worker: -1, it: -1, msg: &wire.ShadowDone{Seq: b, Iteration: it,
		LateDeparture: late, Forward: forward, RSSPeak: procmem.PeakRSS()}})
}

// queue hands o to the sender.
func (n *Node) queue(ctx context.Context, o outgoing) error {
	select {
	case n.out <- o:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// predict is the routing hook of a forward pass, step (seq, it): the
// moment layer l is routed (the union over a batch's rows), hint its
// group's workers and tell the main node (through the
// sender). If ctx has ended nothing is queued, and the forward pass stops
// at its next layer.
func (n *Node) predict(ctx context.Context, seq uint64, it int64, l int, routes []model.Route) {
	now := time.Now()
	n.trace.Span(trace.Shadow, it, l, -1, n.mark, now)
	n.mark = now
	n.experts = n.experts[:0]
	for _, r := range routes {
		if !slices.Contains(n.experts, r.Expert) {
			n.experts = append(n.experts, r.Expert)
		}
	}
	slices.Sort(n.experts)
	prediction := func(worker int, experts []int) outgoing {
		return outgoing{worker: worker, it: it, layer: l, msg: &wire.Prediction{Seq: seq, Iteration: it, Layer: l, Experts: int32s(experts)}}
	}
	// each worker of the group loads its share, where the main node's
	// planner will look for it (sched.PlacePredicted), or each owner its
	// experts when they stay resident
	var failed error
	hint := func(w int, experts []int) {
		if failed == nil && n.workers[w].up.Load() {
			failed = n.queue(ctx, prediction(w, experts))
		}
	}
	if n.owners != nil {
		n.buf = ownerHints(n.owners, l, n.experts, n.buf, hint)
	} else {
		n.buf = n.layout.PredictionHints(l, n.experts, n.buf, hint)
	}
	if failed == nil {
		_ = n.queue(ctx, prediction(-1, n.experts))
	}
}

// setPlacement takes the main node's placement of the experts, unless it
// is older than the one the shadow has (they travel on streams of their
// own) or does not fit the layout (logged, and ignored: hints then go to
// the default workers and only cost misses).
func (n *Node) setPlacement(m *wire.Placement) {
	p, err := sched.DecodePlacement(m.Workers, m.Experts, m.Version, m.Layers, m.Owners)
	if err == nil && (p.Workers() != n.layout.Workers || p.Experts() != n.m.Config.NumExperts || !slices.Equal(p.Layers(), n.m.Config.ExpertLayers())) {
		err = fmt.Errorf("placement of %d experts of layers %v over %d workers, the shadow has %d experts of layers %v and %d workers",
			p.Experts(), p.Layers(), p.Workers(), n.m.Config.NumExperts, n.m.Config.ExpertLayers(), n.layout.Workers)
	}
	if err != nil {
		n.log.Warn().Err(err).Msg("shadow: the main node's placement is unusable: hinting the default workers")
		return
	}
	if n.owners == nil || p.Version() > n.owners.Version() {
		n.owners = p
		n.log.Debug().Uint64("version", p.Version()).Msg("shadow: hinting experts to their owners")
	}
}

// ownerHints calls f once per owner of some of experts (distinct, sorted)
// of layer, with the experts it owns; buf is scratch for them (valid
// until f returns), returned grown.
func ownerHints(owners *sched.Placement, layer int, experts, buf []int, f func(worker int, experts []int)) []int {
	for i, e := range experts {
		w := owners.Owner(layer, e)
		if slices.ContainsFunc(experts[:i], func(d int) bool { return owners.Owner(layer, d) == w }) {
			continue
		}
		buf = buf[:0]
		for _, d := range experts[i:] {
			if owners.Owner(layer, d) == w {
				buf = append(buf, d)
			}
		}
		f(w, buf)
	}
	return buf
}

// int32s copies ids for a message, which the sender owns.
func int32s(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, e := range ids {
		out[i] = int32(e)
	}
	return out
}

// kvRows turns an alignment's tensors back into align.KVRows.
func kvRows(a *wire.Alignment) (align.KVRows, error) {
	if len(a.Keys) != len(a.Values) || len(a.Keys) == 0 {
		return align.KVRows{}, errors.New("keys and values per layer do not match")
	}
	kv := align.KVRows{From: a.FromPos, Keys: make([][]uint16, len(a.Keys)), Values: make([][]uint16, len(a.Keys))}
	for l := range a.Keys {
		k, v := a.Keys[l], a.Values[l]
		if k.DType != wire.F16 || v.DType != k.DType || len(k.Shape) != 2 || !slices.Equal(k.Shape, v.Shape) {
			return align.KVRows{}, fmt.Errorf("layer %d: want two F16 [rows, width] tensors", l)
		}
		kv.Rows, kv.Width = k.Shape[0], k.Shape[1]
		kv.Keys[l], kv.Values[l] = u16s(k.Data), u16s(v.Data)
	}
	return kv, nil
}

func u16s(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	return out
}
