package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// refE4M3 decodes an E4M3FN code by the OFP8 specification: sign, 4
// exponent bits of bias 7, 3 mantissa bits, exponent 0 subnormal,
// S.1111.111 NaN.
func refE4M3(b byte) float64 {
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	e, m := int(b>>3&15), float64(b&7)
	switch {
	case e == 15 && m == 7:
		return math.NaN()
	case e == 0:
		return sign * m / 8 * math.Ldexp(1, -6)
	}
	return sign * (1 + m/8) * math.Ldexp(1, e-7)
}

// randF8 draws an F8E4M3 matrix: codes of weights of N(0, 1) scaled to
// E4M3's range (no NaN), block scales around 1e-3 as DeepSeek-V3's
// weight_scale_inv are.
func randF8(rng *rand.Rand, rows, cols int) Matrix {
	m := Matrix{DType: F8E4M3, Rows: rows, Cols: cols, Data: make([]byte, rows*cols),
		Scales: make([]byte, ScalesBytes(F8E4M3, rows, cols))}
	for i := range m.Data {
		b := byte(rng.IntN(256))
		if b&0x7f == 0x7f {
			b ^= 1 // not NaN
		}
		m.Data[i] = b
	}
	for i := 0; i < len(m.Scales); i += 4 {
		binary.LittleEndian.PutUint32(m.Scales[i:], math.Float32bits(float32(1e-3*(0.5+rng.Float64()))))
	}
	return m
}

// TestE4M3DecodesAsTheSpecificationSays: every code's float32 value is
// the specification's, and the landmarks are where they should be.
func TestE4M3DecodesAsTheSpecificationSays(t *testing.T) {
	for b := range 256 {
		want := refE4M3(byte(b))
		if got := e4m3[b]; math.IsNaN(want) != isNaN32(got) || (!math.IsNaN(want) && float64(got) != want) || (want == 0 && math.Signbit(want) != math.Signbit(float64(got))) {
			t.Fatalf("code %#02x: %v, want %v", b, got, want)
		}
	}
	for b, v := range map[byte]float32{0x7e: 448, 0x08: 0x1p-6, 0x01: 0x1p-9, 0x38: 1, 0xb8: -1} {
		if e4m3[b] != v {
			t.Errorf("code %#02x: %v, want %v", b, e4m3[b], v)
		}
	}
}

// TestF8ProductsAreTheFloat32ProductsOfItsWeights: on every path, an
// F8E4M3 MatVec and MatMul equal, bit for bit, the same products on the
// float32 matrix of its weights (each float32(e4m3 * block scale)), for
// shapes across and inside 128x128 blocks, row tails and thread counts
// that split rows anywhere; and they are within the Dot error bound of
// the float64 product of those weights.
func TestF8ProductsAreTheFloat32ProductsOfItsWeights(t *testing.T) {
	defer SetThreads(SetThreads(0))
	forEachPath(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(301, 302))
		for _, s := range []struct{ rows, cols int }{{1, 16}, {3, 17}, {130, 256}, {67, 300}, {257, 1024}} {
			m := randF8(rng, s.rows, s.cols)
			f := widened(m)
			wide := f32View(f.Data)
			for r := range s.rows {
				for c := range s.cols {
					sc := math.Float32frombits(binary.LittleEndian.Uint32(m.Scales[4*((r/128)*((s.cols+127)/128)+c/128):]))
					if w := float32(refE4M3(m.Data[r*s.cols+c]) * float64(sc)); wide[r*s.cols+c] != w {
						t.Fatalf("weight (%d, %d) = %v, want %v", r, c, wide[r*s.cols+c], w)
					}
				}
			}
			for _, n := range []int{1, 2, 5} {
				x := randVec(rng, n*s.cols)
				var want []float32
				for _, th := range []int{1, 3} {
					SetThreads(th)
					got := make([]float32, n*s.rows)
					want = make([]float32, n*s.rows)
					MatMul(got, m, x, n)
					MatMul(want, f, x, n)
					if i, ok := sameSlices(got, want); !ok {
						t.Fatalf("%dx%d n=%d threads=%d: out[%d] = %v, float32 weights give %v", s.rows, s.cols, n, th, i, got[i], want[i])
					}
				}
				for r := range s.rows {
					dot, abs := refDot(wide[r*s.cols:(r+1)*s.cols], x[:s.cols])
					if e := math.Abs(float64(want[r]) - dot); e > dotErrBound(s.cols, abs) {
						t.Fatalf("%dx%d row %d: %v, float64 %v", s.rows, s.cols, r, want[r], dot)
					}
				}
			}
		}
	})
}

// TestQuantizingF8QuantizesItsValues and the validation of its scales.
func TestQuantizingF8QuantizesItsValues(t *testing.T) {
	m := randF8(rand.New(rand.NewPCG(303, 304)), 130, 160)
	quantizesLikeItsValues(t, m)
	bad := m
	bad.Scales = m.Scales[:12] // 2x2 blocks need 16 bytes
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "needs 16 bytes of scales, has 12") {
		t.Errorf("short scales: %v", err)
	}
}

// TestF8AssemblyDequantizesEveryCode: the assembly paths' dequantization
// gives every code (subnormal, normal, ±0, NaN) under several scales the
// definition's weight (a scale so large that 256 times it overflows
// included), and a row's tail past the last 16 too.
func TestF8AssemblyDequantizesEveryCode(t *testing.T) {
	const cols = 256 + 5 // every code, then a tail
	m := Matrix{DType: F8E4M3, Rows: 1, Cols: cols, Data: make([]byte, cols), Scales: make([]byte, 4*3)}
	for c := range m.Data {
		m.Data[c] = byte(c)
	}
	for _, scales := range [][3]float32{{1, 1e-3, 0x1p-120}, {0x1p125, 1, 1}} {
		for i, s := range scales {
			binary.LittleEndian.PutUint32(m.Scales[4*i:], math.Float32bits(s))
		}
		want := make([]float32, cols)
		dequantF8Row(want, m.Data, m.Scales, 0)
		for _, name := range simdPathNames() {
			got := make([]float32, cols)
			withPath(t, name, func() { dequantF8Asm(0, got, m.Data, m.Scales, 0) })
			if i, ok := sameSlices(got, want); !ok {
				t.Fatalf("%s, scales %v: code %#02x (scale %d) = %v, want %v", name, scales, m.Data[i], i/128, got[i], want[i])
			}
		}
	}
}
