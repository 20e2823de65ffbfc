//go:build (!amd64 && !arm64) || purego

package store

// mergeBF16Asm has no SIMD version on this platform: mergeBF16Go does all.
func mergeBF16Asm(dst, exp, sm []byte) int { return 0 }
