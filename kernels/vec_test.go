package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

func TestAxpyAndAddFollowDefinition(t *testing.T) { forEachPath(t, testAxpyAndAddFollowDefinition) }

func testAxpyAndAddFollowDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	for _, n := range []int{0, 1, 17, 1000} {
		dst, x := randVec(rng, n), randVec(rng, n)
		a := float32(rng.NormFloat64())
		got := append([]float32(nil), dst...)
		Axpy(got, a, x)
		for i := range got {
			if want := dst[i] + float32(a*x[i]); !sameBits(got[i], want) {
				t.Fatalf("Axpy n=%d i=%d: %v, definition %v", n, i, got[i], want)
			}
			ref := float64(dst[i]) + float64(a)*float64(x[i])
			if math.Abs(float64(got[i])-ref) > 2*u*(math.Abs(float64(dst[i]))+math.Abs(float64(a)*float64(x[i]))) {
				t.Fatalf("Axpy n=%d i=%d: %v, float64 %v", n, i, got[i], ref)
			}
		}
		got = append([]float32(nil), dst...)
		Add(got, x)
		for i := range got {
			if want := float32(float64(dst[i]) + float64(x[i])); got[i] != want {
				t.Fatalf("Add n=%d i=%d: %v, want %v", n, i, got[i], want)
			}
		}
	}
}

// TestAxpyRoundsProductBeforeAdding: with a = 1+2^-12, float32(a*a) is
// 1+2^-11 (tie to even), so -(1+2^-11) + float32(a*a) is 0 exactly; a fused
// multiply-add would leave 2^-24.
func TestAxpyRoundsProductBeforeAdding(t *testing.T) {
	forEachPath(t, testAxpyRoundsProductBeforeAdding)
}

func testAxpyRoundsProductBeforeAdding(t *testing.T) {
	a := float32(1 + 1.0/(1<<12))
	dst := []float32{-(1 + 1.0/(1<<11))}
	Axpy(dst, a, []float32{a})
	if dst[0] != 0 {
		t.Fatalf("Axpy = %g, want exactly 0 (fused?)", dst[0])
	}
}

// TestAddBiasAddsTheWidenedRowToEveryRow checks every float dtype against
// the exact widening, row by row.
func TestAddBiasAddsTheWidenedRowToEveryRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	const n, c = 3, 37
	for _, dt := range []DType{F32, F16, BF16} {
		want := randVec(rng, c)
		b := Matrix{DType: dt, Rows: 1, Cols: c, Data: make([]byte, c*dt.Size())}
		for j, v := range want {
			switch dt {
			case F32:
				binary.LittleEndian.PutUint32(b.Data[4*j:], math.Float32bits(v))
			case F16:
				binary.LittleEndian.PutUint16(b.Data[2*j:], F32ToF16(v))
				want[j] = F16ToF32(F32ToF16(v))
			case BF16:
				binary.LittleEndian.PutUint16(b.Data[2*j:], F32ToBF16(v))
				want[j] = BF16ToF32(F32ToBF16(v))
			}
		}
		dst := randVec(rng, n*c)
		orig := append([]float32(nil), dst...)
		AddBias(dst, n, b)
		for i := range dst {
			if w := orig[i] + want[i%c]; !sameBits(dst[i], w) {
				t.Fatalf("%v: element %d = %v, want %v", dt, i, dst[i], w)
			}
		}
	}
}
