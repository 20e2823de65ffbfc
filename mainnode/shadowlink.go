package mainnode

import (
	"context"
	"github.com/odmoe/odmoe/passloop"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/stage"
	"github.com/odmoe/odmoe/wire"
)

// shadowLink is the main node's side of the shadow: it starts and aligns
// the shadow's passes and collects its predictions, which it scores
// against the real routing (align.Recall) and hands to placement.
type shadowLink struct {
	peer atomic.Pointer[wire.Peer] // the current connection; nil before the first
	name string                    // the shadow's name, once known
	// policy is when to align: each member sequence has its own
	// controller of it (shadowSeq.ctl); steps sums the decode steps ended
	// sequences ran under each choice
	policy align.Policy
	steps  map[align.Policy]int

	mu        sync.Mutex
	up        bool       // the current connection is live
	next      *wire.Peer // a connection waiting to attach at a sequence's next forward pass
	redialing bool
	seqs      map[uint64]*shadowSeq
	pred      map[layerKey]predicted // predictions not taken yet
	// partialTaken are layers placed on a partial prediction: scored when
	// the whole union comes
	partialTaken map[layerKey]bool
	actual       map[layerKey]routing // routing awaiting its prediction, for scoring
	recall       *align.Recall        // over decode passes
	late         []float64            // late-departure ms per decode pass (index: pass-2)
	cpu          []time.Duration      // the shadow process's CPU time when it finished each pass (index: pass-1; 0: not heard)
	done         int64                // the last pass the shadow finished
	forwardMs    float64              // the shadow's decode forward passes, summed
	forwards     int
	peakRSS      int64
	received     chan struct{}
	trace        *trace.Recorder
	traces       chan *wire.Trace
	// every decode layer scored, alone or batched: eq. (3) for the metrics
	counts recallCounts
	// running ahead: decode passes the shadow ran ahead of its alignment;
	// its latest counts of alignments that agreed with the token it ran
	// ahead on and that rewound it; the withdrawals it sent and the
	// predictions they took back; predictions dropped as made on a token
	// this node did not feed
	ahead, agreed, rewound, withdrawals, withdrawn, offPath int64
	unhinted                                                int64 // the shadow's ShadowDone.Unhinted
	// reused sums the shadow's ShadowDone.Reused over its connections
	// (reusedSeen: the current connection's latest)
	reused, reusedSeen int64
	// guesses are the shadow's guesses of members' tokens, met and
	// rewound, by the kind of request (guessKind), over its connections;
	// ended keeps the kind of sequences just ended, whose last guesses
	// may be told after their end
	guesses map[string]GuessCounts
	ended   map[uint64]string
	// stages, when the main node has them, run the layers after its own:
	// the shadow's predictions of their layers go on to them, and their
	// KV rows come from them (stage.Client.KVRows)
	stages *stage.Client
}

// GuessCounts are the shadow's guesses of members' next tokens on the
// passes it ran ahead: met (the main node fed that token) or rewound.
type GuessCounts struct {
	Met     int64 `json:"met"`
	Rewound int64 `json:"rewound"`
}

// The kinds of request the shadow's guesses are counted by: chosen
// greedily from the logits alone, sampled (a temperature, penalties or
// biases: the request's own draw), and constrained by a grammar.
const (
	KindGreedy      = "greedy"
	KindSampled     = "sampled"
	KindConstrained = "constrained"
)

// guessKind is the kind of request s says (nil: greedy).
func guessKind(s *wire.Sampling) string {
	switch {
	case s == nil:
		return KindGreedy
	case s.Constrained:
		return KindConstrained
	}
	return KindSampled
}

// countGuess counts a guess of sequence seq's token, met or rewound,
// under its kind of request. Call with mu held.
func (sl *shadowLink) countGuess(seq uint64, met bool) {
	if sl.guesses == nil {
		sl.guesses = map[string]GuessCounts{}
	}
	k := sl.kindOf(seq)
	c := sl.guesses[k]
	if met {
		c.Met++
	} else {
		c.Rewound++
	}
	sl.guesses[k] = c
}

// kindOf is sequence seq's kind of request, live or just ended (greedy
// when unknown). Call with mu held.
func (sl *shadowLink) kindOf(seq uint64) string {
	if q := sl.seqs[seq]; q != nil {
		return guessKind(q.sampling)
	}
	if k, ok := sl.ended[seq]; ok {
		return k
	}
	return KindGreedy
}

// predicted is one layer's prediction: its experts (sorted) and the token
// the shadow fed that pass (-1: not said).
type predicted struct {
	experts []int
	on      []int // the worker each expert was hinted to; nil: sched's index rule
	token   int32
	// partial: more of the pass's rows are to come (Prediction.Partial):
	// placed on, but the layer is scored on the whole union
	partial bool
}

// shadowSeq is what the link keeps of one sequence: enough to bring a
// shadow that attaches mid-sequence up to date.
type shadowSeq struct {
	lastKV int     // cache positions already sent
	kvStep int64   // the decode step of the latest KV alignment
	hist   []int32 // every token fed so far
	synced bool    // the current connection has been sent the sequence
	// decodes are the generated tokens fed so far (decode steps)
	decodes int64
	// sent is the last pass (a batch's: pass) the shadow was sent
	// all of (SequenceEnd.Last)
	sent int64
	// a member's own alignment controller (its decode steps' periods,
	// driven by its rows' recall) and its rows' experts routed and
	// predicted so far
	ctl               *align.Controller
	routed, predicted int64
	// a batch's scratch: its pass's members and their last tokens
	rowSeqs   []uint64
	rowTokens []int
	// the latest decode pass departed, the token it fed, and whether
	// the shadow was sent that token: then a prediction made on another
	// token is on a path not taken (the shadow rewinds and withdraws it)
	iter      int64
	token     int32
	tokenSent bool
	// sampling is how the sequence chooses its tokens, for the shadow's
	// guesses (nil: greedily)
	sampling *wire.Sampling
	// draft is how many tokens the shadow is to guess after the
	// member's row in the passes it runs ahead (Alignment.Draft), as the
	// drafting policy last chose; drafted says its last pass fed guesses
	draft, sentDraft int
	drafted          bool
	// drafts are the shadow's latest guesses for the member (wire.Drafts),
	// one a pass it ran ahead: its rows from a position on
	drafts []memberDrafts
}

// memberDrafts are a member's rows from position pos on, as the shadow
// guessed them in a pass it ran ahead: the token there, then its guesses.
type memberDrafts struct {
	pos    int
	tokens []int
}

// maxDrafts is how many passes' drafts a member keeps: the shadow runs
// -ahead passes ahead, each with its own (1 by default).
const maxDrafts = 4

// maxEndedKinds ended sequences' kinds are kept (shadowLink.ended): far
// more than a pass's guesses can be told late for.
const maxEndedKinds = 4096

// wireSampling is p on the wire, nil for none; promptLen is the request's
// prompt length.
func wireSampling(p *model.Sampling, promptLen int) *wire.Sampling {
	if p == nil {
		return nil
	}
	w := &wire.Sampling{Temperature: p.Temperature, TopP: p.TopP, TopK: p.TopK, Seed: p.Seed, Presence: p.Presence, Frequency: p.Frequency,
		PromptLen: promptLen, Constrained: p.Constrained, Grammar: p.Grammar, MinP: p.MinP, Repeat: p.Repeat, RepeatN: p.RepeatN}
	for _, id := range p.RepeatTail {
		w.RepeatTail = append(w.RepeatTail, int32(id))
	}
	for _, id := range slices.Sorted(maps.Keys(p.Bias)) { // the same bytes every time
		w.BiasIDs, w.Biases = append(w.BiasIDs, int32(id)), append(w.Biases, p.Bias[id])
	}
	return w
}

// maxAttachKVBytes bounds the KV rows an attaching shadow is sent with
// the token history; above it the shadow keeps the KV of its own prefill
// of the history until the next KV alignment.
const maxAttachKVBytes = 16 << 20

// layerKey is one layer of one forward pass.
type layerKey struct {
	step  model.Step
	layer int
}

// newShadowLink returns the link over p, or a link that waits for its
// first connection if p is nil.
func newShadowLink(p *wire.Peer, policy align.Policy, k int, layers []int, rec *trace.Recorder) *shadowLink {
	sl := &shadowLink{policy: policy, steps: map[align.Policy]int{}, seqs: map[uint64]*shadowSeq{}, pred: map[layerKey]predicted{}, actual: map[layerKey]routing{},
		recall: align.NewRecall(k, layers), received: make(chan struct{}, 1), trace: rec, traces: make(chan *wire.Trace, 1)}
	if p != nil {
		sl.peer.Store(p)
		sl.name, sl.up = p.Identity().Name, true
	}
	return sl
}

// isUp reports whether the shadow is connected and following.
func (sl *shadowLink) isUp() bool {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return sl.up
}

// conn is the current connection while it is up, else nil.
func (sl *shadowLink) conn() *wire.Peer {
	if !sl.isUp() {
		return nil
	}
	return sl.peer.Load()
}

// down marks the connection lost: nothing more comes from it, so the
// predictions and routing waiting for each other are dropped.
func (sl *shadowLink) down() {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	sl.up = false
	clear(sl.pred)
	clear(sl.actual)
	clear(sl.partialTaken)
}

// attach makes p the connection: every live sequence is sent whole at
// its next forward pass.
func (sl *shadowLink) attach(p *wire.Peer) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	sl.peer.Store(p)
	sl.name, sl.up = p.Identity().Name, true
	sl.reusedSeen = 0
	sl.cpu = nil // another process's CPU time, maybe: a decode's spans only one
	for _, q := range sl.seqs {
		q.synced = false
	}
}

// receive takes the shadow's predictions and reports from p until the
// connection or ctx ends, and returns why.
func (sl *shadowLink) receive(ctx context.Context, p *wire.Peer) error {
	for {
		m, err := p.Recv(ctx)
		if err != nil {
			p.Close()
			return err
		}
		at := time.Now()
		switch m := m.(type) {
		case *wire.Trace:
			select {
			case sl.traces <- m:
			default:
			}
		case *wire.Prediction:
			sl.trace.Message(trace.Recv, trace.MsgPrediction, p.Identity().Name, m.Pass, m.Layer, -1, 0, at)
			if sl.stages != nil && sl.stages.Layers().Contains(m.Layer) {
				sl.stages.Tell(ctx, m.Layer, m) // their placement's; a stage lost fails the pass, not this
			}
			es, on := predictedOn(m.Experts, m.Workers)
			key := layerKey{model.Step{Seq: m.Seq, Pass: m.Pass}, m.Layer}
			sl.mu.Lock()
			_, live := sl.seqs[m.Seq]
			scored := false
			if act, ok := sl.actual[key]; ok {
				// a late prediction: the layer has run; a partial one
				// waits for the whole union that follows it
				if !m.Partial && !sl.offPathLocked(key.step, m.Token) {
					sl.score(key, es, act)
					scored = true
				}
			} else if live && key.step.Pass >= sl.seqs[m.Seq].iter {
				sl.pred[key] = predicted{experts: es, on: on, token: m.Token, partial: m.Partial}
			} // else: a sequence that has ended, or a pass that has run, ran no such layer
			sl.mu.Unlock()
			if scored {
				sl.signal()
			}
		case *wire.Withdraw:
			if len(m.Experts) > 0 {
				break // a worker's: the shadow revises its prediction for this node
			}
			if sl.stages != nil {
				sl.stages.Tell(ctx, -1, m)
			}
			sl.mu.Lock()
			sl.withdrawals++
			for k := range sl.pred {
				if k.step.Seq == m.Seq && k.step.Pass >= m.From {
					delete(sl.pred, k)
					sl.withdrawn++
				}
			}
			sl.mu.Unlock()
		case *wire.Drafts:
			sl.mu.Lock()
			for i, seq := range m.Seqs {
				if q := sl.seqs[seq]; q != nil {
					q.putDrafts(m.Pos[i], m.Tokens[i])
				}
			}
			sl.mu.Unlock()
		case *wire.ShadowDone:
			if it := int(m.Pass); it >= 1 && it <= maxPassStats {
				sl.mu.Lock()
				for len(sl.cpu) < it {
					sl.cpu = append(sl.cpu, 0)
				}
				sl.cpu[it-1] = m.CPU
				sl.mu.Unlock()
			}
			// the rows it met and rewound, each its member's (a new
			// batch's first pass tells those of the passes before it too)
			sl.mu.Lock()
			for _, seq := range m.AgreedSeqs {
				sl.countGuess(seq, true)
			}
			for _, seq := range m.RewoundSeqs { // a member's guessed token: its own alignment's
				if q := sl.seqs[seq]; q != nil && q.ctl != nil {
					q.ctl.Rewound(1)
				}
				sl.countGuess(seq, false)
			}
			sl.mu.Unlock()
			if it := int(m.Pass); it >= 2 {
				sl.mu.Lock()
				if it <= maxPassStats { // a server's batch runs on
					for len(sl.late) < it-1 {
						sl.late = append(sl.late, 0)
					}
					sl.late[it-2] = ms(m.LateDeparture)
				}
				sl.forwardMs += ms(m.Forward)
				sl.peakRSS = max(sl.peakRSS, m.RSSPeak)
				sl.forwards++
				if m.Ahead > 0 {
					sl.ahead++
				}
				sl.agreed, sl.rewound, sl.unhinted = m.Agreed, m.Rewound, m.Unhinted
				sl.reused += max(m.Reused-sl.reusedSeen, 0)
				sl.reusedSeen = max(sl.reusedSeen, m.Reused)
				sl.done = max(sl.done, int64(it))
				sl.mu.Unlock()
				sl.signal()
			}
		}
	}
}

// signal wakes stats, which waits for the shadow's last figures.
func (sl *shadowLink) signal() {
	select {
	case sl.received <- struct{}{}:
	default:
	}
}

// routing is a decode layer's real routing: the experts its pass
// activated (the union over its rows) and, when the pass said whose they
// are, each row's member and routes (k a row).
type routing struct {
	experts []int
	members []uint64
	routes  []model.Route
}

// score records one (pass, layer) of a pass: the union's share
// predicted, and each member's rows' (pass i+1 produces output token i+1
// of a batch of one in the paper's numbering: pass 1 is the prompt).
func (sl *shadowLink) score(key layerKey, pred []int, r routing) {
	sl.counts.add(pred, r.experts)
	// a pass activates the union of its rows' experts, and the shadow
	// predicts the union: eq. (3) for a pass of one row
	sl.recall.Observe(0, int(key.step.Pass-1), key.layer, pred, r.experts)
	if n := len(r.members); n > 0 {
		k := len(r.routes) / n
		for t, seq := range r.members {
			q := sl.seqs[seq]
			if q == nil {
				continue // scored after its end: nobody asks any more
			}
			hits := 0
			for _, rt := range r.routes[t*k : (t+1)*k] {
				if slices.Contains(pred, rt.Expert) {
					hits++
				}
			}
			q.routed, q.predicted = q.routed+int64(k), q.predicted+int64(hits)
			if q.ctl != nil {
				q.ctl.Observe(hits, k) // its own recall drives its alignment
			}
		}
	}
	delete(sl.actual, key)
}

// chosenLocked is the alignment the run's sequences ran the most decode
// steps under, ended and live: the policy itself unless adaptive.
func (sl *shadowLink) chosenLocked() align.Policy {
	if !sl.policy.Adaptive {
		return sl.policy
	}
	all := maps.Clone(sl.steps)
	for _, q := range sl.seqs {
		if q.ctl != nil {
			for p, n := range q.ctl.Counts {
				all[p] += n
			}
		}
	}
	return align.MostSteps(all, align.Policy{TokenPeriod: 1, KVPeriod: 1})
}

// memberFigures is member sequence seq's rows' routed and predicted
// experts scored so far, and the alignment it ran the most decode steps
// under.
func (sl *shadowLink) memberFigures(seq uint64) (routed, predicted int64, chosen align.Policy) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	q := sl.seqs[seq]
	if q == nil || q.ctl == nil {
		return 0, 0, sl.policy
	}
	return q.routed, q.predicted, q.ctl.Chosen()
}

// predictedOn widens a prediction's experts and the workers they were
// hinted to (none: nil), sorted by expert.
func predictedOn(experts, workers []int32) (es, on []int) {
	es = make([]int, len(experts))
	for i, e := range experts {
		es[i] = int(e)
	}
	if len(workers) == 0 {
		slices.Sort(es)
		return es, nil
	}
	on = make([]int, len(workers))
	for i, w := range workers {
		on[i] = int(w)
	}
	if slices.IsSorted(es) { // as the shadow sends them
		return es, on
	}
	order := make([]int, len(es))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return es[a] - es[b] })
	sorted, sortedOn := make([]int, len(es)), make([]int, len(es))
	for i, j := range order {
		sorted[i], sortedOn[i] = es[j], on[j]
	}
	return sorted, sortedOn
}

// prediction takes the shadow's prediction for a decode layer if it has
// arrived: its experts and the worker each was hinted to (nil, nil
// otherwise; on is nil when the shadow did not say).
func (sl *shadowLink) prediction(step model.Step, layer int) (experts, on []int) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	key := layerKey{step, layer}
	p := sl.takeLocked(key)
	if p.partial {
		if sl.partialTaken == nil {
			sl.partialTaken = map[layerKey]bool{}
		}
		sl.partialTaken[key] = true
	}
	return p.experts, p.on
}

// takeLocked takes the prediction for key if it has arrived and was made
// on the token this node fed (none otherwise: one made on another token is
// dropped, counted; the shadow will withdraw or revise it).
func (sl *shadowLink) takeLocked(key layerKey) predicted {
	p, ok := sl.pred[key]
	if !ok {
		return predicted{}
	}
	delete(sl.pred, key)
	if sl.offPathLocked(key.step, p.token) {
		return predicted{}
	}
	return p
}

// offPathLocked reports whether a prediction for step made on token is
// on a path this node did not take (counted): the shadow ran ahead on a
// token other than the one this node sampled and sent it.
func (sl *shadowLink) offPathLocked(step model.Step, token int32) bool {
	q := sl.seqs[step.Seq]
	if token < 0 || q == nil || q.iter != step.Pass || !q.tokenSent || q.token == token {
		return false
	}
	sl.offPath++
	return true
}

// routed tells the link the real routing of a decode layer (experts:
// the union; members and routes: each row's member, nil if unknown, and
// its routes), with the prediction taken for it (nil if none had
// arrived): it is scored now, or when the prediction arrives.
func (sl *shadowLink) routed(step model.Step, layer int, pred, experts []int, members []uint64, routes []model.Route) {
	key := layerKey{step, layer}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.partialTaken[key] { // placed on a partial union: scored on the whole, when it comes
		delete(sl.partialTaken, key)
		pred = nil
	}
	if pred == nil { // it may have arrived since (a partial one is not scored)
		if p := sl.takeLocked(key); !p.partial {
			pred = p.experts
		}
	}
	r := routing{experts: experts, members: members, routes: routes}
	if pred != nil {
		sl.score(key, pred, r)
	} else {
		r.experts, r.members, r.routes = slices.Clone(experts), slices.Clone(members), slices.Clone(routes)
		sl.actual[key] = r
	}
}

// batchPass is the pass a member's forward pass runs in: the batch's
// sequence id and pass, and how many members it has.
type batchPass struct {
	seq  uint64
	iter int64
	size int
}

// startBatch departs the shadow on a pass (step is the batch's): one
// alignment per member, rows[i] being member i's part. The shadow runs
// the pass once it has them all. It reports whether every member
// departed.
func (sl *shadowLink) startBatch(ctx context.Context, step model.Step, rows []passloop.Row) (bool, error) {
	sl.mu.Lock()
	if sl.seqs[step.Seq] == nil {
		sl.seqs[step.Seq] = &shadowSeq{} // the batch's predictions are for a live sequence
	}
	sl.mu.Unlock()
	bp := batchPass{seq: step.Seq, iter: step.Pass, size: len(rows)}
	all := true
	for _, r := range rows {
		departed, err := sl.startIn(ctx, r, bp)
		if err != nil {
			return false, err
		}
		all = all && departed
	}
	// the pass's own mark: a prediction for it made on other tokens (the
	// shadow ran it ahead on its own) is off the path taken
	sent := true
	sl.mu.Lock()
	q := sl.seqs[step.Seq]
	q.rowSeqs, q.rowTokens = q.rowSeqs[:0], q.rowTokens[:0]
	for _, r := range rows {
		q.rowSeqs, q.rowTokens = append(q.rowSeqs, r.Step.Seq), append(q.rowTokens, rowToken(r))
		m := sl.seqs[r.Step.Seq]
		sent = sent && m != nil && m.iter == r.Step.Pass && m.tokenSent
	}
	q.iter, q.token, q.tokenSent = step.Pass, align.PassToken(q.rowSeqs, q.rowTokens), sent && all
	// predictions for earlier passes nobody will ask for (revised ones that
	// came after their layer ran)
	maps.DeleteFunc(sl.pred, func(k layerKey, _ predicted) bool { return k.step.Seq == step.Seq && k.step.Pass < step.Pass })
	if all {
		q.sent = step.Pass
	}
	sl.mu.Unlock()
	return all, nil
}

// rowToken is what a member's row says of its pass in align.PassToken:
// its decode token (the one before any guesses), or its chunk's last.
func rowToken(r passloop.Row) int {
	if r.Prompt {
		return r.Tokens[len(r.Tokens)-1]
	}
	return r.Tokens[0]
}

// startIn sends the alignment of row, a member of pass bp: the token
// every TokenPeriod decode steps and the KV rows written since the last
// KV alignment every KVPeriod decode steps; every prompt chunk (the
// shadow cannot guess them) and, at the member's first pass, the prefix
// its cache reused. A shadow that
// attached since the sequence's last forward pass gets the whole sequence
// instead: every token so far, the KV rows (when they are not too big)
// and what to feed.
func (sl *shadowLink) startIn(ctx context.Context, row passloop.Row, bp batchPass) (bool, error) {
	step, tokens, cache := row.Step, row.Tokens, row.Cache
	first := step.Pass == 1
	sl.mu.Lock()
	q := sl.seqs[step.Seq]
	if q == nil {
		q = &shadowSeq{ctl: align.NewController(sl.policy)}
		sl.seqs[step.Seq] = q
	}
	if first {
		q.hist = q.hist[:0]
		for _, t := range row.Reused {
			q.hist = append(q.hist, int32(t))
		}
		q.sampling = wireSampling(row.Sampling, row.PromptLen)
	}
	// guesses an earlier pass fed and did not keep are not the
	// sequence's: its tokens are those its cache holds rows of
	q.hist = q.hist[:min(len(q.hist), cache.Len())]
	before := len(q.hist)
	for _, t := range tokens { // guesses too: the next pass keeps those the cache kept
		q.hist = append(q.hist, int32(t))
	}
	if !row.Prompt {
		q.decodes++
	}
	up, synced, lastKV, sampling := sl.up, q.synced, q.lastKV, q.sampling
	decodeStep := q.decodes // the generated tokens fed so far
	var tokenDue, kvDue bool
	if up && synced && !row.Prompt && decodeStep > 0 {
		tokenDue, kvDue = q.ctl.Step(decodeStep, q.kvStep)
	}
	// a drafting member's shadow may hold rows its pass turned down, or
	// have run ahead past a guess turned down: it is told every token
	// (the shadow ran this pass ahead with the Draft the last alignment
	// said, sentDraft)
	drafting := row.Drafted > 0 || q.drafted || q.draft > 0 || q.sentDraft > 0
	tokenDue = tokenDue || drafting
	q.drafted = row.Drafted > 0
	draftK := q.draft
	q.sentDraft = draftK
	var history []int32
	if up && (!synced || first) {
		history = slices.Clone(q.hist[:before])
	}
	sl.mu.Unlock()
	if !up {
		if sl.stages != nil { // a shadow that attaches is sent the sequence's tokens
			sl.stages.ForgetKV(step.Seq, cache.Len()+len(tokens))
		}
		return false, nil
	}
	p := sl.peer.Load()
	a := &wire.Alignment{Seq: step.Seq, Pass: step.Pass, Token: -1, Batch: bp.seq, BatchPass: bp.iter, BatchSize: bp.size, Pos: cache.Len(), Draft: draftK}
	kvStep := int64(-1)   // unchanged
	if first || !synced { // the shadow starts the sequence
		a.Sampling = sampling
	}
	switch {
	case first: // its first chunk, after the prefix it reused
		a.History = history
		lastKV = cache.Len() + len(tokens)
	case !synced:
		a.History = history
		if !row.Prompt {
			a.Token = int32(tokens[0])
		}
		// (a staged main node's stages keep no rows for this: the shadow
		// runs the history itself)
		if sl.stages == nil && 4*int64(cache.Len())*int64(cache.Width())*int64(cache.Layers()) <= maxAttachKVBytes {
			if err := packInto(a, cache, 0, nil); err != nil {
				return false, err
			}
		}
		lastKV, kvStep = cache.Len(), decodeStep
	case row.Prompt: // the shadow computes the chunk's rows itself
		lastKV = cache.Len() + len(tokens)
	default:
		if tokenDue {
			a.Token = int32(tokens[0])
		}
		if kvDue && cache.Len() > lastKV {
			if err := packInto(a, cache, lastKV, sl.stages); err != nil {
				return false, err
			}
			lastKV, kvStep = cache.Len(), decodeStep
		}
	}
	if row.Prompt {
		a.Chunk, a.PromptLeft = int32s(tokens), row.PromptLeft
	} else if a.Token >= 0 && row.Drafted > 0 {
		a.Guesses = int32s(tokens[1:])
	}
	a.Final = row.Final
	if sl.stages != nil {
		sl.stages.ForgetKV(step.Seq, lastKV) // rows before it are never sent again
	}
	sl.mu.Lock()
	q.synced, q.lastKV = true, lastKV
	if kvStep >= 0 {
		q.kvStep = kvStep
	}
	q.iter, q.token, q.tokenSent = step.Pass, int32(rowToken(row)), a.Token >= 0 || row.Prompt
	sl.mu.Unlock()
	sl.trace.Message(trace.Send, trace.MsgAlignment, p.Identity().Name, a.Pass, 0, -1, 0, time.Now())
	if err := p.Send(ctx, a); err != nil {
		if ctx.Err() == nil && connGone(p, err) {
			return false, nil
		}
		return false, err
	}
	sl.mu.Lock()
	q.sent = step.Pass
	sl.mu.Unlock()
	return true, nil
}

// int32s narrows token ids for the wire.
func int32s(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, t := range ids {
		out[i] = int32(t)
	}
	return out
}

// packInto puts the KV rows from position from to the end of cache into
// a: with stages, those of cache's layers (the main node's) and then the
// stages' as their runs handed them back; where they do not have them
// all, a carries none (the shadow keeps its own rows).
func packInto(a *wire.Alignment, cache *kvcache.Cache, from int, stages *stage.Client) error {
	kv, err := align.PackKV(cache, from, cache.Len())
	if err != nil {
		return err
	}
	if stages != nil {
		theirs, ok := stages.KVRows(a.Seq, from, cache.Len())
		if !ok {
			return nil
		}
		if kv, err = align.JoinLayers(kv, theirs); err != nil {
			return err
		}
	}
	a.FromPos = kv.From
	a.Keys, a.Values = kv.Tensors() // no values for a latent cache
	return nil
}

// guessRate is the share of the shadow's guesses of members' tokens
// that met the main node's, over every kind of request (0.5 before any).
func (sl *shadowLink) guessRate() float64 {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	var met, all int64
	for _, c := range sl.guesses {
		met, all = met+c.Met, all+c.Met+c.Rewound
	}
	if all == 0 {
		return 0.5
	}
	return float64(met) / float64(all)
}

// draftsFor returns up to most of the shadow's guesses of the tokens after
// position pos of sequence seq, whose token there is last (none unless
// its latest drafts begin there with that token), and has the shadow
// guess k tokens a pass for it from its next alignment on.
func (sl *shadowLink) draftsFor(seq uint64, pos, last, most, k int) []int {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	q := sl.seqs[seq]
	if q == nil {
		return nil
	}
	q.draft = k
	if !sl.up {
		return nil
	}
	for _, d := range q.drafts {
		if d.pos == pos && d.tokens[0] == last {
			return slices.Clone(d.tokens[1:min(len(d.tokens), 1+most)])
		}
	}
	return nil
}

// putDrafts keeps the shadow's rows for the member from position pos on
// (replacing those it had from there: each step of a pass run ahead sends
// them with one more guess), and forgets the oldest past maxDrafts.
func (q *shadowSeq) putDrafts(pos int, tokens []int32) {
	i := slices.IndexFunc(q.drafts, func(d memberDrafts) bool { return d.pos == pos })
	if i < 0 {
		if len(q.drafts) >= maxDrafts {
			q.drafts = slices.Delete(q.drafts, 0, 1)
		}
		q.drafts = append(q.drafts, memberDrafts{pos: pos})
		i = len(q.drafts) - 1
	}
	d := &q.drafts[i]
	d.tokens = d.tokens[:0]
	for _, t := range tokens {
		d.tokens = append(d.tokens, int(t))
	}
}

// end forgets sequence seq: its alignment mark and predictions nobody
// will ask for. Routing still waiting for its prediction stays, to be
// scored when the shadow finishes the sequence's last pass. It
// returns the last pass the shadow was sent all of (0: none).
func (sl *shadowLink) end(seq uint64) (last int64) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if q := sl.seqs[seq]; q != nil {
		last = q.sent
		if q.ctl != nil {
			for p, n := range q.ctl.Counts {
				sl.steps[p] += n
			}
		}
	}
	if q := sl.seqs[seq]; q != nil {
		if sl.ended == nil || len(sl.ended) >= maxEndedKinds {
			sl.ended = map[uint64]string{}
		}
		sl.ended[seq] = guessKind(q.sampling)
	}
	delete(sl.seqs, seq)
	maps.DeleteFunc(sl.pred, func(k layerKey, _ predicted) bool { return k.step.Seq == seq })
	maps.DeleteFunc(sl.partialTaken, func(k layerKey, _ bool) bool { return k.step.Seq == seq })
	return last
}

// ShadowStats are the shadow's figures for the run summary.
type ShadowStats struct {
	// Recall is, over the decode passes, the share of the experts a
	// layer activated (the union over the pass's rows) that the shadow
	// predicted for it: eq. (3) when every pass has one row (text mode);
	// RecallByToken is the same per pass, eq. (2) for text mode's output
	// tokens 1..N.
	Recall          float64
	RecallByToken   []float64
	LateDepartureMs []float64 // per decode pass
	// ForwardMs is the shadow's mean decode forward pass (all layers).
	ForwardMs float64
	// PeakRSS is the shadow process's peak resident memory.
	PeakRSS int64
	// Ahead are the decode passes the shadow ran ahead of the main node's
	// alignment, on its own tokens. Agreed and Rewound are the members'
	// rows of such passes that the main node's pass met: on the same
	// token, or not (the shadow took that row back and ran the member's
	// row again alone, revising each layer's prediction and withdrawing
	// Withdrawn predictions it had sent this node). OffPath are
	// predictions this node dropped as made on a token it did not feed
	// before their withdrawal came.
	Ahead, Agreed, Rewound, Withdrawn, OffPath int64
	// Guesses are the agreed and rewound rows by the kind of request
	// (KindGreedy, KindSampled, KindConstrained), over the shadow's
	// connections.
	Guesses map[string]GuessCounts
	// Unhinted is the layers the shadow predicted after this node had
	// started a later pass (it had fallen behind): no loads hinted.
	Unhinted int64
	// Reused are the prompt tokens whose KV rows the shadow copied from
	// its prefix cache instead of running them.
	Reused int64
	// Align is the alignment the run used: the fixed policy, or the
	// periods an adaptive one ran the most decode steps under.
	Align align.Policy
	// DecodeCPU is the CPU time the shadow used (a staged shadow's
	// stages too) from the end of the prompt's pass to the end of the
	// last decode pass's (text mode's one sequence; 0 where it did not
	// say).
	DecodeCPU time.Duration
}

// stats waits (up to timeout) for the shadow to finish pass last
// and for every layer of it that has run to be scored (a prediction the
// shadow made running ahead on another token is dropped, and comes again
// after it rewinds, possibly after that pass's first finish), and
// returns its figures. A lost shadow is not waited for.
func (sl *shadowLink) stats(last int64, timeout time.Duration) ShadowStats {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		sl.mu.Lock()
		unscored := false
		for k := range sl.actual {
			unscored = unscored || k.step.Pass == last
		}
		finished := (sl.done >= last && !unscored) || !sl.up
		sl.mu.Unlock()
		if finished {
			break
		}
		select {
		case <-sl.received:
			continue
		case <-deadline.C:
		}
		break
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	// a shadow running ahead may have run a pass past the last
	late := sl.late[:min(len(sl.late), int(max(last-1, 0)))]
	st := ShadowStats{Recall: sl.recall.Overall(), RecallByToken: sl.recall.ByToken(), LateDepartureMs: slices.Clone(late), PeakRSS: sl.peakRSS,
		Ahead: sl.ahead, Agreed: sl.agreed, Rewound: sl.rewound, Withdrawn: sl.withdrawn, OffPath: sl.offPath, Unhinted: sl.unhinted, Reused: sl.reused, Align: sl.chosenLocked(), Guesses: maps.Clone(sl.guesses)}
	if sl.forwards > 0 {
		st.ForwardMs = sl.forwardMs / float64(sl.forwards)
	}
	// the decode's passes: from the prompt's end to the last pass's
	if l := int(last); l >= 2 && l <= len(sl.cpu) && sl.cpu[0] > 0 && sl.cpu[l-1] >= sl.cpu[0] {
		st.DecodeCPU = sl.cpu[l-1] - sl.cpu[0]
	}
	return st
}
