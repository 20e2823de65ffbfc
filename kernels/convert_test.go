package kernels

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func isNaN32(f float32) bool { return f != f }

func TestBF16RoundTripIsExactForAllBitPatterns(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := BF16ToF32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %#08x", h, math.Float32bits(f))
		}
		back := F32ToBF16(f)
		if isNaN32(f) {
			// NaN stays NaN, quiet, same sign.
			if back&0x7f80 != 0x7f80 || back&0x0040 == 0 || back&0x8000 != h&0x8000 {
				t.Fatalf("NaN %#04x -> %#04x, want a quiet NaN of the same sign", h, back)
			}
			continue
		}
		if back != h {
			t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x", h, back)
		}
	}
}

func TestF16RoundTripIsExactForAllBitPatterns(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := F16ToF32(h)
		ref := refF16(h)
		if math.IsNaN(ref) {
			fb := math.Float32bits(f)
			if !isNaN32(f) || fb&0x00400000 == 0 || fb>>31 != uint32(h>>15) || (fb>>13)&0x1ff != uint32(h&0x1ff) {
				t.Fatalf("F16ToF32(NaN %#04x) = %#08x, want quiet NaN keeping sign and payload", h, fb)
			}
			back := F32ToF16(f)
			if back != h|0x0200 {
				t.Fatalf("F32ToF16(F16ToF32(NaN %#04x)) = %#04x, want %#04x", h, back, h|0x0200)
			}
			continue
		}
		if float64(f) != ref || math.Signbit(float64(f)) != math.Signbit(ref) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, f, ref)
		}
		if back := F32ToF16(f); back != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, back)
		}
	}
}

func TestF32ToBF16RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		name string
		in   uint32
		want uint16
	}{
		{"tie down to even", 0x3f808000, 0x3f80},
		{"tie up to even", 0x3f818000, 0x3f82},
		{"above tie", 0x3f808001, 0x3f81},
		{"below tie", 0x3f807fff, 0x3f80},
		{"max float32 overflows", 0x7f7fffff, 0x7f80},
		{"largest below overflow", 0x7f7f7fff, 0x7f7f},
		{"subnormal tie to zero", 0x00008000, 0x0000},
		{"subnormal tie up", 0x00018000, 0x0002},
		{"subnormal above tie", 0x00008001, 0x0001},
		{"negative zero", 0x80000000, 0x8000},
		{"negative tie", 0xbf808000, 0xbf80},
		{"+inf", 0x7f800000, 0x7f80},
		{"-inf", 0xff800000, 0xff80},
		{"signalling NaN becomes quiet", 0x7f800001, 0x7fc0},
		{"negative NaN payload kept", 0xffa10000, 0xffe1},
	}
	for _, tc := range cases {
		if got := F32ToBF16(math.Float32frombits(tc.in)); got != tc.want {
			t.Errorf("%s: F32ToBF16(%#08x) = %#04x, want %#04x", tc.name, tc.in, got, tc.want)
		}
	}
}

func TestF32ToF16RoundsToNearestEven(t *testing.T) {
	ld := func(m float64, e int) float32 { return float32(math.Ldexp(m, e)) }
	cases := []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"max half", 65504, 0x7bff},
		{"below overflow tie", 65519.996, 0x7bff},
		{"overflow tie goes to inf", 65520, 0x7c00},
		{"far overflow", 1e10, 0x7c00},
		{"smallest subnormal", ld(1, -24), 0x0001},
		{"half smallest subnormal ties to zero", ld(1, -25), 0x0000},
		{"just above half smallest subnormal", ld(1.0000001, -25), 0x0001},
		{"subnormal tie up to even", ld(3, -25), 0x0002},
		{"subnormal tie down to even", ld(5, -25), 0x0002},
		{"tiny to zero", 1e-30, 0x0000},
		{"negative tiny to negative zero", -1e-30, 0x8000},
		{"smallest normal", ld(1, -14), 0x0400},
		{"largest subnormal rounds up to normal", ld(1, -14) - ld(1, -25), 0x0400},
		{"largest subnormal", ld(1023, -24), 0x03ff},
		{"normal tie to even", 1 + ld(1, -11), 0x3c00},
		{"normal tie up to even", 1 + ld(3, -11), 0x3c02},
		{"negative zero", float32(math.Copysign(0, -1)), 0x8000},
		{"+inf", float32(math.Inf(1)), 0x7c00},
		{"-inf", float32(math.Inf(-1)), 0xfc00},
		{"NaN quiet", math.Float32frombits(0x7f800001), 0x7e00},
		{"NaN payload", math.Float32frombits(0xffc12000), 0xfe09},
	}
	for _, tc := range cases {
		if got := F32ToF16(tc.in); got != tc.want {
			t.Errorf("%s: F32ToF16(%g) = %#04x, want %#04x", tc.name, tc.in, got, tc.want)
		}
	}
}

// TestF32ToF16MatchesNearestHalf compares with a brute-force reference:
// the nearest of all finite halves (ties to the even code), with 65536 as
// the value beyond the largest half (IEEE overflow rule).
func TestF32ToF16MatchesNearestHalf(t *testing.T) {
	halves := make([]float64, 0x7c01) // codes 0..0x7bff, then "0x7c00" = 2^16
	for h := range 0x7c00 {
		halves[h] = refF16(uint16(h))
	}
	halves[0x7c00] = 65536
	rng := rand.New(rand.NewPCG(21, 22))
	for range 200000 {
		f := float32(math.Ldexp(1+rng.Float64(), rng.IntN(50)-30))
		if rng.IntN(2) == 0 {
			f = -f
		}
		a := math.Abs(float64(f))
		var want uint16
		j := sort.SearchFloat64s(halves, a) // halves[j-1] < a <= halves[j]
		switch {
		case j >= len(halves):
			want = 0x7c00
		case halves[j] == a:
			want = uint16(j)
		default:
			dlo, dhi := a-halves[j-1], halves[j]-a
			want = uint16(j)
			if dlo < dhi || dlo == dhi && (j-1)%2 == 0 {
				want = uint16(j - 1)
			}
		}
		if f < 0 {
			want |= 0x8000
		}
		if got := F32ToF16(f); got != want {
			t.Fatalf("F32ToF16(%g) = %#04x, want %#04x", f, got, want)
		}
	}
}

// TestF32ToBF16MatchesNearest compares random float32 bit patterns with the
// nearer of the two enclosing bfloat16 values, computed in float64.
func TestF32ToBF16MatchesNearest(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for range 200000 {
		b := rng.Uint32()
		f := math.Float32frombits(b)
		if isNaN32(f) || math.IsInf(float64(f), 0) {
			continue
		}
		lo := uint16(b >> 16)
		a := math.Abs(float64(f))
		vlo := math.Abs(float64(BF16ToF32(lo)))
		vhi := math.Abs(float64(BF16ToF32(lo + 1)))
		if lo&0x7fff == 0x7f7f {
			vhi = math.Ldexp(1, 128) // unbounded-exponent successor of the max
		}
		want := lo
		if d1, d2 := a-vlo, vhi-a; d2 < d1 || d1 == d2 && lo&1 == 1 {
			want = lo + 1
		}
		if got := F32ToBF16(f); got != want {
			t.Fatalf("F32ToBF16(%#08x) = %#04x, want %#04x", b, got, want)
		}
	}
}

func TestToFloat32WidensEachDType(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, dt := range dtypes {
		for _, n := range []int{0, 1, 7, 100} {
			src := make([]byte, n*dt.Size())
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			dst := make([]float32, n)
			ToFloat32(dst, src, dt)
			for i := range dst {
				if want := refWiden(dt, src, i); !(float64(dst[i]) == want || math.IsNaN(want) && isNaN32(dst[i])) {
					t.Fatalf("%v: element %d = %v, want %v", dt, i, dst[i], want)
				}
			}
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("length mismatch did not panic")
		}
	}()
	ToFloat32(make([]float32, 2), make([]byte, 6), BF16)
}
