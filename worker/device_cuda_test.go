//go:build cuda

package worker

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/odmoe/odmoe/kernels/cuda"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/store"
	"github.com/rs/zerolog"
)

// These tests need a GPU (cuda:0).

func openTestCUDA(t *testing.T, budget int64) *CUDA {
	t.Helper()
	dev, err := OpenDevice("cuda:0", budget, NewLink(0))
	if err != nil {
		t.Fatalf("the cuda tag's tests need a CUDA GPU: %v", err)
	}
	return dev.(*CUDA)
}

// TestCUDAEngineEqualsLocalExperts runs every expert of every layer of
// the tiny model through an engine on the GPU, from the store (misses),
// from a hint, and through the host cache (an expert that is not in the
// block's staging memory), for one token and for batches: each output is
// local mode's bits.
func TestCUDAEngineEqualsLocalExperts(t *testing.T) {
	checkCUDAEngine(t, tinyFixture(t))
}

// TestCUDAEngineEqualsLocalGptOssExperts is the same on gpt-oss's kind of
// expert (gate and up interleaved, biases, the clamped activation) with
// its weights in MXFP4 as published: what the store holds is what the
// GPU computes from, scales and biases uploaded with the codes.
func TestCUDAEngineEqualsLocalGptOssExperts(t *testing.T) {
	dir := t.TempDir()
	md, sd := filepath.Join(dir, "gpt-oss"), filepath.Join(dir, "store")
	if err := synth.Generate(md, synth.Options{Preset: "gpt-oss-tiny-mxfp4", Seed: 5}); err != nil {
		t.Fatal(err)
	}
	if err := store.Convert(context.Background(), md, sd, store.ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(md, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(sd, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Form() != store.FormClampedSwiGLU {
		t.Fatalf("store form %v, want gpt-oss's", st.Form())
	}
	checkCUDAEngine(t, fixture{model: m, store: st, dir: dir})
}

// checkCUDAEngine runs every expert of f's store on the GPU as
// TestCUDAEngineEqualsLocalExperts says.
func checkCUDAEngine(t *testing.T, f fixture) {
	h := f.model.Config.HiddenSize
	dev := openTestCUDA(t, 64<<20)
	e := NewEngine(f.store, h, dev, zerolog.Nop())
	defer func() {
		e.Close()
		if err := dev.Close(); err != nil {
			t.Error(err)
		}
	}()
	host, err := NewHostCache(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	ctx := context.Background()
	t.Logf("device %s", dev)
	runs := 0
	for _, l := range f.store.Layers() {
		if l == 2 {
			e.Host = host // layer 2 and after: loads go through the host cache
		}
		for ex := range f.store.Experts() {
			for _, n := range []int{1, 3, 9} {
				x := randomInput(n, h, uint64(100*l+10*ex+n))
				out := make([]float32, n*h)
				step := model.Step{Seq: 1, Pass: int64(runs)}
				if n == 3 {
					e.Prefetch(ctx, step, l, []int{ex})
				}
				if _, err := e.Run(ctx, step, l, ex, x, n, out, Evict); err != nil {
					t.Fatalf("layer %d expert %d n=%d: %v", l, ex, n, err)
				}
				if want := localExpert(f.model, l, ex, x, n); !sameBits(out, want) {
					t.Fatalf("layer %d expert %d n=%d: the GPU's output differs from local mode's", l, ex, n)
				}
				runs++
			}
		}
	}
	e.wg.Wait()
	if _, inUse, peak := dev.Memory(); inUse != 0 || peak > 64<<20 {
		t.Fatalf("after the runs: %d bytes in use, peak %d", inUse, peak)
	}
	t.Logf("%d expert runs bit-identical to local mode", runs)
}

// TestCUDADeviceHoldsItsBudget: the device takes its budget from the GPU
// once (cuMemGetInfo before and after, with experts loaded and run), an
// allocation past it is refused with ErrOverBudget, and Close gives the
// budget back. cuMemGetInfo counts every process's memory on the GPU: run
// it with the GPU to itself (make test-cuda runs packages one at a time,
// -p 1; a swarm test's workers beside it once read as 564 MiB taken).
func TestCUDADeviceHoldsItsBudget(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	probe, err := cuda.Open(0) // the context and a module of the kernels, already there
	if err != nil {
		t.Fatalf("the cuda tag's tests need a CUDA GPU: %v", err)
	}
	defer probe.Close()
	free0, total, err := probe.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	const budget = 48 << 20
	dev := openTestCUDA(t, budget)
	e := NewEngine(f.store, h, dev, zerolog.Nop())
	ctx := context.Background()
	lowest := free0
	for _, l := range f.store.Layers() {
		x := randomInput(4, h, uint64(l))
		out := make([]float32, 4*h)
		e.Prefetch(ctx, model.Step{Seq: 2, Pass: int64(l)}, l, []int{0, 1, 2, 3})
		for ex := range 4 {
			if _, err := e.Run(ctx, model.Step{Seq: 2, Pass: int64(l)}, l, ex, x, 4, out, Hold); err != nil {
				t.Fatal(err)
			}
		}
		free, _, err := probe.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		lowest = min(lowest, free)
	}
	if _, err := dev.Alloc(budget + 1); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("allocating past the budget: %v, want ErrOverBudget", err)
	}
	_, _, peak := dev.Memory()
	e.Close()
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	freeAfter, _, err := probe.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	used := free0 - lowest
	t.Logf("GPU of %d MiB: budget %d MiB, the device took %.2f MiB of GPU memory at most (its kernels' second module and streams included), arena peak %.2f MiB; after Close %.2f MiB still taken",
		total>>20, budget>>20, float64(used)/(1<<20), float64(peak)/(1<<20), float64(free0-freeAfter)/(1<<20))
	// the driver hands out device memory in 2 MiB pages: the budget's
	// allocation rounded up, plus at most one page for the module's code
	// and the streams
	if used > budget+4<<20 {
		t.Fatalf("the device took %d bytes of GPU memory for a budget of %d", used, budget)
	}
	// Close gives the budget back; what the driver keeps of the module's
	// code and the streams (4 MiB on an H100 with driver 580) stays in the
	// context, which the process keeps
	if back := freeAfter - lowest; back < budget {
		t.Fatalf("Close gave back %d bytes of GPU memory, less than the budget of %d", back, budget)
	}
}
