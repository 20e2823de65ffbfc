// Package kvcache holds the keys and values that attention has computed for
// the positions of one sequence, per layer, in float32. The main node's
// cache is authoritative; the shadow keeps its own copy and overwrites
// rows of it at KV alignment, which is why rows are addressable by
// position rather than only appendable. A layer with a sliding window
// (SetWindows: gpt-oss's sliding layers) keeps only the positions its
// window can still read.
package kvcache

import "fmt"

// Cache stores, for every layer, one key row and one value row (kvHeads *
// headDim floats each) per position in [0, Len()); or, a latent cache
// (NewLatent), one row per position that is both.
type Cache struct {
	width int         // floats per row: kvHeads * headDim
	k, v  [][]float32 // per layer, rows from base[layer] on; v nil for a latent cache
	n     int         // committed positions
	cap   int         // positions Put may address
	// window, when set, is each layer's sliding window (0: every
	// position); base is the first position a layer holds (0 but for
	// windowed layers, which drop the rows no window reaches any more)
	window, base []int
	// first and end bound the layers it holds (a stage's: SetLayers);
	// the others hold no rows
	first, end int
}

// SetLayers makes the cache hold layers [first, end) only, those of one
// stage of a staged model: the others hold no rows, and Put to one is an
// error. The cache must be empty.
func (c *Cache) SetLayers(first, end int) error {
	if first < 0 || end < first || end > len(c.k) || c.n != 0 {
		return fmt.Errorf("kvcache: layers %d to %d of %d, %d positions held", first, end-1, len(c.k), c.n)
	}
	c.first, c.end = first, end
	for l := range c.k {
		if !c.holds(l) {
			c.k[l] = nil
			if c.v != nil {
				c.v[l] = nil
			}
		}
	}
	return nil
}

// holds reports whether the cache holds layer's rows.
func (c *Cache) holds(layer int) bool { return layer >= c.first && layer < c.end }

// HeldLayers are the layers whose rows the cache holds: [first, end).
func (c *Cache) HeldLayers() (first, end int) { return c.first, c.end }

// WindowSlack is how many positions before the ones a window reads a
// windowed layer still holds after a Commit: Truncate may go back that
// far (the shadow steps back one; a pass that checked guesses takes back
// those not kept, passloop.MaxDraft at most).
const WindowSlack = 16

// SetWindows gives the layers their sliding windows (window[l] > 0: the
// query at position p reads positions p-window[l]+1..p only): from then
// on such a layer holds about 2*window + WindowSlack rows, whatever the
// length. The cache must be empty.
func (c *Cache) SetWindows(window []int) error {
	if len(window) != len(c.k) || c.n != 0 {
		return fmt.Errorf("kvcache: windows for %d layers of %d, %d positions held", len(window), len(c.k), c.n)
	}
	c.window, c.base = append([]int(nil), window...), make([]int, len(c.k))
	for l, w := range c.window {
		if w > 0 { // its rows grow in Put, up to what a pass needs
			c.k[l] = nil
			if c.v != nil {
				c.v[l] = nil
			}
		}
	}
	return nil
}

// Base is the first position layer holds: 0, or for a windowed layer the
// oldest one it has not dropped. Keys and Values start there.
func (c *Cache) Base(layer int) int {
	if c.base == nil {
		return 0
	}
	return c.base[layer]
}

// windowed reports whether layer has a sliding window.
func (c *Cache) windowed(layer int) bool { return c.window != nil && c.window[layer] > 0 }

// New returns an empty cache for layers layers of kvHeads heads of headDim,
// with room for capacity positions (it grows on demand).
func New(layers, kvHeads, headDim, capacity int) *Cache {
	c := &Cache{width: kvHeads * headDim, k: make([][]float32, layers), v: make([][]float32, layers), end: layers}
	c.Reserve(capacity)
	return c
}

// NewLatent returns an empty cache of one row of width floats per layer
// and position that serves as both key and value (Values returns the key
// rows, Put ignores its value row): Multi-head Latent Attention's
// compressed latent and rotary key, from which every head's keys and
// values are computed.
func NewLatent(layers, width, capacity int) *Cache {
	c := &Cache{width: width, k: make([][]float32, layers), end: layers}
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
		if c.windowed(l) || !c.holds(l) {
			continue // its rows grow in Put, up to what a pass needs; or none
		}
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
	if !c.holds(layer) {
		return fmt.Errorf("kvcache: layer %d is not among the layers held (%d to %d)", layer, c.first, c.end-1)
	}
	if c.windowed(layer) {
		r := pos - c.base[layer]
		if r < 0 {
			return nil // a row no window reads any more (a KV alignment's older rows)
		}
		c.k[layer] = rowsFor(c.k[layer], r+1, c.width)
		copy(c.k[layer][r*c.width:], k)
		if c.v != nil {
			c.v[layer] = rowsFor(c.v[layer], r+1, c.width)
			copy(c.v[layer][r*c.width:], v)
		}
		return nil
	}
	copy(c.k[layer][pos*c.width:], k)
	if c.v != nil {
		copy(c.v[layer][pos*c.width:], v)
	}
	return nil
}

// rowsFor returns rows (a windowed layer's) long enough for n rows of
// width, keeping what it holds.
func rowsFor(rows []float32, n, width int) []float32 {
	if need := n * width; len(rows) < need {
		if cap(rows) < need {
			grown := make([]float32, need, max(need, 2*cap(rows)))
			copy(grown, rows)
			return grown
		}
		return rows[:need]
	}
	return rows
}

// Keys returns the key rows of layer for positions [Base(layer), upto)
// as one slice (row p at [(p-Base)*Width, (p-Base+1)*Width)). It aliases
// the cache.
func (c *Cache) Keys(layer, upto int) []float32 { return c.k[layer][:(upto-c.Base(layer))*c.width] }

// Values is Keys for the value rows (a latent cache's are its keys).
func (c *Cache) Values(layer, upto int) []float32 {
	if c.v == nil {
		return c.Keys(layer, upto)
	}
	return c.v[layer][:(upto-c.Base(layer))*c.width]
}

// Commit marks positions [0, n) as valid. A windowed layer then drops the
// rows no query from position n-WindowSlack on can read, once it holds
// twice its window's (moving the rows it keeps down: a row a position,
// amortized).
func (c *Cache) Commit(n int) error {
	if n < 0 || n > c.cap {
		return fmt.Errorf("kvcache: commit %d positions with %d reserved", n, c.cap)
	}
	c.n = n
	for l := range c.window {
		w := c.window[l]
		if w == 0 || !c.holds(l) || n-c.base[l] < 2*w+WindowSlack {
			continue
		}
		keep := n - w - WindowSlack // the first row a query at n-WindowSlack reads
		drop, held := keep-c.base[l], min(n-c.base[l], len(c.k[l])/c.width)
		copy(c.k[l], c.k[l][drop*c.width:held*c.width])
		c.k[l] = c.k[l][:(held-drop)*c.width]
		if c.v != nil {
			copy(c.v[l], c.v[l][drop*c.width:held*c.width])
			c.v[l] = c.v[l][:(held-drop)*c.width]
		}
		c.base[l] = keep
	}
	return nil
}

// Truncate forgets positions from n on (n <= Len). A windowed layer can
// go on from n only if it still holds what a query at n reads: n back by
// WindowSlack at most from the last Commit (Holds says).
func (c *Cache) Truncate(n int) {
	if n < c.n {
		c.n = max(n, 0)
	}
}

// Reset forgets every position, a windowed layer's rows too: the
// sequence is run again from its first token (its rows elsewhere were
// lost), keeping the room reserved.
func (c *Cache) Reset() {
	c.n = 0
	for l := range c.base {
		c.base[l] = 0
		if c.windowed(l) {
			c.k[l] = c.k[l][:0]
			if c.v != nil {
				c.v[l] = c.v[l][:0]
			}
		}
	}
}

// Holds reports whether every layer holds what a query at position n
// reads (always, but for a windowed layer that dropped those rows).
func (c *Cache) Holds(n int) bool {
	for l, w := range c.window {
		if w > 0 && c.holds(l) && max(n-w+1, 0) < c.base[l] {
			return false
		}
	}
	return true
}

// Prefix returns a new cache holding a copy of positions [0, n) of c
// (a windowed layer's rows from those a query at n reads), with room for
// capacity positions (it grows on demand): the start of another sequence
// that begins with the same tokens. It is an error if c no longer holds
// them (Holds).
func (c *Cache) Prefix(n, capacity int) (*Cache, error) {
	if n < 0 || n > c.n {
		return nil, fmt.Errorf("kvcache: a prefix of %d positions of %d", n, c.n)
	}
	if !c.Holds(n) {
		return nil, fmt.Errorf("kvcache: a prefix of %d positions: a windowed layer no longer holds them", n)
	}
	p := &Cache{width: c.width, k: make([][]float32, len(c.k)), first: c.first, end: c.end}
	if c.v != nil {
		p.v = make([][]float32, len(c.v))
	}
	if c.window != nil {
		p.window, p.base = append([]int(nil), c.window...), make([]int, len(c.k))
	}
	p.Reserve(max(n, capacity))
	for l := range c.k {
		if !c.holds(l) {
			continue
		}
		if !c.windowed(l) { // into the reserved room
			copy(p.k[l], c.k[l][:n*c.width])
			if c.v != nil {
				copy(p.v[l], c.v[l][:n*c.width])
			}
			continue
		}
		from := max(n-c.window[l]-WindowSlack, c.base[l], 0)
		lo, hi := (from-c.base[l])*c.width, (n-c.base[l])*c.width
		p.base[l] = from
		p.k[l] = append([]float32(nil), c.k[l][lo:hi]...)
		if c.v != nil {
			p.v[l] = append([]float32(nil), c.v[l][lo:hi]...)
		}
	}
	p.n = n
	return p, nil
}

// Bytes is the memory the cache holds: every reserved row of every
// layer, keys and values (a latent cache's rows once).
func (c *Cache) Bytes() int64 {
	var floats int64
	for l := range c.k {
		floats += int64(cap(c.k[l]))
		if c.v != nil {
			floats += int64(cap(c.v[l]))
		}
	}
	return 4 * floats
}
