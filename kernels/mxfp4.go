package kernels

import "math"

// MXFP4 (OCP Microscaling Formats v1.0, as gpt-oss ships its experts):
// blocks of 32 weights along a row share one E8M0 scale byte s; each
// weight is an E2M1 code q (sign, two exponent bits, one mantissa bit)
// and is worth e2m1[q] * 2^(s-127), the value transformers' dequantizer
// computes (torch.ldexp). A Matrix of MXFP4 holds the codes in Data, two
// a byte, the lower nibble first (rows of Cols/2 bytes: the checkpoint's
// *_blocks tensor), and the scales in Scales (rows of Cols/32 bytes: its
// *_scales tensor), both read in place.

const mxfp4Block = 32 // MXFP4 weights per E8M0 scale

// e2m1 are the 16 values of an E2M1 code (code 8 is -0: a Go constant
// -0.0 would be +0).
var e2m1 = [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, math.Copysign(0, -1), -0.5, -1, -1.5, -2, -3, -4, -6}

// mxfp4Values[s][q] is the float32 value of code q under scale byte s:
// e2m1[q] * 2^(s-127), exact (at most two significant bits, and float32
// holds every power of two from 2^-149) except where it passes float32's
// range (s = 255, |q| > 0.5: ±Inf, as torch.ldexp gives in float32).
var mxfp4Values = func() (t [256][16]float32) {
	for s := range t {
		for q, v := range e2m1 {
			t[s][q] = float32(math.Ldexp(v, s-127))
		}
	}
	return t
}()

// dequantMXFP4Row writes the len(dst) weights of one MXFP4 row (codes:
// len(dst)/2 bytes, scales: len(dst)/32) into dst.
func dequantMXFP4Row(dst []float32, codes, scales []byte) {
	for b, s := range scales[:len(dst)/mxfp4Block] {
		t := &mxfp4Values[s]
		c := (*[16]byte)(codes[16*b:])
		d := (*[32]float32)(dst[32*b:])
		for j, q := range c {
			d[2*j], d[2*j+1] = t[q&15], t[q>>4]
		}
	}
}

// matVecMXFP4Go is the go path's MXFP4 row kernel: codes and scales hold
// len(out) rows.
func matVecMXFP4Go(out []float32, codes, scales []byte, x []float32) {
	cb, sb := len(x)/2, len(x)/mxfp4Block
	for r := range out {
		out[r] = dotMXFP4Go(codes[r*cb:(r+1)*cb], scales[r*sb:(r+1)*sb], x)
	}
}

// dotMXFP4Go is Dot of one MXFP4 row with x (len(x) a multiple of 32):
// each weight dequantized as mxfp4Values gives it, element i to lane
// i%16 (a block's byte j holds elements 2j and 2j+1: its first eight
// bytes fill the sixteen lanes once, its last eight once more), each
// product rounded to float32 before the add, then fold16.
func dotMXFP4Go(codes, scales []byte, x []float32) float32 {
	var s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 float32
	for b, s := range scales[:len(x)/mxfp4Block] {
		t := &mxfp4Values[s]
		blk := (*[16]byte)(codes[16*b:])
		xb := (*[32]float32)(x[32*b:])
		for h := 0; h < 2; h++ {
			c := (*[8]byte)(blk[8*h:])
			v := (*[16]float32)(xb[16*h:])
			s0 += float32(t[c[0]&15] * v[0])
			s1 += float32(t[c[0]>>4] * v[1])
			s2 += float32(t[c[1]&15] * v[2])
			s3 += float32(t[c[1]>>4] * v[3])
			s4 += float32(t[c[2]&15] * v[4])
			s5 += float32(t[c[2]>>4] * v[5])
			s6 += float32(t[c[3]&15] * v[6])
			s7 += float32(t[c[3]>>4] * v[7])
			s8 += float32(t[c[4]&15] * v[8])
			s9 += float32(t[c[4]>>4] * v[9])
			s10 += float32(t[c[5]&15] * v[10])
			s11 += float32(t[c[5]>>4] * v[11])
			s12 += float32(t[c[6]&15] * v[12])
			s13 += float32(t[c[6]>>4] * v[13])
			s14 += float32(t[c[7]&15] * v[14])
			s15 += float32(t[c[7]>>4] * v[15])
		}
	}
	return fold16(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15)
}
