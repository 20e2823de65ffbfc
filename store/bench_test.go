package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/odmoe/odmoe/model/synth"
)

// benchDirs returns the benchmark model (the preset named by
// ODMOE_BENCH_PRESET, default tiny; `make bench` uses small) and its
// store, each generated once under ODMOE_CACHE (default the user cache
// dir) at the same paths model/bench_test.go uses for the model. The
// store's path names the format version and K only: delete it after
// changing the encoder.
func benchDirs(b *testing.B) (modelDir, storeDir string) {
	b.Helper()
	preset := os.Getenv("ODMOE_BENCH_PRESET")
	if preset == "" {
		preset = "tiny"
	}
	cache, err := synth.CacheDir()
	if err != nil {
		b.Fatal(err)
	}
	if modelDir, err = synth.Cached(cache, preset, 1, nil); err != nil {
		b.Fatal(err)
	}
	storeDir = filepath.Join(cache, "stores", fmt.Sprintf("%s-seed1-k%d-v%d", preset, DefaultShards, Version))
	if _, err := os.Stat(filepath.Join(storeDir, IndexFile)); err != nil {
		os.MkdirAll(filepath.Dir(storeDir), 0o755)
		b.Logf("converting %s into %s (once)", modelDir, storeDir)
		err := Convert(context.Background(), modelDir, storeDir, ConvertOptions{})
		if err != nil && !errors.Is(err, ErrExist) {
			b.Fatal(err)
		}
	}
	return modelDir, storeDir
}

// reportCPU reports bytes per CPU-second of this process ("GB/cpu-s"): a
// core's decompression speed even when other processes share the cores.
func reportCPU(b *testing.B, cpu time.Duration, bytes int64) {
	if cpu > 0 {
		b.ReportMetric(float64(bytes)/cpu.Seconds()/1e9, "GB/cpu-s")
	}
}

// BenchmarkStoreReadExpert decompresses whole experts, rotating through
// every expert of the model (the small model's 1.4 GB of experts exceed
// the L3 cache), from the local store (pread from the page cache) into a
// reused buffer. GB/s is reconstructed bytes (BF16) per second of wall
// time, GB/cpu-s per second of CPU time used; ratio and bound are the store's size and its entropy bound as
// fractions of the original.
func BenchmarkStoreReadExpert(b *testing.B) {
	_, dir := benchDirs(b)
	for _, p := range []int{1, 2} {
		b.Run(fmt.Sprintf("goroutines=%d", p), func(b *testing.B) {
			st, err := Open(dir, Options{Parallelism: p})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			r := st.Report()
			n, _ := st.ExpertBytes(0, 0)
			buf := make([]byte, n)
			ctx := context.Background()
			experts := len(st.Layers()) * st.Experts()
			read := func(i int) {
				if _, err := st.ReadExpert(ctx, st.Layers()[i/st.Experts()%len(st.Layers())], i%st.Experts(), buf); err != nil {
					b.Fatal(err)
				}
			}
			for i := range experts { // warm the page cache
				read(i)
			}
			b.SetBytes(int64(n))
			i, cpu0 := 0, cpuTime()
			for b.Loop() {
				read(i)
				i++
			}
			b.ReportMetric(float64(n)*float64(i)/b.Elapsed().Seconds()/1e9, "GB/s")
			reportCPU(b, cpuTime()-cpu0, int64(n)*int64(i))
			b.ReportMetric(r.Total.Ratio(), "ratio")
			b.ReportMetric(r.Total.BoundRatio(), "bound")
		})
	}
}
