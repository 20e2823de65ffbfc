package anonmem

import "golang.org/x/sys/unix"

// adviseHuge asks for transparent huge pages for r, anonymous memory: a
// hint, where it is refused the pages are small.
func adviseHuge(r []byte) { _ = unix.Madvise(r, unix.MADV_HUGEPAGE) }
