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
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// Node runs the shadow model for one main node at a time.
type Node struct {
	m       *model.Model // quantized
	workers []*wire.Peer
	layout  sched.Layout
	log     zerolog.Logger

	sess    *model.Session
	seq     uint64 // the main node's id of the sequence sess follows
	next    int    // the token the shadow itself sampled last (valid unless headDue)
	headDue bool   // the last forward pass's head has not run yet (see iterate)
	it      int64  // the iteration being run
	mainP   *wire.Peer
	ctx     context.Context
	experts []int
	sendErr error
	trace   *trace.Recorder
	mark    time.Time // the end of the last traced piece of the forward pass
}

// NewNode returns a shadow over the quantized model m that hints workers
// (in layout order).
func NewNode(m *model.Model, workers []*wire.Peer, layout sched.Layout, log zerolog.Logger) (*Node, error) {
	if len(workers) != layout.Workers {
		return nil, fmt.Errorf("shadow: %d worker connections for a layout of %d", len(workers), layout.Workers)
	}
	return &Node{m: m, workers: workers, layout: layout, log: log, trace: trace.NewRecorder("shadow")}, nil
}

// ServeMain follows one main node until its connection ends: alignments
// start iterations, run in iteration order.
func (n *Node) ServeMain(ctx context.Context, p *wire.Peer) error {
	n.mainP, n.ctx = p, ctx
	// Alignments travel on bulk streams and may arrive out of order: each
	// waits here until its iteration is next in its sequence.
	type seqIter struct {
		seq uint64
		it  int64
	}
	pending := map[seqIter]*wire.Alignment{}
	var ended []uint64 // sequences the main node ended, most recent last
	for {
		m, err := p.Recv(ctx)
		if err != nil {
			return err
		}
		if t, ok := m.(*wire.Trace); ok {
			if err := wire.AnswerTrace(ctx, p, n.trace, t); err != nil {
				return err
			}
			continue
		}
		if end, ok := m.(*wire.SequenceEnd); ok {
			if end.Seq == n.seq {
				n.sess, n.seq, n.it = nil, 0, 0
			}
			maps.DeleteFunc(pending, func(k seqIter, _ *wire.Alignment) bool { return k.seq == end.Seq })
			ended = append(ended[max(0, len(ended)-63):], end.Seq)
			continue
		}
		a, ok := m.(*wire.Alignment)
		if !ok {
			continue
		}
		n.trace.Message(trace.Recv, trace.MsgAlignment, p.Identity().Name, a.Iteration, 0, -1, 0, time.Now())
		if slices.Contains(ended, a.Seq) {
			n.log.Warn().Uint64("seq", a.Seq).Int64("iteration", a.Iteration).Msg("alignment for a sequence that has ended: dropped")
			continue
		}
		if len(a.Prompt) > 0 { // a new sequence: the shadow follows one at a time
			maps.DeleteFunc(pending, func(k seqIter, _ *wire.Alignment) bool { return k.seq != a.Seq })
			n.it, n.seq = 0, a.Seq
		}
		pending[seqIter{a.Seq, a.Iteration}] = a
		for {
			k := seqIter{n.seq, n.it + 1}
			a, ok := pending[k]
			if !ok {
				break
			}
			delete(pending, k)
			if err := n.iterate(a); err != nil {
				return err
			}
		}
	}
}

// iterate runs one iteration: the prompt (no predictions: prefill loads
// every expert anyway) or one decode step after applying the alignment.
func (n *Node) iterate(a *wire.Alignment) error {
	start := time.Now()
	n.it = a.Iteration
	if len(a.Prompt) > 0 {
		toks := make([]int, len(a.Prompt))
		for i, t := range a.Prompt {
			toks[i] = int(t)
		}
		n.sess = model.NewSession(n.m, model.NewResidentExperts(n.m), len(toks)+256)
		if err := n.sess.ForwardHidden(n.ctx, toks); err != nil {
			return fmt.Errorf("shadow: prompt: %w", err)
		}
		n.headDue = true
		return nil
	}
	if n.sess == nil {
		return fmt.Errorf("shadow: iteration %d before any prompt", a.Iteration)
	}
	if len(a.Keys) > 0 {
		kv, err := kvRows(a)
		if err == nil {
			err = kv.Apply(n.sess.Cache())
		}
		if err != nil {
			return fmt.Errorf("shadow: iteration %d KV alignment: %w", a.Iteration, err)
		}
	}
	// The output head (the vocabulary-sized matvec) only gives the shadow
	// its own next token, which it needs only when the main node does not
	// send one: run it lazily, here, when it is due and the alignment has
	// no token, so with token alignment it never delays a departure.
	token := int(a.Token)
	if a.Token < 0 {
		if n.headDue {
			n.next = model.Argmax(n.sess.Logits())
		}
		token = n.next
	}
	n.headDue = false
	late := time.Since(start) // late departure: the alignment's own cost here
	n.trace.Span(trace.Align, a.Iteration, 0, -1, start, start.Add(late))
	n.sess.OnRoute = n.predict
	n.sendErr = nil
	t0 := time.Now()
	n.mark = t0
	err := n.sess.ForwardHidden(n.ctx, []int{token})
	forward := time.Since(t0)
	n.trace.Span(trace.Shadow, a.Iteration, n.m.Config.NumLayers, -1, n.mark, t0.Add(forward))
	n.sess.OnRoute = nil
	if err != nil {
		return fmt.Errorf("shadow: iteration %d: %w", a.Iteration, err)
	}
	n.headDue = true
	if n.sendErr != nil {
		return n.sendErr
	}
	return n.mainP.Send(n.ctx, &wire.Heartbeat{Seq: uint64(a.Iteration), UnixNano: time.Now().UnixNano(),
		Stats: wire.Metrics{"iteration": float64(a.Iteration), "late_departure_ms": float64(late) / 1e6,
			"forward_ms": float64(forward) / 1e6, "rss_peak_bytes": float64(procmem.PeakRSS())}})
}

// predict is the Session's routing hook: the moment layer l is routed,
// hint its group's workers and tell the main node.
func (n *Node) predict(_ model.Step, l int, _ []float32, routes []model.Route) {
	if n.sendErr != nil {
		return
	}
	now := time.Now()
	n.trace.Span(trace.Shadow, n.it, l, -1, n.mark, now)
	n.mark = now
	n.experts = n.experts[:0]
	for _, r := range routes {
		if !slices.Contains(n.experts, r.Expert) {
			n.experts = append(n.experts, r.Expert)
		}
	}
	slices.Sort(n.experts)
	all := make([]int32, len(n.experts))
	per := map[int][]int32{}
	for i, e := range n.experts {
		all[i] = int32(e)
		w := n.layout.DecodeWorker(l, i)
		per[w] = append(per[w], int32(e))
	}
	for w, es := range per {
		n.trace.Message(trace.Send, trace.MsgPrediction, n.workers[w].Identity().Name, n.it, l, -1, 0, time.Now())
		if err := n.workers[w].Send(n.ctx, &wire.Prediction{Seq: n.seq, Iteration: n.it, Layer: l, Experts: es}); err != nil {
			n.sendErr = fmt.Errorf("shadow: hinting worker %d: %w", w, err)
			return
		}
	}
	n.trace.Message(trace.Send, trace.MsgPrediction, n.mainP.Identity().Name, n.it, l, -1, 0, time.Now())
	if err := n.mainP.Send(n.ctx, &wire.Prediction{Seq: n.seq, Iteration: n.it, Layer: l, Experts: all}); err != nil {
		n.sendErr = fmt.Errorf("shadow: telling the main node: %w", err)
	}
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
