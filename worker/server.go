package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/model"

	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// Server is the worker role on the network: it accepts the main node and
// the shadow, turns their Predictions into Engine.Prefetch and their
// Activations into Engine.Run, and answers with ExpertResults (or Errors
// the main node sees).
type Server struct {
	engine *Engine
	health *storeHealth // nil: never out of service (a bare Server)
	// store, if set, is served to worker peers fetching their share of it
	// (served counts the bytes); fetched, if set, says the bytes of the
	// store fetched from other nodes (-fetch-from)
	store   fetch.Holder
	served  atomic.Int64
	fetched func() int64
	// place, if set, is told the worker's place in the main node's
	// layout (a worker filling its share in the background)
	place func(wire.Place) <-chan struct{}
	log   zerolog.Logger

	mu    sync.Mutex
	done  map[seqLayer]int64 // the last pass of a sequence that ended a layer here
	ended [endedSeqs]uint64  // the sequences ended last (a ring), whose late hints are dropped
	nEnd  int
	seen  map[int]int64 // layer -> the last pass a message named (what a load is for, in traces)
	late  atomic.Int64  // predictions that arrived after their layer ran
	trace *trace.Recorder
}

// endedSeqs is how many ended sequences a worker remembers, so that a
// prediction that arrives after its sequence's end (the shadow's and the
// main node's messages travel on different connections) loads nothing.
const endedSeqs = 64

// seqLayer is one layer of one sequence.
type seqLayer struct {
	seq   uint64
	layer int
}

// NewServer serves engine.
func NewServer(engine *Engine, log zerolog.Logger) *Server {
	s := &Server{engine: engine, log: log, done: map[seqLayer]int64{}, seen: map[int]int64{}, trace: trace.NewRecorder("worker")}
	engine.OnLoad = func(layer, expert int, start, end time.Time) {
		s.mu.Lock()
		it := s.seen[layer]
		s.mu.Unlock()
		s.trace.Span(trace.Load, it, layer, expert, start, end)
	}
	return s
}

// traceRecv records a message that arrived from peer, and which
// pass it named layer for (what a load of that layer is for), when
// that pass is traced.
func (s *Server) traceRecv(msg, peer string, it int64, layer int, id uint64, at time.Time) {
	if !s.trace.Active(it) {
		return
	}
	s.mu.Lock()
	s.seen[layer] = it
	s.mu.Unlock()
	s.trace.Message(trace.Recv, msg, peer, it, layer, -1, id, at)
}

// prefetch starts loading a prediction's experts unless its layer has
// already run here in that pass of its sequence (then loading would
// only waste memory: it is counted as late). Checked and started under
// s.mu, so that endLayer's eviction never misses a prefetch.
func (s *Server) prefetch(ctx context.Context, m *wire.Prediction) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ranLocked(m.Seq, m.Pass, m.Layer) {
		s.late.Add(1)
		return
	}
	experts := make([]int, len(m.Experts))
	for i, e := range m.Experts {
		experts[i] = int(e)
	}
	s.engine.Prefetch(ctx, model.Step{Seq: m.Seq, Pass: m.Pass}, m.Layer, experts)
}

// endLayer records that layer of pass it of sequence seq has run here
// and evicts what was loaded for it on a wrong prediction (wasted,
// counted).
func (s *Server) endLayer(seq uint64, it int64, layer int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done[seqLayer{seq, layer}] = it
	s.engine.Evict(model.Step{Seq: seq, Pass: it}, layer)
}

// endSequence forgets sequence seq: its pass marks, and the experts
// it still holds (hints for passes that never came).
func (s *Server) endSequence(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.done {
		if k.seq == seq {
			delete(s.done, k)
		}
	}
	s.ended[s.nEnd%endedSeqs] = seq
	s.nEnd++
	s.engine.EndSequence(seq)
}

// ranLocked reports whether layer of pass it of sequence seq has
// already ended here.
func (s *Server) ranLocked(seq uint64, it int64, layer int) bool {
	if last, ok := s.done[seqLayer{seq, layer}]; ok {
		return it <= last
	}
	return slices.Contains(s.ended[:min(s.nEnd, endedSeqs)], seq)
}

// Serve accepts peers on ln until ctx ends, serving each on its own
// goroutine; it returns when every peer's goroutines have ended.
func (s *Server) Serve(ctx context.Context, ln *wire.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var peers int
	for {
		p, err := ln.Accept(ctx)
		if err != nil {
			for range peers {
				<-done
			}
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		peers++
		go func() {
			defer func() { done <- struct{}{} }()
			s.ServePeer(ctx, p)
		}()
	}
}

// ServeFetching serves the workers fetching their share of the store
// from this one (its stream listener, Node.Listen) until ctx ends, each
// on its own goroutine.
func (s *Server) ServeFetching(ctx context.Context, ln *wire.StreamListener) {
	fetch.ServeStreams(ctx, ln, fetch.Served{Store: s.store}, &s.served,
		func(id wire.Identity) { s.log.Info().Str("peer", id.Name).Msg("serving a share of the store") },
		func(id wire.Identity, sent int64, err error) {
			if ctx.Err() == nil {
				s.log.Info().Str("peer", id.Name).Int64("served_bytes", sent).Err(err).Msg("fetching peer gone")
			}
		})
}

// ServePeer handles one connection until it ends. Activations are computed
// one after another in arrival order, as on one device: the next
// mini-batch arrives while this one computes, and a Keep=false request is
// always the last one of its expert. Predictions start loads at once.
func (s *Server) ServePeer(ctx context.Context, p *wire.Peer) {
	id := p.Identity()
	log := s.log.With().Str("peer", id.Name).Str("role", string(id.Role)).Logger()
	defer p.Close()
	if s.health != nil {
		if !s.health.serving(p) { // out of service: refused, told why
			return
		}
		defer s.health.done(p)
	}
	log.Info().Msg("peer connected")
	acts := make(chan *wire.Activation, 64)
	computed := make(chan struct{})
	go func() {
		defer close(computed)
		var out []float32
		var res wire.ExpertResult // reused: Send encodes before it returns
		for a := range acts {
			out = s.activate(ctx, p, a, out, &res, log)
		}
	}()
	defer func() { close(acts); <-computed }()
	for {
		m, err := p.Recv(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Info().Err(err).Msg("peer gone")
			}
			return
		}
		at := time.Now()
		switch m := m.(type) {
		case *wire.Prediction:
			s.traceRecv(trace.MsgPrediction, id.Name, m.Pass, m.Layer, 0, at)
			s.prefetch(ctx, m)
		case *wire.Activation:
			s.traceRecv(trace.MsgActivation, id.Name, m.Pass, m.Layer, m.ID, at)
			select {
			case acts <- m:
			case <-ctx.Done():
				return
			}
		case *wire.Withdraw:
			if len(m.Experts) > 0 {
				experts := make([]int, len(m.Experts))
				for i, e := range m.Experts {
					experts[i] = int(e)
				}
				s.engine.WithdrawExperts(model.Step{Seq: m.Seq, Pass: m.From}, m.Layer, experts)
			} else {
				s.engine.Withdraw(model.Step{Seq: m.Seq, Pass: m.From})
			}
		case *wire.SequenceEnd:
			s.endSequence(m.Seq)
		case *wire.Place:
			var in <-chan struct{}
			if s.place != nil {
				in = s.place(*m)
			}
			go func() { // its share in: the main node takes it into the layout
				if in != nil {
					select {
					case <-in:
					case <-p.Done(): // (this connection's answer is owed no more)
						return
					case <-ctx.Done():
						return
					}
				}
				var fetched int64
				if s.fetched != nil {
					fetched = s.fetched()
				}
				if err := p.Send(ctx, &wire.ShareIn{Fetched: fetched}); err != nil {
					log.Info().Err(err).Msg("telling the main node the share is in failed")
				}
			}()
		case *wire.Heartbeat:
			if err := p.Send(ctx, &wire.Heartbeat{Seq: m.Seq, UnixNano: time.Now().UnixNano()}); err != nil {
				log.Info().Err(err).Msg("answering a heartbeat failed")
			}
		case *wire.StatsRequest:
			if err := p.Send(ctx, s.Stats()); err != nil {
				log.Info().Err(err).Msg("sending the worker's counters failed")
			}
		case *wire.Trace:
			if err := wire.AnswerTrace(ctx, p, s.trace, m); err != nil {
				log.Info().Err(err).Msg("sending the trace failed")
			}
		default:
			log.Warn().Str("type", m.Type().String()).Msg("ignoring a message a worker does not handle")
		}
	}
}

// activate runs every expert the activation names on its hidden states
// and sends one result per expert; out and msg are reused.
func (s *Server) activate(ctx context.Context, p *wire.Peer, a *wire.Activation, out []float32, msg *wire.ExpertResult, log zerolog.Logger) []float32 {
	fail := func(expert int, code uint32, err error) {
		log.Warn().Uint64("seq", a.Seq).Int64("pass", a.Pass).Int("layer", a.Layer).Int("expert", expert).Err(err).Msg("request failed")
		p.Send(ctx, &wire.Error{Code: code, Msg: err.Error(), Pass: a.Pass, Layer: a.Layer, Expert: expert, ID: a.ID, Seq: a.Seq})
	}
	x, err := a.Hidden.Float32s()
	h := s.engine.hidden
	if err == nil && (a.Tokens <= 0 || len(x) != a.Tokens*h) {
		err = fmt.Errorf("activation of %d floats for %d tokens of hidden size %d", len(x), a.Tokens, h)
	}
	if err != nil {
		fail(-1, wire.ReqBadRequest, err)
		return out
	}
	// buf holds the outputs, then (for per-expert rows) the gathered rows
	buf := out
	if cap(buf) < 2*len(x) {
		buf = make([]float32, 2*len(x))
	}
	buf = buf[:2*len(x)]
	for i, e := range a.Experts {
		in, n := x, a.Tokens
		if rows := a.ExpertRows(i); rows != nil {
			in, n = buf[len(x):len(x)+len(rows)*h], len(rows)
			for j, r := range rows {
				copy(in[j*h:(j+1)*h], x[int(r)*h:(int(r)+1)*h])
			}
		}
		out := buf[:n*h]
		res, err := s.engine.Run(ctx, model.Step{Seq: a.Seq, Pass: a.Pass}, a.Layer, int(e), in, n, out, afterOf(a))
		if a.EndLayer && i == len(a.Experts)-1 {
			s.endLayer(a.Seq, a.Pass, a.Layer)
		}
		if err != nil {
			fail(int(e), requestCode(err), err)
			continue
		}
		if res.Miss {
			log.Debug().Int64("pass", a.Pass).Int("layer", a.Layer).Int32("expert", e).Msg("miss: expert loaded on demand")
		}
		if s.trace.Active(a.Pass) {
			if res.Stall > 0 {
				s.trace.Span(trace.Stall, a.Pass, a.Layer, int(e), res.Arrived, res.Arrived.Add(res.Stall))
			}
			s.trace.Span(trace.Compute, a.Pass, a.Layer, int(e), res.Started, res.Started.Add(res.Compute))
			s.trace.Message(trace.Send, trace.MsgResult, p.Identity().Name, a.Pass, a.Layer, int(e), a.ID, time.Now())
		}
		msg.Seq, msg.Pass, msg.Layer, msg.Expert, msg.ID = a.Seq, a.Pass, a.Layer, int(e), a.ID
		msg.Loaded, msg.Miss, msg.LoadTime, msg.ComputeTime, msg.StallTime, msg.Lead = res.Loaded, res.Miss, res.Load, res.Compute, res.Stall, res.Lead
		msg.Output.SetFloat32s(out, n, h)
		err = p.Send(ctx, msg)
		if err != nil {
			log.Info().Err(err).Msg("sending a result failed")
			return buf
		}
	}
	return buf
}

// afterOf is what becomes of an activation's experts once computed.
func afterOf(a *wire.Activation) After {
	switch {
	case a.Keep:
		return Hold
	case a.Cache:
		return Cache
	}
	return Evict
}

// Stats are the worker's counters, as a StatsRequest gets them.
func (s *Server) Stats() *wire.WorkerStats {
	st := &s.engine.Stats
	budget, inUse, peak := s.engine.Device().Memory()
	ws := &wire.WorkerStats{
		Loads: st.Loads.Load(), Hits: st.Hits.Load(), Misses: st.Misses.Load(), WastedLoads: st.Wasted.Load(),
		Refused: st.Refused.Load(), LatePredictions: s.late.Load(),
		LoadTime: time.Duration(st.LoadNanos.Load()), ComputeTime: time.Duration(st.ComputeNanos.Load()), StallTime: time.Duration(st.StallNanos.Load()),
		DeviceBudget: budget, DevicePeak: peak, DeviceInUse: inUse, RSSPeak: procmem.PeakRSS(), CPU: procmem.CPUTime(),
	}
	ws.WithdrawnLoads, ws.WithdrawnBytes = st.Withdrawn.Load(), st.WithdrawnBytes.Load()
	ws.StoreServed = s.served.Load()
	if s.fetched != nil {
		ws.StoreFetched = s.fetched()
	}
	n, b := s.engine.Cached()
	ws.ResidentHits, ws.ResidentEvicted, ws.ResidentExperts, ws.ResidentBytes = st.Resident.Load(), st.Evicted.Load(), int64(n), b
	if c := s.engine.Chunks; c != nil {
		ws.HostCompressedHits, ws.HostCompressedMisses, ws.HostCompressedBytes = c.Stats()
	}
	if h := s.engine.Host; h != nil {
		hits, misses, used := h.Stats()
		ws.HostCacheHits, ws.HostCacheMisses, ws.HostCacheBytes = int64(hits), int64(misses), used
	}
	return ws
}

// requestCode maps an engine error onto the protocol's request codes.
func requestCode(err error) uint32 {
	switch {
	case errors.Is(err, ErrOverBudget):
		return wire.ReqOverBudget
	case errors.Is(err, store.ErrNotFound):
		return wire.ReqBadRequest
	case damaged(err): // quarantined: the main node sends it to another worker
		return wire.ReqLoadFailed
	}
	return wire.ReqInternal
}
