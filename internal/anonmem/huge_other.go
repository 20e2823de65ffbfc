//go:build !linux

package anonmem

// AdviseHuge does nothing where madvise has no MADV_HUGEPAGE.
func AdviseHuge([]byte) {}
