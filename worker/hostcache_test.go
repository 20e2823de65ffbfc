package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/store"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
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
	e.Host = newHostCache(t, int64(2*size)) // room for two experts
	x := randomInput(2, h, 9)
	out := make([]float32, 2*h)
	for round := range 3 {
		e.Prefetch(context.Background(), model.Step{Seq: 1}, 1, []int{4})
		e.wg.Wait()
		if arena.InUse() != int64(size) {
			t.Fatalf("round %d: a resident expert holds %d device bytes, want %d", round, arena.InUse(), size)
		}
		if _, err := e.Run(context.Background(), model.Step{Seq: 1}, 1, 4, x, 2, out, Evict); err != nil {
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
		if _, err := e.Run(context.Background(), model.Step{Seq: 1}, 1, ex, x, 2, out, Evict); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Run(context.Background(), model.Step{Seq: 1}, 1, 4, x, 2, out, Evict); err != nil {
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
	c := newHostCache(t, int64(3*size+size/2))
	var progressed int64
	n, err := c.Preload(context.Background(), src, f.store.Layers(), f.store.Experts(), nil, func(done int64) { progressed = done })
	if err != nil || n != 3 || progressed != int64(3*size) {
		t.Fatalf("preloaded %d experts (%d bytes reported), err %v; want 3", n, progressed, err)
	}
	// held: only those (a worker filling its store preloads what its
	// directory holds, and reads nothing else)
	odd := newHostCache(t, int64(3*size+size/2))
	other := &countingSource{ExpertSource: f.store}
	n, err = odd.Preload(context.Background(), other, f.store.Layers(), f.store.Experts(), func(l, e int) bool { return l == 0 && e%2 == 1 }, nil)
	odd.mu.Lock()
	_, has0 := odd.byKey[slotKey{0, 0}]
	_, has1 := odd.byKey[slotKey{0, 1}]
	odd.mu.Unlock()
	if err != nil || n != 3 || other.reads.Load() != 3 || has0 || !has1 {
		t.Fatalf("preloaded %d experts held (%d read), err %v; want experts 1, 3, 5 of layer 0", n, other.reads.Load(), err)
	}
	arena, _ := NewArena(64 << 20)
	e := NewEngine(src, f.model.Config.HiddenSize, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	e.Host = c
	h := f.model.Config.HiddenSize
	x := randomInput(1, h, 4)
	out := make([]float32, h)
	for ex := range 3 { // layer 0, experts 0..2: preloaded
		if _, err := e.Run(context.Background(), model.Step{Seq: 1}, 0, ex, x, 1, out, Evict); err != nil {
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

func newHostCache(t *testing.T, budget int64) *HostCache {
	t.Helper()
	c, err := NewHostCache(budget)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestHostCacheKeepsACopyInUseUntilReleased: a copy the device computes
// from is never evicted from under it; when every copy is held a new one
// does not fit (and the engine reads into device staging instead), and
// once released it makes room.
func TestHostCacheKeepsACopyInUseUntilReleased(t *testing.T) {
	f := tinyFixture(t)
	size, _ := f.store.ExpertBytes(0, 0)
	c := newHostCache(t, int64(size)) // room for one expert
	ctx := context.Background()
	a, err := c.hold(ctx, f.store, slotKey{0, 0}, size)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), a.expert.Gate.Data...)
	if _, err := c.hold(ctx, f.store, slotKey{0, 1}, size); !errors.Is(err, errHostFull) {
		t.Fatalf("second copy while the first is held: err %v, want errHostFull", err)
	}
	if !bytes.Equal(a.expert.Gate.Data, want) {
		t.Fatal("a held copy changed")
	}
	c.release(a)
	b, err := c.hold(ctx, f.store, slotKey{0, 1}, size)
	if err != nil {
		t.Fatalf("second copy after the first was released: %v", err)
	}
	defer c.release(b)
	if _, _, used := c.Stats(); used != int64(size) {
		t.Errorf("%d bytes held, want %d", used, size)
	}
}

// TestHostCacheBoundedUnderConcurrentLoads: many experts loaded and run
// at once through a host cache smaller than the device budget give local
// mode's bits, the cache's memory never exceeds its budget, and every
// copy is back once the engine has closed.
func TestHostCacheBoundedUnderConcurrentLoads(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	size, _ := f.store.ExpertBytes(0, 0)
	arena, _ := NewArena(64 << 20)
	defer arena.Close()
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	c := newHostCache(t, int64(3*size))
	e.Host = c
	layers, experts := f.store.Layers(), f.store.Experts()
	var g errgroup.Group
	for w := range 6 {
		g.Go(func() error {
			x := randomInput(1, h, uint64(w))
			out := make([]float32, h)
			for i := range 40 {
				l, ex := layers[(w+i)%len(layers)], (w*3+i)%experts
				after := []After{Hold, Cache, Evict}[i%3]
				if _, err := e.Run(context.Background(), model.Step{Seq: uint64(w + 1)}, l, ex, x, 1, out, after); err != nil {
					return err
				}
				if !sameBits(out, localExpert(f.model, l, ex, x, 1)) {
					return fmt.Errorf("layer %d expert %d differs from local mode", l, ex)
				}
				if c.arena.InUse() > c.arena.Budget() {
					return fmt.Errorf("host cache holds %d of %d bytes", c.arena.InUse(), c.arena.Budget())
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if _, _, used := c.Stats(); c.arena.InUse() != used {
		t.Errorf("after the engine closed the cache's arena holds %d bytes, its copies %d: a hold was never released", c.arena.InUse(), used)
	}
	if hits, misses, _ := c.Stats(); hits+misses != e.Stats.Loads.Load() {
		t.Errorf("%d host cache hits and %d misses for %d loads: every load goes through the cache once", hits, misses, e.Stats.Loads.Load())
	}
}

// TestHostCacheIsOffTheGoHeap: cached copies neither count as live Go
// heap nor leave garbage when evicted, so a worker's host cache costs
// its budget and no more.
func TestHostCacheIsOffTheGoHeap(t *testing.T) {
	f := tinyFixture(t)
	size, _ := f.store.ExpertBytes(0, 0)
	layers, experts := f.store.Layers(), f.store.Experts()
	before := liveHeap()
	c := newHostCache(t, int64(len(layers)*experts*size))
	n, err := c.Preload(context.Background(), f.store, layers, experts, nil, nil)
	if err != nil || n != len(layers)*experts {
		t.Fatalf("preloaded %d of %d experts: %v", n, len(layers)*experts, err)
	}
	grew := int64(liveHeap()) - int64(before)
	t.Logf("%d experts (%d KiB) cached: live Go heap %+d KiB", n, int64(n*size)>>10, grew>>10)
	if grew > int64(n*size)/4 {
		t.Errorf("caching %d KiB of experts added %d KiB of live Go heap", int64(n*size)>>10, grew>>10)
	}
}

// TestHostCacheFillsAllocateNoExpertBuffers: loads through a host cache
// too small for the experts they cycle through (every load a fill and an
// eviction) take their memory from the cache's arena, not from the Go
// heap, so they leave no expert-sized garbage behind.
func TestHostCacheFillsAllocateNoExpertBuffers(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	size, _ := f.store.ExpertBytes(0, 0)
	arena, _ := NewArena(64 << 20)
	defer arena.Close()
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	e.Host = newHostCache(t, int64(2*size))
	x, out := randomInput(1, h, 5), make([]float32, h)
	const loads = 64
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range loads {
		if _, err := e.Run(context.Background(), model.Step{Seq: 1}, 0, i%f.store.Experts(), x, 1, out, Evict); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if hits, _, _ := e.Host.Stats(); hits != 0 {
		t.Fatalf("%d host cache hits: the loads should all be fills", hits)
	}
	perLoad := (after.TotalAlloc - before.TotalAlloc) / loads
	t.Logf("%d fills of %d KiB experts: %d bytes of Go heap allocated per load", loads, size>>10, perLoad)
	if perLoad > uint64(size)/8 {
		t.Errorf("a load through the host cache allocates %d bytes of Go heap (an expert is %d)", perLoad, size)
	}
}

// compressedTierEngine is an engine over the tiny store opened with a
// 64 MiB compressed tier (as Run opens it), and that tier's arena.
func compressedTierEngine(t *testing.T) (*Engine, *store.Store, *ArenaChunks, fixture) {
	t.Helper()
	f := tinyFixture(t)
	st, chunks, _, closeStore, err := openStore(context.Background(), Config{Store: filepath.Join(f.dir, "store"), HostCompressedBytes: 64 << 20}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	arena, err := NewArena(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(st, f.model.Config.HiddenSize, NewCPU(arena, NewLink(0)), zerolog.Nop())
	e.Chunks = chunks
	t.Cleanup(func() { e.Close(); closeStore() })
	return e, st, chunks.Memory().(*ArenaChunks), f
}

// TestCompressedTierServesReloadsFromHostMemory: a worker whose store
// keeps its chunks in host memory (-host-compressed) reloads an expert it
// evicted by decompressing it from RAM, without reading the store file,
// and computes local mode's bits; the compressed copy is smaller than the
// expert.
func TestCompressedTierServesReloadsFromHostMemory(t *testing.T) {
	e, st, mem, f := compressedTierEngine(t)
	chunks, h := e.Chunks, f.model.Config.HiddenSize
	x := randomInput(1, h, 5)
	out := make([]float32, h)
	for range 2 {
		if _, err := e.Run(context.Background(), model.Step{Seq: 1}, 1, 3, x, 1, out, Evict); err != nil {
			t.Fatal(err)
		}
		if !sameBits(out, localExpert(f.model, 1, 3, x, 1)) {
			t.Fatal("not local mode's bits")
		}
	}
	hits, misses, held := chunks.Stats()
	if mem.InUse() < held || mem.InUse() > held+64*arenaAlign {
		t.Fatalf("the compressed tier holds %d bytes, its arena lends %d", held, mem.InUse())
	}
	eb, _ := st.ExpertBytes(1, 3)
	if e.Stats.Loads.Load() != 2 || hits != misses || hits == 0 || held <= 0 || held >= int64(eb) {
		t.Fatalf("2 loads (%d): %d chunk reads from RAM, %d from the store, %d bytes held for an expert of %d", e.Stats.Loads.Load(), hits, misses, held, eb)
	}
}
