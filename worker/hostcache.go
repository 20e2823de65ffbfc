package worker

import (
	"container/list"
	"context"
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
// enforced exactly as without the cache. Safe for concurrent use.
type HostCache struct {
	budget int64

	mu     sync.Mutex
	used   int64
	lru    *list.List // of *hostEntry, most recent at the front
	byKey  map[slotKey]*list.Element
	hits   int64
	misses int64
}

type hostEntry struct {
	key    slotKey
	expert model.Expert
	size   int64
}

// NewHostCache returns a cache of up to budget bytes.
func NewHostCache(budget int64) *HostCache {
	return &HostCache{budget: budget, lru: list.New(), byKey: map[slotKey]*list.Element{}}
}

func (c *HostCache) get(k slotKey) (model.Expert, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if !ok {
		c.misses++
		return model.Expert{}, false
	}
	c.hits++
	c.lru.MoveToFront(el)
	return el.Value.(*hostEntry).expert, true
}

// put adds an expert of size bytes unless it is larger than the budget,
// evicting the least recently used ones to make room.
func (c *HostCache) put(k slotKey, ex model.Expert, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if size > c.budget {
		return
	}
	if el, ok := c.byKey[k]; ok { // loaded twice at once: keep one
		c.lru.MoveToFront(el)
		return
	}
	for c.used+size > c.budget {
		old := c.lru.Back()
		e := old.Value.(*hostEntry)
		c.lru.Remove(old)
		delete(c.byKey, e.key)
		c.used -= e.size
	}
	c.byKey[k] = c.lru.PushFront(&hostEntry{key: k, expert: ex, size: size})
	c.used += size
}

// Stats returns the cache's hits, misses and bytes held.
func (c *HostCache) Stats() (hits, misses, used int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.used
}

// Preload fills the cache with src's experts in (layer, expert) order
// until the next would not fit (a node that keeps the whole model in host
// RAM, as OD-MoE's do), reporting bytes done to progress (may be nil).
// It returns the number of experts loaded.
func (c *HostCache) Preload(ctx context.Context, src ExpertSource, layers, experts int, progress func(done int64)) (int, error) {
	var done int64
	n := 0
	for l := range layers {
		for e := range experts {
			size, err := src.ExpertBytes(l, e)
			if err != nil {
				return n, err
			}
			c.mu.Lock()
			full := c.used+int64(size) > c.budget
			c.mu.Unlock()
			if full {
				return n, nil
			}
			ex, err := src.ReadExpert(ctx, l, e, make([]byte, size))
			if err != nil {
				return n, err
			}
			c.put(slotKey{l, e}, ex, int64(size))
			n++
			done += int64(size)
			if progress != nil {
				progress(done)
			}
		}
	}
	return n, nil
}
