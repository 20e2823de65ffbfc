//go:build amd64 || arm64

package kernels

import "unsafe"

// Weight bytes are little-endian (safetensors). amd64 and arm64 hosts are
// little-endian and load unaligned elements in hardware, so the bytes are
// reinterpreted in place: no copy, whatever the tensor's offset in its
// mapped file. Other architectures use view_portable.go.

// f32View reinterprets b as float32 elements.
func f32View(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// u16View reinterprets b as uint16 elements (BF16 or F16 bits).
func u16View(b []byte) []uint16 {
	if len(b) < 2 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}

// viewsCopy reports whether f32View and u16View copy (and allocate).
const viewsCopy = false
