// Package cuda runs odmoe's expert kernels on an NVIDIA GPU: a binding of
// the few CUDA driver calls a worker needs, loaded from libcuda.so.1 at
// run time (purego: no cgo, no CUDA headers or toolkit to build), and
// the expert FFN (gate and up products with SwiGLU, then down) as CUDA
// kernels that compute kernels/doc.go's definitions bit for bit.
//
// Everything but this file is behind the cuda build tag, so a default
// build carries none of it. The kernels are expert.cu, compiled once to
// PTX (expert.ptx, committed and embedded: building needs no nvcc) by
// `go generate -tags cuda` where nvcc is; the driver JIT-compiles the PTX for the
// GPU it finds when the package opens a device.
//
// Why not gorgonia.org/cu (the design card's choice): v0.9.6 does not
// compile against CUDA 13's cuda.h, whose cuCtxCreate, cuMemAdvise,
// cuMemPrefetchAsync, cuGraphAddDependencies and cuGraphGetEdges take
// other arguments than it passes (its exact errors, from the H100
// machine's CUDA 13.0: docs/kernels.md, "CUDA workers"); it builds against CUDA
// 11.8 and 12.5. Its init also exits a process that finds no GPU, and it
// needs cgo and the CUDA headers to build. The twenty-nine driver calls a
// worker makes, loaded with purego, need none of that.
package cuda
