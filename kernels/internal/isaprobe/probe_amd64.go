//go:build amd64

package isaprobe

// dpOnce computes acc[j] += a[2j]*b[2j] + a[2j+1]*b[2j+1] for the 16
// lanes (a and b 32 BF16 each) with VDPBF16PS, twice (into Z0, then
// from it into Z8: both forms of the destination's encoding).
func dpOnce(a, b *[32]uint16, acc *[16]float32)

// Each runs n rounds of 12 independent register-to-register operations.
func dpbf16(n int)
func mulAdd(n int)
func fma(n int)
