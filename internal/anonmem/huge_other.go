//go:build unix && !linux

package anonmem

// adviseHuge does nothing where madvise has no MADV_HUGEPAGE.
func adviseHuge([]byte) {}
