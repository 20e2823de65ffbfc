// Package kvcache holds the keys and values that attention has computed for
// the positions of one sequence, per layer, in float32. The main node's
// cache is authoritative; the shadow keeps its own copy and overwrites
// rows of it at KV alignment, which is why rows are addressable by
// position rather than only appendable.
package kvcache

import "fmt"

// Cache stores, for every layer, one key row and one value row (kvHeads *
// headDim floats each) per position in [0, Len()); or, a latent cache
// (NewLatent), one row per position that is both.
type Cache struct {
	width int         // floats per row: kvHeads * headDim
	k, v  [][]float32 // per layer, capacity*width floats; v nil for a latent cache
	n     int         // committed positions
	cap   int
}

// New returns an empty cache for layers layers of kvHeads heads of headDim,
// with room for capacity positions (it grows on demand).
func New(layers, kvHeads, headDim, capacity int) *Cache {
	c := &Cache{width: kvHeads * headDim, k: make([][]float32, layers), v: make([][]float32, layers)}
	c.Reserve(capacity)
	return c
}

// NewLatent returns an empty cache of one row of width floats per layer
// and position that serves as both key and value (Values returns the key
// rows, Put ignores its value row): Multi-head Latent Attention's
// compressed latent and rotary key, from which every head's keys and
// values are computed.
func NewLatent(layers, width, capacity int) *Cache {
	c := &Cache{width: width, k: make([][]float32, layers)}
	c.Reserve(capacity)
	return c
}

// Latent reports whether the cache is a latent one (NewLatent).
func (c *Cache) Latent() bool { return c.v == nil }

// Width is the number of floats in one key or value row.
func (c *Cache) Width() int { return c.width }

// Layers is the number of layers.
func (c *Cache) Layers() int { return len(c.k) }

// Len is the number of committed positions.
func (c *Cache) Len() int { return c.n }

// Reserve makes room for at least positions positions, keeping the rows.
func (c *Cache) Reserve(positions int) {
	if positions <= c.cap {
		return
	}
	newCap := max(positions, 2*c.cap, 16)
	for l := range c.k {
		k := make([]float32, newCap*c.width)
		copy(k, c.k[l][:c.n*c.width])
		c.k[l] = k
		if c.v != nil {
			v := make([]float32, newCap*c.width)
			copy(v, c.v[l][:c.n*c.width])
			c.v[l] = v
		}
	}
	c.cap = newCap
}

// Put writes the key and value rows of layer at pos; pos may run ahead of
// Len (positions of a batch being computed) but not past the reserved room.
// A latent cache writes k only (v may be nil).
func (c *Cache) Put(layer, pos int, k, v []float32) error {
	if len(k) != c.width || c.v != nil && len(v) != c.width {
		return fmt.Errorf("kvcache: rows of %d and %d floats, want %d", len(k), len(v), c.width)
	}
	if layer < 0 || layer >= len(c.k) || pos < 0 || pos >= c.cap {
		return fmt.Errorf("kvcache: layer %d position %d outside %d layers x %d reserved positions", layer, pos, len(c.k), c.cap)
	}
	copy(c.k[layer][pos*c.width:], k)
	if c.v != nil {
		copy(c.v[layer][pos*c.width:], v)
	}
	return nil
}

// Keys returns the key rows of layer for positions [0, upto) as one slice
// (row p at [p*Width, (p+1)*Width)). It aliases the cache.
func (c *Cache) Keys(layer, upto int) []float32 { return c.k[layer][:upto*c.width] }

// Values is Keys for the value rows (a latent cache's are its keys).
func (c *Cache) Values(layer, upto int) []float32 {
	if c.v == nil {
		return c.Keys(layer, upto)
	}
	return c.v[layer][:upto*c.width]
}

// Commit marks positions [0, n) as valid.
func (c *Cache) Commit(n int) error {
	if n < 0 || n > c.cap {
		return fmt.Errorf("kvcache: commit %d positions with %d reserved", n, c.cap)
	}
	c.n = n
	return nil
}

// Truncate forgets positions from n on (n <= Len).
func (c *Cache) Truncate(n int) {
	if n < c.n {
		c.n = max(n, 0)
	}
}

// Prefix returns a new cache holding a copy of positions [0, n) of c,
// with room for capacity positions (it grows on demand): the start of
// another sequence that begins with the same tokens.
func (c *Cache) Prefix(n, capacity int) (*Cache, error) {
	if n < 0 || n > c.n {
		return nil, fmt.Errorf("kvcache: a prefix of %d positions of %d", n, c.n)
	}
	p := &Cache{width: c.width, k: make([][]float32, len(c.k))}
	if c.v != nil {
		p.v = make([][]float32, len(c.v))
	}
	p.Reserve(max(n, capacity))
	for l := range c.k {
		copy(p.k[l], c.k[l][:n*c.width])
		if c.v != nil {
			copy(p.v[l], c.v[l][:n*c.width])
		}
	}
	p.n = n
	return p, nil
}

// Bytes is the memory the cache holds: every reserved row of every
// layer, keys and values (a latent cache's rows once).
func (c *Cache) Bytes() int64 {
	rows := int64(2)
	if c.v == nil {
		rows = 1
	}
	return rows * 4 * int64(len(c.k)) * int64(c.cap) * int64(c.width)
}
