//go:build arm64

package kernels

// packedAsm reports whether k computes BF16P in assembly: no path off
// amd64 does yet.
func packedAsm(isa) bool { return false }

func rowsBF16PSIMD(_ isa, out []float32, data []byte, table *[packedTableBytes]byte, x []float32) {
	matVecBF16PGo(out, data, table, x)
}

func widenBlocksSIMD(_ isa, dst []float32, src []byte, table *[packedTableBytes]byte) {
	widenBlocksGo(dst, src, table)
}
