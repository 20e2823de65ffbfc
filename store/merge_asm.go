//go:build (amd64 || arm64) && !purego

package store

// mergeBF16Asm merges the first len(exp) rounded down to 16 elements of
// BF16 with SIMD (SSE2 on amd64, which every amd64 has; NEON on arm64) and
// returns how many it merged. Same arithmetic and overlap rules as
// mergeBF16Go.
func mergeBF16Asm(dst, exp, sm []byte) int {
	n := len(exp) &^ 15
	if n == 0 {
		return 0
	}
	// bounds once, here: the assembly trusts them
	_, _ = dst[2*n-1], sm[n-1]
	mergeBF16x16(&dst[0], &exp[0], &sm[0], n/16)
	return n
}

// mergeBF16x16 merges blocks*16 elements.
//
//go:noescape
func mergeBF16x16(dst, exp, sm *byte, blocks int)
