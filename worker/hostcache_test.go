package worker

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/rs/zerolog"
)

// countingSource counts store reads.
type countingSource struct {
	ExpertSource
	reads atomic.Int64
}

func (c *countingSource) ReadExpert(ctx context.Context, layer, expert int, dst []byte) (model.Expert, error) {
	c.reads.Add(1)
	return c.ExpertSource.ReadExpert(ctx, layer, expert, dst)
}

// TestHostCacheServesReloadsWithoutTheStore: with a host cache, an
// expert evicted from device memory and loaded again is not read from the
// store a second time, computes the same bits, and still takes its bytes
// from the device budget while resident.
func TestHostCacheServesReloadsWithoutTheStore(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	src := &countingSource{ExpertSource: f.store}
	arena, _ := NewArena(64 << 20)
	e := NewEngine(src, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	size, err := f.store.ExpertBytes(1, 4)
	if err != nil {
		t.Fatal(err)
	}
	e.Host = NewHostCache(int64(2 * size)) // room for two experts
	x := randomInput(2, h, 9)
	out := make([]float32, 2*h)
	for round := range 3 {
		e.Prefetch(context.Background(), 1, 1, []int{4})
		e.wg.Wait()
		if arena.InUse() != int64(size) {
			t.Fatalf("round %d: a resident expert holds %d device bytes, want %d", round, arena.InUse(), size)
		}
		if _, err := e.Run(context.Background(), 1, 1, 4, x, 2, out, true); err != nil {
			t.Fatal(err)
		}
		if !sameBits(out, localExpert(f.model, 1, 4, x, 2)) {
			t.Fatalf("round %d: output differs from local mode", round)
		}
		if arena.InUse() != 0 {
			t.Fatalf("round %d: %d device bytes after eviction", round, arena.InUse())
		}
	}
	if got := src.reads.Load(); got != 1 {
		t.Errorf("%d store reads for three loads of one expert, want 1", got)
	}
	// two more experts push the first out of the host cache (LRU)
	for _, ex := range []int{5, 6} {
		if _, err := e.Run(context.Background(), 1, 1, ex, x, 2, out, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Run(context.Background(), 1, 1, 4, x, 2, out, true); err != nil {
		t.Fatal(err)
	}
	hits, misses, used := e.Host.Stats()
	if src.reads.Load() != 4 || hits != 2 || misses != 4 || used != int64(2*size) {
		t.Errorf("after evicting from the host cache: %d reads, %d hits, %d misses, %d bytes held (want 4, 2, 4, %d)",
			src.reads.Load(), hits, misses, used, 2*size)
	}
}

// TestHostPreloadFillsInOrderUpToTheBudget: preloading stops at the first
// expert that would not fit, and preloaded experts load without a store
// read.
func TestHostPreloadFillsInOrderUpToTheBudget(t *testing.T) {
	f := tinyFixture(t)
	src := &countingSource{ExpertSource: f.store}
	size, _ := f.store.ExpertBytes(0, 0)
	c := NewHostCache(int64(3*size + size/2))
	var progressed int64
	n, err := c.Preload(context.Background(), src, f.store.Layers(), f.store.Experts(), func(done int64) { progressed = done })
	if err != nil || n != 3 || progressed != int64(3*size) {
		t.Fatalf("preloaded %d experts (%d bytes reported), err %v; want 3", n, progressed, err)
	}
	arena, _ := NewArena(64 << 20)
	e := NewEngine(src, f.model.Config.HiddenSize, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	e.Host = c
	h := f.model.Config.HiddenSize
	x := randomInput(1, h, 4)
	out := make([]float32, h)
	for ex := range 3 { // layer 0, experts 0..2: preloaded
		if _, err := e.Run(context.Background(), 1, 0, ex, x, 1, out, true); err != nil {
			t.Fatal(err)
		}
		if !sameBits(out, localExpert(f.model, 0, ex, x, 1)) {
			t.Fatalf("expert %d differs from local mode", ex)
		}
	}
	if got := src.reads.Load(); got != 3 {
		t.Errorf("%d store reads: preloading reads 3, running them should read none", got)
	}
}
