// Package shadow is the shadow node role: a quantized copy of the whole
// model that decodes the same sequence as the main node and, as soon as
// its router has chosen a layer's experts, tells that layer's worker group
// to load them (and the main node, which scores the prediction and places
// the real experts on the workers that loaded them). The main node's
// alignments carry the token to feed and KV rows to overwrite (OD-MoE
// section 3.2).
//
// It departs speculatively: once a pass is done it runs the batch's next
// pass on the tokens it guessed itself (each member's as the main node
// draws it), up to Ahead passes past the main node's latest alignment,
// so its predictions come a pass early instead of a few layers. When the
// main node's pass differs, only the rows that differ cost anything
// (revise): a member guessed wrong, or gone, has its row taken back (its
// KV row truncated), a member fed another token or new to the pass runs
// its row alone, and each layer's prediction is revised (experts still
// wanted stay on their workers, the rest are withdrawn: wire.Withdraw);
// passes run further ahead than the one met are rewound whole. KV rows
// overwrite the shadow's own in place. With Ahead 0 it waits for every
// alignment before departing (OD-MoE's "late departure").
//
// A staged shadow is a first stage of this node (its first layers and
// the head) whose model runs the later layers on its Stages (package
// stage): the decisions above stay here.
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
	"github.com/odmoe/odmoe/grammar"
	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// Stages are the shadow stages that hold a staged shadow's later layers
// (stage.Client): they hear of each sequence's KV alignments and end
// (its rows they run as its model's LayerRunner).
type Stages interface {
	ApplyKV(ctx context.Context, seq uint64, kv align.KVRows) error
	End(ctx context.Context, seq uint64) error
	Reset(ctx context.Context) error
	// CPU is the CPU time the stages' processes have used (their rows
	// say it): the shadow's CPU is its own and theirs
	CPU() time.Duration
}

// Node runs the shadow model for one main node at a time, following
// every sequence that main node runs.
type Node struct {
	m       *model.Model // quantized
	workers []*workerLink
	layout  sched.Layout
	log     zerolog.Logger
	trace   *trace.Recorder
	redial  func(ctx context.Context, w int) (*wire.Peer, error)
	// mainWire is how the shadow listens for the main node: its model,
	// layout and group said in its Hello (New)
	mainWire wire.Config

	// the watchers of the worker connections: Close ends life and waits
	life     context.Context
	stop     context.CancelFunc
	watchers sync.WaitGroup

	// while a forward pass runs (one at a time, on ServeMain's goroutine)
	out     chan<- outgoing // to the sender
	mainP   *wire.Peer
	experts []int // scratch: a layer's predicted experts
	on      []int // scratch: the worker each is hinted to
	// owners, once the main node has sent one, is who owns each expert
	// (-residency on): a predicted expert is hinted to its owner
	owners *sched.Placement
	mark   time.Time // the end of the last traced piece of the forward pass

	// Ahead is how many passes past the main node's latest alignment
	// a sequence may run on its own tokens (0: wait for every alignment).
	// Set it before ServeMain.
	Ahead int
	// Stages, if set, hold the layers after the model's own (a staged
	// shadow: the model runs them on Stages, its LayerRunner): each
	// sequence's KV alignments and end reach them too. Set it before
	// ServeMain.
	Stages Stages
	// Prefixes, if set, keeps finished sequences' KV rows: a sequence
	// that starts with a prefix the main node reused (a chat's next turn)
	// copies them instead of running those tokens again. Set it before
	// ServeMain.
	Prefixes *kvcache.Prefixes
	// vocabulary, when set, is the model's, for the grammars of
	// constrained requests (grammarOf), made on first use; grammars and
	// masks are theirs
	vocabulary func() (*grammar.Vocabulary, error)
	grammars   *grammar.Grammars
	masks      *grammar.MaskCache
	// agreed and rewound count the members' rows of passes run ahead
	// whose alignment met them: on the same token, or not (a rewind of
	// that row); rewoundSeqs are the members whose rows the pass being
	// run rewound, for its ShadowDone
	agreed, rewound int64
	rewoundSeqs     []uint64
	agreedSeqs      []uint64 // as rewoundSeqs, the members whose rows it met
	// started is the latest pass the main node has started of each
	// sequence, as its alignments arrive (before they are handled): a
	// shadow behind it hints no loads for passes the main node has
	// finished (see predict)
	started  startedIters
	unhinted int64 // layers predicted after the main node had run them: no hints sent
	reused   int64 // tokens whose rows came from Prefixes
}

// startedIters is, per sequence, the latest pass whose alignment
// has arrived; safe for concurrent use.
type startedIters struct {
	mu sync.Mutex
	it map[uint64]int64
}

func (s *startedIters) saw(a *wire.Alignment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.it == nil {
		s.it = map[uint64]int64{}
	}
	if a.Batch != 0 && a.BatchPass > 0 { // the batch's pass has started too
		s.it[a.Batch] = max(s.it[a.Batch], a.BatchPass)
	}
	if len(a.History) > 0 { // the sequence (re)starts here
		s.it[a.Seq] = a.Pass
		return
	}
	s.it[a.Seq] = max(s.it[a.Seq], a.Pass)
}

// passed reports whether the main node has started a pass of seq
// after it, so has run every layer of it.
func (s *startedIters) passed(seq uint64, it int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.it[seq] > it
}

func (s *startedIters) forget(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.it, seq)
}

// DefaultAhead is Node.Ahead unless set: one pass ahead hides a
// whole pass's loads, and holds twice a pass's predictions on
// the workers at most.
const DefaultAhead = 1

// follow is the shadow's copy of one of the main node's sequences, which
// runs in the passes of one of its batches (passFollow).
type follow struct {
	seq     uint64 // the main node's id for it
	sess    *model.Session
	aligned int64 // the last pass whose alignment has been applied
	next    int   // the token the shadow itself sampled last (valid unless headDue)
	headDue bool  // the last forward pass's head has not run yet (see ownToken)
	// promptLeft are the prompt tokens a later pass feeds it; final: its
	// last pass has been aligned (it leaves the batch after it)
	promptLeft int
	final      bool
	// fed are the tokens whose rows sess holds, in order (for the prefix
	// cache when the sequence ends)
	fed []int
	// sampler chooses as the main node's request does (its Sampling),
	// nil for greedy; the request's k-th token sits at promptLen+k
	sampler   *model.Sampler
	promptLen int
	// grammar, when the request has one, keeps the guesses inside it:
	// c has accepted the generated tokens accepted (made anew when a
	// rewind takes some of them back)
	grammar  *grammar.Constraints
	c        *grammar.Constraint
	accepted []int
	// draft is how many tokens to guess after the member's row in a pass
	// run ahead (the main node's latest Alignment.Draft; 0: none)
	draft int
}

// takeBack forgets f's last n rows (and the tokens they fed).
func (f *follow) takeBack(n int) {
	n = min(n, f.sess.Len())
	f.sess.Cache().Truncate(f.sess.Len() - n)
	f.fed = f.fed[:max(len(f.fed)-n, 0)]
}

// ownToken is the token f's last forward pass chose, running the output
// head once per pass: greedily, or as the main node's sampler would from
// the same logits (model.Sampler.Guess: the same seeded draw for the
// same position, the penalties counted over the tokens fed since the
// prompt), so that a sampled request's guess is right as often as a
// greedy one's.
func (f *follow) ownToken() int {
	if f.headDue {
		if f.sampler != nil && len(f.fed) >= f.promptLen {
			generated := f.fed[f.promptLen:]
			f.next = f.sampler.Guess(f.sess.Logits(), generated, f.allowed(generated))
		} else {
			f.next = model.Argmax(f.sess.Logits())
		}
		f.headDue = false
	}
	return f.next
}

// allowed is what f's grammar lets come after generated (nil: any, or
// no grammar). A grammar that refuses a token the main node fed is not
// the request's: f guesses without it from then on.
func (f *follow) allowed(generated []int) []uint64 {
	if f.grammar == nil {
		return nil
	}
	if n := commonPrefix(f.accepted, generated); n < len(f.accepted) || f.c == nil {
		c, err := f.grammar.New()
		if err != nil {
			f.grammar = nil
			return nil
		}
		f.c, f.accepted = c, f.accepted[:0]
	}
	for _, id := range generated[len(f.accepted):] {
		if err := f.c.Accept(id); err != nil {
			f.grammar = nil
			return nil
		}
		f.accepted = append(f.accepted, id)
	}
	mask, err := f.c.Allowed()
	if err != nil {
		f.grammar = nil
		return nil
	}
	return mask
}

func commonPrefix(a, b []int) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// grammarOf is the maker of constraints of the grammar spec says, over
// the model's vocabulary: one kept per grammar (up to
// grammar.GrammarCacheBytes, the oldest let go first), their masks in
// one cache (grammar.MaskCacheBytes). nil where the shadow has no
// vocabulary or the spec does not read (logged): the sequence is guessed
// without it.
func (n *Node) grammarOf(spec []byte) *grammar.Constraints {
	if len(spec) == 0 || n.vocabulary == nil {
		return nil
	}
	if n.grammars == nil {
		n.grammars = grammar.NewGrammars(grammar.GrammarCacheBytes)
	}
	if cs, ok := n.grammars.Get(string(spec)); ok {
		return cs
	}
	v, err := n.vocabulary()
	if err == nil && n.masks == nil {
		n.masks = grammar.NewMaskCache(grammar.MaskCacheBytes)
	}
	var g *grammar.Grammar
	if err == nil {
		g, err = grammar.FromSpec(spec)
	}
	if err != nil {
		n.log.Warn().Err(err).Msg("shadow: a request's grammar: its tokens are guessed without it")
		return nil
	}
	cs := grammar.For(g, v, n.masks)
	n.grammars.Put(string(spec), cs)
	return cs
}

// samplerOf is the sampler that guesses as w says the main node chooses,
// nil for none (greedy), and the request's prompt length.
func samplerOf(w *wire.Sampling) (*model.Sampler, int) {
	if w == nil {
		return nil, 0
	}
	p := model.Sampling{Temperature: w.Temperature, TopP: w.TopP, TopK: w.TopK, Seed: w.Seed, Presence: w.Presence, Frequency: w.Frequency,
		MinP: w.MinP, Repeat: w.Repeat, RepeatN: w.RepeatN}
	for _, id := range w.RepeatTail {
		p.RepeatTail = append(p.RepeatTail, int(id))
	}
	if len(w.BiasIDs) > 0 {
		p.Bias = make(map[int]float64, len(w.BiasIDs))
		for i, id := range w.BiasIDs {
			p.Bias[int(id)] = w.Biases[i]
		}
	}
	return model.NewSamplerOf(p), w.PromptLen
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

// newNode returns a shadow over the quantized model m that hints workers
// (in layout order). When a worker's connection ends its hints are
// dropped, and redial (if set) is called in the background until it
// answers again. Close the node when done.
func newNode(m *model.Model, workers []*wire.Peer, layout sched.Layout, redial func(ctx context.Context, w int) (*wire.Peer, error), log zerolog.Logger) (*Node, error) {
	if len(workers) != layout.Workers {
		return nil, fmt.Errorf("shadow: %d worker connections for a layout of %d", len(workers), layout.Workers)
	}
	n := &Node{m: m, layout: layout, log: log, trace: trace.NewRecorder("shadow"), redial: redial, Ahead: DefaultAhead}
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
// network: two passes' predictions of a 32-layer model to a group.
const sendQueue = 256

// ServeMain follows one main node until its connection ends, and says why
// it ended. Its alignments start passes, run on this goroutine in each
// sequence's pass order; a sender goroutine carries the predictions
// to the workers and the main node, so the forward pass never waits on
// the network. Both end before ServeMain returns.
func (n *Node) ServeMain(ctx context.Context, p *wire.Peer) error {
	if n.Stages != nil { // every stage there, holding none of another main node's sequences
		if err := n.Stages.Reset(ctx); err != nil {
			n.log.Warn().Err(err).Str("main", p.Identity().Name).Msg("shadow: a stage is not there: the main node runs without the shadow until it is")
			return err
		}
	}
	n.owners = nil // a placement is one main node's: the next may run without residency, or number its own from 0
	n.agreed, n.rewound, n.rewoundSeqs, n.agreedSeqs = 0, 0, n.rewoundSeqs[:0], n.agreedSeqs[:0]
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
		if _, ok := o.msg.(*wire.Prediction); ok && n.trace.Active(o.it) {
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

// receive reads the main node's messages and runs the passes they
// start, and those sequences may run ahead, until the connection or ctx
// ends. Messages come first: an alignment may rewind what would run ahead.
func (n *Node) receive(ctx context.Context, p *wire.Peer) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	inbox := make(chan wire.Message, 64)
	failed := make(chan error, 1)
	go func() {
		for {
			m, err := p.Recv(ctx)
			if err != nil {
				failed <- err
				return
			}
			switch m := m.(type) {
			case *wire.Alignment:
				n.started.saw(m)
			case *wire.SequenceEnd:
				n.started.forget(m.Seq)
			}
			select {
			case inbox <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	st := &mainState{ending: map[uint64]int64{}, seqs: map[uint64]*follow{}, passes: map[seqIter][]*wire.Alignment{}, batches: map[uint64]*passFollow{}}
	for {
		var m wire.Message
		select {
		case m = <-inbox:
		default:
			if b, bf := n.passDueAhead(st.batches, st.seqs); bf != nil {
				if err := n.runPassAhead(ctx, b, bf, st.seqs); err != nil {
					return err
				}
				continue
			}
			select {
			case m = <-inbox:
			case err := <-failed:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := n.handle(ctx, p, st, m); err != nil {
			return err
		}
	}
}

// mainState is what the shadow keeps of one main node's sequences.
type mainState struct {
	seqs  map[uint64]*follow
	ended []uint64 // sequences the main node ended, most recent last
	// the member alignments of each pass (they travel on bulk streams and
	// may arrive out of order: they wait here until the pass is next in
	// its batch and complete), and each batch's state
	passes  map[seqIter][]*wire.Alignment
	batches map[uint64]*passFollow
	// ending are the sequences (and batches) whose SequenceEnd came
	// before the alignment of their last pass (the value): they end
	// once it has run
	ending map[uint64]int64
}

// behind reports whether sequence or batch seq, ended after pass
// last, has not run that pass yet (0: not said); one the shadow
// does not know yet is not waited for (its alignments, should they come,
// find it ended and run no row of it).
func (st *mainState) behind(seq uint64, last int64) bool {
	if last <= 0 {
		return false
	}
	if bf := st.batches[seq]; bf != nil {
		return bf.aligned < last
	}
	if f := st.seqs[seq]; f != nil {
		return f.aligned < last
	}
	for k := range st.passes {
		if k.seq == seq {
			return true // a batch whose first pass waits
		}
	}
	return false
}

// end lets sequence or batch seq go: a sequence's rows go to the prefix
// cache; alignments that still come for it are dropped (a batch's) or
// count without a row (a member's).
func (n *Node) end(ctx context.Context, st *mainState, seq uint64) {
	if f := st.seqs[seq]; f != nil && f.sess != nil {
		n.Prefixes.Put(f.fed[:min(len(f.fed), f.sess.Len())], f.sess.Cache())
		if n.Stages != nil {
			if err := n.Stages.End(ctx, f.sess.Seq()); err != nil {
				n.log.Warn().Err(err).Uint64("seq", seq).Msg("shadow: a stage did not hear of a sequence's end")
			}
		}
	}
	delete(st.seqs, seq)
	delete(st.batches, seq)
	delete(st.ending, seq)
	maps.DeleteFunc(st.passes, func(k seqIter, _ []*wire.Alignment) bool { return k.seq == seq })
	st.ended = append(st.ended[max(0, len(st.ended)-63):], seq)
}

// settle ends every sequence and batch in st.ending that has now run its
// last pass.
func (n *Node) settle(ctx context.Context, st *mainState) {
	for seq, last := range st.ending {
		if !st.behind(seq, last) {
			n.end(ctx, st, seq)
		}
	}
}

// handle takes one message from the main node.
func (n *Node) handle(ctx context.Context, p *wire.Peer, st *mainState, m wire.Message) error {
	switch m := m.(type) {
	case *wire.Trace:
		return wire.AnswerTrace(ctx, p, n.trace, m)
	case *wire.Placement:
		n.setPlacement(m)
	case *wire.SequenceEnd:
		if st.behind(m.Seq, m.Last) {
			st.ending[m.Seq] = m.Last // its last alignments are still on their way
			return nil
		}
		n.end(ctx, st, m.Seq)
	case *wire.Alignment:
		n.trace.Message(trace.Recv, trace.MsgAlignment, p.Identity().Name, m.Pass, 0, -1, 0, time.Now())
		if slices.Contains(st.ended, m.Batch) {
			n.log.Warn().Uint64("batch", m.Batch).Int64("pass", m.BatchPass).Msg("alignment for a batch that has ended: dropped")
			return nil
		}
		// a member whose end overtook this alignment (they travel on
		// different streams) still counts: its pass waits for it
		k := seqIter{m.Batch, m.BatchPass}
		st.passes[k] = append(st.passes[k], m)
		return n.runPasses(ctx, m.Batch, st)
	default:
		n.log.Warn().Str("type", m.Type().String()).Msg("ignoring a message the shadow does not handle")
	}
	return nil
}

// done traces the forward pass of step (seq, it), which ran from t0 to
// now, and reports it to the main node: late is what applying its
// alignment cost before it departed, ahead how many passes past the
// latest alignment it ran.
func (n *Node) done(ctx context.Context, seq uint64, it int64, t0 time.Time, late time.Duration, ahead int64) error {
	forward := time.Since(t0)
	n.trace.Span(trace.Shadow, it, n.m.Config.NumLayers, -1, n.mark, t0.Add(forward))
	return n.queue(ctx, outgoing{worker: -1, it: -1, msg: &wire.ShadowDone{Seq: seq, Pass: it,
		LateDeparture: late, Forward: forward, RSSPeak: procmem.PeakRSS(), Ahead: ahead, Agreed: n.agreed, Rewound: n.rewound, RewoundSeqs: take(&n.rewoundSeqs), AgreedSeqs: take(&n.agreedSeqs), Unhinted: n.unhinted, Reused: n.reused, CPU: n.cpu()}})
}

// cpu is the CPU time the shadow has used: its process's, and its
// stages' where it is a staged shadow's first stage.
func (n *Node) cpu() time.Duration {
	t := procmem.CPUTime()
	if n.Stages != nil {
		t += n.Stages.CPU()
	}
	return t
}

// take hands over the sequences in *seqs (nil for none) and empties it.
func take(seqs *[]uint64) []uint64 {
	if len(*seqs) == 0 {
		return nil
	}
	out := slices.Clone(*seqs)
	*seqs = (*seqs)[:0]
	return out
}

// apply aligns f with a, its pass's alignment: the pass, what
// is left of its prompt, whether it is its last, and its KV rows if a
// has any.
func (n *Node) apply(ctx context.Context, f *follow, a *wire.Alignment) error {
	f.aligned, f.promptLeft, f.final, f.draft = a.Pass, a.PromptLeft, a.Final, a.Draft
	if len(a.Keys) == 0 {
		return nil
	}
	kv, err := align.FromTensors(a.FromPos, 0, a.Keys, a.Values)
	if err == nil {
		err = kv.Apply(f.sess.Cache()) // of a staged shadow, its own layers'
	}
	if err == nil && n.Stages != nil {
		err = n.Stages.ApplyKV(ctx, f.sess.Seq(), kv)
	}
	if err != nil {
		return fmt.Errorf("shadow: sequence %d pass %d KV alignment: %w", f.seq, a.Pass, err)
	}
	return nil
}

// withdraw takes back the predictions for passes from and later of
// seq (a batch's passes): from the live workers, which
// drop their loads unless something else holds them, and the main node.
func (n *Node) withdraw(ctx context.Context, seq uint64, from int64) {
	w := &wire.Withdraw{Seq: seq, From: from}
	for i, l := range n.workers {
		if l.up.Load() {
			_ = n.queue(ctx, outgoing{worker: i, it: from, msg: w})
		}
	}
	_ = n.queue(ctx, outgoing{worker: -1, it: from, msg: w})
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

// int32s copies ids for a message, which the sender owns.
func int32s(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, e := range ids {
		out[i] = int32(e)
	}
	return out
}
