package align

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/odmoe/odmoe/wire"
)

// Tensors are kv's rows as a message carries them: one F16 [rows, width]
// tensor a layer, keys and values (none for a latent cache).
func (kv KVRows) Tensors() (keys, values []wire.Tensor) {
	for l := range kv.Keys {
		keys = append(keys, f16Tensor(kv.Keys[l], kv.Rows, kv.Width))
		if kv.Values != nil {
			values = append(values, f16Tensor(kv.Values[l], kv.Rows, kv.Width))
		}
	}
	return keys, values
}

func f16Tensor(v []uint16, rows, width int) wire.Tensor {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return wire.Tensor{DType: wire.F16, Shape: []int{rows, width}, Data: b}
}

// FromTensors reads back the rows Tensors wrote: positions from on, of
// layers first.. (values empty: a latent cache's).
func FromTensors(from, first int, keys, values []wire.Tensor) (KVRows, error) {
	latent := len(values) == 0 // a latent cache's rows are keys and values at once
	if !latent && len(keys) != len(values) || len(keys) == 0 {
		return KVRows{}, errors.New("keys and values per layer do not match")
	}
	kv := KVRows{From: from, First: first, Keys: make([][]uint16, len(keys))}
	if !latent {
		kv.Values = make([][]uint16, len(keys))
	}
	for l := range keys {
		k := keys[l]
		if k.DType != wire.F16 || len(k.Shape) != 2 {
			return KVRows{}, fmt.Errorf("layer %d: want F16 [rows, width] tensors", first+l)
		}
		kv.Rows, kv.Width = k.Shape[0], k.Shape[1]
		kv.Keys[l] = u16s(k.Data)
		if !latent {
			v := values[l]
			if v.DType != k.DType || !slices.Equal(k.Shape, v.Shape) {
				return KVRows{}, fmt.Errorf("layer %d: want two F16 [rows, width] tensors", first+l)
			}
			kv.Values[l] = u16s(v.Data)
		}
	}
	return kv, nil
}

func u16s(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}
