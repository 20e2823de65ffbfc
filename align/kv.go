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
	Keys, Values      [][]uint16 // per layer, Rows*Width values
}

// PackKV copies positions [from, to) of every layer of c as fp16.
func PackKV(c *kvcache.Cache, from, to int) (KVRows, error) {
	if from < 0 || to < from || to > c.Len() {
		return KVRows{}, fmt.Errorf("align: KV rows [%d, %d) outside the cache's %d positions", from, to, c.Len())
	}
	w := c.Width()
	kv := KVRows{From: from, Rows: to - from, Width: w, Keys: make([][]uint16, c.Layers())}
	if !c.Latent() {
		kv.Values = make([][]uint16, c.Layers())
	}
	for l := range c.Layers() {
		// a windowed layer's rows below its base are gone and no query
		// reads them: they go as zeros, which the other side drops too
		b := c.Base(l)
		lo := min(max(from, b), to) // the first row held
		var keys, values []float32
		if lo < to {
			keys, values = c.Keys(l, to)[(lo-b)*w:], c.Values(l, to)[(lo-b)*w:]
		}
		kv.Keys[l] = toF16(keys, (lo-from)*w)
		if kv.Values != nil {
			kv.Values[l] = toF16(values, (lo-from)*w)
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
// the shadow's own length extend it.
func (kv KVRows) Apply(c *kvcache.Cache) error {
	if kv.Width != c.Width() || len(kv.Keys) != c.Layers() || (kv.Values == nil) != c.Latent() || kv.Values != nil && len(kv.Values) != c.Layers() {
		return fmt.Errorf("align: KV rows of width %d for %d layers (latent: %v), the cache has width %d and %d layers (latent: %v)",
			kv.Width, len(kv.Keys), kv.Values == nil, c.Width(), c.Layers(), c.Latent())
	}
	if kv.From > c.Len() {
		return fmt.Errorf("align: KV rows start at %d, past the cache's %d positions (a gap)", kv.From, c.Len())
	}
	c.Reserve(kv.From + kv.Rows)
	k, v := make([]float32, kv.Width), make([]float32, kv.Width)
	if kv.Values == nil {
		v = nil // a latent cache's values are its keys
	}
	for l := range kv.Keys {
		if len(kv.Keys[l]) != kv.Rows*kv.Width || kv.Values != nil && len(kv.Values[l]) != kv.Rows*kv.Width {
			return fmt.Errorf("align: layer %d has %d keys and the values of %d rows, want %d each", l, len(kv.Keys[l]), kv.Rows, kv.Rows*kv.Width)
		}
		for r := range kv.Rows {
			for i := range k {
				k[i] = kernels.F16ToF32(kv.Keys[l][r*kv.Width+i])
				if v != nil {
					v[i] = kernels.F16ToF32(kv.Values[l][r*kv.Width+i])
				}
			}
			if err := c.Put(l, kv.From+r, k, v); err != nil {
				return err
			}
		}
	}
	return c.Commit(max(c.Len(), kv.From+kv.Rows))
}
