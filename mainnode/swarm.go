package mainnode

import (
	"context"
	"errors"
	"fmt"
	"github.com/odmoe/odmoe/passloop"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/stage"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// DefaultMiniBatch is the prefill mini-batch in tokens. At Mixtral's hidden
// size a 16-token mini-batch is 256 KiB of hidden state: ~2 ms on 1 Gbit/s,
// short next to a worker's compute of the same tokens, so the worker starts
// computing after one small transfer and the rest streams in behind it
// (OD-MoE section 3.3), while each message stays large enough that
// per-message costs (~0.1 ms on loopback QUIC) stay small.
const DefaultMiniBatch = 16

// Options configure a Swarm.
type Options struct {
	Layout    sched.Layout
	Prefetch  Prefetch
	MiniBatch int // prefill tokens per activation; 0: DefaultMiniBatch
	Hidden    int // the model's hidden size
	Log       zerolog.Logger

	// Shadow is the connection to the shadow node (-prefetch shadow, or
	// resident to run it beside a resident swarm); nil with RedialShadow
	// set starts without predictions until the shadow answers.
	Shadow *wire.Peer
	// RedialShadow, if set, connects to the shadow again after its
	// connection was lost; the Swarm calls it in the background until the
	// shadow answers, and runs reactive meanwhile.
	RedialShadow func(ctx context.Context) (*wire.Peer, error)
	// Align is when the shadow is re-aligned (-align-token, -align-kv).
	Align align.Policy
	// Layers (the model's layers that have experts, ascending:
	// model.Config.ExpertLayers), Experts and TopK size the recall scorer
	// and the random policy.
	Layers        []int
	Experts, TopK int
	// Seed drives -prefetch random.
	Seed uint64
	// Residency keeps experts resident on the workers (-residency on):
	// every expert runs on its owner (sched.Placement), which keeps it
	// until it needs the memory for another. Off: OD-MoE's cacheless
	// workers, each expert evicted once computed.
	Residency bool
	// Intermediate is an expert's width (the model's), which with Hidden
	// sizes the experts residency places.
	Intermediate int
	// UniformPlacement keeps residency's owners at (expert + layer) mod
	// workers for good (-placement uniform); otherwise the main node
	// places by the workers' capabilities at start and by activation
	// after (-placement activation).
	UniformPlacement bool
	// Trace, if set, records this node's part of the swarm's timeline
	// (StartTrace, CollectTrace).
	Trace *trace.Recorder
	// Forwarded says the shadow's predictions come from the main node,
	// handed on as it hears them (Forwarded): a main stage's Swarm, whose
	// -prefetch shadow places on them with no shadow connection of its
	// own.
	Forwarded bool
	// Stages, if set, run the layers after the main node's (its model's
	// LayerRunner): the Swarm tells them which passes feed prompt chunks
	// and which sequences end, as it tells its workers.
	Stages *stage.Client
	// Redial, if set, connects to worker w of the layout again after its
	// connection was lost (one attempt, which may retry inside); the
	// Swarm calls it in the background until the worker answers.
	Redial func(ctx context.Context, w int) (*wire.Peer, error)
	// StoreServed, if set, counts the bytes of the checkpoint and store
	// this node served to nodes fetching theirs (-store-listen), for
	// /metrics.
	StoreServed *atomic.Int64
	// WorkerAddrs, if set, are the workers' addresses in layout order:
	// each worker told its place is told them (wire.Place.Peers), so that
	// it fetches from the others what they hold.
	WorkerAddrs []string
	// Holders, if set, are the addresses of nodes that relay the store as
	// they fill their own (the shadow, given -store): each worker told its
	// place is told them (wire.Place.Holders) and asks them for its chunks
	// before this node, so that the store leaves this node's link about
	// once.
	Holders []string
	// Draft is -draft: how many of the shadow's guesses a pass checks
	// after each decoding member's token (with a shadow; off: none).
	Draft Drafting
}

// Swarm runs experts on remote workers: the model.ExpertRunner of the main
// node. It asks its Planner what to do with each layer and carries the
// plan out: hints, activations, results, figures. Safe for concurrent use
// by many sequences (Sessions), each making one RunExperts call at a time.
type Swarm struct {
	opt     Options
	planner *Planner
	workers []*link
	shadow  *shadowLink
	// forwarded are the predictions a main stage's main node hands on
	// (Options.Forwarded)
	forwarded *forwarded
	// drafter chooses and scores the guesses each pass checks
	// (Options.Draft), nil when off or without a shadow
	drafter *drafter
	placer  *placer // -residency on: activation statistics and migrations
	// rebalancing: one rebalance at a time reads, moves and sets the
	// placement, so concurrent sequences never both move from one version
	rebalancing sync.Mutex
	nextID      atomic.Uint64
	traced      [2]int64     // the passes StartTrace asked for
	rejoins     atomic.Int64 // lost workers with a new connection waiting to rejoin

	// the receive loops of the worker and shadow connections and the
	// redials of lost ones: Close ends life, closing them, and waits
	life      context.Context
	stop      context.CancelFunc
	receivers sync.WaitGroup

	mu      sync.Mutex
	seqs    map[uint64]*sequence
	batches map[uint64]bool // the sequence ids of Batchers' decode passes
	// figures are each member sequence's share of the decode misses
	// (SequenceFigures; the shadow link keeps its share of the recall)
	figures  map[uint64]*model.ExpertFigures
	lastPass int64 // the highest pass any sequence has run
	stats    Stats
	degraded map[int][]string // worker -> the loads it failed (Degraded)
	// asking: one WorkerStats at a time (the workers' answers carry no
	// tag); polled: each worker's latest answer to PollWorkers, nil
	// before one
	asking sync.Mutex
	polled []*wire.WorkerStats
}

// sequence is one sequence's state in the Swarm: the plan of its current
// layer and the buffers that carry it out, reused layer after layer.
type sequence struct {
	step     model.Step // the forward pass of the current RunExperts call
	batch    bool       // the sequence is a Batcher's: its passes are batched
	prompt   bool       // its current pass feeds prompt chunks (BeforeBatch): prefill
	rowSeqs  []uint64   // the member each row of the current pass is of (BeforeBatch)
	mark     time.Time  // end of the last RunExperts: main compute starts
	plan     Plan
	in       Input
	reqs     []request // the plan's requests, then any re-sent after a worker was lost
	planned  int       // how many of reqs the plan made
	expected int       // replies that may still be delivered to replies this layer, at most
	replies  chan reply
	pred     wire.Prediction
	act      wire.Activation
	toks     []int           // scratch: the rows of one result
	leads    []time.Duration // scratch: the layer's prediction leads
}

// NewSwarm runs experts on peers, which must be workers, in sched order:
// peers[i] is worker i of the layout.
func NewSwarm(peers []*wire.Peer, opt Options) (*Swarm, error) {
	if len(peers) != opt.Layout.Workers {
		return nil, fmt.Errorf("mainnode: %d worker connections for a layout of %d workers", len(peers), opt.Layout.Workers)
	}
	if opt.MiniBatch <= 0 {
		opt.MiniBatch = DefaultMiniBatch
	}
	policy, err := NewPolicy(opt.Prefetch, PolicyModel{Layers: opt.Layers, Experts: opt.Experts, TopK: opt.TopK, Seed: opt.Seed})
	if err != nil {
		return nil, err
	}
	planner, err := NewPlanner(opt.Layout, policy, opt.MiniBatch)
	if err != nil {
		return nil, err
	}
	if opt.Residency {
		if opt.Prefetch == Resident {
			return nil, fmt.Errorf("mainnode: -residency on with -prefetch resident: the resident swarm keeps every expert already")
		}
		if opt.Hidden <= 0 || opt.Intermediate <= 0 {
			return nil, fmt.Errorf("mainnode: -residency on needs the experts' shape, got hidden %d, intermediate %d", opt.Hidden, opt.Intermediate)
		}
		owners, err := sched.NewPlacement(opt.Layout.Workers, opt.Layers, opt.Experts)
		if err != nil {
			return nil, fmt.Errorf("mainnode: -residency on: %w", err)
		}
		if err := planner.SetPlacement(owners); err != nil {
			return nil, err
		}
	}
	for i, p := range peers {
		h := p.Hello()
		opt.Log.Info().Int("worker", i).Str("name", h.Name).Str("device", h.Device).Int64("device_mem", h.DeviceMemBytes).Msg("mainnode: worker")
	}
	var pc *placer
	if opt.Residency && !opt.UniformPlacement {
		hellos := make([]wire.Hello, len(peers))
		for i, p := range peers {
			hellos[i] = p.Hello()
		}
		expertBytes := int64(3 * opt.Hidden * opt.Intermediate * 2) // gate, up, down in BF16
		if pc, err = newPlacer(opt.Layers, opt.Experts, expertBytes, hellos, opt.Log); err != nil {
			return nil, fmt.Errorf("mainnode: -residency on: %w", err)
		}
		start, err := pc.initial(planner.Placement(), opt.TopK)
		if err != nil {
			return nil, fmt.Errorf("mainnode: -residency on: %w", err)
		}
		if err := planner.SetPlacement(start); err != nil {
			return nil, err
		}
		if start.Version() > 0 {
			var per []int
			for w := range opt.Layout.Workers {
				n := 0
				for _, l := range opt.Layers {
					n += len(start.Owned(w, l))
				}
				per = append(per, n)
			}
			opt.Log.Info().Ints("experts_per_worker", per).Msg("mainnode: experts placed by the workers' capabilities")
		}
	}
	s := &Swarm{opt: opt, planner: planner, placer: pc, seqs: map[uint64]*sequence{}, batches: map[uint64]bool{}}
	for i, p := range peers {
		if p.Identity().Role != wire.RoleWorker {
			return nil, fmt.Errorf("mainnode: peer %d (%s) is a %s, not a worker", i, p.Identity().Name, p.Identity().Role)
		}
	}
	_, predicted := policy.(shadowPolicy)
	// a resident swarm may run the shadow too, aligned and hinting as in
	// shadow mode, its hints landing on experts pinned already: the
	// baseline that pays the shadow's CPU as shadow mode does
	shadowed := predicted || opt.Prefetch == Resident && (opt.Shadow != nil || opt.RedialShadow != nil)
	switch {
	case opt.Forwarded && (opt.Shadow != nil || opt.RedialShadow != nil):
		return nil, fmt.Errorf("mainnode: predictions both forwarded and from a shadow node of its own")
	case opt.Forwarded:
		s.forwarded = newForwarded()
	case predicted && opt.Shadow == nil && opt.RedialShadow == nil:
		return nil, fmt.Errorf("mainnode: -prefetch shadow needs a shadow node")
	case !shadowed && opt.Shadow != nil:
		return nil, fmt.Errorf("mainnode: a shadow node is only used with -prefetch shadow or resident, not %s", policy.Name())
	case shadowed:
		if opt.Shadow != nil && opt.Shadow.Identity().Role != wire.RoleShadow {
			return nil, fmt.Errorf("mainnode: %s is a %s, not a shadow", opt.Shadow.Identity().Name, opt.Shadow.Identity().Role)
		}
		if err := opt.Align.Validate(); err != nil {
			return nil, err
		}
		s.shadow = newShadowLink(opt.Shadow, opt.Align, opt.TopK, opt.Layers, opt.Trace)
		if opt.Draft.K > 0 {
			s.drafter = newDrafter(opt.Draft)
		}
		if opt.Stages != nil {
			s.shadow.stages = opt.Stages
			if opt.Align.KVPeriod > 0 { // the KV rows of their layers, for the shadow's alignments
				opt.Stages.KeepKV()
			}
		}
	}
	if opt.TopK > 64 {
		return nil, fmt.Errorf("mainnode: top-%d routing: at most 64 experts per token", opt.TopK)
	}
	s.life, s.stop = context.WithCancel(context.Background())
	for i, p := range peers {
		l := newLink(p, i)
		s.workers = append(s.workers, l)
		s.watch(l, p)
		s.tellPlace(l.index, p)
	}
	switch {
	case opt.Shadow != nil:
		s.sendPlacement(opt.Shadow)
		s.watchShadow(opt.Shadow)
	case s.shadow != nil:
		s.opt.Log.Warn().Msg("mainnode: the shadow is not reachable: " + s.withoutShadow() + " until it answers")
		s.startRedialShadow()
	}
	return s, nil
}

// placed reports whether the swarm tells workers their place
// (tellPlace): cacheless workers only; with residency the experts move.
func (s *Swarm) placed() bool { return !s.opt.Residency && s.opt.Prefetch != Resident }

// tellPlace tells worker w, on p, its place in the layout (where placed):
// a worker filling its store as it runs fills the rest of its share from
// it, and answers once its share is in (wire.ShareIn). A failed send is
// logged and returned: the connection is ending.
func (s *Swarm) tellPlace(w int, p *wire.Peer) error {
	if !s.placed() {
		return nil
	}
	l := s.opt.Layout
	place := &wire.Place{Worker: w, Workers: l.Workers, Group: l.Group}
	if len(s.opt.WorkerAddrs) == l.Workers {
		place.Peers = s.opt.WorkerAddrs
	}
	place.Holders = s.opt.Holders
	err := p.Send(s.life, place)
	if err != nil {
		s.opt.Log.Debug().Int("worker", w).Err(err).Msg("mainnode: a worker was not told its place")
	}
	return err
}

// sendPlacement tells the shadow on p who owns each expert, when experts
// stay resident (-residency on, or the resident swarm's owners), so that
// it hints them to their owners. A failed send only costs misses (the
// shadow hints its default workers): logged.
func (s *Swarm) sendPlacement(p *wire.Peer) {
	owners := s.planner.Placement()
	if owners == nil && s.opt.Prefetch == Resident {
		var err error
		if owners, err = sched.NewPlacement(s.opt.Layout.Workers, s.opt.Layers, s.opt.Experts); err != nil {
			s.opt.Log.Warn().Err(err).Msg("mainnode: the resident swarm's owners cannot be told to the shadow: its hints go to workers that load them")
			return
		}
	}
	if owners == nil {
		return
	}
	v, layers, own := owners.Encode()
	m := &wire.Placement{Version: v, Workers: owners.Workers(), Experts: owners.Experts(), Layers: layers, Owners: own}
	if err := p.Send(s.life, m); err != nil {
		s.opt.Log.Warn().Str("shadow", p.Identity().Name).Err(err).Msg("mainnode: the placement did not reach the shadow: its hints go astray until it does")
	}
}

// rebalance asks the placer whether experts should move to other owners
// and, if so, runs on the new placement from now on, logs every move and
// tells the shadow.
func (s *Swarm) rebalance() {
	s.rebalancing.Lock()
	next, moves := s.placer.pass(s.planner.Placement())
	if next == nil {
		s.rebalancing.Unlock()
		return
	}
	err := s.planner.SetPlacement(next)
	s.rebalancing.Unlock()
	if err != nil {
		s.opt.Log.Error().Err(err).Msg("mainnode: placement not taken")
		return
	}
	for _, m := range moves {
		s.opt.Log.Info().Int("layer", m.Layer).Int("expert", m.Expert).Str("from", s.workers[m.From].name).Str("to", s.workers[m.To].name).
			Float64("gain_ms_per_pass", m.Gain*1e3).Uint64("placement", next.Version()).Msg("mainnode: expert migrated")
	}
	if s.shadow != nil {
		if p := s.shadow.conn(); p != nil {
			s.receivers.Go(func() { s.sendPlacement(p) }) // off the decode path; versions order them
		}
	}
}

// Stats returns a copy of the figures measured so far, over all sequences.
func (s *Swarm) Stats() *Stats {
	s.mu.Lock()
	st := s.stats.clone()
	s.mu.Unlock()
	if s.opt.Stages != nil {
		for _, f := range s.opt.Stages.Figures() {
			st.addStage(f)
		}
	}
	if s.placer != nil {
		r := s.placer.snapshot()
		st.Residency = &r
	}
	return st
}

// RecentPasses returns the last decode passes' layer timelines, oldest
// first (Stats keeps 16): what the console draws.
func (s *Swarm) RecentPasses() []PassTimeline {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.recentPasses()
}

// sequence returns the state of sequence seq, made on its first layer.
func (s *Swarm) sequence(step model.Step) *sequence {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.seqs[step.Seq]
	if q == nil {
		q = &sequence{batch: s.batches[step.Seq]}
		s.seqs[step.Seq] = q
	}
	s.lastPass = max(s.lastPass, step.Pass)
	return q
}

// request is one planned Activation on its way: its ID and the results
// still to come.
type request struct {
	Request
	id      uint64
	pending int    // results not yet received; 0 also once re-sent elsewhere
	got     uint64 // bit j: Experts[j] has answered
	failed  []int  // workers that could not load its experts from their store before it
}

// RunExperts implements model.ExpertRunner over the workers.
func (s *Swarm) RunExperts(ctx context.Context, step model.Step, layer int, x []float32, n int, routes []model.Route, out []float32) error {
	start := time.Now()
	h := s.opt.Hidden
	q := s.sequence(step)
	if q.step != step {
		s.rejoin() // a pass boundary of this sequence (a stage's passes begin past layer 0)
	}
	q.step = step
	// several rows: a prompt's, or a pass's (a batch's rows); both go out
	// as rows per expert. A pass says what it carries: one that feeds
	// prompt chunks is prefill (one prompt token alone too: the last
	// chunk of 129 at 128), one of decode steps only is decode. Outside a
	// batch, several rows are a prompt.
	rows := n > 1
	prefill := q.prompt
	if !q.batch {
		prefill = rows
	}
	if !q.mark.IsZero() {
		s.mu.Lock()
		s.stats.main(prefill, step.Pass, layer, start.Sub(q.mark))
		s.mu.Unlock()
		s.opt.Trace.Span(trace.Main, step.Pass, layer, -1, q.mark, start)
	}
	defer func() { q.mark = time.Now() }()
	if n <= 0 || len(routes)%n != 0 || len(x) != n*h || len(out) != len(routes)*h {
		return fmt.Errorf("mainnode: %d routes for %d tokens, %d inputs, %d outputs at hidden size %d", len(routes), n, len(x), len(out), h)
	}
	if s.planner.Live() == 0 {
		return fmt.Errorf("mainnode: layer %d: every worker is lost (%d in the layout)", layer, len(s.workers))
	}
	if s.placer != nil && !prefill && layer == s.placer.first {
		s.rebalance() // a decode pass's boundary
	}
	q.in = Input{Step: step, Layer: layer, Tokens: n, Routes: routes, Batched: q.batch && !prefill}
	predicted := s.shadow != nil && !prefill && s.shadow.isUp()
	switch {
	case predicted:
		q.in.Predicted, q.in.PredictedOn = s.shadow.prediction(step, layer)
	case s.forwarded != nil && !prefill:
		predicted = true // as far as the main node hears the shadow
		q.in.Predicted, q.in.PredictedOn = s.forwarded.take(step, layer)
	}
	s.planner.Plan(&q.plan, &q.in)
	if s.placer != nil && !prefill {
		s.placer.observe(layer, routes)
	}
	if predicted && s.shadow != nil { // a main stage's main node scores them
		s.shadow.routed(step, layer, q.in.Predicted, q.plan.Experts, q.members(n), routes)
	}
	if err := s.hint(ctx, q); err != nil {
		return err
	}
	if err := s.send(ctx, q, x, rows); err != nil {
		return err
	}
	return s.collect(ctx, q, x, routes, len(routes)/n, out, rows, prefill, predicted, start)
}

// hint sends the plan's hints.
func (s *Swarm) hint(ctx context.Context, q *sequence) error {
	for _, hn := range q.plan.Hints {
		s.traceWorker(q, trace.Send, trace.MsgPrediction, hn.Worker, hn.Layer, -1, 0, time.Now())
		q.pred = wire.Prediction{Seq: hn.Step.Seq, Pass: hn.Step.Pass, Layer: hn.Layer, Experts: hn.Experts, Token: -1}
		if err := s.sendTo(ctx, hn.Worker, &q.pred); err != nil {
			return err
		}
	}
	return nil
}

// send registers and sends the plan's requests. For one row they go out
// one after another; for several (prefill, a pass) each worker's requests
// go out on their own goroutine, in order, so transfers to different
// workers overlap.
func (s *Swarm) send(ctx context.Context, q *sequence, x []float32, rows bool) error {
	results := 0
	q.reqs = q.reqs[:0]
	// the layer's requests take consecutive ids, so that a reply finds its
	// request by subtraction
	first := s.nextID.Add(uint64(len(q.plan.Requests))) - uint64(len(q.plan.Requests)) + 1
	for i, r := range q.plan.Requests {
		q.reqs = append(q.reqs, request{Request: r, id: first + uint64(i), pending: len(r.Experts)})
		results += len(r.Experts)
	}
	q.planned = len(q.reqs)
	// every result, and one lost-connection reply per request; room for
	// as much again lets a lost worker's requests be re-sent
	q.expected = results + len(q.reqs)
	if need := 2 * q.expected; cap(q.replies) < need {
		q.replies = make(chan reply, max(need, 2*cap(q.replies)))
	}
	for i := range q.reqs {
		s.workers[q.reqs[i].Worker].expect(q.reqs[i].id, q.reqs[i].pending, q.replies)
	}
	if !rows {
		for i := range q.reqs {
			if err := s.sendRequest(ctx, q, &q.act, &q.reqs[i], x, nil); err != nil {
				return err
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	errs := make([]error, len(s.workers))
	for w := range s.workers {
		wg.Go(func() {
			var act wire.Activation
			var buf []float32
			for i := range q.reqs {
				if q.reqs[i].Worker != w {
					continue
				}
				if err := s.sendRequest(ctx, q, &act, &q.reqs[i], x, &buf); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sendRequest sends r as act (reused). For one row the hidden state is x
// itself; for several the request's rows are gathered into *buf.
func (s *Swarm) sendRequest(ctx context.Context, q *sequence, act *wire.Activation, r *request, x []float32, buf *[]float32) error {
	h := s.opt.Hidden
	hidden := x[:h]
	if buf != nil {
		*buf = slices.Grow((*buf)[:0], len(r.Tokens)*h)[:len(r.Tokens)*h]
		for j, t := range r.Tokens {
			copy((*buf)[j*h:(j+1)*h], x[t*h:(t+1)*h])
		}
		hidden = *buf
	}
	act.Seq, act.Pass, act.Layer, act.Tokens, act.Experts = q.step.Seq, q.step.Pass, q.in.Layer, len(r.Tokens), r.Experts
	act.ID, act.Keep, act.Cache, act.EndLayer = r.id, r.Keep, r.Cache, r.EndLayer
	act.Rows, act.RowCounts = r.Rows, r.RowCounts
	act.Hidden.SetFloat32s(hidden, len(r.Tokens), h)
	s.traceWorker(q, trace.Send, trace.MsgActivation, r.Worker, q.in.Layer, -1, r.id, time.Now())
	return s.sendTo(ctx, r.Worker, act)
}

// collect waits for every result, places each output row where its route
// is, and records the layer's figures (as prefill's or decode's).
func (s *Swarm) collect(ctx context.Context, q *sequence, x []float32, routes []model.Route, k int, out []float32, rows, prefill, predicted bool, start time.Time) error {
	h, layer := s.opt.Hidden, q.in.Layer
	var crit time.Duration // the slowest request's worker-side time
	var ls layerSample
	first := q.reqs[0].id
	for left := len(q.reqs); left > 0; {
		var rp reply
		select {
		case rp = <-q.replies:
		case <-ctx.Done():
			return ctx.Err()
		}
		i, ok := q.find(rp.id, first)
		if !ok || q.reqs[i].pending == 0 {
			continue // a stale answer to a layer that failed, or to a request re-sent elsewhere
		}
		r := &q.reqs[i]
		if rp.err != nil {
			var lost *lostError
			if we := (*wire.Error)(nil); errors.As(rp.err, &we) && we.Code == wire.ReqLoadFailed {
				if err := s.loadFailed(ctx, q, i, x, rows, we); err != nil {
					return err
				}
				continue
			}
			if !errors.As(rp.err, &lost) {
				return fmt.Errorf("mainnode: layer %d on worker %d (%s): %w", layer, r.Worker, s.workers[r.Worker].name, rp.err)
			}
			if err := s.failover(ctx, q, r.Worker, x, rows, rp.err); err != nil {
				return err
			}
			continue
		}
		res := rp.res
		got, err := res.Output.Float32s()
		q.toks = q.toks[:0]
		if j := slices.Index(r.Experts, int32(res.Expert)); j >= 0 {
			q.toks = r.ExpertTokens(q.toks, j)
		}
		if err != nil || len(q.toks) == 0 || len(got) != len(q.toks)*h || !r.gotExpert(res.Expert) {
			return fmt.Errorf("mainnode: layer %d: worker %d sent a result for expert %d of %d floats, want one of %v with %d", layer, r.Worker, res.Expert, len(got), r.Experts, len(q.toks)*h)
		}
		for j, t := range q.toks {
			for slot, rt := range routes[t*k : (t+1)*k] {
				if rt.Expert == res.Expert {
					copy(out[(t*k+slot)*h:(t*k+slot+1)*h], got[j*h:(j+1)*h])
				}
			}
		}
		ls.add(res)
		if res.Loaded && !res.Miss && res.Lead > 0 && !prefill {
			q.leads = append(q.leads, res.Lead)
		}
		if s.placer != nil {
			s.placer.measured(r.Worker, res, len(q.toks))
		}
		if res.Miss {
			// scored when the layer had a prediction: wrong if it did not
			// name the expert, else late
			wrong := predicted && q.in.Predicted != nil && !slices.Contains(q.in.Predicted, res.Expert)
			switch {
			case wrong:
				ls.missesWrong++
				s.workers[r.Worker].counts.wrong.Add(1)
			case predicted:
				ls.missesLate++
				s.workers[r.Worker].counts.late.Add(1)
			}
			if !prefill {
				s.missed(q, predicted, wrong)
			}
		}
		s.traceWorker(q, trace.Recv, trace.MsgResult, r.Worker, layer, res.Expert, r.id, rp.at)
		crit = max(crit, res.StallTime+res.ComputeTime)
		if r.pending--; r.pending == 0 {
			left--
		}
	}
	wall := time.Since(start)
	ls.wall, ls.network = wall, max(wall-crit, 0)
	s.mu.Lock()
	s.stats.experts(prefill, q.step.Pass, layer, ls)
	s.stats.addLeads(q.leads)
	q.leads = q.leads[:0]
	s.mu.Unlock()
	return nil
}

// traceWorker records a message to or from worker w, when this pass
// is traced.
func (s *Swarm) traceWorker(q *sequence, kind trace.Kind, msg string, w, layer, expert int, id uint64, at time.Time) {
	if s.opt.Trace.Active(q.step.Pass) {
		s.opt.Trace.Message(kind, msg, s.workers[w].name, q.step.Pass, layer, expert, id, at)
	}
}

func (s *Swarm) workerErr(w int, err error) error {
	return fmt.Errorf("mainnode: worker %d (%s): %w", w, s.workers[w].name, err)
}

// Close stops the receive loops and redials, then closes the worker and
// shadow connections, current and waiting to rejoin.
func (s *Swarm) Close() error {
	s.stop() // ends every receive loop (they receive with s.life) and redial
	s.receivers.Wait()
	var errs []error
	for _, l := range s.workers {
		errs = append(errs, l.conn().Close())
		if l.next != nil {
			errs = append(errs, l.next.Close())
		}
	}
	if s.shadow != nil {
		if p := s.shadow.peer.Load(); p != nil {
			errs = append(errs, p.Close())
		}
		if s.shadow.next != nil {
			errs = append(errs, s.shadow.next.Close())
		}
	}
	return errors.Join(errs...)
}

// BeforeBatch is the pass loop's hook (passloop.Hooks.BeforePass): it notes
// whether the pass (step is the batch's) feeds prompt chunks, which run
// as prefill does, and departs and aligns the shadow for it, rows[i]
// being member i's part.
func (s *Swarm) BeforeBatch(ctx context.Context, step model.Step, rows []passloop.Row) error {
	prompt := slices.ContainsFunc(rows, func(r passloop.Row) bool { return r.Prompt })
	if prompt && s.opt.Stages != nil {
		s.opt.Stages.Prefill(step)
	}
	q := s.sequence(step)
	// the main node's compute before the pass's first experts counts from
	// here: not from the last pass's experts, which would count the head,
	// and the idle time between requests, as layer compute
	defer func() { q.mark = time.Now() }()
	q.prompt, q.rowSeqs = prompt, q.rowSeqs[:0]
	if s.drafter != nil {
		s.drafter.passStarted(step.Seq, rows, prompt, time.Now())
	}
	s.mu.Lock()
	for _, r := range rows {
		for range r.Tokens {
			q.rowSeqs = append(q.rowSeqs, r.Step.Seq)
		}
		if !r.Prompt {
			s.figuresLocked(r.Step.Seq).Steps++
		}
	}
	s.mu.Unlock()
	if s.shadow == nil {
		return nil
	}
	s.attachShadow()
	departed, err := s.shadow.startBatch(ctx, step, rows)
	if !departed && err == nil && !prompt {
		s.mu.Lock()
		s.stats.Faults.ReactivePasses++
		s.mu.Unlock()
	}
	return err
}

// members is the member sequence of each of the current pass's n rows,
// nil when the pass did not say (a Session run on the Swarm directly).
func (q *sequence) members(n int) []uint64 {
	if len(q.rowSeqs) != n {
		return nil
	}
	return q.rowSeqs
}

// missed counts a miss in the current decode pass of q against every
// member whose row was routed to its expert (q.toks: the result's rows),
// late or wrong when the pass had a prediction (collect's verdict).
func (s *Swarm) missed(q *sequence, predicted, wrong bool) {
	rows := q.members(q.in.Tokens)
	if rows == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range q.toks {
		f := s.figuresLocked(rows[t])
		f.Misses++
		switch {
		case wrong:
			f.MissesWrong++
		case predicted:
			f.MissesLate++
		}
	}
}

// figuresLocked is member sequence seq's figures, made on first use.
func (s *Swarm) figuresLocked(seq uint64) *model.ExpertFigures {
	if s.figures == nil {
		s.figures = map[uint64]*model.ExpertFigures{}
	}
	f := s.figures[seq]
	if f == nil {
		f = &model.ExpertFigures{}
		s.figures[seq] = f
	}
	return f
}

// SequenceFigures is member sequence seq's share of the decode figures
// so far: its misses, and its rows' recall as the shadow link scored it
// (passloop.Hooks.Figures).
func (s *Swarm) SequenceFigures(seq uint64) model.ExpertFigures {
	var f model.ExpertFigures
	s.mu.Lock()
	if p := s.figures[seq]; p != nil {
		f = *p
	}
	s.mu.Unlock()
	if s.shadow != nil {
		var chosen align.Policy
		f.Routed, f.Predicted, chosen = s.shadow.memberFigures(seq)
		f.AlignToken, f.AlignKV = chosen.TokenPeriod, chosen.KVPeriod
	}
	return f
}

// EndSequence tells every worker and the shadow that sequence seq is over,
// so that they free what they keep for it (hints for passes that never
// came, the shadow's copy of the sequence). Call it after ShadowStats and
// CollectTrace, which read what the sequence left.
func (s *Swarm) EndSequence(ctx context.Context, seq uint64) error {
	s.mu.Lock()
	delete(s.seqs, seq)
	delete(s.figures, seq)
	s.mu.Unlock()
	if s.forwarded != nil {
		s.forwarded.end(seq)
	}
	if s.drafter != nil {
		s.drafter.end(seq)
	}
	var errs []error // every node is told, whichever cannot be
	if s.opt.Stages != nil {
		if err := s.opt.Stages.End(ctx, seq); err != nil {
			errs = append(errs, fmt.Errorf("mainnode: ending sequence %d on the stages: %w", seq, err))
		}
	}
	end := &wire.SequenceEnd{Seq: seq}
	for i := range s.workers {
		if err := s.sendTo(ctx, i, end); err != nil {
			errs = append(errs, err)
		}
	}
	if s.shadow != nil {
		end = &wire.SequenceEnd{Seq: seq, Last: s.shadow.end(seq)}
		if p := s.shadow.conn(); p != nil {
			if err := p.Send(ctx, end); err != nil && ctx.Err() == nil && !connGone(p, err) {
				errs = append(errs, fmt.Errorf("mainnode: ending sequence %d on the shadow: %w", seq, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ShadowStats waits (up to timeout) for the shadow to finish the last
// pass run and returns its recall and late departures; ok is false
// without a shadow.
func (s *Swarm) ShadowStats(timeout time.Duration) (st ShadowStats, ok bool) {
	if s.shadow == nil {
		return st, false
	}
	s.mu.Lock()
	last := s.lastPass
	s.mu.Unlock()
	return s.shadow.stats(last, timeout), true
}
