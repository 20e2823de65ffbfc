package kernels

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// refE2M1 decodes an E2M1 code from its bits as the OCP MX specification
// defines it: sign, two exponent bits of bias 1, one mantissa bit; an
// exponent of 0 is subnormal (0 or 0.5).
func refE2M1(q byte) float64 {
	sign := 1.0
	if q&8 != 0 {
		sign = -1
	}
	e, m := int(q>>1&3), float64(q&1)
	if e == 0 {
		return sign * m * 0.5
	}
	return sign * (1 + m/2) * math.Ldexp(1, e-1)
}

// randMXFP4 draws an MXFP4 matrix: any codes, scales around 2^0 (the
// E8M0 bias, 127) and, with extremes, the smallest and largest scales too.
func randMXFP4(rng *rand.Rand, rows, cols int, extremes bool) Matrix {
	m := Matrix{DType: MXFP4, Rows: rows, Cols: cols, Data: make([]byte, rows*cols/2), Scales: make([]byte, rows*cols/32)}
	for i := range m.Data {
		m.Data[i] = byte(rng.IntN(256))
	}
	for i := range m.Scales {
		m.Scales[i] = byte(120 + rng.IntN(14))
		if extremes && rng.IntN(8) == 0 {
			m.Scales[i] = []byte{0, 1, 2, 250, 254}[rng.IntN(5)]
		}
	}
	return m
}

// refMXFP4 is element (r, c) of m by the specification: the code's value
// times 2^(scale-127), in float64.
func refMXFP4(m Matrix, r, c int) float64 {
	b := m.Data[r*m.Cols/2+c/2]
	q := b & 15
	if c%2 == 1 {
		q = b >> 4
	}
	return math.Ldexp(refE2M1(q), int(m.Scales[r*m.Cols/32+c/32])-127)
}

// TestMXFP4DequantizesAsTheSpecificationSays: every code under every
// scale byte dequantizes to the specification's value (exactly: float32
// holds them all, subnormal ones included, but those past its range,
// which are ±Inf as torch.ldexp gives them), the lower nibble first.
func TestMXFP4DequantizesAsTheSpecificationSays(t *testing.T) {
	m := Matrix{DType: MXFP4, Rows: 256, Cols: 32, Data: make([]byte, 256*16), Scales: make([]byte, 256)}
	for s := range 256 {
		m.Scales[s] = byte(s)
		for j := range 8 { // codes 0..15 in order, then again
			m.Data[s*16+j] = byte(2*j) | byte(2*j+1)<<4
			m.Data[s*16+8+j] = m.Data[s*16+j]
		}
	}
	row := make([]float32, 32)
	subnormal := 0
	for s := range 256 {
		RowToFloat32(row, m, s)
		for c, got := range row {
			want := refMXFP4(m, s, c)
			if c%16 != int(m.Data[s*16+c/2%8]>>(4*(c%2))&15) {
				t.Fatalf("test layout: column %d", c)
			}
			w32 := float32(want)
			if want != 0 && math.Abs(want) < 0x1p-126 {
				subnormal++
			}
			if !sameBits(got, w32) || (!math.IsInf(float64(w32), 0) && float64(w32) != want) {
				t.Fatalf("scale %d code %d: %v, want %v", s, c%16, got, want)
			}
		}
	}
	if subnormal == 0 || !math.IsInf(float64(mxfp4Values[255][7]), 1) || mxfp4Values[255][1] != 0x1p127 || mxfp4Values[0][1] != 0x1p-128 {
		t.Errorf("the extremes: %d subnormal values, 6*2^128 = %v, 0.5*2^128 = %v, 0.5*2^-127 = %v",
			subnormal, mxfp4Values[255][7], mxfp4Values[255][1], mxfp4Values[0][1])
	}
}

// TestMXFP4ProductsAreTheFloat32ProductsOfItsWeights: on every path, an
// MXFP4 MatVec and MatMul equal, bit for bit, the same products on the
// float32 matrix of its dequantized weights (and so the Dot definition),
// for decode and prefill shapes, extreme scales and thread counts that
// split rows unevenly; and they are within the Dot error bound of the
// float64 product of the specification's values.
func TestMXFP4ProductsAreTheFloat32ProductsOfItsWeights(t *testing.T) {
	defer SetThreads(SetThreads(0))
	forEachPath(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(201, 202))
		for _, s := range []struct{ rows, cols int }{{1, 32}, {5, 64}, {67, 2880}, {9, 4096}, {3, 0}} {
			m := randMXFP4(rng, s.rows, s.cols, s.rows%2 == 1)
			f := widened(m)
			for _, n := range []int{1, 2, 3, 5, 9} {
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
					if n == 1 {
						MatVec(got, m, x)
						if i, ok := sameSlices(got, want); !ok {
							t.Fatalf("%dx%d MatVec threads=%d: out[%d] = %v, want %v", s.rows, s.cols, th, i, got[i], want[i])
						}
					}
				}
				for r := range s.rows {
					var dot, abs float64
					for c := range s.cols {
						p := refMXFP4(m, r, c) * float64(x[c])
						dot, abs = dot+p, abs+math.Abs(p)
					}
					if abs > 1e36 { // the float32 lanes may overflow where float64 does not
						continue
					}
					if e := math.Abs(float64(want[r]) - dot); e > dotErrBound(s.cols, abs) {
						t.Fatalf("%dx%d row %d: %v, float64 %v (error %g > bound %g)", s.rows, s.cols, r, want[r], dot, e, dotErrBound(s.cols, abs))
					}
				}
			}
		}
	})
}

// TestQuantizingMXFP4QuantizesItsValues: the shadow's copy of MXFP4
// weights is the copy of their dequantized values.
func TestQuantizingMXFP4QuantizesItsValues(t *testing.T) {
	quantizesLikeItsValues(t, randMXFP4(rand.New(rand.NewPCG(203, 204)), 7, 96, false))
}

// widened is m's weights as an F32 matrix (RowToFloat32 row by row).
func widened(m Matrix) Matrix {
	f := Matrix{DType: F32, Rows: m.Rows, Cols: m.Cols, Data: make([]byte, 4*m.Rows*m.Cols)}
	row := make([]float32, m.Cols)
	for r := range m.Rows {
		RowToFloat32(row, m, r)
		copy(f.Data[4*r*m.Cols:], encode(F32, row))
	}
	return f
}

// quantizesLikeItsValues checks that quantizing m (to F16, Q8, NF4: the
// shadow's copies) gives the bytes that quantizing its widened values
// gives.
func quantizesLikeItsValues(t *testing.T, m Matrix) {
	t.Helper()
	f := widened(m)
	for _, dt := range []DType{F16, Q8, NF4} {
		a, err := Quantize(dt, m)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Quantize(dt, f)
		if err != nil {
			t.Fatal(err)
		}
		if string(a.Data) != string(b.Data) {
			t.Errorf("%v: quantizing %v differs from quantizing its values", dt, m.DType)
		}
	}
}

// TestMXFP4MatricesAreValidated: rows of whole blocks and scales of the
// right size, and no scales on other dtypes.
func TestMXFP4MatricesAreValidated(t *testing.T) {
	good := randMXFP4(rand.New(rand.NewPCG(1, 2)), 2, 64, false)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m    Matrix
		says string
	}{
		{Matrix{DType: MXFP4, Rows: 2, Cols: 48, Data: make([]byte, 48), Scales: make([]byte, 4)}, "blocks of 32"},
		{Matrix{DType: MXFP4, Rows: 2, Cols: 64, Data: good.Data, Scales: good.Scales[:3]}, "needs 4 bytes of scales, has 3"},
		{Matrix{DType: BF16, Rows: 1, Cols: 2, Data: make([]byte, 4), Scales: []byte{1}}, "needs 0 bytes of scales"},
	} {
		if err := c.m.Validate(); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%v %dx%d: %v, want an error saying %s", c.m.DType, c.m.Rows, c.m.Cols, err, c.says)
		}
	}
}

// TestMXFP4AssemblyDequantizesEveryCodeAndScale: the assembly paths'
// dequantization gives every code under every scale byte the value of
// the definition, bit for bit, but for code 8's -0, which it may give as
// +0 (no Dot tells them apart; the product tests above compare whole
// products with the float32 weights').
func TestMXFP4AssemblyDequantizesEveryCodeAndScale(t *testing.T) {
	const cols = 256 * 32
	codes, scales := make([]byte, cols/2), make([]byte, cols/32)
	for b := range scales {
		scales[b] = byte(b)
		for j := range 16 {
			codes[16*b+j] = byte(j) | byte(15-j)<<4
		}
	}
	want := make([]float32, cols)
	dequantMXFP4Row(want, codes, scales)
	for _, name := range simdPathNames() {
		got := make([]float32, cols)
		withPath(t, name, func() { dequantMXFP4Asm(0, got, codes, scales) })
		for i := range got {
			if !sameBits(got[i], want[i]) && !(got[i] == 0 && want[i] == 0) {
				t.Fatalf("%s: weight %d (scale %d) = %v, want %v", name, i, i/32, got[i], want[i])
			}
		}
	}
}
