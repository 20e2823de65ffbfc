package mainnode

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/wire"
)

// Worker failover. Every worker holds the whole expert store and the main
// node holds all the state that matters (KV cache, hidden states), so a
// lost worker loses nothing but time: its connection's end takes it out
// of the layout (the planner moves its work to live workers), what it had
// in flight is re-sent to the worker that now owns it, and a background
// goroutine dials it again; a new connection rejoins the layout when a
// sequence starts its next forward pass. Experts compute the same bits on
// any worker, so the output stays bit-identical to local mode.

// FaultStats count what faults cost a run.
type FaultStats struct {
	WorkersLost int64 // worker connections that ended during the run
	Rejoins     int64 // workers that came back
	Resent      int64 // requests re-sent to another worker after their worker was lost or could not load them
	ShadowLost  int64 // times the shadow's connection ended
	// ReactivePasses are decode passes run without the shadow
	// (lost, or not reached yet), with reactive loading.
	ReactivePasses   int64
	ShadowReattached int64 // times a lost shadow came back and was re-aligned
	// LoadFailures are requests a worker could not serve because an
	// expert failed its checksum in its store (or its store could not be
	// read): each was re-sent to another live worker.
	LoadFailures int64
	// StagesLost are stage connections that ended (-stages): each time,
	// once the stage answered again, the live sequences ran again from
	// their first tokens (Refills of them in all).
	StagesLost, Refills int64
}

// watch runs l's receive loop on p; when the connection ends (not by
// Close) the worker is lost.
func (s *Swarm) watch(l *link, p *wire.Peer) {
	s.receivers.Go(func() {
		err := l.receive(s.life, p)
		if s.life.Err() != nil {
			return
		}
		s.lost(l, err)
	})
}

// lost takes l's worker out of the layout and starts dialing it again.
func (s *Swarm) lost(l *link, err error) {
	s.planner.SetLive(l.index, false)
	s.mu.Lock()
	s.stats.Faults.WorkersLost++
	s.mu.Unlock()
	s.opt.Log.Warn().Str("worker", l.name).Int("index", l.index).Int("live", s.planner.Live()).Err(err).
		Msg("mainnode: worker lost; the live workers take its experts until it rejoins")
	if s.opt.Redial == nil {
		return
	}
	l.mu.Lock()
	start := !l.redialing
	l.redialing = true
	l.mu.Unlock()
	if start {
		s.receivers.Go(func() { s.redial(l) })
	}
}

// redial dials l's worker until it answers (or the Swarm closes) and
// leaves the connection for rejoin.
func (s *Swarm) redial(l *link) {
	defer func() {
		l.mu.Lock()
		l.redialing = false
		l.mu.Unlock()
	}()
	p, attempt, err := wire.Redial(s.life, func(ctx context.Context) (*wire.Peer, error) { return s.opt.Redial(ctx, l.index) },
		func(id wire.Identity) error {
			if id.Name != l.name || id.Role != wire.RoleWorker {
				return fmt.Errorf("not worker %s", l.name)
			}
			return nil
		},
		func(attempt int, err error) {
			s.opt.Log.Warn().Str("worker", l.name).Int("attempt", attempt).Err(err).Msg("mainnode: lost worker still unreachable; dialing again")
		})
	if err != nil {
		return // the Swarm closed
	}
	l.mu.Lock()
	l.next = p
	l.mu.Unlock()
	s.rejoins.Add(1)
	s.opt.Log.Info().Str("worker", l.name).Int("attempt", attempt).Msg("mainnode: lost worker answers again; it rejoins at the next pass")
}

// rejoin puts the workers whose new connection is ready back into the
// layout. Called when a sequence starts a forward pass.
func (s *Swarm) rejoin() {
	if s.rejoins.Load() == 0 || s.life.Err() != nil {
		return
	}
	for _, l := range s.workers {
		l.mu.Lock()
		p := l.next
		if p != nil {
			l.next, l.err = nil, nil
			l.peer.Store(p)
			s.rejoins.Add(-1)
		}
		l.mu.Unlock()
		if p == nil {
			continue
		}
		// told its place, it answers once its share is in (a worker
		// started again on an empty store fills it first, at its
		// -fetch-rate): until then the live workers keep its experts, so
		// that no running sequence waits on what it would fetch. Where no
		// worker is live it is taken in at once: the pass needs one.
		in := func(fetched int64) {
			s.planner.Unspoil(l.index) // a new connection: its store may have been put back
			s.planner.SetLive(l.index, true)
			l.counts.rejoins.Add(1)
			s.mu.Lock()
			s.stats.Faults.Rejoins++
			delete(s.degraded, l.index)
			s.mu.Unlock()
			s.opt.Log.Info().Str("worker", l.name).Int("index", l.index).Int("live", s.planner.Live()).Str("fetched", progress.Bytes(fetched)).
				Msg("mainnode: worker rejoined the layout")
		}
		wait := s.placed() && s.planner.Live() > 0
		if wait {
			l.mu.Lock()
			l.shareIn = in
			l.mu.Unlock()
		}
		s.watch(l, p)
		if !s.placed() {
			in(0)
			continue
		}
		if err := s.tellPlace(l.index, p); err != nil {
			continue // the connection ends: it is lost again, and dialed again
		}
		if !wait {
			in(0)
			continue
		}
		s.opt.Log.Info().Str("worker", l.name).Int("index", l.index).Msg("mainnode: worker answers again; it rejoins the layout once its share of the store is in")
	}
}

// failover re-sends every request of q still waiting on worker w, whose
// connection is lost, to the worker that now runs its experts: the
// experts it had not answered yet, on the same rows, in the same order
// (so prefill mini-batches keep their Keep chain).
func (s *Swarm) failover(ctx context.Context, q *sequence, w int, x []float32, rows bool, cause error) error {
	s.planner.SetLive(w, false) // the receive loop does it too; whichever comes first
	if s.planner.Live() == 0 {
		return fmt.Errorf("mainnode: layer %d: no live worker left (the last lost: %s): %w", q.in.Layer, s.workers[w].name, cause)
	}
	n := len(q.reqs)
	for i := range n {
		if r := &q.reqs[i]; r.Worker == w && r.pending > 0 {
			if err := s.resend(ctx, q, i, s.planner.Substitute(w), x, rows, cause); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadFailed handles a worker's answer that it could not load an expert
// of request i from its store (a chunk failing its checksum, a truncated
// or unreadable file): the worker stays in the layout, the request's
// unanswered experts go to another live worker that has not failed them
// (every worker holds the whole store), and the worker is reported
// degraded. With no such worker left the layer fails.
func (s *Swarm) loadFailed(ctx context.Context, q *sequence, i int, x []float32, rows bool, cause *wire.Error) error {
	r := &q.reqs[i]
	w := r.Worker
	s.degrade(w, fmt.Sprintf("layer %d expert %d: %s", cause.Layer, cause.Expert, cause.Msg))
	if cause.Expert >= 0 {
		s.planner.Spoil(w, cause.Layer, cause.Expert) // later plans run it elsewhere
	}
	// never back to a worker that failed this request (two damaged stores
	// failing different experts of it would pass it to and fro)
	tried := append(append([]int(nil), r.failed...), w)
	to, ok := s.planner.nearest(w, func(c int) bool {
		return s.planner.IsLive(c) && !slices.Contains(tried, c) && !s.planner.isSpoiled(c, cause.Layer, cause.Expert)
	})
	if !ok {
		return fmt.Errorf("mainnode: layer %d: no live worker could load expert %d (the last, %s: %s): %w",
			q.in.Layer, cause.Expert, s.workers[w].name, cause.Msg, cause)
	}
	if err := s.resend(ctx, q, i, to, x, rows, cause); err != nil {
		return err
	}
	q.reqs[len(q.reqs)-1].failed = tried
	s.mu.Lock()
	s.stats.Faults.LoadFailures++
	s.mu.Unlock()
	return nil
}

// degrade records why worker w is degraded (for /healthz), logging the
// first time for each reason.
func (s *Swarm) degrade(w int, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.degraded == nil {
		s.degraded = map[int][]string{}
	}
	if slices.Contains(s.degraded[w], why) {
		return
	}
	s.degraded[w] = append(s.degraded[w], why)
	s.opt.Log.Warn().Str("worker", s.workers[w].name).Str("reason", why).Msg("mainnode: worker degraded: its requests for this expert go to another worker")
}

// Degraded names the workers that failed to load an expert from their
// store, one line each: how many experts failed there, and the first
// failure, for /healthz.
func (s *Swarm) Degraded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for w, why := range s.degraded {
		line := s.workers[w].name + ": " + why[0]
		if len(why) > 1 {
			line = fmt.Sprintf("%s: %d experts failed to load from its store, the first %s", s.workers[w].name, len(why), why[0])
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return out
}

// resend sends request i's unanswered experts to worker to as a new
// request, the old one no longer awaited.
func (s *Swarm) resend(ctx context.Context, q *sequence, i, to int, x []float32, rows bool, cause error) error {
	var act wire.Activation
	var buf []float32
	var bufp *[]float32
	if rows {
		bufp = &buf
	}
	r := &q.reqs[i]
	rest := make([]int32, 0, r.pending)
	var own, counts []int32 // the unanswered experts' own rows, if they have them
	off := 0
	for j, e := range r.Experts {
		c := 0
		if len(r.RowCounts) > 0 {
			c = int(r.RowCounts[j])
		}
		if r.got&(1<<j) == 0 {
			rest = append(rest, e)
			if c > 0 {
				own, counts = append(own, r.Rows[off:off+c]...), append(counts, int32(c))
			}
		}
		off += c
	}
	r.pending = 0 // replaced
	nr := request{Request: Request{Worker: to, Experts: rest, Tokens: r.Tokens, Keep: r.Keep, Cache: r.Cache, Rows: own, RowCounts: counts},
		id: s.nextID.Add(1), pending: len(rest)}
	if q.expected+nr.pending+1 > cap(q.replies) {
		return fmt.Errorf("mainnode: layer %d: too many requests re-sent at once (last from %s): %w", q.in.Layer, s.workers[r.Worker].name, cause)
	}
	q.expected += nr.pending + 1
	q.reqs = append(q.reqs, nr) // r is stale from here
	s.workers[nr.Worker].expect(nr.id, nr.pending, q.replies)
	if err := s.sendRequest(ctx, q, &act, &q.reqs[len(q.reqs)-1], x, bufp); err != nil {
		return err
	}
	s.mu.Lock()
	s.stats.Faults.Resent++
	s.mu.Unlock()
	return nil
}

// find is the index in q.reqs of the request with id: planned requests
// have consecutive ids from first; re-sent ones follow.
func (q *sequence) find(id, first uint64) (int, bool) {
	if id >= first && id < first+uint64(q.planned) {
		return int(id - first), true
	}
	for i := q.planned; i < len(q.reqs); i++ {
		if q.reqs[i].id == id {
			return i, true
		}
	}
	return 0, false
}

// sendTo sends m to worker w. A connection that has ended is not an error
// here: its receive loop fails what waits on it, and failover re-sends it.
func (s *Swarm) sendTo(ctx context.Context, w int, m wire.Message) error {
	l := s.workers[w]
	p := l.conn()
	err := p.Send(ctx, m)
	if err == nil || ctx.Err() != nil {
		return err
	}
	if connGone(p, err) {
		return nil
	}
	return s.workerErr(w, err)
}

// connGone reports whether Send on p failed because the connection is
// gone (its receive loop reports that), rather than because this node
// could not send the message at all.
func connGone(p *wire.Peer, err error) bool {
	if p.Err() != nil {
		return true
	}
	var ce *wire.ConnError
	if errors.As(err, &ce) {
		return ce.Remote || ce.Code == wire.CodeClosed
	}
	return errors.Is(err, wire.ErrTimeout) || errors.Is(err, wire.ErrClosed)
}

// gotExpert records that r's expert e has answered; false if r does not
// name e or it has answered already.
func (r *request) gotExpert(e int) bool {
	j := slices.Index(r.Experts, int32(e))
	if j < 0 || j >= 64 || r.got&(1<<j) != 0 {
		return false
	}
	r.got |= 1 << j
	return true
}

// Shadow fallback. The shadow only ever changes speed: while it is lost
// the main node loads reactively (its planner places experts as it would
// with no prediction), dials it again in the background, and when it
// answers attaches it at a batch's next pass, sending each member's
// whole sequence first (shadowLink.startIn, its history and KV rows).

// shadowConn is the shadow's connection while it is up, else nil.
func (s *Swarm) shadowConn() *wire.Peer {
	if s.shadow == nil {
		return nil
	}
	return s.shadow.conn()
}

// watchShadow runs the shadow link's receive loop on p; when the
// connection ends (not by Close) the shadow is lost.
func (s *Swarm) watchShadow(p *wire.Peer) {
	s.receivers.Go(func() {
		err := s.shadow.receive(s.life, p)
		if s.life.Err() != nil {
			return
		}
		s.shadow.down()
		s.mu.Lock()
		s.stats.Faults.ShadowLost++
		s.mu.Unlock()
		s.opt.Log.Warn().Str("shadow", p.Identity().Name).Err(err).
			Msg("mainnode: shadow lost; " + s.withoutShadow() + " until it answers again")
		s.startRedialShadow()
	})
}

// startRedialShadow dials the shadow in the background until it answers
// (unless a dial is under way already or the Swarm cannot redial).
func (s *Swarm) startRedialShadow() {
	if s.opt.RedialShadow == nil {
		return
	}
	sl := s.shadow
	sl.mu.Lock()
	start := !sl.redialing
	sl.redialing = true
	sl.mu.Unlock()
	if !start {
		return
	}
	s.receivers.Go(func() {
		defer func() {
			sl.mu.Lock()
			sl.redialing = false
			sl.mu.Unlock()
		}()
		p, attempt, err := wire.Redial(s.life, s.opt.RedialShadow,
			func(id wire.Identity) error {
				if id.Role != wire.RoleShadow {
					return errors.New("not a shadow")
				}
				return nil
			},
			func(attempt int, err error) {
				s.opt.Log.Warn().Int("attempt", attempt).Err(err).Msg("mainnode: the shadow is still unreachable; dialing again")
			})
		if err != nil {
			return // the Swarm closed
		}
		sl.mu.Lock()
		sl.next = p
		sl.mu.Unlock()
		s.opt.Log.Info().Str("shadow", p.Identity().Name).Int("attempt", attempt).Msg("mainnode: the shadow answers; it attaches at the next forward pass")
	})
}

// attachShadow attaches a shadow connection that is ready.
func (s *Swarm) attachShadow() {
	sl := s.shadow
	sl.mu.Lock()
	p := sl.next
	sl.next = nil
	sl.mu.Unlock()
	if p == nil || s.life.Err() != nil {
		if p != nil {
			p.Close()
		}
		return
	}
	sl.attach(p)
	s.sendPlacement(p)
	s.watchShadow(p)
	s.mu.Lock()
	s.stats.Faults.ShadowReattached++
	s.mu.Unlock()
	s.opt.Log.Info().Str("shadow", p.Identity().Name).Msg("mainnode: shadow attached; each sequence is sent whole before it predicts")
}

// withoutShadow says what the swarm does while its shadow is away: a
// resident swarm runs on as it is, any other loads on demand.
func (s *Swarm) withoutShadow() string {
	if s.opt.Prefetch == Resident {
		return "running without its predictions (every expert is resident)"
	}
	return "loading reactively"
}
