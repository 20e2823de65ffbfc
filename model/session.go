package model

import (
	"context"
	"fmt"
	"slices"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/kvcache"
)

// Session decodes one sequence: it owns the KV cache and every working
// buffer, so a token step allocates nothing once the buffers have grown to
// the largest batch seen. It has its own sequence id and counts its forward
// passes (Step). Not safe for concurrent use; Sessions are independent of
// each other.
type Session struct {
	// OnRoute, if set, sees every layer's routing decision for the batch:
	// router logits (n*experts) and routes (n*topk). Both are reused after
	// it returns. The shadow node uses it to send its predictions.
	OnRoute func(step Step, layer int, routerLogits []float32, routes []Route)

	m       *Model
	seq     uint64
	iter    int64 // forward passes run
	experts ExpertRunner
	cache   *kvcache.Cache
	layers  LayerRange // the layers it runs (a stage's), and its cache holds
	invFreq []float32
	ropeMul float32 // cos and sin are multiplied by it (YaRN's attention factor), unless 1

	// working buffers, n = tokens in the current batch
	x, hn, q, k, v, att, proj []float32 // n * width
	cos, sin, scores, probs   []float32
	routerLogits              []float32     // n * experts
	routes                    []Route       // n * topk
	expertOut                 []float32     // n * topk * hidden
	shared, sharedGate        []float32     // a shared expert's output and gate, n * hidden and n
	ffnScratch                ExpertScratch // a shared expert's or a dense MLP's
	qkv                       [3]kernels.Product
	logits                    []float32 // vocab for each kept row
	// kept are the last pass's rows whose hidden state x holds, first
	// rows first, for Logits and LogitsOf (0: none); keep is how many a
	// batch's pass keeps (KeepRows; 0 is 1)
	kept, keep int
	headDone   bool // logits hold the head of every kept row (Batch.Logits)
}

// NewSession starts an empty sequence on m whose experts run on experts.
// capacity is a hint for the longest sequence (the cache grows past it).
//
// Of a model that holds only some layers, the session holds those.
func NewSession(m *Model, experts ExpertRunner, capacity int) *Session {
	s, err := NewStageSession(m, experts, capacity, m.held)
	if err != nil {
		panic(err) // the whole model's layers: cannot be
	}
	return s
}

// NewStageSession starts an empty sequence on m of which this process
// runs layers r (one stage of a staged model: Batch.ForwardLayers); its
// cache holds those layers' rows only.
func NewStageSession(m *Model, experts ExpertRunner, capacity int, r LayerRange) (*Session, error) {
	c := m.Config
	if err := r.heldOf(c.NumLayers); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if !m.held.Covers(r) {
		return nil, fmt.Errorf("model: a session of layers %s on a model that holds %s", r, m.held)
	}
	if c.MLA != nil {
		cache := kvcache.NewLatent(c.NumLayers, c.KVWidth(), 0)
		if err := cache.SetLayers(r.First, r.End); err != nil {
			return nil, err
		}
		cache.Reserve(capacity)
		return newSession(m, experts, cache), nil
	}
	cache := kvcache.New(c.NumLayers, c.NumKVHeads, c.HeadDim, 0)
	if err := cache.SetLayers(r.First, r.End); err != nil {
		return nil, err
	}
	// a windowed layer's cache holds only what its window reads
	windows := make([]int, c.NumLayers)
	for l := range windows {
		windows[l] = m.Layers[l].Attention.Window
	}
	if slices.ContainsFunc(windows, func(w int) bool { return w > 0 }) {
		if err := cache.SetWindows(windows); err != nil {
			return nil, err
		}
	}
	cache.Reserve(capacity)
	return newSession(m, experts, cache), nil
}

// newSession starts a sequence on m that goes on after the rows in cache.
func newSession(m *Model, experts ExpertRunner, cache *kvcache.Cache) *Session {
	c := m.Config
	first, end := cache.HeldLayers()
	s := &Session{
		m:       m,
		seq:     nextSeq(),
		experts: experts,
		cache:   cache,
		layers:  LayerRange{first, end},
		logits:  make([]float32, c.VocabSize),
	}
	s.invFreq, s.ropeMul = c.ropeTables(c.HeadDim)
	return s
}

// Seq is the session's sequence id, unique within this process.
func (s *Session) Seq() uint64 { return s.seq }

// Next is the step the next forward pass will run.
func (s *Session) Next() Step { return Step{Seq: s.seq, Pass: s.iter + 1} }

// Len is the number of positions already in the KV cache.
func (s *Session) Len() int { return s.cache.Len() }

// Cache exposes the KV cache (for alignment and tests).
func (s *Session) Cache() *kvcache.Cache { return s.cache }

// Layers are the layers the session runs and its cache holds.
func (s *Session) Layers() LayerRange { return s.layers }

// Forward appends tokens at positions Len().. and returns the logits after
// the last one. The slice is reused by the next call.
func (s *Session) Forward(ctx context.Context, tokens []int) ([]float32, error) {
	if err := s.ForwardHidden(ctx, tokens); err != nil {
		return nil, err
	}
	return s.Logits(), nil
}

// ForwardHidden is Forward without the output head: it appends tokens to
// the sequence and keeps the last hidden state, for Logits. (The shadow
// node skips the head when the main node will send it the token anyway.)
func (s *Session) ForwardHidden(ctx context.Context, tokens []int) error {
	c, m := s.m.Config, s.m
	n, h := len(tokens), c.HiddenSize
	if n == 0 {
		return fmt.Errorf("model: Forward with no tokens")
	}
	if s.layers != m.held || m.held.First > 0 {
		return fmt.Errorf("model: Forward of a session of layers %s (a stage's: Batch.ForwardLayers)", s.layers)
	}
	start := s.cache.Len()
	if start+n > c.MaxPositions {
		return fmt.Errorf("model: position %d exceeds the context of %d positions (max_position_embeddings, or -context)", start+n-1, c.MaxPositions)
	}
	for _, id := range tokens {
		if id < 0 || id >= c.VocabSize {
			return fmt.Errorf("model: token id %d outside the vocabulary of %d", id, c.VocabSize)
		}
	}
	s.iter++
	step := Step{Seq: s.seq, Pass: s.iter}
	s.cache.Reserve(start + n)
	s.x = grow(s.x, n*h)
	s.kept, s.headDone = 0, false
	for t, id := range tokens {
		s.m.embed(s.x[t*h:(t+1)*h], id)
	}
	rows := kvRows{cache: s.cache, start: start}
	for l := m.held.First; l < m.held.End; l++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		L := &s.m.Layers[l]
		if err := L.Attention.forward(s, l, n, rows); err != nil {
			return err
		}
		if err := L.ffn().forward(ctx, s, step, l, n); err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	if err := s.cache.Commit(start + n); err != nil {
		return err
	}
	if m.held.End < c.NumLayers {
		if err := m.runRest(ctx, step, []RowSpan{{Seq: s.seq, Start: start, Count: n}}, s.x[:n*h], s.OnRoute); err != nil {
			return err
		}
	}
	s.kept = n
	return nil
}

// embed writes token id's embedding row, as float32, into dst (hidden
// size long).
func (m *Model) embed(dst []float32, id int) {
	n := len(dst) * m.Embed.DType.Size()
	kernels.ToFloat32(dst, m.Embed.Data[id*n:(id+1)*n], m.Embed.DType)
}

// Logits computes the output head on the last hidden state of the last
// ForwardHidden (nil if there is none). The slice is reused.
func (s *Session) Logits() []float32 { return s.LogitsOf(s.kept - 1) }

// KeepRows makes each later pass of a Batch keep the hidden state of its
// last n rows of this session (1 below 1), for LogitsOf: a pass that
// checks guessed tokens needs the logits after each of them. A Forward
// of the session alone keeps all its rows.
func (s *Session) KeepRows(n int) { s.keep = n }

// Kept is how many of the last pass's rows LogitsOf can be asked for:
// the last Kept rows it fed.
func (s *Session) Kept() int { return s.kept }

// LogitsOf computes the output head on the hidden state after the i-th
// of the last pass's kept rows (0 the first kept, Kept()-1 the last: what
// Logits computes), nil when there is no such row. Each row's logits are
// the bits one pass feeding up to that row would give. The slice is
// reused: where Batch.Logits has not computed every kept row's, the next
// call overwrites it.
func (s *Session) LogitsOf(i int) []float32 {
	if i < 0 || i >= s.kept {
		return nil
	}
	c := s.m.Config
	V := c.VocabSize
	if s.headDone {
		return s.logits[i*V : (i+1)*V]
	}
	// one row at a time, into the first: a prompt's kept rows are many
	h := c.HiddenSize
	if cap(s.logits) < V {
		s.logits = make([]float32, V)
	}
	s.hn = grow(s.hn, h)
	kernels.RMSNorm(s.hn[:h], s.x[i*h:(i+1)*h], s.m.FinalNorm, float32(c.RMSNormEps))
	kernels.MatVec(s.logits[:V], s.m.LMHead, s.hn[:h])
	return s.logits[:V]
}

// ResumeSession starts a sequence on m that goes on after the rows
// already in cache (a prefix another sequence computed: the prefix
// cache), whose experts run on experts. The session owns cache from now
// on.
func ResumeSession(m *Model, experts ExpertRunner, cache *kvcache.Cache) (*Session, error) {
	c := m.Config
	if cache.Layers() != c.NumLayers || cache.Width() != c.KVWidth() || cache.Latent() != (c.MLA != nil) {
		return nil, fmt.Errorf("model: a KV cache of %d layers of width %d (latent: %v) for a model of %d layers of width %d (latent: %v)",
			cache.Layers(), cache.Width(), cache.Latent(), c.NumLayers, c.KVWidth(), c.MLA != nil)
	}
	return newSession(m, experts, cache), nil
}
