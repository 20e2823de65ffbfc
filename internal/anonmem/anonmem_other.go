//go:build !unix

package anonmem

// Supported reports whether copies are made outside the Go heap, in
// regions of their own: not here, where they are Go memory.
const Supported = false

// mapAligned allocates n bytes of Go memory at a huge page's boundary.
func mapAligned(n int) ([]byte, error) {
	b := make([]byte, n+align)
	off := (align - int(addr(b))%align) % align
	return b[off : off+n : off+n], nil
}

func unmap([]byte) error { return nil }
