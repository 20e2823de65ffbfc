package worker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/odmoe/odmoe/model"
)

// Device is the memory and compute a worker keeps and runs experts on:
// allocate within the budget, upload an expert, run it on a batch of rows,
// free. CPU is this build's device; a GPU device keeps the same
// accounting over its own memory (DESIGN.md "Bounded device memory").
type Device interface {
	// Alloc reserves n bytes of device memory, or fails with ErrOverBudget
	// (wrapped) rather than exceed the budget.
	Alloc(n int64) (Block, error)
	// Free returns b.
	Free(b Block)
	// Staging is the host memory the store decompresses an expert bound
	// for b into: b itself where device memory is host memory.
	Staging(b Block) []byte
	// Upload moves the n bytes of expert ex (in host memory: the staging
	// bytes of b, or a host cache) into b and returns the expert as the
	// device runs it.
	Upload(ctx context.Context, b Block, ex model.Expert, n int64) (model.Expert, error)
	// Run computes an uploaded expert on n rows of x into out, its working
	// memory taken from the budget too.
	Run(ex model.Expert, x []float32, n int, out []float32) error
	// ComputeBytes is the working memory Run takes from the budget for n
	// rows of an expert of hidden and inter sizes, fused or not
	// (model.Expert.Fused: gpt-oss's).
	ComputeBytes(n, hidden, inter int, fused bool) int64
	// Memory reports the budget, the bytes in use and their peak.
	Memory() (budget, inUse, peak int64)
	// String names the device as the worker reports it (Hello, logs):
	// "cpu", or "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)".
	String() string
	// Close frees the device memory, once nothing runs on it any more.
	Close() error
}

// OpenDevice opens the device spec names with budget bytes of memory,
// loads paced by link (a zero rate: unpaced): "cpu" (or "") is host
// memory and the kernels package; "cuda:N" is GPU N, in a build with the
// cuda tag.
func OpenDevice(spec string, budget int64, link *Link) (Device, error) {
	if spec == "" || spec == "cpu" {
		arena, err := NewArena(budget)
		if err != nil {
			return nil, err
		}
		return NewCPU(arena, link), nil
	}
	if ord, ok := strings.CutPrefix(spec, "cuda:"); ok {
		n, err := strconv.Atoi(ord)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("worker: device %q: want cuda:N, N the GPU's ordinal (0, 1, ...)", spec)
		}
		return openCUDA(n, budget, link)
	}
	return nil, fmt.Errorf("worker: device %q: want cpu or cuda:N", spec)
}

// CPU is the device of a worker without a GPU: an Arena of host memory
// stands in for device memory, with loads paced by a Link to emulate the
// host-to-device bus, and experts run on the kernels package.
type CPU struct {
	arena *Arena
	link  *Link
}

// NewCPU returns a CPU device over arena with transfers paced by link.
func NewCPU(arena *Arena, link *Link) *CPU { return &CPU{arena: arena, link: link} }

// Alloc implements Device.
func (d *CPU) Alloc(n int64) (Block, error) { return d.arena.Alloc(n) }

// Free implements Device.
func (d *CPU) Free(b Block) { d.arena.Free(b) }

// Staging implements Device: device memory is host memory.
func (d *CPU) Staging(b Block) []byte { return b.Bytes }

// Upload implements Device. The expert is already in host memory, which
// is the device's: only the paced transfer remains.
func (d *CPU) Upload(ctx context.Context, _ Block, ex model.Expert, n int64) (model.Expert, error) {
	return ex, d.link.Transfer(ctx, n)
}

// Run implements Device.
func (d *CPU) Run(ex model.Expert, x []float32, n int, out []float32) error {
	b, err := d.arena.Alloc(d.ComputeBytes(n, ex.Hidden(), ex.Intermediate(), ex.Fused()))
	if err != nil {
		return fmt.Errorf("worker: compute buffers for %d tokens: %w", n, err)
	}
	defer d.arena.Free(b)
	f := unsafe.Slice((*float32)(unsafe.Pointer(&b.Bytes[0])), ex.ScratchFloats(n))
	ex.Forward(out, x, n, model.NewExpertScratch(f))
	return nil
}

// ComputeBytes implements Device: the gate and up products of n rows
// (a fused expert's too, in the same room).
func (d *CPU) ComputeBytes(n, _, inter int, _ bool) int64 { return int64(2 * n * inter * 4) }

// String implements Device.
func (d *CPU) String() string { return "cpu" }

// Memory implements Device.
func (d *CPU) Memory() (budget, inUse, peak int64) {
	return d.arena.Budget(), d.arena.InUse(), d.arena.Peak()
}

// Close implements Device: the arena's memory goes back to the system.
func (d *CPU) Close() error { return d.arena.Close() }
