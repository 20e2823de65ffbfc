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
	if ex.Fused() {
		return model.Expert{}, fmt.Errorf("worker: the CUDA device computes SwiGLU experts only; gpt-oss's (fused, with biases) run on -device cpu")
	}
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
// elsewhere (the host cache): its three matrices must lie within n bytes.
func (d *CUDA) place(b Block, ex model.Expert, n int64) (model.Expert, error) {
	ms := []*kernels.Matrix{&ex.Gate, &ex.Up, &ex.Down}
	lo, hi := uintptr(0), uintptr(0)
	for i, m := range ms {
		if len(m.Data) == 0 {
			return model.Expert{}, fmt.Errorf("worker: uploading an expert with an empty matrix")
		}
		p := uintptr(unsafe.Pointer(&m.Data[0]))
		if i == 0 || p < lo {
			lo = p
		}
		hi = max(hi, p+uintptr(len(m.Data)))
	}
	if int64(hi-lo) > n || int64(len(b.Bytes)) < n {
		return model.Expert{}, fmt.Errorf("worker: expert spans %d bytes, its block %d of %d", hi-lo, len(b.Bytes), n)
	}
	start := uintptr(unsafe.Pointer(&b.Bytes[0]))
	inPlace := lo >= start && hi <= start+uintptr(n)
	for _, m := range ms {
		off := uintptr(unsafe.Pointer(&m.Data[0])) - lo
		if inPlace {
			off += lo - start
		} else {
			copy(b.Bytes[off:], m.Data)
		}
		m.Data = b.Bytes[off : off+uintptr(len(m.Data)) : off+uintptr(len(m.Data))]
	}
	return ex, nil
}

// onDevice is m's device copy: where its bytes lie in the mirror.
func (d *CUDA) onDevice(m kernels.Matrix) (cuda.Matrix, error) {
	mirror := d.arena.mem
	start, p := uintptr(unsafe.Pointer(&mirror[0])), uintptr(unsafe.Pointer(&m.Data[0]))
	if p < start || p+uintptr(len(m.Data)) > start+uintptr(len(mirror)) {
		return cuda.Matrix{}, errors.New("worker: running an expert that was not uploaded to this GPU")
	}
	return cuda.Matrix{Ptr: d.base + cuda.Ptr(p-start), DType: m.DType, Rows: m.Rows, Cols: m.Cols}, nil
}

// ComputeBytes implements Device: the n rows in, their activations and
// the n rows out, each aligned.
func (d *CUDA) ComputeBytes(n, hidden, inter int) int64 {
	return 2*align(int64(n*hidden*4)) + align(int64(n*inter*4))
}

// Run implements Device.
func (d *CUDA) Run(ex model.Expert, x []float32, n int, out []float32) error {
	var g cuda.Expert
	var err error
	for _, m := range []struct {
		dst *cuda.Matrix
		src kernels.Matrix
	}{{&g.Gate, ex.Gate}, {&g.Up, ex.Up}, {&g.Down, ex.Down}} {
		if *m.dst, err = d.onDevice(m.src); err != nil {
			return err
		}
	}
	hidden, inter := ex.Gate.Cols, ex.Gate.Rows
	if len(x) != n*hidden || len(out) != n*hidden {
		return fmt.Errorf("worker: expert run on %d rows: %d inputs, %d outputs for hidden size %d", n, len(x), len(out), hidden)
	}
	b, err := d.arena.Alloc(d.ComputeBytes(n, hidden, inter))
	if err != nil {
		return fmt.Errorf("worker: compute buffers for %d tokens: %w", n, err)
	}
	defer d.arena.Free(b)
	rows := int64(n * hidden * 4) // bytes of x, and of out
	ob := align(rows)             // x at 0, out at ob, the activations after
	at := d.base + cuda.Ptr(b.Offset())
	copy(b.Bytes, floatBytes(x))
	s := <-d.compute
	defer func() { d.compute <- s }()
	if err = s.CopyToDevice(at, b.Bytes[:rows]); err == nil {
		if err = s.Forward(g, at, at+cuda.Ptr(2*ob), at+cuda.Ptr(ob), n); err == nil {
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
