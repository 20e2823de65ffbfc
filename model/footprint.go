package model

import (
	"context"
	"fmt"
	"slices"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/kvcache"
)

// Footprint is what a node holding some of a model's layers will hold,
// by kind, in bytes: what it says at start, and what its -mem budget is
// held against.
type Footprint struct {
	Embedding int64 // as stored (read a row a token)
	Head      int64 // the output head and the final norm
	Layers    int64 // the layers' attention, norms, routers, dense and shared MLPs
	Experts   int64 // their routed experts
	KV        int64 // the KV cache of one sequence at the model's full context
}

// Total is every byte of f.
func (f Footprint) Total() int64 { return f.Embedding + f.Head + f.Layers + f.Experts + f.KV }

// Weights is f without its KV cache.
func (f Footprint) Weights() int64 { return f.Total() - f.KV }

func (f Footprint) String() string {
	return fmt.Sprintf("%s: weights %s (embedding %s, layers %s, experts %s, head %s), KV cache of one sequence at the node's context (-context) %s",
		progress.Bytes(f.Total()), progress.Bytes(f.Weights()), progress.Bytes(f.Embedding), progress.Bytes(f.Layers),
		progress.Bytes(f.Experts), progress.Bytes(f.Head), progress.Bytes(f.KV))
}

// FootprintOptions say what a node keeps of the layers it holds.
type FootprintOptions struct {
	// Quantized, with Quant, counts the matrices as the shadow quantizes
	// them (Quantized: routers F16, the embedding as stored); else as
	// the checkpoint stores them.
	Quantized bool
	Quant     kernels.DType
	Experts   bool // the routed experts too (a shadow's; a main node's are on workers)
	// ExpertsFrom, with Experts, is where the experts of a model loaded
	// without them are (a store: a shadow that quantizes them from it,
	// QuantizedWith): each layer's are counted by its first's shape.
	ExpertsFrom ExpertReader
	Head        bool // the output head, even where r ends before the last layer
	SkipHead    bool // no output head, even where r ends at the last layer (a later stage's)
}

// FootprintOf is what a node holding layers r of m keeps, as opt says
// (the embedding where r begins at the first layer, the head where it
// ends at the last or opt.Head asks). m must have r's layers bound, and
// their experts where opt.Experts counts them.
func (m *Model) FootprintOf(r LayerRange, opt FootprintOptions) (Footprint, error) {
	c := m.Config
	if err := r.heldOf(c.NumLayers); err != nil {
		return Footprint{}, fmt.Errorf("model: %w", err)
	}
	hasExperts := slices.ContainsFunc(c.ExpertLayers(), r.Contains) // not a range of dense layers alone
	if !m.held.Covers(r) || opt.Experts && opt.ExpertsFrom == nil && hasExperts && m.expertBytes == 0 {
		return Footprint{}, fmt.Errorf("model: the footprint of layers %s from a model holding %s (experts bound: %v)", r, m.held, m.expertBytes > 0)
	}
	bytes := func(x kernels.Matrix, dt kernels.DType) int64 {
		if x.Rows == 0 {
			return 0
		}
		if !opt.Quantized { // as stored: its codes and scales (its Data and Scales, but for a model of shapes only)
			if len(x.Data) > 0 {
				return int64(x.Bytes()) // a packed matrix's table and exception rows too
			}
			return int64(x.Rows)*int64(x.DType.RowBytes(x.Cols)) + int64(kernels.ScalesBytes(x.DType, x.Rows, x.Cols))
		}
		return int64(x.Rows) * int64(dt.RowBytes(x.Cols)+dt.ScaleBytes(x.Cols))
	}
	vec := func(vs ...[]float32) (n int64) {
		for _, v := range vs {
			n += 4 * int64(len(v))
		}
		return n
	}
	var f Footprint
	q := opt.Quant
	head := (opt.Head || r.End == c.NumLayers) && !opt.SkipHead
	if r.First == 0 || head && c.TieEmbeddings {
		f.Embedding = int64(len(m.Embed.Data))
	}
	if head {
		f.Head = bytes(m.LMHead, q) + vec(m.FinalNorm)
	}
	router := kernels.F16 // the shadow's routers (Quantized)
	for l := r.First; l < r.End; l++ {
		L := &m.Layers[l]
		a := &L.Attention
		f.Layers += bytes(a.Q, q) + bytes(a.K, q) + bytes(a.V, q) + bytes(a.O, q) +
			vec(a.Norm, a.QNorm, a.KNorm, a.QBias, a.KBias, a.VBias, a.OBias, a.Sinks)
		if x := a.MLA; x != nil {
			f.Layers += bytes(x.QA, q) + bytes(x.QB, q) + bytes(x.KVA, q) + bytes(x.KVB, q) + bytes(x.ukT, q) + vec(x.QANorm, x.KVANorm)
		}
		if d := L.Dense; d != nil {
			f.Layers += bytes(d.MLP.Gate, q) + bytes(d.MLP.Up, q) + bytes(d.MLP.Down, q) + vec(d.Norm)
		}
		moe := L.MoE
		if moe == nil {
			continue
		}
		f.Layers += bytes(moe.Router, router) + vec(moe.Norm, moe.RouterBias)
		if s := moe.Shared; s != nil {
			f.Layers += bytes(s.Gate, q) + bytes(s.Up, q) + bytes(s.Down, q) + bytes(moe.SharedGate, router)
		}
		switch {
		case opt.Experts && opt.ExpertsFrom != nil && moe.Experts == nil:
			// every expert of a layer has one shape: its first's, times
			// their number
			n, err := opt.ExpertsFrom.ExpertBytes(l, 0)
			if err != nil {
				return Footprint{}, fmt.Errorf("model: layer %d's experts: %w", l, err)
			}
			x, err := opt.ExpertsFrom.ReadExpert(context.Background(), l, 0, make([]byte, n))
			if err != nil {
				return Footprint{}, fmt.Errorf("model: layer %d's experts: %w", l, err)
			}
			f.Experts += int64(c.NumExperts) * expertBytes(x, bytes, q)
		case opt.Experts:
			for _, e := range moe.Experts {
				f.Experts += expertBytes(e, bytes, q)
			}
		}
	}
	f.KV = m.kvBytes(r, c.MaxPositions)
	return f, nil
}

// expertBytes is what expert e holds, its matrices counted by bytes at
// dt, a fused expert's biases as they are.
func expertBytes(e Expert, bytes func(kernels.Matrix, kernels.DType) int64, dt kernels.DType) int64 {
	return bytes(e.Gate, dt) + bytes(e.Up, dt) + bytes(e.GateUp, dt) + bytes(e.Down, dt) + int64(len(e.GateUpBias.Data)+len(e.DownBias.Data))
}

// kvBytes is the KV cache of one sequence of positions positions in
// layers r: float32 key and value rows (a latent cache's once), a
// windowed layer's only as many as its window keeps.
func (m *Model) kvBytes(r LayerRange, positions int) int64 {
	c := m.Config
	rows := int64(2)
	if c.MLA != nil {
		rows = 1
	}
	var n int64
	for l := r.First; l < r.End; l++ {
		p := positions
		if w := c.WindowOf(l); w > 0 {
			p = min(p, 2*w+kvcache.WindowSlack)
		}
		n += rows * 4 * int64(c.KVWidth()) * int64(p)
	}
	return n
}
