package worker

import (
	"container/list"
	"context"
	"errors"
	"sync"

	"github.com/odmoe/odmoe/model"
)

// HostCache keeps decompressed experts in host memory, up to a byte
// budget, least recently used out first: the worker's CPU RAM of
// OD-MoE's rig, where experts wait to be copied to the GPU. With it a
// load is a host-to-device transfer only (paced by the Link, as a DMA
// over PCIe would be, costing no CPU) instead of a store read and
// decompression. The expert then computes from the host copy while the
// Arena accounts its bytes as device memory, so the device budget is
// enforced exactly as without the cache.
//
// The copies live in an Arena of their own (off the Go heap, as the
// device's), so the cache's resident memory is its budget at most and
// its evictions leave no garbage behind. A copy in use stays until its
// last user lets go, even when evicted. Safe for concurrent use; Close
// it once nothing uses its copies any more.
type HostCache struct {
	arena *Arena

	mu     sync.Mutex
	used   int64      // bytes of the cached copies
	lru    *list.List // of *hostEntry, most recent at the front
	byKey  map[slotKey]*list.Element
	hits   int64
	misses int64
}

type hostEntry struct {
	key    slotKey
	expert model.Expert
	block  Block
	size   int64
	users  int  // holds not yet released
	cached bool // in lru and byKey; false once evicted
}

// errHostFull says a copy does not fit the host cache, even after
// evicting every copy nobody uses.
var errHostFull = errors.New("worker: host cache full")

// NewHostCache returns a cache of up to budget bytes.
func NewHostCache(budget int64) (*HostCache, error) {
	a, err := NewArena(budget)
	if err != nil {
		return nil, err
	}
	return &HostCache{arena: a, lru: list.New(), byKey: map[slotKey]*list.Element{}}, nil
}

// Budget is the bytes the cache may hold.
func (c *HostCache) Budget() int64 { return c.arena.Budget() }

// Close gives the cache's memory back; no copy may be used after.
func (c *HostCache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Init()
	clear(c.byKey)
	c.used = 0
	return c.arena.Close()
}

// hold returns the host copy of expert k (n bytes), reading it from src
// into the cache first if it is not there; its memory stays until the
// hold is released (once). It fails with errHostFull (wrapped) when the
// copy does not fit.
func (c *HostCache) hold(ctx context.Context, src ExpertSource, k slotKey, n int) (*hostEntry, error) {
	if ent, ok := c.get(k); ok {
		return ent, nil
	}
	return c.fill(ctx, src, k, n)
}

// fill reads expert k (n bytes) from src into the cache and holds it, as
// hold does for an expert the cache does not have.
func (c *HostCache) fill(ctx context.Context, src ExpertSource, k slotKey, n int) (*hostEntry, error) {
	c.mu.Lock()
	b, err := c.allocLocked(int64(n))
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	ex, err := src.ReadExpert(ctx, k.layer, k.expert, b.Bytes)
	if err != nil {
		c.arena.Free(b)
		return nil, err
	}
	ent := &hostEntry{key: k, expert: ex, block: b, size: int64(n), users: 1}
	c.insert(ent)
	return ent, nil
}

// get takes a hold on k's copy if it is cached.
func (c *HostCache) get(k slotKey) (*hostEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if !ok {
		c.misses++
		return nil, false
	}
	c.hits++
	c.lru.MoveToFront(el)
	ent := el.Value.(*hostEntry)
	ent.users++
	return ent, true
}

// allocLocked takes n bytes of the cache's memory, evicting the least
// recently used copies nobody holds until they fit.
func (c *HostCache) allocLocked(n int64) (Block, error) {
	for {
		b, err := c.arena.Alloc(n)
		if err == nil || !errors.Is(err, ErrOverBudget) {
			return b, err
		}
		el := c.lru.Back()
		for el != nil && el.Value.(*hostEntry).users > 0 {
			el = el.Prev()
		}
		if el == nil {
			return Block{}, errors.Join(errHostFull, err)
		}
		c.evictLocked(el)
	}
}

// insert caches ent, unless a copy of its expert was cached meanwhile
// (loaded twice at once): then ent is only held, and freed on release.
func (c *HostCache) insert(ent *hostEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[ent.key]; ok {
		c.lru.MoveToFront(el)
		if ent.users == 0 {
			c.arena.Free(ent.block)
		}
		return
	}
	ent.cached = true
	c.byKey[ent.key] = c.lru.PushFront(ent)
	c.used += ent.size
}

// evictLocked drops a copy from the cache; its memory goes back now, or
// when its last hold is released.
func (c *HostCache) evictLocked(el *list.Element) {
	ent := el.Value.(*hostEntry)
	c.lru.Remove(el)
	delete(c.byKey, ent.key)
	c.used -= ent.size
	ent.cached = false
	if ent.users == 0 {
		c.arena.Free(ent.block)
	}
}

// release ends one hold on ent.
func (c *HostCache) release(ent *hostEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ent.users--
	if ent.users == 0 && !ent.cached {
		c.arena.Free(ent.block)
	}
}

// Stats returns the cache's hits, misses and bytes held.
func (c *HostCache) Stats() (hits, misses, used int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.used
}

// Preload fills the cache with src's experts of layers (ascending) in
// (layer, expert) order, those held says (nil: all; a worker filling its
// store: those its directory holds, none fetched for this), until the
// next would not fit (a node that keeps the whole model in host RAM, as
// OD-MoE's do), reporting bytes done to progress (may be nil). It
// returns the number of experts loaded.
func (c *HostCache) Preload(ctx context.Context, src ExpertSource, layers []int, experts int, held func(layer, expert int) bool, progress func(done int64)) (int, error) {
	var done int64
	n := 0
	for _, l := range layers {
		for e := range experts {
			if held != nil && !held(l, e) {
				continue
			}
			size, err := src.ExpertBytes(l, e)
			if err != nil {
				return n, err
			}
			b, err := c.arena.Alloc(int64(size)) // no eviction: stop when full
			if errors.Is(err, ErrOverBudget) {
				return n, nil
			} else if err != nil {
				return n, err
			}
			ex, err := src.ReadExpert(ctx, l, e, b.Bytes)
			if err != nil {
				c.arena.Free(b)
				return n, err
			}
			c.insert(&hostEntry{key: slotKey{l, e}, expert: ex, block: b, size: int64(size)})
			n++
			done += int64(size)
			if progress != nil {
				progress(done)
			}
		}
	}
	return n, nil
}
