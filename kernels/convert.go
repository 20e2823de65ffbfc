package kernels

import (
	"fmt"
	"math"
)

// BF16ToF32 widens a bfloat16 exactly: its bits become the top half of the
// float32. NaN payloads (signalling ones too) are kept as they are.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even, with gradual
// underflow (no flush of subnormals) and overflow to ±Inf. A NaN stays a
// NaN: its payload is truncated and the quiet bit set, as AVX512_BF16's
// VCVTNEPS2BF16 does (which, unlike this function, flushes subnormals).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToF32 widens an IEEE binary16 exactly, subnormals, ±0 and ±Inf
// included. A NaN keeps its sign and payload and is made quiet, as the F16C
// and NEON conversion instructions do.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		// ±0 or subnormal: mant * 2^-24, exact in float32.
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	case 0x1f:
		if mant == 0 {
			return math.Float32frombits(sign | 0x7f800000)
		}
		return math.Float32frombits(sign | 0x7fc00000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// F32ToF16 rounds f to the nearest IEEE binary16, ties to even, with
// gradual underflow into the half subnormals and overflow to ±Inf. A NaN
// stays a NaN: payload truncated, quiet bit set (as VCVTPS2PH and NEON do).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // biased half exponent
	switch {
	case e >= 31:
		return sign | 0x7c00
	case e <= 0:
		// Half subnormal (or zero): the value is m24 * 2^(e-38) with the
		// implicit bit; in units of 2^-24 that is m24 >> (14-e).
		if e < -10 {
			return sign // below half the smallest subnormal: rounds to ±0
		}
		m := mant | 0x800000
		shift := uint(14 - e)
		q := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && q&1 == 1 {
			q++ // may carry into the smallest normal: still the right encoding
		}
		return sign | uint16(q)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // a carry into the exponent is right, up to and including Inf
	}
	return sign | uint16(h)
}

// ToFloat32 widens the len(dst) elements stored in src (little-endian, in
// dtype dt) into dst. It panics unless len(src) == len(dst)*dt.Size().
func ToFloat32(dst []float32, src []byte, dt DType) {
	if dt.Size() == 0 || len(src) != len(dst)*dt.Size() {
		panic(fmt.Sprintf("kernels.ToFloat32: %d bytes of %v for %d elements", len(src), dt, len(dst)))
	}
	switch dt {
	case F32:
		copy(dst, f32View(src))
	case BF16:
		for i, h := range u16View(src)[:len(dst)] {
			dst[i] = BF16ToF32(h)
		}
	case F16:
		tab := f16Table()
		for i, h := range u16View(src)[:len(dst)] {
			dst[i] = tab[h]
		}
	}
}
