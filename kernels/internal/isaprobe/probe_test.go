//go:build amd64

package isaprobe

import (
	"math"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestDPBF16BytesAreVDPBF16PS: the EVEX bytes compute Intel's
// definition, lane j += a[2j]*b[2j] + a[2j+1]*b[2j+1] (exact BF16
// products), on values whose sums are exact.
func TestDPBF16BytesAreVDPBF16PS(t *testing.T) {
	if !cpu.X86.HasAVX512BF16 {
		t.Skip("no AVX512_BF16 on this CPU")
	}
	bf := func(f float32) uint16 { return uint16(math.Float32bits(f) >> 16) }
	var a, b [32]uint16
	var acc, want [16]float32
	for i := range a {
		a[i], b[i] = bf(float32(i%5)-2), bf(float32(i%7)*0.5)
	}
	for j := range acc {
		acc[j] = float32(j) * 0.25
		dot := (float32(2*j%5)-2)*float32(2*j%7)*0.5 + (float32((2*j+1)%5)-2)*float32((2*j+1)%7)*0.5
		want[j] = acc[j] + dot + dot
	}
	dpOnce(&a, &b, &acc)
	if acc != want {
		t.Fatalf("got %v, want %v", acc, want)
	}
}

// BenchmarkArithmetic reports products a nanosecond for each way to
// multiply and accumulate 16 lanes of float32 (VDPBF16PS: 32 products).
func BenchmarkArithmetic(b *testing.B) {
	for _, c := range []struct {
		name     string
		products int // a round of 12 operations
		run      func(int)
		need     bool
	}{
		{"mul+add", 12 * 16, mulAdd, cpu.X86.HasAVX512F},
		{"fma", 12 * 16, fma, cpu.X86.HasAVX512F},
		{"vdpbf16ps", 12 * 32, dpbf16, cpu.X86.HasAVX512BF16},
	} {
		b.Run(c.name, func(b *testing.B) {
			if !c.need {
				b.Skip("not on this CPU")
			}
			const rounds = 1 << 20
			for range b.N {
				c.run(rounds)
			}
			b.ReportMetric(float64(c.products)*rounds*float64(b.N)/float64(b.Elapsed().Nanoseconds()), "products/ns")
		})
	}
}
