//go:build !(amd64 || arm64)

package kernels

// Features lists the CPU's SIMD features the kernels use: none here, where
// only the pure-Go path runs.
func Features() []string { return nil }
