//go:build unix

package model

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// release tells the kernel this process no longer needs the pages of b,
// a piece of the read-only checkpoint mapping: they leave its resident
// set (a later read faults them in from the file again). Only whole pages
// inside b are released, so neighbouring tensors are untouched.
func release(b []byte) {
	page := uintptr(os.Getpagesize())
	if len(b) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	first := (start + page - 1) &^ (page - 1)
	end := (start + uintptr(len(b))) &^ (page - 1)
	if end <= first {
		return
	}
	off := int(first - start)
	_ = unix.Madvise(b[off:off+int(end-first)], unix.MADV_DONTNEED)
}
