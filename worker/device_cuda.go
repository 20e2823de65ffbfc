//go:build cuda

package worker

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/kernels/cuda"
	"github.com/odmoe/odmoe/model"
)

// CUDA is a worker's GPU: one device allocation of the budget, and a
// page-locked host mirror of it that the Arena's bookkeeping hands out,
// so that block b is device memory at base+b.Offset() and its staging
// host memory is b.Bytes. Experts are decompressed into the mirror and
// copied up on copy streams while other requests compute on compute
// streams; working memory comes out of the same budget.
type CUDA struct {
	gpu     *cuda.Device
	arena   *Arena
	base    cuda.Ptr
	link    *Link
	copies  chan *cuda.Stream
	compute chan *cuda.Stream
}

// cudaStreams is how many uploads, and how many expert runs, may be in
// flight at once.
const cudaStreams = 4

// openCUDA opens GPU ordinal with budget bytes of device memory.
func openCUDA(ordinal int, budget int64, link *Link) (Device, error) {
	if budget <= 0 {
		return nil, fmt.Errorf("worker: device memory budget must be positive, got %d", budget)
	}
	gpu, err := cuda.Open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("worker: device cuda:%d: %w", ordinal, err)
	}
	d := &CUDA{gpu: gpu, link: link, copies: make(chan *cuda.Stream, cudaStreams), compute: make(chan *cuda.Stream, cudaStreams)}
	if err := d.open(budget); err != nil {
		d.Close()
		return nil, fmt.Errorf("worker: device cuda:%d: %w", ordinal, err)
	}
	return d, nil
}

func (d *CUDA) open(budget int64) error {
	var err error
	if d.base, err = d.gpu.Alloc(budget); err != nil {
		d.base = 0
		return fmt.Errorf("%s of device memory: %w", progress.Bytes(budget), err)
	}
	mirror, err := d.gpu.HostAlloc(budget)
	if err != nil {
		return fmt.Errorf("%s of page-locked host memory: %w", progress.Bytes(budget), err)
	}
	d.arena = newArenaOver(mirror, func() error { return d.gpu.FreeHost(mirror) })
	for range cudaStreams {
		for _, pool := range []chan *cuda.Stream{d.copies, d.compute} {
			s, err := d.gpu.NewStream()
			if err != nil {
				return err
			}
			pool <- s
		}
	}
	return nil
}

// Alloc implements Device.
func (d *CUDA) Alloc(n int64) (Block, error) { return d.arena.Alloc(n) }

// Free implements Device.
func (d *CUDA) Free(b Block) { d.arena.Free(b) }

// Staging implements Device: b's page-locked mirror.
func (d *CUDA) Staging(b Block) []byte { return b.Bytes }

// Upload implements Device: the expert's n bytes go to b's device memory
// (from b's mirror, where the store decompressed it; an expert in the
// host cache is copied into the mirror first), and the expert returned
// is the mirror's copy, whose place in the mirror is its place on the
// device.
func (d *CUDA) Upload(ctx context.Context, b Block, ex model.Expert, n int64) (model.Expert, error) {
	at, err := d.place(b, ex, n)
	if err != nil {
		return model.Expert{}, err
	}
	s := <-d.copies
	defer func() { d.copies <- s }()
	err = s.CopyToDevice(d.base+cuda.Ptr(b.Offset()), b.Bytes[:n])
	if err == nil {
		err = s.Sync()
	}
	if err != nil {
		return model.Expert{}, err
	}
	return at, d.link.Transfer(ctx, n)
}

// place returns ex as it lies in b's mirror, copying it there if it lies
// elsewhere (the host cache): the bytes it is made of (its matrices,
// MXFP4's scales, gpt-oss's biases) must lie within n bytes.
func (d *CUDA) place(b Block, ex model.Expert, n int64) (model.Expert, error) {
	parts := expertParts(&ex)
	lo, hi := uintptr(0), uintptr(0)
	for i, p := range parts {
		q := uintptr(unsafe.Pointer(&(*p)[0]))
		if i == 0 || q < lo {
			lo = q
		}
		hi = max(hi, q+uintptr(len(*p)))
	}
	if len(parts) == 0 || int64(hi-lo) > n || int64(len(b.Bytes)) < n {
		return model.Expert{}, fmt.Errorf("worker: expert of %d parts spans %d bytes, its block %d of %d", len(parts), hi-lo, len(b.Bytes), n)
	}
	start := uintptr(unsafe.Pointer(&b.Bytes[0]))
	inPlace := lo >= start && hi <= start+uintptr(n)
	for _, p := range parts {
		off := uintptr(unsafe.Pointer(&(*p)[0])) - lo
		if inPlace {
			off += lo - start
		} else {
			copy(b.Bytes[off:], *p)
		}
		*p = b.Bytes[off : off+uintptr(len(*p)) : off+uintptr(len(*p))]
	}
	return ex, nil
}

// expertParts are the byte slices an expert is made of, to upload:
// Gate, Up and Down's weights, or gpt-oss's GateUp and Down (with
// MXFP4's scales) and its two biases. An empty one is left out only
// where a format has none (scales).
func expertParts(ex *model.Expert) []*[]byte {
	ms := []*kernels.Matrix{&ex.Gate, &ex.Up, &ex.Down}
	if ex.Fused() {
		ms = []*kernels.Matrix{&ex.GateUp, &ex.Down, &ex.GateUpBias, &ex.DownBias}
	}
	var parts []*[]byte
	for _, m := range ms {
		parts = append(parts, &m.Data)
		if m.DType.HasScales() {
			parts = append(parts, &m.Scales)
		}
	}
	for _, p := range parts {
		if len(*p) == 0 {
			return nil // place refuses it
		}
	}
	return parts
}

// onDevice is where b's bytes lie on the device: their place in the
// mirror.
func (d *CUDA) onDevice(b []byte) (cuda.Ptr, error) {
	mirror := d.arena.mem
	start := uintptr(unsafe.Pointer(&mirror[0]))
	if len(b) == 0 {
		return 0, errors.New("worker: running an expert with an empty matrix")
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	if p < start || p+uintptr(len(b)) > start+uintptr(len(mirror)) {
		return 0, errors.New("worker: running an expert that was not uploaded to this GPU")
	}
	return d.base + cuda.Ptr(p-start), nil
}

// matrixOnDevice is m's device copy, its scales' too.
func (d *CUDA) matrixOnDevice(m kernels.Matrix) (cuda.Matrix, error) {
	dm := cuda.Matrix{DType: m.DType, Rows: m.Rows, Cols: m.Cols}
	var err error
	if dm.Ptr, err = d.onDevice(m.Data); err == nil && m.DType.HasScales() {
		dm.Scales, err = d.onDevice(m.Scales)
	}
	return dm, err
}

// ComputeBytes implements Device: the n rows in, their activations and
// the n rows out, each aligned; a fused expert's gate and up products
// too (the activation cannot overwrite them in place on a GPU).
func (d *CUDA) ComputeBytes(n, hidden, inter int, fused bool) int64 {
	b := 2*align(int64(n*hidden*4)) + align(int64(n*inter*4))
	if fused {
		b += align(int64(2 * n * inter * 4))
	}
	return b
}

// Run implements Device.
func (d *CUDA) Run(ex model.Expert, x []float32, n int, out []float32) error {
	hidden, inter := ex.Hidden(), ex.Intermediate()
	if len(x) != n*hidden || len(out) != n*hidden {
		return fmt.Errorf("worker: expert run on %d rows: %d inputs, %d outputs for hidden size %d", n, len(x), len(out), hidden)
	}
	queue, err := d.forward(ex, n)
	if err != nil {
		return err
	}
	b, err := d.arena.Alloc(d.ComputeBytes(n, hidden, inter, ex.Fused()))
	if err != nil {
		return fmt.Errorf("worker: compute buffers for %d tokens: %w", n, err)
	}
	defer d.arena.Free(b)
	rows := int64(n * hidden * 4) // bytes of x, and of out
	ob := align(rows)             // x at 0, out at ob, the activations after, a fused expert's products after them
	at := d.base + cuda.Ptr(b.Offset())
	copy(b.Bytes, floatBytes(x))
	s := <-d.compute
	defer func() { d.compute <- s }()
	if err = s.CopyToDevice(at, b.Bytes[:rows]); err == nil {
		act := at + cuda.Ptr(2*ob)
		if err = queue(s, at, act, act+cuda.Ptr(align(int64(n*inter*4))), at+cuda.Ptr(ob)); err == nil {
			err = s.CopyToHost(b.Bytes[ob:ob+rows], at+cuda.Ptr(ob))
		}
	}
	if serr := s.Sync(); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	copy(floatBytes(out), b.Bytes[ob:ob+rows])
	return nil
}

// forward returns what queues ex's kernels on n rows: x in, act (and a
// fused expert's products gu) working memory, out.
func (d *CUDA) forward(ex model.Expert, n int) (func(s *cuda.Stream, x, act, gu, out cuda.Ptr) error, error) {
	if ex.Fused() {
		var f cuda.FusedExpert
		f.Limit, f.Alpha = ex.Limit, ex.Alpha
		for _, m := range []struct {
			dst *cuda.Matrix
			src kernels.Matrix
		}{{&f.GateUp, ex.GateUp}, {&f.Down, ex.Down}, {&f.GateUpBias, ex.GateUpBias}, {&f.DownBias, ex.DownBias}} {
			var err error
			if *m.dst, err = d.matrixOnDevice(m.src); err != nil {
				return nil, err
			}
		}
		return func(s *cuda.Stream, x, act, gu, out cuda.Ptr) error { return s.ForwardFused(f, x, gu, act, out, n) }, nil
	}
	var g cuda.Expert
	for _, m := range []struct {
		dst *cuda.Matrix
		src kernels.Matrix
	}{{&g.Gate, ex.Gate}, {&g.Up, ex.Up}, {&g.Down, ex.Down}} {
		var err error
		if *m.dst, err = d.matrixOnDevice(m.src); err != nil {
			return nil, err
		}
	}
	return func(s *cuda.Stream, x, act, _, out cuda.Ptr) error { return s.Forward(g, x, act, out, n) }, nil
}

func floatBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// Memory implements Device.
func (d *CUDA) Memory() (budget, inUse, peak int64) {
	return d.arena.Budget(), d.arena.InUse(), d.arena.Peak()
}

// String implements Device.
func (d *CUDA) String() string { return d.gpu.String() }

// Close implements Device: the streams, the device memory and the
// mirror go back, then the GPU.
func (d *CUDA) Close() error {
	var errs []error
	for _, pool := range []chan *cuda.Stream{d.copies, d.compute} {
		close(pool)
		for s := range pool {
			errs = append(errs, s.Close())
		}
	}
	if d.base != 0 {
		errs = append(errs, d.gpu.Free(d.base))
	}
	if d.arena != nil {
		errs = append(errs, d.arena.Close())
	}
	errs = append(errs, d.gpu.Close())
	return errors.Join(errs...)
}
