package model

import (
	"context"
	"fmt"
	"math"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/kvcache"
)

// The blocks a decoder layer is made of. A family (mixtral.go) binds its
// tensors to these and sets their switches; the Session runs them in
// order. A family whose layers differ (query/key norms, a dense or shared
// feed-forward) adds the block or switch here and says so in its file.

// Layer is one decoder block: attention, then a feed-forward block, MoE
// or Dense (exactly one is set).
type Layer struct {
	Attention Attention
	MoE       *MoE   // the sparse feed-forward block
	Dense     *Dense // a dense layer's feed-forward block
}

// feedForward is the second half of a layer.
type feedForward interface {
	forward(ctx context.Context, s *Session, step Step, l, n int) error
}

// ffn is the layer's feed-forward block.
func (L *Layer) ffn() feedForward {
	if L.Dense != nil {
		return L.Dense
	}
	return L.MoE
}

// Dense is a dense layer's feed-forward block: pre-norm and one SwiGLU
// MLP every token runs, held with the non-expert weights (Qwen's
// mlp_only_layers).
type Dense struct {
	Norm []float32 // [hidden]
	MLP  Expert
}

// forward runs the block on the session's batch: x += MLP(norm(x)).
func (d *Dense) forward(_ context.Context, s *Session, _ Step, _, n int) error {
	c := s.m.Config
	h := c.HiddenSize
	s.hn = grow(s.hn, n*h)
	for t := range n {
		kernels.RMSNorm(s.hn[t*h:(t+1)*h], s.x[t*h:(t+1)*h], d.Norm, float32(c.RMSNormEps))
	}
	s.proj = grow(s.proj, n*h)
	d.MLP.Forward(s.proj, s.hn[:n*h], n, &s.ffnScratch)
	kernels.Add(s.x[:n*h], s.proj[:n*h])
	return nil
}

// Attention is pre-norm grouped-query self-attention with rotate-half
// RoPE over the sequence's KV cache (and a sliding window if the config
// has one). QNorm and KNorm, when set, are RMSNorm weights applied before
// RoPE: over each head when they are head_dim long (Qwen3), over the whole
// query and key projections when they are that long (OLMoE). With the
// config's ClipQKV, queries, keys and values are then clamped (OLMoE).
type Attention struct {
	Norm         []float32      // [hidden]
	Q, K, V, O   kernels.Matrix // projections
	QNorm, KNorm []float32      // [head_dim], or [heads*head_dim] and [kv_heads*head_dim], or nil
	// QBias, KBias and VBias, when set (Qwen2-MoE, gpt-oss), are added to
	// the projections, OBias (gpt-oss) to the output projection's.
	QBias, KBias, VBias, OBias []float32
	// MLA, when set (DeepSeek-V3), makes this Multi-head Latent
	// Attention: K and V are unused, Q is q_proj or unset (MLA's QA, QB).
	MLA *MLAWeights
	// Sinks, when set (gpt-oss), are each head's learned attention sink
	// (kernels.AttendSink); Window, when positive, is this layer's
	// sliding window (Config.WindowOf, set at bind: the config's
	// sliding_window, or gpt-oss's alternating windowed and full layers).
	Sinks  []float32 // [heads]
	Window int
}

// MoE is a sparse feed-forward block: pre-norm, a router choosing each
// token's top-k experts (softmax, or Grouped's; renormalised when
// NormTopK), the experts,
// and their outputs mixed in expert-id order. The experts run wherever
// the session's ExpertRunner puts them; Experts is nil on a main node.
type MoE struct {
	Norm     []float32      // [hidden]
	Router   kernels.Matrix // [experts, hidden]
	Experts  []Expert
	NormTopK bool
	// Shared, when set (Qwen2-MoE, DeepSeek-V3), is an expert every token
	// runs, scaled by sigmoid(SharedGate x) (unscaled without SharedGate)
	// and added to the routed experts' mix. Every
	// token needs it, so it is held and run with the non-expert weights
	// (on the main node), never on a worker.
	Shared     *Expert
	SharedGate kernels.Matrix // [1, hidden]
	// Grouped, when set (DeepSeek-V3), routes with sigmoid scores, a
	// choice bias and group-limited top-k instead of the softmax router.
	Grouped *GroupRouting
	// RouterBias, when set (gpt-oss), is added to the router's logits;
	// SoftmaxOfTopK (gpt-oss) weights the k largest logits by their own
	// softmax instead of the softmax over every expert.
	RouterBias    []float32
	SoftmaxOfTopK bool
}

// forward runs the block on s's n rows at layer l (the KV cache layer
// each row reads and extends, where rows says): x += O(attn(norm(x))).
// The projections go over their weights once for all rows; only
// attention is per row, over its own cache.
func (a *Attention) forward(s *Session, l, n int, rows kvRows) error {
	if a.MLA != nil {
		return a.forwardMLA(s, l, n, rows)
	}
	a.project(s, n)
	if err := a.attend(s, l, n, rows); err != nil {
		return err
	}
	a.output(s, n)
	return nil
}

// project computes the queries, keys and values of s's n rows of x
// (s.q, s.k, s.v): norm, the three products in one pass over the
// weights, then the family's biases, norms and clipping.
func (a *Attention) project(s *Session, n int) {
	c := s.m.Config
	h, hd := c.HiddenSize, c.HeadDim
	qw, kvw := c.NumHeads*hd, c.NumKVHeads*hd
	eps := float32(c.RMSNormEps)
	s.hn = grow(s.hn, n*h)
	for t := range n {
		kernels.RMSNorm(s.hn[t*h:(t+1)*h], s.x[t*h:(t+1)*h], a.Norm, eps)
	}
	s.q, s.k, s.v = grow(s.q, n*qw), grow(s.k, n*kvw), grow(s.v, n*kvw)
	s.qkv = [3]kernels.Product{{Out: s.q[:n*qw], W: a.Q}, {Out: s.k[:n*kvw], W: a.K}, {Out: s.v[:n*kvw], W: a.V}}
	kernels.MatMulEach(s.hn[:n*h], n, s.qkv[:])
	if a.QBias != nil {
		for t := range n {
			kernels.Add(s.q[t*qw:(t+1)*qw], a.QBias)
			kernels.Add(s.k[t*kvw:(t+1)*kvw], a.KBias)
			kernels.Add(s.v[t*kvw:(t+1)*kvw], a.VBias)
		}
	}
	if a.QNorm != nil {
		qn, kn := len(a.QNorm), len(a.KNorm) // a head, or the whole projection
		for i := 0; i < n*qw; i += qn {
			kernels.RMSNorm(s.q[i:i+qn], s.q[i:i+qn], a.QNorm, eps)
		}
		for i := 0; i < n*kvw; i += kn {
			kernels.RMSNorm(s.k[i:i+kn], s.k[i:i+kn], a.KNorm, eps)
		}
	}
	if c.ClipQKV > 0 {
		lim := float32(c.ClipQKV)
		for _, v := range [][]float32{s.q[:n*qw], s.k[:n*kvw], s.v[:n*kvw]} {
			for i, x := range v {
				v[i] = min(max(x, -lim), lim)
			}
		}
	}
}

// kvRows says where each row of a pass sits: its sequence's KV cache and
// position. A session's rows are consecutive positions of one cache
// (start, start+1, ...); a Batch's rows are seqs[t]'s position starts[t]
// (a member's rows consecutive).
type kvRows struct {
	cache  *kvcache.Cache
	start  int
	seqs   []*Session
	starts []int
}

func (r kvRows) at(t int) (*kvcache.Cache, int) {
	if r.seqs == nil {
		return r.cache, r.start + t
	}
	return r.seqs[t].cache, r.starts[t]
}

// attend rotates s's n rows of queries and keys to their positions,
// stores each row's key and value in its KV cache at layer l, and
// attends each row over its cache up to its own position, into s.att.
func (a *Attention) attend(s *Session, l, n int, rows kvRows) error {
	c := s.m.Config
	hd := c.HeadDim
	qw, kvw := c.NumHeads*hd, c.NumKVHeads*hd
	s.cos, s.sin = grow(s.cos, hd/2), grow(s.sin, hd/2)
	span, positions := 0, 0 // the longest row's positions, all rows'
	for t := range n {
		cache, pos := rows.at(t)
		s.ropeAt(pos)
		kernels.RoPE(s.q[t*qw:(t+1)*qw], c.NumHeads, hd, s.cos, s.sin)
		kernels.RoPE(s.k[t*kvw:(t+1)*kvw], c.NumKVHeads, hd, s.cos, s.sin)
		if err := cache.Put(l, pos, s.k[t*kvw:(t+1)*kvw], s.v[t*kvw:(t+1)*kvw]); err != nil {
			return err
		}
		if lo := max(pos-a.Window+1, 0); a.Window > 0 && lo < cache.Base(l) {
			return fmt.Errorf("model: layer %d's KV cache no longer holds position %d, which position %d reads (a sequence stepped back more than %d positions)",
				l, lo, pos, kvcache.WindowSlack)
		}
		span, positions = max(span, pos+1), positions+pos+1
	}
	s.att = grow(s.att, n*qw)
	group := c.NumHeads / c.NumKVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	// every (token, head) on its own, over the thread team: a chunk of
	// them shares one scores buffer
	heads := n * c.NumHeads
	chunks := kernels.ParallelChunks(heads, 2*c.NumHeads*positions*hd)
	s.scores = grow(s.scores, chunks*span)
	kernels.ParallelFor(chunks, heads, func(ch, i0, i1 int) {
		scores := s.scores[ch*span : (ch+1)*span]
		for i := i0; i < i1; i++ {
			t, head := i/c.NumHeads, i%c.NumHeads
			cache, pos := rows.at(t)
			keys, values := cache.Keys(l, pos+1), cache.Values(l, pos+1)
			lo := 0
			if a.Window > 0 && pos-a.Window+1 > 0 {
				lo = pos - a.Window + 1
			}
			// a windowed layer's cache starts at its base: it holds lo on
			// (the pass started within its slack: kvcache.Cache.Holds)
			keys, values = keys[(lo-cache.Base(l))*kvw:], values[(lo-cache.Base(l))*kvw:]
			q := s.q[t*qw+head*hd : t*qw+(head+1)*hd]
			out := s.att[t*qw+head*hd : t*qw+(head+1)*hd]
			// positions lo..pos of the head's KV head, kvw floats apart
			if a.Sinks != nil {
				kernels.AttendSink(out, scores[:pos+1-lo], q, keys, values, kvw, (head/group)*hd, scale, a.Sinks[head])
			} else {
				kernels.Attend(out, scores[:pos+1-lo], q, keys, values, kvw, (head/group)*hd, scale)
			}
		}
	})
	return nil
}

// ropeAt fills s.cos and s.sin for position pos: the rotary table, times
// YaRN's attention factor where there is one (transformers'
// attention_scaling).
func (s *Session) ropeAt(pos int) {
	kernels.RoPETable(s.cos, s.sin, pos, s.invFreq)
	if s.ropeMul != 1 {
		for i := range s.cos {
			s.cos[i] *= s.ropeMul
			s.sin[i] *= s.ropeMul
		}
	}
}

// output adds the attention's output projection of s's n rows to x.
func (a *Attention) output(s *Session, n int) {
	h := s.m.Config.HiddenSize
	s.proj = grow(s.proj, n*h)
	kernels.MatMul(s.proj, a.O, s.att, n)
	if a.OBias != nil {
		for t := range n {
			kernels.Add(s.proj[t*h:(t+1)*h], a.OBias)
		}
	}
	kernels.Add(s.x[:n*h], s.proj[:n*h])
}

// forward runs the block on the session's batch at layer l: route each
// token, run its experts on the session's ExpertRunner, mix their outputs
// in expert-id order, add to the residual.
func (b *MoE) forward(ctx context.Context, s *Session, step Step, l, n int) error {
	c := s.m.Config
	h, E, k := c.HiddenSize, c.NumExperts, c.TopK
	s.hn = grow(s.hn, n*h)
	for t := range n {
		kernels.RMSNorm(s.hn[t*h:(t+1)*h], s.x[t*h:(t+1)*h], b.Norm, float32(c.RMSNormEps))
	}
	s.routerLogits = grow(s.routerLogits, n*E)
	kernels.MatMul(s.routerLogits, b.Router, s.hn, n)
	if cap(s.routes) < n*k {
		s.routes = make([]Route, n*k)
	}
	s.routes = s.routes[:n*k]
	if b.RouterBias != nil {
		for t := range n {
			kernels.Add(s.routerLogits[t*E:(t+1)*E], b.RouterBias)
		}
	}
	if b.SoftmaxOfTopK {
		s.probs = grow(s.probs, k)
		for t := range n {
			routeTopKSoftmax(s.routes[t*k:(t+1)*k], s.routerLogits[t*E:(t+1)*E], s.probs)
		}
	} else if g := b.Grouped; g != nil {
		s.probs = grow(s.probs, g.scratch(E))
		for t := range n {
			routeGrouped(s.routes[t*k:(t+1)*k], s.routerLogits[t*E:(t+1)*E], s.probs, g, b.NormTopK)
		}
	} else {
		s.probs = grow(s.probs, E)
		for t := range n {
			route(s.routes[t*k:(t+1)*k], s.routerLogits[t*E:(t+1)*E], s.probs, b.NormTopK)
		}
	}
	if s.OnRoute != nil {
		s.OnRoute(step, l, s.routerLogits, s.routes)
	}
	s.expertOut = grow(s.expertOut, n*k*h)
	if err := s.experts.RunExperts(ctx, step, l, s.hn[:n*h], n, s.routes, s.expertOut); err != nil {
		return err
	}
	s.proj = grow(s.proj, n*h)
	for t := range n {
		mix := s.proj[t*h : (t+1)*h]
		clear(mix)
		// fixed summation order (routes are sorted by expert id): swarm == local
		for j, r := range s.routes[t*k : (t+1)*k] {
			kernels.Axpy(mix, r.Weight, s.expertOut[(t*k+j)*h:(t*k+j+1)*h])
		}
	}
	if b.Shared != nil {
		s.shared = grow(s.shared, n*h)
		b.Shared.Forward(s.shared, s.hn[:n*h], n, &s.ffnScratch)
		if b.SharedGate.Rows == 0 { // DeepSeek-V3's: added as it is
			kernels.Add(s.proj[:n*h], s.shared[:n*h])
		} else {
			s.sharedGate = grow(s.sharedGate, n)
			kernels.MatMul(s.sharedGate, b.SharedGate, s.hn, n)
			for t := range n {
				g := 1 / (1 + kernels.Exp(-s.sharedGate[t])) // sigmoid
				kernels.Axpy(s.proj[t*h:(t+1)*h], g, s.shared[t*h:(t+1)*h])
			}
		}
	}
	kernels.Add(s.x[:n*h], s.proj[:n*h])
	return nil
}
