//go:build amd64 || arm64

package kernels

import "unsafe"

// The glue between the Q8 and NF4 row kernels and their assembly, as
// rowsSIMD is for the float dtypes: the assembly computes whole 16-element
// blocks (a block never straddles a Q8 group of 32 or an NF4 block of 64),
// and a row's last cols%16 elements are added here, dequantized as
// RowToFloat32 does, to the lanes the assembly returns.

// rowsQuantSIMD computes out[r] = Dot(row r of w, x) for every r <
// len(out); w holds len(out) rows of dt.RowBytes(len(x)) bytes.
func rowsQuantSIMD(k isa, dt DType, out []float32, w []byte, x []float32) {
	rows, cols := len(out), len(x)
	if rows == 0 {
		return
	}
	stride := dt.RowBytes(cols)
	w = w[:rows*stride]
	sb := quantScaleBytes(dt, cols)
	wp, xp := unsafe.Pointer(unsafe.SliceData(w)), unsafe.SliceData(x)
	n16 := cols &^ 15
	if n16 == cols {
		quantRowsAsm(k, dt, &out[0], wp, xp, rows, n16, stride, sb, false)
		return
	}
	var lanes [tailRows * 16]float32
	for r0 := 0; r0 < rows; r0 += tailRows {
		nr := min(tailRows, rows-r0)
		quantRowsAsm(k, dt, &lanes[0], unsafe.Add(wp, r0*stride), xp, nr, n16, stride, sb, true)
		for r := range nr {
			acc := (*[16]float32)(lanes[16*r : 16*r+16])
			row := w[(r0+r)*stride : (r0+r+1)*stride]
			for j := n16; j < cols; j++ {
				acc[j-n16] += float32(quantWeight(dt, row, sb, j) * x[j])
			}
			out[r0+r] = fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
				acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
		}
	}
}

// quantScaleBytes returns the bytes of a Q8 or NF4 row's scales, where its
// codes start.
func quantScaleBytes(dt DType, cols int) int {
	if dt == Q8 {
		return 4 * ceilDiv(cols, q8Group)
	}
	return 4 * ceilDiv(cols, nf4Block)
}

// quantWeight returns weight j of a Q8 or NF4 row whose codes start at sb.
func quantWeight(dt DType, row []byte, sb, j int) float32 {
	if dt == Q8 {
		return float32(int8(row[sb+j])) * f32le(row[4*(j/q8Group):])
	}
	return nf4Codes[row[sb+j/2]>>(4*(j%2))&15] * f32le(row[4*(j/nf4Block):])
}

// dequantRows writes the nr rows of cols weights of dt (Q8 or NF4) in src
// into dst as float32, exactly as RowToFloat32 does: in assembly when cols
// is a multiple of 16 (MatMul's tiles always are), else in Go.
func dequantRows(k isa, dt DType, dst []float32, src []byte, nr, cols int) {
	rb := dt.RowBytes(cols)
	if nr > 0 && cols > 0 && cols%16 == 0 {
		src, dst = src[:nr*rb], dst[:nr*cols]
		dequantAsm(k, dt, &dst[0], unsafe.Pointer(&src[0]), nr, cols, rb, quantScaleBytes(dt, cols))
		return
	}
	for r := range nr {
		row, d := src[r*rb:(r+1)*rb], dst[r*cols:(r+1)*cols]
		if dt == Q8 {
			dequantQ8Row(d, row)
		} else {
			dequantNF4Row(d, row)
		}
	}
}
