package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// packedAsm reports whether k computes BF16P in assembly: AVX-512 with
// VBMI's byte permutes (Ice Lake, Zen 4 and later; not Skylake-X).
func packedAsm(k isa) bool {
	return k == isaAVX512 && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VBMI
}

// rowsBF16PSIMD is BF16P's row kernel on k.
func rowsBF16PSIMD(k isa, out []float32, data []byte, table *[packedTableBytes]byte, x []float32) {
	if !packedAsm(k) {
		matVecBF16PGo(out, data, table, x)
		return
	}
	if len(out) == 0 {
		return
	}
	nb := len(x) / packedBlock
	if nb == 0 {
		clear(out)
		return
	}
	_ = data[len(out)*nb*packedBlockBytes-1]
	rowsBF16PAVX512(&out[0], unsafe.Pointer(&data[0]), &x[0], len(out), nb, table, &packedConsts)
}

// widenBlocksSIMD widens the len(dst)/64 blocks of src on k.
func widenBlocksSIMD(k isa, dst []float32, src []byte, table *[packedTableBytes]byte) {
	nb := len(dst) / packedBlock
	if !packedAsm(k) || nb == 0 {
		widenBlocksGo(dst, src, table)
		return
	}
	_ = src[nb*packedBlockBytes-1]
	widenBF16PAVX512(&dst[0], unsafe.Pointer(&src[0]), nb, table, &packedConsts)
}

//go:noescape
func rowsBF16PAVX512(out *float32, w unsafe.Pointer, x *float32, rows, nblk int, table *[packedTableBytes]byte, consts *[2][64]byte)

//go:noescape
func widenBF16PAVX512(dst *float32, src unsafe.Pointer, nblk int, table *[packedTableBytes]byte, consts *[2][64]byte)

// mmBF16PSIMD applies rows of a BF16P matrix (whole rows, from the
// matrix's Data at the first) to t vectors, 3 or 4, as mmDirectAsm does
// for BF16 (mmWayOf: 2 go by vector); exception rows are left to the
// caller.
func mmBF16PSIMD(t int, out *float32, outStride int, w unsafe.Pointer, wStride, rows int, x *float32, xStride, cols int, table *[packedTableBytes]byte) {
	nb := cols / packedBlock
	switch t {
	case 3:
		mmBF16Px3AVX512(out, outStride, w, wStride, rows, x, xStride, nb, table, &packedConsts)
	case 4:
		mmBF16Px4AVX512(out, outStride, w, wStride, rows, x, xStride, nb, table, &packedConsts)
	default:
		panic("kernels: no BF16P MatMul micro-kernel for this many vectors")
	}
}

//go:noescape
func mmBF16Px3AVX512(out *float32, outStride int, w unsafe.Pointer, wStride, rows int, x *float32, xStride, nblk int, table *[packedTableBytes]byte, consts *[2][64]byte)

//go:noescape
func mmBF16Px4AVX512(out *float32, outStride int, w unsafe.Pointer, wStride, rows int, x *float32, xStride, nblk int, table *[packedTableBytes]byte, consts *[2][64]byte)
