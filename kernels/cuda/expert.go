//go:build cuda

package cuda

import (
	"fmt"
	"math"

	"github.com/odmoe/odmoe/kernels"
)

// Matrix is a row-major weight matrix in device memory.
type Matrix struct {
	Ptr        Ptr
	DType      kernels.DType // F32, F16, BF16, or MXFP4 (MatMul's weights only)
	Rows, Cols int
	// Scales are an MXFP4 matrix's scale bytes (Rows x Cols/32, as
	// kernels.Matrix.Scales holds them); 0 for the other formats.
	Scales Ptr
}

// checkProduct reports whether MatMul has a kernel for w.
func (w Matrix) checkProduct() error {
	switch {
	case w.Rows <= 0 || w.Cols <= 0:
		return fmt.Errorf("cuda: a %dx%d matrix", w.Rows, w.Cols)
	case w.DType == kernels.MXFP4 && (w.Cols%32 != 0 || w.Scales == 0):
		return fmt.Errorf("cuda: MXFP4 matrix of %d columns with scales at %#x: its rows are blocks of 32, each with a scale", w.Cols, w.Scales)
	case w.DType != kernels.F32 && w.DType != kernels.F16 && w.DType != kernels.BF16 && w.DType != kernels.MXFP4:
		return fmt.Errorf("cuda: no kernel for %v weights (want F32, F16, BF16 or MXFP4)", w.DType)
	}
	return nil
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
	if err := w.checkProduct(); err != nil {
		return err
	}
	if w.DType == kernels.MXFP4 {
		return s.launch("odmoe_mat_mul_mxfp4", s.d.fn.matMulMXFP4[tileFor(n)], blocksFor(w.Rows), threadsPerBlock,
			uint64(out), uint64(w.Ptr), uint64(w.Scales), uint64(x), uint64(w.Rows), uint64(w.Cols), uint64(n))
	}
	return s.launch("odmoe_mat_mul", s.d.fn.matMul[w.DType][tileFor(n)], blocksFor(w.Rows), threadsPerBlock,
		uint64(out), uint64(w.Ptr), uint64(x), uint64(w.Rows), uint64(w.Cols), uint64(n))
}

// FusedExpert is gpt-oss's kind of expert in device memory (model.Expert
// with GateUp set): GateUp [2 x intermediate, hidden] (gate and up rows
// interleaved), Down [hidden, intermediate], a bias row for each, and
// the clamped activation's limit and alpha.
type FusedExpert struct {
	GateUp, Down         Matrix
	GateUpBias, DownBias Matrix
	Limit, Alpha         float32
}

// Check reports whether ex's shapes fit together and its formats have
// kernels.
func (ex FusedExpert) Check() error {
	gu, dn, bg, bd := ex.GateUp, ex.Down, ex.GateUpBias, ex.DownBias
	if gu.Rows%2 != 0 || dn.Rows != gu.Cols || dn.Cols != gu.Rows/2 || bg.Rows != 1 || bg.Cols != gu.Rows || bd.Rows != 1 || bd.Cols != dn.Rows {
		return fmt.Errorf("cuda: expert of gate_up %dx%d, down %dx%d, biases %dx%d and %dx%d: shapes do not fit",
			gu.Rows, gu.Cols, dn.Rows, dn.Cols, bg.Rows, bg.Cols, bd.Rows, bd.Cols)
	}
	for _, m := range []Matrix{gu, dn} {
		if err := m.checkProduct(); err != nil {
			return err
		}
	}
	for _, b := range []Matrix{bg, bd} {
		if b.DType != kernels.F32 && b.DType != kernels.F16 && b.DType != kernels.BF16 {
			return fmt.Errorf("cuda: no kernel for a %v bias (want F32, F16 or BF16)", b.DType)
		}
	}
	if !(ex.Limit > 0 && ex.Alpha > 0) {
		return fmt.Errorf("cuda: clamped SwiGLU of limit %v and alpha %v", ex.Limit, ex.Alpha)
	}
	return nil
}

// ForwardFused queues expert ex on n rows of x (n x hidden float32) into
// out (n x hidden float32), with gu (n x 2 x intermediate float32) and
// act (n x intermediate float32) as working memory: model.Expert.Forward
// of a fused expert, bit for bit: Down(ClampedSwiGLU(GateUp x +
// GateUpBias)) + DownBias.
func (s *Stream) ForwardFused(ex FusedExpert, x, gu, act, out Ptr, n int) error {
	if err := ex.Check(); err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("cuda: ForwardFused on %d rows", n)
	}
	if err := s.MatMul(ex.GateUp, x, gu, n); err != nil {
		return err
	}
	if err := s.AddBias(gu, ex.GateUpBias, n); err != nil {
		return err
	}
	if err := s.ClampedSwiGLU(act, gu, n*ex.Down.Cols, ex.Limit, ex.Alpha); err != nil {
		return err
	}
	if err := s.MatMul(ex.Down, act, out, n); err != nil {
		return err
	}
	return s.AddBias(out, ex.DownBias, n)
}

// AddBias queues kernels.AddBias: the bias row b added to each of n rows
// of b.Cols floats at dst.
func (s *Stream) AddBias(dst Ptr, b Matrix, n int) error {
	if b.Rows != 1 || b.Cols <= 0 || (b.DType != kernels.F32 && b.DType != kernels.F16 && b.DType != kernels.BF16) {
		return fmt.Errorf("cuda: no kernel for a %dx%d %v bias (want one row of F32, F16 or BF16)", b.Rows, b.Cols, b.DType)
	}
	elems := n * b.Cols
	return s.launch("odmoe_add_bias", s.d.fn.addBias[b.DType], (elems+threadsPerBlock-1)/threadsPerBlock, threadsPerBlock,
		uint64(dst), uint64(b.Ptr), uint64(b.Cols), uint64(n))
}

// ClampedSwiGLU queues out[i] = kernels.ClampedSwiGLU of gu[2i], gu[2i+1]
// for i < n (gu holds 2n floats; out must not overlap it).
func (s *Stream) ClampedSwiGLU(out, gu Ptr, n int, limit, alpha float32) error {
	return s.launch("odmoe_clamped_swiglu", s.d.fn.clampedSwiGLU, (n+threadsPerBlock-1)/threadsPerBlock, threadsPerBlock,
		uint64(out), uint64(gu), uint64(n), uint64(math.Float32bits(limit)), uint64(math.Float32bits(alpha)))
}

// SwiGLU queues out[i] = kernels.SwiGLU of gate[i], up[i] for i < n.
func (s *Stream) SwiGLU(out, gate, up Ptr, n int) error {
	return s.launch("odmoe_swiglu", s.d.fn.swiglu, (n+threadsPerBlock-1)/threadsPerBlock, threadsPerBlock,
		uint64(out), uint64(gate), uint64(up), uint64(n))
}

// blocksFor is the grid of a product over rows rows (16 lanes a row).
func blocksFor(rows int) int { return (rows*16 + threadsPerBlock - 1) / threadsPerBlock }
