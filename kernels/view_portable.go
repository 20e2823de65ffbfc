//go:build !(amd64 || arm64)

package kernels

import (
	"encoding/binary"
	"math"
)

// On architectures other than amd64 and arm64 (which odmoe does not serve
// on) the little-endian weight bytes are decoded into a fresh copy: correct
// on any byte order and alignment, but it allocates on every call.

// f32View decodes b as little-endian float32 elements.
func f32View(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// u16View decodes b as little-endian uint16 elements.
func u16View(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

// viewsCopy reports whether f32View and u16View copy (and allocate).
const viewsCopy = true
