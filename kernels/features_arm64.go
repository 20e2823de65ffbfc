package kernels

import "golang.org/x/sys/cpu"

// Features lists the CPU's SIMD features the kernels use or could, as
// /proc/cpuinfo names them: what a table of kernel figures needs beside
// it.
func Features() []string {
	var fs []string
	for _, f := range []struct {
		name string
		has  bool
	}{
		{"asimd", cpu.ARM64.HasASIMD}, {"fphp", cpu.ARM64.HasFPHP}, {"asimdhp", cpu.ARM64.HasASIMDHP},
		{"asimddp", cpu.ARM64.HasASIMDDP}, {"sve", cpu.ARM64.HasSVE}, {"sve2", cpu.ARM64.HasSVE2},
	} {
		if f.has {
			fs = append(fs, f.name)
		}
	}
	return fs
}
