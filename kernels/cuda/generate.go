//go:build cuda

package cuda

// expert.ptx is expert.cu compiled for compute capability 7.5 and later
// (the oldest CUDA 13 compiles for); the driver JIT-compiles it for the
// GPU at hand. -fmad=false and -ftz=false are the arithmetic's
// definition (kernels/doc.go), not tuning.
//go:generate nvcc -ptx -arch=compute_75 -fmad=false -ftz=false -prec-div=true -prec-sqrt=true -O3 -o expert.ptx expert.cu
