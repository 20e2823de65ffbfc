//go:build !(amd64 || arm64)

package kernels

// Other architectures run the pure-Go path only.
var simdPaths []*path
