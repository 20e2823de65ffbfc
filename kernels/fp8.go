package kernels

import "math"

// F8E4M3 (FP8 E4M3FN, as DeepSeek-V3 ships its weights): one code a byte
// (a sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 is
// subnormal; S.1111.111 is NaN, there is no infinity), and one float32
// scale per block of 128 rows and 128 columns (weight_scale_inv, by
// which the codes are multiplied). A Matrix of F8E4M3 holds the codes in
// Data (rows of Cols bytes) and the scales in Scales (ceil(Rows/128) rows
// of ceil(Cols/128) float32s, little-endian), both read in place. Weight
// (r, c) is float32(e4m3[q] * scale[r/128][c/128]): one float32 multiply,
// rounded.

const f8Block = 128 // F8E4M3 rows and columns per scale

// e4m3 is the float32 value of every E4M3FN code: exact (4 significant
// bits, exponents -9 to 8).
var e4m3 = func() (t [256]float32) {
	for b := range t {
		e, m := b>>3&15, float64(b&7)
		v := math.Ldexp(m/8, -6) // subnormal
		switch {
		case e == 15 && m == 7:
			v = math.NaN()
		case e > 0:
			v = math.Ldexp(1+m/8, e-7)
		}
		if b&0x80 != 0 {
			v = -v
		}
		t[b] = float32(v)
	}
	return t
}()

// f8Scales returns the scales of one 128-row block of a cols-wide
// F8E4M3 matrix (ceil(cols/128) float32s) from Matrix.Scales.
func f8Scales(scales []byte, rowBlock, cols int) []float32 {
	cb := ceilDiv(cols, f8Block)
	return f32View(scales[4*rowBlock*cb : 4*(rowBlock+1)*cb])
}

// dequantF8Row writes the len(dst) weights of row r of an F8E4M3 matrix
// (codes: its len(dst) bytes; scales: the whole Matrix.Scales) into dst.
func dequantF8Row(dst []float32, codes, scales []byte, r int) {
	sc := f8Scales(scales, r/f8Block, len(dst))
	for c, q := range codes[:len(dst)] {
		dst[c] = e4m3[q] * sc[c/f8Block]
	}
}

// matVecF8Go is the go path's F8E4M3 row kernel: codes holds len(out)
// rows, the first of them row r0 of the matrix whose scales are scales.
func matVecF8Go(out []float32, codes, scales []byte, x []float32, r0 int) {
	cols := len(x)
	for i := range out {
		out[i] = dotF8Go(codes[i*cols:(i+1)*cols], f8Scales(scales, (r0+i)/f8Block, cols), x)
	}
}

// dotF8Go is Dot of one F8E4M3 row (sc: its row block's scales) with x:
// each weight float32(e4m3[q] * scale), then the Dot definition, element
// i to lane i%16 (a block of 128 columns is 8 runs of the 16 lanes; a
// row's last block may be shorter, and its last cols%16 elements go
// element by element).
func dotF8Go(codes []byte, sc []float32, x []float32) float32 {
	var acc [16]float32
	n := len(x)
	n16 := n &^ 15
	for i := 0; i < n16; i += 16 {
		s := sc[i/f8Block]
		c := (*[16]byte)(codes[i:])
		v := (*[16]float32)(x[i:])
		for l := range 16 {
			acc[l] += float32(float32(e4m3[c[l]]*s) * v[l])
		}
	}
	for i := n16; i < n; i++ {
		acc[i-n16] += float32(float32(e4m3[codes[i]]*sc[i/f8Block]) * x[i])
	}
	return fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
		acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
}
