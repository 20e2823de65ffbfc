// Package isaprobe measures the AVX-512 arithmetic a MatMul could be
// built on, register to register, so that the choice between them rests
// on this machine's figures (issue 39): the multiply and the add that
// kernels' definition prescribes (a product rounded to float32, then
// added), a fused multiply-add, and VDPBF16PS (AVX512_BF16: 32 BF16
// products a register, summed two a lane). Go's assembler has no
// VDPBF16PS: it is written out as its EVEX bytes, and a test checks
// them against the instruction's definition.
//
//	go test ./kernels/internal/isaprobe -bench . -benchtime 2s
package isaprobe
