//go:build arm64

package kernels

import "unsafe"

// packedAsm reports whether k computes BF16P in assembly: no path off
// amd64 does yet.
func packedAsm(isa) bool { return false }

func rowsBF16PSIMD(_ isa, out []float32, data []byte, table *[packedTableBytes]byte, x []float32) {
	matVecBF16PGo(out, data, table, x)
}

func widenBlocksSIMD(_ isa, dst []float32, src []byte, table *[packedTableBytes]byte) {
	widenBlocksGo(dst, src, table)
}

// mmBF16PSIMD is never called here: NEON's mmDirect is false.
func mmBF16PSIMD(int, *float32, int, unsafe.Pointer, int, int, *float32, int, int, *[packedTableBytes]byte) {
	panic("kernels: no BF16P MatMul micro-kernel on arm64")
}
