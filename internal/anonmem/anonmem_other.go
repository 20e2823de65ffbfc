//go:build !unix

package anonmem

import "unsafe"

// Supported reports whether copies are made outside the Go heap, in
// regions of their own: not here, where they are Go memory.
const Supported = false

func mapAligned(n int) (raw, r []byte, err error) {
	b := make([]byte, n+align)
	off := (align - int(addr(b))%align) % align
	return b, b[off : off+n : off+n], nil
}

func unmap([]byte) error { return nil }

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
