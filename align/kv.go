package align

import (
	"fmt"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/kvcache"
)

// KVRows are the key and value rows of positions [From, From+Rows) of
// every layer, in fp16 (IEEE half, round to nearest even): the payload of
// a KV alignment. A latent cache's rows (kvcache.NewLatent) are keys and
// values at once: Values is nil. fp16 halves the bytes of float32 and only feeds the
// shadow's predictions, never the output; the rows of new positions only
// keep it small (at Mixtral's shapes 32 layers x 2 x 1024 values x 2 B =
// 128 KiB per token).
type KVRows struct {
	From, Rows, Width int
	// First is the layer of Keys[0] and Values[0]: 0 but for a stage's
	// share (Layers)
	First        int
	Keys, Values [][]uint16 // per layer, Rows*Width values
}

// Layers is kv's rows of layers [first, end) only (a stage's share),
// sharing their memory.
func (kv KVRows) Layers(first, end int) KVRows {
	s := kv
	s.First = first
	s.Keys = kv.Keys[first-kv.First : end-kv.First]
	if kv.Values != nil {
		s.Values = kv.Values[first-kv.First : end-kv.First]
	}
	return s
}

// PackKV copies positions [from, to) of every layer of c as fp16 (of a
// stage's cache, every layer it holds).
func PackKV(c *kvcache.Cache, from, to int) (KVRows, error) {
	if from < 0 || to < from || to > c.Len() {
		return KVRows{}, fmt.Errorf("align: KV rows [%d, %d) outside the cache's %d positions", from, to, c.Len())
	}
	w := c.Width()
	first, end := c.HeldLayers() // a stage's cache: its layers'
	kv := KVRows{From: from, Rows: to - from, Width: w, First: first, Keys: make([][]uint16, end-first)}
	if !c.Latent() {
		kv.Values = make([][]uint16, end-first)
	}
	for l := first; l < end; l++ {
		// a windowed layer's rows below its base are gone and no query
		// reads them: they go as zeros, which the other side drops too
		b := c.Base(l)
		lo := min(max(from, b), to) // the first row held
		var keys, values []float32
		if lo < to {
			keys, values = c.Keys(l, to)[(lo-b)*w:], c.Values(l, to)[(lo-b)*w:]
		}
		kv.Keys[l-first] = toF16(keys, (lo-from)*w)
		if kv.Values != nil {
			kv.Values[l-first] = toF16(values, (lo-from)*w)
		}
	}
	return kv, nil
}

// toF16 is src as fp16, after zeros zero values.
func toF16(src []float32, zeros int) []uint16 {
	out := make([]uint16, zeros+len(src))
	for i, v := range src {
		out[zeros+i] = kernels.F32ToF16(v)
	}
	return out
}

// Apply overwrites c's rows at kv's positions with kv's (widened back to
// float32) and commits them: the shadow's KV alignment. Positions past
// the shadow's own length extend it. Of a cache that holds some layers
// only (a stage's), those layers' rows are written and the others'
// skipped.
func (kv KVRows) Apply(c *kvcache.Cache) error {
	last := kv.First + len(kv.Keys)
	heldFirst, heldEnd := c.HeldLayers()
	if kv.Width != c.Width() || kv.First > heldFirst || last < heldEnd || last > c.Layers() || (kv.Values == nil) != c.Latent() || kv.Values != nil && len(kv.Values) != len(kv.Keys) {
		return fmt.Errorf("align: KV rows of width %d for layers %d to %d (latent: %v), the cache has width %d and holds layers %d to %d of %d (latent: %v)",
			kv.Width, kv.First, last-1, kv.Values == nil, c.Width(), heldFirst, heldEnd-1, c.Layers(), c.Latent())
	}
	if kv.From > c.Len() {
		return fmt.Errorf("align: KV rows start at %d, past the cache's %d positions (a gap)", kv.From, c.Len())
	}
	c.Reserve(kv.From + kv.Rows)
	k, v := make([]float32, kv.Width), make([]float32, kv.Width)
	if kv.Values == nil {
		v = nil // a latent cache's values are its keys
	}
	for i := range kv.Keys {
		l := kv.First + i
		if len(kv.Keys[i]) != kv.Rows*kv.Width || kv.Values != nil && len(kv.Values[i]) != kv.Rows*kv.Width {
			return fmt.Errorf("align: layer %d has %d keys and the values of %d rows, want %d each", l, len(kv.Keys[i]), kv.Rows, kv.Rows*kv.Width)
		}
		if l < heldFirst || l >= heldEnd {
			continue
		}
		for r := range kv.Rows {
			for j := range k {
				k[j] = kernels.F16ToF32(kv.Keys[i][r*kv.Width+j])
				if v != nil {
					v[j] = kernels.F16ToF32(kv.Values[i][r*kv.Width+j])
				}
			}
			if err := c.Put(l, kv.From+r, k, v); err != nil {
				return err
			}
		}
	}
	return c.Commit(max(c.Len(), kv.From+kv.Rows))
}

// Positions is kv's rows of positions [from, to) only, sharing their
// memory.
func (kv KVRows) Positions(from, to int) KVRows {
	s := kv
	s.From, s.Rows = from, to-from
	lo, hi := (from-kv.From)*kv.Width, (to-kv.From)*kv.Width
	s.Keys = make([][]uint16, len(kv.Keys))
	for l := range kv.Keys {
		s.Keys[l] = kv.Keys[l][lo:hi]
	}
	if kv.Values != nil {
		s.Values = make([][]uint16, len(kv.Values))
		for l := range kv.Values {
			s.Values[l] = kv.Values[l][lo:hi]
		}
	}
	return s
}

// JoinLayers is the rows of parts, each of consecutive layers after the
// one before (a node's own and its stages'), as one: the same positions,
// width and kind of cache each. A part of no layer (a node that holds
// none) adds nothing.
func JoinLayers(parts ...KVRows) (KVRows, error) {
	var out KVRows
	for i, p := range parts {
		switch {
		case len(p.Keys) == 0:
			continue
		case len(out.Keys) == 0:
			out = KVRows{From: p.From, Rows: p.Rows, Width: p.Width, First: p.First}
			if p.Values != nil {
				out.Values = [][]uint16{}
			}
		case p.From != out.From || p.Rows != out.Rows || p.Width != out.Width || (p.Values == nil) != (out.Values == nil) || p.First != out.First+len(out.Keys):
			return KVRows{}, fmt.Errorf("align: KV rows %d (positions %d+%d, width %d, layers from %d) do not follow positions %d+%d, width %d, layers %d to %d",
				i, p.From, p.Rows, p.Width, p.First, out.From, out.Rows, out.Width, out.First, out.First+len(out.Keys)-1)
		}
		out.Keys = append(out.Keys, p.Keys...)
		if p.Values != nil {
			out.Values = append(out.Values, p.Values...)
		}
	}
	if len(out.Keys) == 0 {
		return KVRows{}, fmt.Errorf("align: no KV rows to join")
	}
	return out, nil
}
