package kernels

import "math"

// The row kernels below are the pure-Go form of the Dot definition in
// doc.go: lane l holds s<l>, element i of each 16-element block goes to
// lane i%16, products are rounded to float32 before the add (the explicit
// float32(...) conversion forbids the compiler to fuse them), the tail
// touches only its own lanes and fold16 is the pairwise fold. The 16
// accumulators are locals, not an array, so the compiler keeps them in
// registers; the (*[16]T) conversions remove the bounds checks.

// Dot returns the dot product of a and b with the 16-lane definition of
// the package doc; it is bit-identical to an F32 MatVec row. It panics if
// the lengths differ.
func Dot(a, b []float32) float32 {
	if len(a) != len(b) {
		panic("kernels.Dot: length mismatch")
	}
	return cur().dotF32(a, b)
}

// Sum returns the sum of x with the 16-lane definition of Dot, each
// product replaced by the element itself.
func Sum(x []float32) float32 { return cur().sum(x) }

func sumGo(x []float32) float32 {
	var acc [16]float32
	for i, v := range x {
		acc[i%16] += v
	}
	return fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
		acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
}

// fold16 is the pairwise fold: lane l += lane l+8 (l<8), then l+4 (l<4),
// then l+2 (l<2), then l+1; the result is lane 0.
func fold16(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 float32) float32 {
	s0 += s8
	s1 += s9
	s2 += s10
	s3 += s11
	s4 += s12
	s5 += s13
	s6 += s14
	s7 += s15
	s0 += s4
	s1 += s5
	s2 += s6
	s3 += s7
	s0 += s2
	s1 += s3
	return s0 + s1
}

// dotF32Go is Dot for float32 weights; len(w) >= len(x).
func dotF32Go(w []float32, x []float32) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 float32
	n16 := len(x) &^ 15
	for i := 0; i < n16; i += 16 {
		a := (*[16]float32)(w[i : i+16])
		b := (*[16]float32)(x[i : i+16])
		s0 += float32(a[0] * b[0])
		s1 += float32(a[1] * b[1])
		s2 += float32(a[2] * b[2])
		s3 += float32(a[3] * b[3])
		s4 += float32(a[4] * b[4])
		s5 += float32(a[5] * b[5])
		s6 += float32(a[6] * b[6])
		s7 += float32(a[7] * b[7])
		s8 += float32(a[8] * b[8])
		s9 += float32(a[9] * b[9])
		s10 += float32(a[10] * b[10])
		s11 += float32(a[11] * b[11])
		s12 += float32(a[12] * b[12])
		s13 += float32(a[13] * b[13])
		s14 += float32(a[14] * b[14])
		s15 += float32(a[15] * b[15])
	}
	if n16 == len(x) {
		return fold16(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15)
	}
	acc := [16]float32{s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15}
	for j, v := range w[n16:] {
		acc[j] += float32(v * x[n16+j])
	}
	return fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
		acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
}

// dotBF16Go is Dot for BF16 weights, widened exactly (bits << 16).
func dotBF16Go(w []uint16, x []float32) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 float32
	n16 := len(x) &^ 15
	for i := 0; i < n16; i += 16 {
		a := (*[16]uint16)(w[i : i+16])
		b := (*[16]float32)(x[i : i+16])
		s0 += float32(math.Float32frombits(uint32(a[0])<<16) * b[0])
		s1 += float32(math.Float32frombits(uint32(a[1])<<16) * b[1])
		s2 += float32(math.Float32frombits(uint32(a[2])<<16) * b[2])
		s3 += float32(math.Float32frombits(uint32(a[3])<<16) * b[3])
		s4 += float32(math.Float32frombits(uint32(a[4])<<16) * b[4])
		s5 += float32(math.Float32frombits(uint32(a[5])<<16) * b[5])
		s6 += float32(math.Float32frombits(uint32(a[6])<<16) * b[6])
		s7 += float32(math.Float32frombits(uint32(a[7])<<16) * b[7])
		s8 += float32(math.Float32frombits(uint32(a[8])<<16) * b[8])
		s9 += float32(math.Float32frombits(uint32(a[9])<<16) * b[9])
		s10 += float32(math.Float32frombits(uint32(a[10])<<16) * b[10])
		s11 += float32(math.Float32frombits(uint32(a[11])<<16) * b[11])
		s12 += float32(math.Float32frombits(uint32(a[12])<<16) * b[12])
		s13 += float32(math.Float32frombits(uint32(a[13])<<16) * b[13])
		s14 += float32(math.Float32frombits(uint32(a[14])<<16) * b[14])
		s15 += float32(math.Float32frombits(uint32(a[15])<<16) * b[15])
	}
	if n16 == len(x) {
		return fold16(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15)
	}
	acc := [16]float32{s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15}
	for j, v := range w[n16:] {
		acc[j] += float32(math.Float32frombits(uint32(v)<<16) * x[n16+j])
	}
	return fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
		acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
}

// dotF16Go is Dot for F16 weights, widened exactly through tab (f16Table).
func dotF16Go(w []uint16, x []float32, tab *[1 << 16]float32) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 float32
	n16 := len(x) &^ 15
	for i := 0; i < n16; i += 16 {
		a := (*[16]uint16)(w[i : i+16])
		b := (*[16]float32)(x[i : i+16])
		s0 += float32(tab[a[0]] * b[0])
		s1 += float32(tab[a[1]] * b[1])
		s2 += float32(tab[a[2]] * b[2])
		s3 += float32(tab[a[3]] * b[3])
		s4 += float32(tab[a[4]] * b[4])
		s5 += float32(tab[a[5]] * b[5])
		s6 += float32(tab[a[6]] * b[6])
		s7 += float32(tab[a[7]] * b[7])
		s8 += float32(tab[a[8]] * b[8])
		s9 += float32(tab[a[9]] * b[9])
		s10 += float32(tab[a[10]] * b[10])
		s11 += float32(tab[a[11]] * b[11])
		s12 += float32(tab[a[12]] * b[12])
		s13 += float32(tab[a[13]] * b[13])
		s14 += float32(tab[a[14]] * b[14])
		s15 += float32(tab[a[15]] * b[15])
	}
	if n16 == len(x) {
		return fold16(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15)
	}
	acc := [16]float32{s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15}
	for j, v := range w[n16:] {
		acc[j] += float32(tab[v] * x[n16+j])
	}
	return fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
		acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
}
