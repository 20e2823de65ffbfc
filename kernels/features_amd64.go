package kernels

import "golang.org/x/sys/cpu"

// Features lists the CPU's SIMD features the kernels use or could
// (issue 39's BF16 dot products among them), as /proc/cpuinfo names them:
// what a table of kernel figures needs beside it.
func Features() []string {
	var fs []string
	for _, f := range []struct {
		name string
		has  bool
	}{
		{"avx2", cpu.X86.HasAVX2}, {"fma", cpu.X86.HasFMA}, {"f16c", cpu.X86.HasF16C},
		{"avx512f", cpu.X86.HasAVX512F}, {"avx512bw", cpu.X86.HasAVX512BW}, {"avx512vl", cpu.X86.HasAVX512VL},
		{"avx512_vnni", cpu.X86.HasAVX512VNNI}, {"avx512_bf16", cpu.X86.HasAVX512BF16},
		{"amx_bf16", cpu.X86.HasAMXBF16}, {"amx_int8", cpu.X86.HasAMXInt8},
	} {
		if f.has {
			fs = append(fs, f.name)
		}
	}
	return fs
}
