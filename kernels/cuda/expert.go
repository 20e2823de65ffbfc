//go:build cuda

package cuda

import (
	"fmt"

	"github.com/odmoe/odmoe/kernels"
)

// Matrix is a row-major weight matrix in device memory.
type Matrix struct {
	Ptr        Ptr
	DType      kernels.DType // F32, F16 or BF16
	Rows, Cols int
}

// Expert is an expert's three matrices in device memory (model.Expert's
// shapes: Gate and Up [intermediate, hidden], Down [hidden, intermediate]).
type Expert struct {
	Gate, Up, Down Matrix
}

// threadsPerBlock is 16 rows of 16 lanes.
const threadsPerBlock = 256

// Check reports whether ex's shapes fit together and its formats have
// kernels.
func (ex Expert) Check() error {
	g, u, dn := ex.Gate, ex.Up, ex.Down
	switch {
	case g.Rows != u.Rows || g.Cols != u.Cols || dn.Rows != g.Cols || dn.Cols != g.Rows || g.Rows <= 0 || g.Cols <= 0:
		return fmt.Errorf("cuda: expert of gate %dx%d, up %dx%d, down %dx%d: shapes do not fit", g.Rows, g.Cols, u.Rows, u.Cols, dn.Rows, dn.Cols)
	case g.DType != u.DType:
		return fmt.Errorf("cuda: expert's gate is %v and up %v: they must be one format", g.DType, u.DType)
	}
	for _, m := range []Matrix{g, dn} {
		if m.DType != kernels.F32 && m.DType != kernels.F16 && m.DType != kernels.BF16 {
			return fmt.Errorf("cuda: no kernel for %v weights (want F32, F16 or BF16)", m.DType)
		}
	}
	return nil
}

// Forward queues expert ex on n rows of x (n x hidden float32) into out
// (n x hidden float32), with act (n x intermediate float32) as working
// memory: model.Expert.Forward, bit for bit. All three are device
// memory; nothing is read back until the stream synchronizes.
func (s *Stream) Forward(ex Expert, x, act, out Ptr, n int) error {
	if err := ex.Check(); err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("cuda: Forward on %d rows", n)
	}
	g, dn := ex.Gate, ex.Down
	if err := s.launch("odmoe_gate_up", s.d.fn.gateUp[g.DType][tileFor(n)], blocksFor(g.Rows), threadsPerBlock,
		uint64(act), uint64(g.Ptr), uint64(ex.Up.Ptr), uint64(x), uint64(g.Rows), uint64(g.Cols), uint64(n)); err != nil {
		return err
	}
	return s.launch("odmoe_mat_mul", s.d.fn.matMul[dn.DType][tileFor(n)], blocksFor(dn.Rows), threadsPerBlock,
		uint64(out), uint64(dn.Ptr), uint64(act), uint64(dn.Rows), uint64(dn.Cols), uint64(n))
}

// MatMul queues out = w x for n vectors: kernels.MatMul, bit for bit.
func (s *Stream) MatMul(w Matrix, x, out Ptr, n int) error {
	if w.DType != kernels.F32 && w.DType != kernels.F16 && w.DType != kernels.BF16 {
		return fmt.Errorf("cuda: no kernel for %v weights (want F32, F16 or BF16)", w.DType)
	}
	return s.launch("odmoe_mat_mul", s.d.fn.matMul[w.DType][tileFor(n)], blocksFor(w.Rows), threadsPerBlock,
		uint64(out), uint64(w.Ptr), uint64(x), uint64(w.Rows), uint64(w.Cols), uint64(n))
}

// SwiGLU queues out[i] = kernels.SwiGLU of gate[i], up[i] for i < n.
func (s *Stream) SwiGLU(out, gate, up Ptr, n int) error {
	return s.launch("odmoe_swiglu", s.d.fn.swiglu, (n+threadsPerBlock-1)/threadsPerBlock, threadsPerBlock,
		uint64(out), uint64(gate), uint64(up), uint64(n))
}

// blocksFor is the grid of a product over rows rows (16 lanes a row).
func blocksFor(rows int) int { return (rows*16 + threadsPerBlock - 1) / threadsPerBlock }
