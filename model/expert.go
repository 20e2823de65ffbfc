package model

import (
	"context"
	"fmt"

	"github.com/odmoe/odmoe/kernels"
)

// ExpertRunner computes the routed experts of one layer. Local mode runs
// them in process on resident weights; the main node sends them to
// workers. This is the seam between routing (main node) and running
// experts (workers).
type ExpertRunner interface {
	// RunExperts computes, for every route r, the expert routes[r].Expert
	// on token r/k's input x[t*hidden:(t+1)*hidden] (k = len(routes)/n)
	// and writes it to out[r*hidden:(r+1)*hidden]. Weights are not applied:
	// the caller mixes the outputs in its fixed order. step is the forward
	// pass the layer belongs to.
	RunExperts(ctx context.Context, step Step, layer int, x []float32, n int, routes []Route, out []float32) error
}

// ExpertScratch is reusable working memory for Expert.Forward.
type ExpertScratch struct {
	buf    []float32
	gateUp [2]kernels.Product
}

// NewExpertScratch wraps a caller-owned buffer (a worker takes it from
// its device budget); Forward uses it while it holds ScratchFloats.
func NewExpertScratch(buf []float32) *ExpertScratch { return &ExpertScratch{buf: buf} }

// ScratchFloats is the working memory Forward needs for n tokens: both
// halves of the gate and up products.
func (e Expert) ScratchFloats(n int) int { return 2 * n * e.Intermediate() }

// Forward computes the expert for n input vectors x (n*hidden floats)
// into out (n*hidden floats): Down(SiLU(Gate x) * Up x), or for a fused
// expert Down(ClampedSwiGLU(GateUp x + GateUpBias)) + DownBias. Every
// node that runs an expert runs exactly this, so results are
// bit-identical wherever it runs.
func (e Expert) Forward(out, x []float32, n int, s *ExpertScratch) {
	inter := e.Intermediate()
	s.buf = grow(s.buf, e.ScratchFloats(n))
	if e.Fused() {
		gu := s.buf[:2*n*inter]
		kernels.MatMul(gu, e.GateUp, x, n)
		kernels.AddBias(gu, n, e.GateUpBias)
		kernels.ClampedSwiGLU(gu[:n*inter], gu, e.Limit, e.Alpha)
		kernels.MatMul(out, e.Down, gu[:n*inter], n)
		kernels.AddBias(out, n, e.DownBias)
		return
	}
	gate, up := s.buf[:n*inter], s.buf[n*inter:2*n*inter]
	s.gateUp = [2]kernels.Product{{Out: gate, W: e.Gate}, {Out: up, W: e.Up}}
	kernels.MatMulEach(x, n, s.gateUp[:])
	kernels.SwiGLU(gate, gate, up)
	kernels.MatMul(out, e.Down, gate, n)
}

// ResidentExperts runs experts whose weights are all in this process: local
// mode, and the "fully cached" reference of the benchmarks.
type ResidentExperts struct {
	model   *Model
	scratch ExpertScratch
	in, res []float32
	tokens  []int
}

// NewResidentExperts returns a runner over m's experts (m must have been
// loaded with its experts).
func NewResidentExperts(m *Model) *ResidentExperts { return &ResidentExperts{model: m} }

// RunExperts implements ExpertRunner. Tokens routed to the same expert are
// batched into one matrix product; each output element is computed exactly
// as for a single token (kernels.MatMul == kernels.MatVec per element).
func (r *ResidentExperts) RunExperts(_ context.Context, _ Step, layer int, x []float32, n int, routes []Route, out []float32) error {
	m := r.model
	h := m.Config.HiddenSize
	if layer < 0 || layer >= len(m.Layers) || m.Layers[layer].MoE == nil || m.Layers[layer].MoE.Experts == nil {
		return fmt.Errorf("model: layer %d has no resident experts", layer)
	}
	if n == 0 || len(routes)%n != 0 || len(x) != n*h || len(out) != len(routes)*h {
		return fmt.Errorf("model: RunExperts: %d routes, %d tokens, %d inputs, %d outputs do not fit hidden size %d", len(routes), n, len(x), len(out), h)
	}
	if err := CheckRoutes(routes, m.Config.NumExperts); err != nil {
		return err
	}
	k := len(routes) / n
	experts := m.Layers[layer].MoE.Experts
	for e := range experts {
		r.tokens = r.tokens[:0]
		for i, rt := range routes {
			if rt.Expert == e {
				r.tokens = append(r.tokens, i)
			}
		}
		if len(r.tokens) == 0 {
			continue
		}
		nt := len(r.tokens)
		r.in = grow(r.in, nt*h)
		r.res = grow(r.res, nt*h)
		for j, i := range r.tokens {
			t := i / k
			copy(r.in[j*h:(j+1)*h], x[t*h:(t+1)*h])
		}
		experts[e].Forward(r.res, r.in, nt, &r.scratch)
		for j, i := range r.tokens {
			copy(out[i*h:(i+1)*h], r.res[j*h:(j+1)*h])
		}
	}
	return nil
}

// grow returns buf resized to n, reallocating only when it lacks capacity.
func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}
