package mainnode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
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

	// Shadow is the connection to the shadow node (-prefetch shadow).
	Shadow *wire.Peer
	// Align is when the shadow is re-aligned (-align-token, -align-kv).
	Align align.Policy
	// Layers, Experts and TopK size the recall scorer and the random policy.
	Layers, Experts, TopK int
	// Seed drives -prefetch random.
	Seed uint64
	// Trace, if set, records this node's part of the swarm's timeline
	// (StartTrace, CollectTrace).
	Trace *trace.Recorder
}

// Swarm runs experts on remote workers: the model.ExpertRunner of the main
// node. Not safe for concurrent RunExperts calls (a Session makes one at a
// time).
type Swarm struct {
	opt     Options
	workers []*link
	shadow  *shadowLink
	rng     *rand.Rand
	random  map[int]map[int]int // -prefetch random: layer -> expert -> worker hinted
	nextID  atomic.Uint64
	step    model.Step // the forward pass the current RunExperts call belongs to
	mark    time.Time  // end of the last RunExperts: main compute starts
	stats   Stats
	traced  [2]int64 // the iterations StartTrace asked for

	// reused per call
	experts []int
	assign  []int
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
	s := &Swarm{opt: opt}
	switch opt.Prefetch {
	case Shadow:
		if opt.Shadow == nil {
			return nil, fmt.Errorf("mainnode: -prefetch shadow needs a shadow node")
		}
		if opt.Shadow.Identity().Role != wire.RoleShadow {
			return nil, fmt.Errorf("mainnode: %s is a %s, not a shadow", opt.Shadow.Identity().Name, opt.Shadow.Identity().Role)
		}
		if err := opt.Align.Validate(); err != nil {
			return nil, err
		}
		s.shadow = newShadowLink(opt.Shadow, opt.Align, opt.TopK, opt.Layers, opt.Trace)
	case Random:
		if opt.Layers <= 0 || opt.TopK <= 0 || opt.Experts < opt.TopK {
			return nil, fmt.Errorf("mainnode: -prefetch random needs the model's layers and top-k")
		}
		s.rng = rand.New(rand.NewPCG(opt.Seed, 0x72616e64))
		s.random = map[int]map[int]int{}
	}
	for i, p := range peers {
		if p.Identity().Role != wire.RoleWorker {
			return nil, fmt.Errorf("mainnode: peer %d (%s) is a %s, not a worker", i, p.Identity().Name, p.Identity().Role)
		}
		l := &link{peer: p, index: i, waits: map[uint64]chan reply{}, beats: make(chan *wire.Heartbeat, 1), traces: make(chan *wire.Trace, 1)}
		go l.receive()
		s.workers = append(s.workers, l)
	}
	return s, nil
}

// Stats returns the figures measured so far.
func (s *Swarm) Stats() *Stats { return &s.stats }

// request is one Activation to one worker and what its results fill in.
type request struct {
	worker  int
	msg     *wire.Activation
	experts []int // as in msg
	tokens  []int // batch token index of each row of msg.Hidden
	replies chan reply
}

// RunExperts implements model.ExpertRunner over the workers.
func (s *Swarm) RunExperts(ctx context.Context, step model.Step, layer int, x []float32, n int, routes []model.Route, out []float32) error {
	start := time.Now()
	h := s.opt.Hidden
	prefill := n > 1
	s.step = step
	if !s.mark.IsZero() {
		s.stats.main(prefill, step.Iter, layer, start.Sub(s.mark))
		s.opt.Trace.Span(trace.Main, step.Iter, layer, -1, s.mark, start)
	}
	defer func() { s.mark = time.Now() }()
	if len(routes)%n != 0 || len(x) != n*h || len(out) != len(routes)*h {
		return fmt.Errorf("mainnode: %d routes for %d tokens, %d inputs, %d outputs at hidden size %d", len(routes), n, len(x), len(out), h)
	}
	k := len(routes) / n

	s.experts = s.experts[:0]
	for _, r := range routes {
		if !slices.Contains(s.experts, r.Expert) {
			s.experts = append(s.experts, r.Expert)
		}
	}
	slices.Sort(s.experts)
	switch {
	case s.opt.Prefetch == Resident:
		s.assign = s.opt.Layout.Owners(s.assign[:0], layer, s.experts)
	case prefill || (s.shadow == nil && s.random == nil):
		s.assign = s.opt.Layout.Assign(s.assign[:0], layer, s.experts, prefill)
	case s.shadow != nil:
		pred := s.shadow.routed(step, layer, s.experts)
		hinted := make(map[int]int, len(pred))
		for i, e := range pred {
			hinted[e] = s.opt.Layout.DecodeWorker(layer, i)
		}
		s.assign = s.opt.Layout.PlaceDecode(s.assign[:0], layer, s.experts, hinted)
	default: // random
		s.assign = s.opt.Layout.PlaceDecode(s.assign[:0], layer, s.experts, s.random[layer])
		delete(s.random, layer)
	}

	if err := s.hint(ctx, layer, prefill); err != nil {
		return err
	}
	reqs := s.requests(layer, x, n, k, routes, prefill)
	if err := s.send(ctx, reqs, prefill); err != nil {
		return err
	}
	return s.collect(ctx, layer, reqs, routes, k, out, prefill, start)
}

// hint sends the loading hints the policy calls for. Prefill always tells
// each worker the experts of this layer it will run (the paper's prefill
// loads every expert of a layer in parallel) and, unless the policy is
// reactive, those of the next layer too, so loading hides behind compute.
func (s *Swarm) hint(ctx context.Context, layer int, prefill bool) error {
	per := make(map[int][]int32)
	switch {
	case s.opt.Prefetch == Resident:
		return nil // nothing to load
	case prefill || s.opt.Prefetch == OracleNext:
		for i, e := range s.experts {
			per[s.assign[i]] = append(per[s.assign[i]], int32(e))
		}
	case s.opt.Prefetch == Random:
		// random experts for the next layer, to its group
		next := (layer + 1) % s.opt.Layers
		es := s.rng.Perm(s.opt.Experts)[:s.opt.TopK]
		slices.Sort(es)
		hinted := map[int]int{}
		nper := map[int][]int32{}
		for i, e := range es {
			w := s.opt.Layout.DecodeWorker(next, i)
			hinted[e] = w
			nper[w] = append(nper[w], int32(e))
		}
		s.random[next] = hinted
		for w, es := range nper {
			s.traceWorker(trace.Send, trace.MsgPrediction, w, next, -1, 0, time.Now())
			if err := s.workers[w].peer.Send(ctx, &wire.Prediction{Seq: s.step.Seq, Iteration: s.step.Iter, Layer: next, Experts: es}); err != nil {
				return s.workerErr(w, err)
			}
		}
		return nil
	default:
		return nil
	}
	for w, es := range per {
		s.traceWorker(trace.Send, trace.MsgPrediction, w, layer, -1, 0, time.Now())
		if err := s.workers[w].peer.Send(ctx, &wire.Prediction{Seq: s.step.Seq, Iteration: s.step.Iter, Layer: layer, Experts: es}); err != nil {
			return s.workerErr(w, err)
		}
	}
	return nil
}

// requests builds the activations: in decode one per worker with all its
// experts on the one token; in prefill one per mini-batch of each
// expert's tokens, the last one of an expert with Keep false.
func (s *Swarm) requests(layer int, x []float32, n, k int, routes []model.Route, prefill bool) []*request {
	h := s.opt.Hidden
	var reqs []*request
	if !prefill {
		byWorker := map[int]*request{}
		for i, e := range s.experts {
			w := s.assign[i]
			r := byWorker[w]
			if r == nil {
				r = &request{worker: w, tokens: []int{0}}
				r.msg = &wire.Activation{Seq: s.step.Seq, Iteration: s.step.Iter, Layer: layer, Tokens: 1, Hidden: wire.Float32Tensor(x[:h], 1, h)}
				byWorker[w] = r
				reqs = append(reqs, r)
			}
			r.experts = append(r.experts, e)
			r.msg.Experts = append(r.msg.Experts, int32(e))
		}
	} else {
		for i, e := range s.experts {
			var toks []int
			for t := range n {
				for _, rt := range routes[t*k : (t+1)*k] {
					if rt.Expert == e {
						toks = append(toks, t)
					}
				}
			}
			for lo := 0; lo < len(toks); lo += s.opt.MiniBatch {
				mb := toks[lo:min(lo+s.opt.MiniBatch, len(toks))]
				buf := make([]float32, len(mb)*h)
				for j, t := range mb {
					copy(buf[j*h:(j+1)*h], x[t*h:(t+1)*h])
				}
				r := &request{worker: s.assign[i], experts: []int{e}, tokens: mb}
				r.msg = &wire.Activation{Seq: s.step.Seq, Iteration: s.step.Iter, Layer: layer, Tokens: len(mb), Experts: []int32{int32(e)},
					Hidden: wire.Float32Tensor(buf, len(mb), h), Keep: lo+s.opt.MiniBatch < len(toks)}
				reqs = append(reqs, r)
			}
		}
	}
	// each worker's last request of the layer ends the layer there
	last := map[int]*request{}
	for _, r := range reqs {
		last[r.worker] = r
	}
	for _, r := range last {
		r.msg.EndLayer = true
	}
	for _, r := range reqs {
		r.msg.ID = s.nextID.Add(1)
		r.replies = make(chan reply, len(r.experts))
		s.workers[r.worker].expect(r.msg.ID, r.replies)
	}
	return reqs
}

// send sends every request; in prefill each worker's requests go out on
// their own goroutine, in order, so transfers to different workers overlap.
func (s *Swarm) send(ctx context.Context, reqs []*request, prefill bool) error {
	if !prefill {
		for _, r := range reqs {
			s.traceWorker(trace.Send, trace.MsgActivation, r.worker, r.msg.Layer, -1, r.msg.ID, time.Now())
			if err := s.workers[r.worker].peer.Send(ctx, r.msg); err != nil {
				return s.workerErr(r.worker, err)
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	errs := make([]error, len(s.workers))
	for w := range s.workers {
		wg.Go(func() {
			for _, r := range reqs {
				if r.worker != w {
					continue
				}
				s.traceWorker(trace.Send, trace.MsgActivation, w, r.msg.Layer, -1, r.msg.ID, time.Now())
				if err := s.workers[w].peer.Send(ctx, r.msg); err != nil {
					errs[w] = s.workerErr(w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// collect waits for every result, places each output row where its route
// is, and records the layer's figures.
func (s *Swarm) collect(ctx context.Context, layer int, reqs []*request, routes []model.Route, k int, out []float32, prefill bool, start time.Time) error {
	h := s.opt.Hidden
	var crit time.Duration // the slowest request's worker-side time
	var ls layerSample
	for _, r := range reqs {
		for range r.experts {
			var rp reply
			select {
			case rp = <-r.replies:
			case <-ctx.Done():
				return ctx.Err()
			}
			if rp.err != nil {
				return fmt.Errorf("mainnode: layer %d on worker %d (%s): %w", layer, r.worker, s.workers[r.worker].peer.Identity().Name, rp.err)
			}
			res := rp.res
			got, err := res.Output.Float32s()
			if err != nil || len(got) != len(r.tokens)*h || !slices.Contains(r.experts, res.Expert) {
				return fmt.Errorf("mainnode: layer %d: worker %d sent a result for expert %d of %d floats, want one of %v with %d", layer, r.worker, res.Expert, len(got), r.experts, len(r.tokens)*h)
			}
			for j, t := range r.tokens {
				for q, rt := range routes[t*k : (t+1)*k] {
					if rt.Expert == res.Expert {
						copy(out[(t*k+q)*h:(t*k+q+1)*h], got[j*h:(j+1)*h])
					}
				}
			}
			ls.add(res)
			s.traceWorker(trace.Recv, trace.MsgResult, r.worker, layer, res.Expert, r.msg.ID, rp.at)
			crit = max(crit, res.StallTime+res.ComputeTime)
		}
	}
	wall := time.Since(start)
	ls.wall, ls.network = wall, max(wall-crit, 0)
	s.stats.experts(prefill, s.step.Iter, layer, ls)
	return nil
}

// traceWorker records a message to or from worker w, when this iteration
// is traced.
func (s *Swarm) traceWorker(kind trace.Kind, msg string, w, layer, expert int, id uint64, at time.Time) {
	if s.opt.Trace.Active(s.step.Iter) {
		s.opt.Trace.Message(kind, msg, s.workers[w].peer.Identity().Name, s.step.Iter, layer, expert, id, at)
	}
}

func (s *Swarm) workerErr(w int, err error) error {
	return fmt.Errorf("mainnode: worker %d (%s): %w", w, s.workers[w].peer.Identity().Name, err)
}

// Close closes the worker connections.
func (s *Swarm) Close() error {
	var errs []error
	for _, l := range s.workers {
		errs = append(errs, l.peer.Close())
	}
	return errors.Join(errs...)
}

// BeforeForward is the generation hook (model.GenerateOptions) that departs
// and aligns the shadow for the forward pass of step; a no-op without one.
func (s *Swarm) BeforeForward(ctx context.Context, step model.Step, tokens []int, cache *kvcache.Cache) error {
	if s.shadow == nil {
		return nil
	}
	return s.shadow.start(ctx, step, tokens, cache)
}

// EndSequence tells every worker and the shadow that sequence seq is over,
// so that they free what they keep for it (hints for iterations that never
// came, the shadow's copy of the sequence). Call it after ShadowStats and
// CollectTrace, which read what the sequence left.
func (s *Swarm) EndSequence(ctx context.Context, seq uint64) error {
	end := &wire.SequenceEnd{Seq: seq}
	for i, l := range s.workers {
		if err := l.peer.Send(ctx, end); err != nil {
			return s.workerErr(i, err)
		}
	}
	if s.shadow != nil {
		if err := s.shadow.peer.Send(ctx, end); err != nil {
			return fmt.Errorf("mainnode: ending sequence %d on the shadow: %w", seq, err)
		}
	}
	return nil
}

// ShadowStats waits (up to timeout) for the shadow to finish the last
// iteration run and returns its recall and late departures; ok is false
// without a shadow.
func (s *Swarm) ShadowStats(timeout time.Duration) (st ShadowStats, ok bool) {
	if s.shadow == nil {
		return st, false
	}
	return s.shadow.stats(s.step.Iter, timeout), true
}
