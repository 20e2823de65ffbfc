package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
)

// u is the float32 unit roundoff, 2^-24.
const u = 1.0 / (1 << 24)

var dtypes = []DType{F32, F16, BF16}

// specDot is the Dot definition of doc.go written as plainly as possible:
// one lane array, element i to lane i%16, products rounded before the add,
// then the pairwise fold. Every fast path must equal it bit for bit.
func specDot(w, x []float32) float32 {
	var acc [16]float32
	for i := range x {
		p := float32(w[i] * x[i])
		acc[i%16] = acc[i%16] + p
	}
	for width := 8; width >= 1; width /= 2 {
		for l := 0; l < width; l++ {
			acc[l] = acc[l] + acc[l+width]
		}
	}
	return acc[0]
}

// refF16 widens binary16 bits with float64 formulas, independently of
// F16ToF32 (NaN for NaN, without payload).
func refF16(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0:
		return sign * math.Ldexp(m, -24)
	case 31:
		if m != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1024+m, e-25)
}

// refWiden widens stored bits of dt to float64, independently of kernels'
// conversions.
func refWiden(dt DType, b []byte, i int) float64 {
	switch dt {
	case F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case BF16:
		return float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
	case F16:
		return refF16(binary.LittleEndian.Uint16(b[2*i:]))
	}
	panic("dtype")
}

// encode stores vals in dt (rounding to nearest), little-endian.
func encode(dt DType, vals []float32) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		switch dt {
		case F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case BF16:
			binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(v))
		case F16:
			binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(v))
		}
	}
	return b
}

// randMatrix returns a rows x cols matrix of dt with N(0,1) entries and its
// exactly widened float32 values (widened by the test's own reference).
func randMatrix(rng *rand.Rand, dt DType, rows, cols int) (Matrix, []float32) {
	vals := randVec(rng, rows*cols)
	m := Matrix{DType: dt, Rows: rows, Cols: cols, Data: encode(dt, vals)}
	wide := make([]float32, rows*cols)
	for i := range wide {
		wide[i] = float32(refWiden(dt, m.Data, i))
	}
	return m, wide
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// wideRangeVec returns values of magnitude 2^-20..2^20 with random signs:
// their sums depend strongly on the order of additions, so a wrong lane or
// fold order shows up as different bits.
func wideRangeVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		x := float32(math.Ldexp(1+rng.Float64(), rng.IntN(41)-20))
		if rng.IntN(2) == 0 {
			x = -x
		}
		v[i] = x
	}
	return v
}

// sameBits reports whether a and b are the same float32, any NaN equal to
// any NaN (NaN payloads are not part of the definitions).
func sameBits(a, b float32) bool {
	if a != a && b != b {
		return true
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

// ulpDiff returns how many float32 values lie between a and b (0 when
// equal; both NaN count as equal, NaN against a number as MaxInt64).
func ulpDiff(a, b float32) int64 {
	if a != a || b != b {
		if a != a && b != b {
			return 0
		}
		return math.MaxInt64
	}
	return abs64(ordered(a) - ordered(b))
}

// ordered maps a float32 to an integer that counts ulps along the number
// line; -0 and +0 both map to 0.
func ordered(f float32) int64 {
	b := int64(math.Float32bits(f))
	if b&0x80000000 != 0 {
		return -(b & 0x7fffffff)
	}
	return b
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// refDot returns the float64 dot product and the sum of |w_i x_i|, the
// scale of the rounding error bound.
func refDot(w, x []float32) (dot, absSum float64) {
	for i := range x {
		p := float64(w[i]) * float64(x[i])
		dot += p
		absSum += math.Abs(p)
	}
	return dot, absSum
}

// dotErrBound bounds |Dot - exact| for n terms: each product passes one
// multiply rounding, at most ceil(n/16) lane additions and 4 fold
// additions, so |error| <= gamma(ceil(n/16)+5) * sum|w_i x_i| with
// gamma(k) = k*u/(1-k*u) (Higham, Accuracy and Stability, eq. 3.5).
func dotErrBound(n int, absSum float64) float64 {
	k := float64((n+15)/16 + 5)
	return k * u / (1 - k*u) * absSum
}
