//go:build amd64 || arm64

package wire

import "unsafe"

// Tensor bytes are little-endian and so are amd64 and arm64: float32 slices
// and their bytes are the same memory (unaligned loads are fine).

func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

func bytesF32(b []byte) []float32 {
	if len(b) < 4 {
		return []float32{}
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}
