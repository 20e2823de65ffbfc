package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// countingSource is memSource that counts the chunks it serves.
type countingSource struct {
	memSource
	reads atomic.Int64
}

func (c *countingSource) ReadChunk(ctx context.Context, ref ChunkRef, dst []byte) error {
	c.reads.Add(1)
	return c.memSource.ReadChunk(ctx, ref, dst)
}

// cachedStore is smallStore read through a chunk cache of budget bytes
// from a counting source.
func cachedStore(t *testing.T, budget int64) (*Store, *countingSource, *ChunkCache, build) {
	t.Helper()
	dir, b := smallStore.write(t, ConvertOptions{Shards: 2})
	local, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Close() })
	chunks, _ := os.ReadFile(filepath.Join(dir, ChunkFile))
	src := &countingSource{memSource: memSource(chunks)}
	cache := NewChunkCache(budget, nil)
	st, err := New(local.IndexBytes(), src, Options{Identity: b.identity, Chunks: cache})
	if err != nil {
		t.Fatal(err)
	}
	return st, src, cache, b
}

// TestChunkCacheServesRepeatReadsFromMemory: with room for every chunk,
// reading the store twice reads the source once; both reads return the
// original weights, and the cache holds the compressed bytes, fewer than
// the decompressed ones.
func TestChunkCacheServesRepeatReadsFromMemory(t *testing.T) {
	st, src, cache, b := cachedStore(t, 1<<20)
	checkStore(t, "first read", st, b)
	first := src.reads.Load()
	checkStore(t, "second read", st, b)
	if got := src.reads.Load(); got != first {
		t.Fatalf("the second read took %d chunks from the source, want 0", got-first)
	}
	hits, misses, held := cache.Stats()
	var raw int64
	for _, s := range b.tensors {
		raw += int64(len(s.m.Data))
	}
	if hits == 0 || misses != first || held <= 0 || held >= raw {
		t.Fatalf("cache: %d hits, %d misses (%d source reads), %d bytes held for %d decompressed", hits, misses, first, held, raw)
	}
}

// TestChunkCacheStaysWithinItsBudget: a cache with room for one expert's
// chunks serves that expert's second read from memory, makes room for the
// next expert by evicting it (least recently used), and never holds more
// than its budget; every read is right.
func TestChunkCacheStaysWithinItsBudget(t *testing.T) {
	probe, _, probeCache, _ := cachedStore(t, 1<<20)
	read := func(st *Store, l, e int) {
		t.Helper()
		n, _ := st.ExpertBytes(l, e)
		if _, err := st.ReadExpert(context.Background(), l, e, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	read(probe, 0, 0)
	_, _, one := probeCache.Stats() // one expert's chunks

	st, src, cache, b := cachedStore(t, one)
	read(st, 0, 0)
	loaded := src.reads.Load()
	read(st, 0, 0)
	if src.reads.Load() != loaded {
		t.Fatal("the second read of a cached expert went to the source")
	}
	read(st, 1, 1)
	read(st, 0, 0)
	if src.reads.Load() != 3*loaded {
		t.Fatalf("%d source reads after reading expert (1, 1) in between, want %d: expert (0, 0) should have been evicted", src.reads.Load(), 3*loaded)
	}
	if _, _, held := cache.Stats(); held > one {
		t.Fatalf("cache holds %d bytes, budget %d", held, one)
	}
	checkStore(t, "small cache", st, b)
}

// TestChunkCacheCatchesAFlippedCachedByte: a cached chunk whose bytes
// changed in memory fails its checksum, is dropped and read again from the
// source: the weights come back right.
func TestChunkCacheCatchesAFlippedCachedByte(t *testing.T) {
	st, src, cache, b := cachedStore(t, 1<<20)
	checkStore(t, "first read", st, b)
	cache.mu.Lock()
	for _, el := range cache.byOff {
		el.Value.(*cachedChunk).data[0] ^= 0x40
	}
	cache.mu.Unlock()
	before := src.reads.Load()
	checkStore(t, "after flipping cached bytes", st, b)
	if src.reads.Load() == before {
		t.Fatal("flipped cached chunks were used without a re-read")
	}
}

// tightMemory lends at most limit bytes, as an arena that fills up or
// fragments would.
type tightMemory struct {
	limit, inUse int
	frees        int
}

func (m *tightMemory) Alloc(n int) ([]byte, error) {
	if m.inUse+n > m.limit {
		return nil, errors.New("no room")
	}
	m.inUse += n
	return make([]byte, n), nil
}

func (m *tightMemory) Free(b []byte) { m.inUse -= len(b); m.frees++ }

// TestChunkCacheEvictsWhenItsMemoryIsFull: when the memory the cache
// keeps its copies in refuses an allocation below the cache's budget, the
// cache evicts until it fits (or keeps nothing), gives back what it
// evicts, and every read is still right.
func TestChunkCacheEvictsWhenItsMemoryIsFull(t *testing.T) {
	dir, b := smallStore.write(t, ConvertOptions{Shards: 2})
	mem := &tightMemory{limit: 500}
	st, err := Open(dir, Options{Chunks: NewChunkCache(1<<20, mem)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for range 2 {
		checkStore(t, "tight memory", st, b)
		if mem.inUse > mem.limit {
			t.Fatalf("memory lends %d of %d", mem.inUse, mem.limit)
		}
	}
	if _, _, held := st.chunks.Stats(); held != int64(mem.inUse) || mem.frees == 0 {
		t.Fatalf("cache holds %d bytes, memory lends %d, %d frees", held, mem.inUse, mem.frees)
	}
}
