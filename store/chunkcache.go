package store

import (
	"container/list"
	"sync"
)

// ChunkCache keeps stored chunks (the compressed experts, ~0.66 of their
// BF16 bytes) in host memory, up to a byte budget, least recently used
// out first: ZipMoE's compressed tier. A Store given one (Options) reads
// a cached chunk from memory instead of its source and only decodes it,
// so a worker can hold half as many experts again in the same RAM as
// decompressed copies take, at the price of decompressing each load. A
// chunk larger than the budget is never kept. Safe for concurrent use.
type ChunkCache struct {
	budget int64
	mem    ChunkMemory // nil: the Go heap

	mu     sync.Mutex
	used   int64
	lru    *list.List // of *cachedChunk, most recent at the front
	byOff  map[int64]*list.Element
	hits   int64
	misses int64
}

type cachedChunk struct {
	off  int64
	data []byte
}

// ChunkMemory is where a ChunkCache keeps its copies: a worker lends it
// an arena off the Go heap, so that the cache's resident memory is its
// budget at most and its evictions leave no garbage. Alloc fails when the
// memory has no room for n bytes (the cache evicts and tries again).
type ChunkMemory interface {
	Alloc(n int) ([]byte, error)
	Free(b []byte)
}

// NewChunkCache returns a cache of up to budget bytes of chunks, kept in
// mem (nil: on the Go heap).
func NewChunkCache(budget int64, mem ChunkMemory) *ChunkCache {
	return &ChunkCache{budget: budget, mem: mem, lru: list.New(), byOff: map[int64]*list.Element{}}
}

// Memory is where the cache keeps its copies (nil: the Go heap).
func (c *ChunkCache) Memory() ChunkMemory { return c.mem }

// Stats returns the cache's hits, misses and the bytes it holds.
func (c *ChunkCache) Stats() (hits, misses, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.used
}

// get copies the chunk at ref into dst if it is cached.
func (c *ChunkCache) get(ref ChunkRef, dst []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byOff[ref.Offset]
	if !ok || len(el.Value.(*cachedChunk).data) != ref.Size {
		c.misses++
		return false
	}
	c.hits++
	c.lru.MoveToFront(el)
	copy(dst, el.Value.(*cachedChunk).data)
	return true
}

// DropExpert forgets the chunks of expert (layer, expert) of st, when
// its caller keeps it another way (a decompressed copy): the compressed
// tier's memory goes to experts only it holds.
func (c *ChunkCache) DropExpert(st *Store, layer, expert int) {
	for _, k := range st.ix.form.kinds() {
		t, err := st.ix.find(layer, expert, k)
		if err != nil {
			return
		}
		for _, sh := range t.shards {
			c.drop(sh.sm)
			c.drop(sh.exp)
		}
	}
}

// drop forgets the chunk at ref.
func (c *ChunkCache) drop(ref ChunkRef) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byOff[ref.Offset]; ok {
		c.removeLocked(el)
	}
}

// removeLocked forgets a cached chunk and gives its memory back.
func (c *ChunkCache) removeLocked(el *list.Element) {
	ch := el.Value.(*cachedChunk)
	c.lru.Remove(el)
	delete(c.byOff, ch.off)
	c.used -= int64(len(ch.data))
	if c.mem != nil {
		c.mem.Free(ch.data)
	}
}

// allocLocked takes n bytes for a copy, evicting the least recently used
// chunks while the budget or the memory has no room; nil if it cannot.
func (c *ChunkCache) allocLocked(n int) []byte {
	for c.used+int64(n) > c.budget && c.lru.Len() > 0 {
		c.removeLocked(c.lru.Back())
	}
	if c.mem == nil {
		return make([]byte, n)
	}
	for {
		b, err := c.mem.Alloc(n)
		if err == nil {
			return b
		}
		if c.lru.Len() == 0 {
			return nil
		}
		c.removeLocked(c.lru.Back()) // room, but in pieces: free more
	}
}

// put keeps a copy of chunk (the bytes at ref, checked), evicting the
// least recently used chunks until it fits.
func (c *ChunkCache) put(ref ChunkRef, chunk []byte) {
	n := int64(len(chunk))
	if n == 0 || n > c.budget {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byOff[ref.Offset]; ok {
		return // read twice at once
	}
	data := c.allocLocked(len(chunk))
	if data == nil {
		return
	}
	copy(data, chunk)
	c.byOff[ref.Offset] = c.lru.PushFront(&cachedChunk{off: ref.Offset, data: data})
	c.used += n
}
