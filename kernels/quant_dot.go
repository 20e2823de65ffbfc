package kernels

// The pure-Go row kernels of Q8 and NF4 weights: the Dot definition of the
// package doc on weights dequantized exactly as RowToFloat32 does. Lane l
// is s<l> (locals, so that they stay in registers), element i goes to lane
// i%16, each product is rounded to float32 before the add, a row's
// partial last group or block goes element by element through the same
// lanes, and fold16 folds. The (*[N]T) conversions remove bounds checks.

func matVecQ8Go(out []float32, w []byte, x []float32) {
	rb := Q8.RowBytes(len(x))
	for r := range out {
		out[r] = dotQ8Go(w[r*rb:(r+1)*rb], x)
	}
}

func matVecNF4Go(out []float32, w []byte, x []float32) {
	rb := NF4.RowBytes(len(x))
	for r := range out {
		out[r] = dotNF4Go(w[r*rb:(r+1)*rb], x)
	}
}

// i8f maps a code byte to the exact float32 value of its int8.
var i8f = func() (t [256]float32) {
	for b := range t {
		t[b] = float32(int8(b))
	}
	return t
}()

// dotQ8Go is Dot of one Q8 row (Q8.RowBytes(len(x)) bytes) with x. Lanes
// 0-7 and lanes 8-15 are computed in two passes over the row's 16-element
// blocks (the second reads the row from cache): eight accumulators, the
// scale and temporaries fit in registers where sixteen do not, and the
// lanes are independent sums, so the order within each is unchanged.
func dotQ8Go(row []byte, x []float32) float32 {
	n := len(x)
	ng := ceilDiv(n, q8Group)
	scales, codes := row[:4*ng], row[4*ng:4*ng+n]
	n16 := n &^ 15
	var acc [16]float32
	for h := 0; h < 16; h += 8 {
		var s0, s1, s2, s3, s4, s5, s6, s7 float32
		for i := 0; i < n16; i += 16 {
			sc := f32le(scales[i/8&^3:]) // group i/32
			a := (*[8]byte)(codes[i+h:])
			b := (*[8]float32)(x[i+h:])
			s0 += float32(float32(i8f[a[0]]*sc) * b[0])
			s1 += float32(float32(i8f[a[1]]*sc) * b[1])
			s2 += float32(float32(i8f[a[2]]*sc) * b[2])
			s3 += float32(float32(i8f[a[3]]*sc) * b[3])
			s4 += float32(float32(i8f[a[4]]*sc) * b[4])
			s5 += float32(float32(i8f[a[5]]*sc) * b[5])
			s6 += float32(float32(i8f[a[6]]*sc) * b[6])
			s7 += float32(float32(i8f[a[7]]*sc) * b[7])
		}
		acc[h], acc[h+1], acc[h+2], acc[h+3], acc[h+4], acc[h+5], acc[h+6], acc[h+7] = s0, s1, s2, s3, s4, s5, s6, s7
	}
	for i := n16; i < n; i++ {
		acc[i%16] += float32(float32(i8f[codes[i]]*f32le(scales[i/8&^3:])) * x[i])
	}
	return fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
		acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
}

// nf4Table returns the 16 dequantized values of a block of absmax am.
func nf4Table(am float32) (t [16]float32) {
	for k, c := range nf4Codes {
		t[k] = c * am
	}
	return t
}

// dotNF4Go is Dot of one NF4 row (NF4.RowBytes(len(x)) bytes) with x.
func dotNF4Go(row []byte, x []float32) float32 {
	n := len(x)
	nb := ceilDiv(n, nf4Block)
	scales, codes := row[:4*nb], row[4*nb:4*nb+ceilDiv(n, 2)]
	var s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 float32
	full := n / nf4Block
	for blk := range full {
		t := nf4Table(f32le(scales[4*blk:]))
		c64 := (*[32]byte)(codes[32*blk:])
		x64 := (*[64]float32)(x[64*blk:])
		for j := 0; j < 32; j += 8 {
			a := (*[8]byte)(c64[j : j+8])
			b := (*[16]float32)(x64[2*j : 2*j+16])
			s0 += float32(t[a[0]&15] * b[0])
			s1 += float32(t[a[0]>>4] * b[1])
			s2 += float32(t[a[1]&15] * b[2])
			s3 += float32(t[a[1]>>4] * b[3])
			s4 += float32(t[a[2]&15] * b[4])
			s5 += float32(t[a[2]>>4] * b[5])
			s6 += float32(t[a[3]&15] * b[6])
			s7 += float32(t[a[3]>>4] * b[7])
			s8 += float32(t[a[4]&15] * b[8])
			s9 += float32(t[a[4]>>4] * b[9])
			s10 += float32(t[a[5]&15] * b[10])
			s11 += float32(t[a[5]>>4] * b[11])
			s12 += float32(t[a[6]&15] * b[12])
			s13 += float32(t[a[6]>>4] * b[13])
			s14 += float32(t[a[7]&15] * b[14])
			s15 += float32(t[a[7]>>4] * b[15])
		}
	}
	if full == nb {
		return fold16(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15)
	}
	acc := [16]float32{s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15}
	t := nf4Table(f32le(scales[4*full:]))
	for i := full * nf4Block; i < n; i++ {
		acc[i%16] += float32(t[codes[i/2]>>(4*(i%2))&15] * x[i])
	}
	return fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
		acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
}
