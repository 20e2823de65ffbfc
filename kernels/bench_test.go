package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// benchSetBytes is the least total weight bytes a benchmark rotates
// through: more than any cache (this machine reports a 260 MiB L3), so
// GB/s measures DRAM streaming, as decoding does.
const benchSetBytes = 512 << 20

// benchMatrices returns enough matrices of dt and rows x cols to total at
// least benchSetBytes. The data is random N(0, 0.02) weights, cheap to
// make: one random block repeated at shifting offsets.
func benchMatrices(dt DType, rows, cols int) []Matrix {
	if dt == BF16P {
		ms := benchMatrices(BF16, rows, cols)
		for i, m := range ms {
			ms[i], _, _ = PackBF16(m, nil)
		}
		return ms
	}
	size := rows * cols * dt.Size()
	count := (benchSetBytes + size - 1) / size
	rng := rand.New(rand.NewPCG(71, 72))
	block := make([]float32, 1<<16)
	for i := range block {
		block[i] = float32(rng.NormFloat64() * 0.02)
	}
	pattern := encode(dt, block)
	ms := make([]Matrix, count)
	for k := range ms {
		shift := (k * 4096) % len(pattern)
		rotated := append(append([]byte(nil), pattern[shift:]...), pattern[:shift]...)
		data := make([]byte, size)
		for off := 0; off < size; off += len(rotated) {
			copy(data[off:], rotated)
		}
		ms[k] = Matrix{DType: dt, Rows: rows, Cols: cols, Data: data}
	}
	return ms
}

// BenchmarkMatVec streams Mixtral expert-sized matrices (w1/w3 are
// 14336x4096, w2 4096x14336) with Threads() goroutines; SetBytes counts
// weight bytes as stored, so MB/s (and the GB/s metric) is weight
// bandwidth, and Gweight/s compares dtypes (BF16P reads 0.81 of BF16's
// bytes for the same weights).
func BenchmarkMatVec(b *testing.B) {
	for _, dt := range []DType{BF16, BF16P, F16, F32} {
		b.Run(dt.String(), func(b *testing.B) {
			var ms []Matrix // shared by both shapes: same byte size
			next := 0       // rotation continues across runs: no matrix is reused while cached
			for _, s := range []struct{ rows, cols int }{{4096, 14336}, {14336, 4096}} {
				b.Run(fmt.Sprintf("%dx%d", s.rows, s.cols), func(b *testing.B) {
					if ms == nil {
						ms = benchMatrices(dt, s.rows, s.cols)
					}
					x := randVec(rand.New(rand.NewPCG(1, 1)), s.cols)
					out := make([]float32, s.rows)
					bytes := int64(s.rows * dt.RowBytes(s.cols))
					b.SetBytes(bytes)
					b.ResetTimer()
					for range b.N {
						m := ms[next%len(ms)]
						next++
						m.Rows, m.Cols = s.rows, s.cols
						MatVec(out, m, x)
					}
					b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
					b.ReportMetric(float64(s.rows*s.cols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gweight/s")
				})
			}
		})
	}
}

// BenchmarkMatMul applies one 14336x4096 BF16 matrix to a batch of
// vectors (a batched decode pass's 2 to 16 rows, prefill); SetBytes
// counts the weight bytes once per call.
func BenchmarkMatMul(b *testing.B) {
	for _, dt := range []DType{BF16, BF16P} {
		benchMatMul(b, dt)
	}
}

func benchMatMul(b *testing.B, dt DType) {
	ms := benchMatrices(dt, 14336, 4096)
	next := 0
	for _, n := range []int{2, 3, 4, 8, 16, 128} {
		b.Run(fmt.Sprintf("%v/n=%d", dt, n), func(b *testing.B) {
			x := randVec(rand.New(rand.NewPCG(1, 1)), n*4096)
			out := make([]float32, n*14336)
			b.SetBytes(int64(len(ms[0].Data)))
			for range b.N {
				MatMul(out, ms[next%len(ms)], x, n)
				next++
			}
			b.ReportMetric(float64(2*14336*4096*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkClampedSwiGLU is gpt-oss's activation over its 2880-wide
// expert (interleaved gate and up pairs), in place as Expert.Forward runs
// it.
func BenchmarkClampedSwiGLU(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	gu := randVec(rng, 2*2880)
	work := make([]float32, len(gu))
	b.SetBytes(int64(4 * len(gu)))
	for b.Loop() {
		copy(work, gu)
		ClampedSwiGLU(work[:2880], work, 7, 1.702)
	}
}

func BenchmarkSwiGLU(b *testing.B) {
	rng := rand.New(rand.NewPCG(2, 2))
	gate, up := randVec(rng, 14336), randVec(rng, 14336)
	out := make([]float32, 14336)
	b.SetBytes(14336 * 4)
	for range b.N {
		SwiGLU(out, gate, up)
	}
}

// BenchmarkMatVecDecodeShapes times one product of each of the small
// preset's decode shapes, cache-resident: what a parallel region costs
// beside the work (go test -bench DecodeShapes -cpu 1,2).
func BenchmarkMatVecDecodeShapes(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range []struct{ rows, cols int }{{256, 1024}, {1024, 1024}, {3584, 1024}, {1024, 3584}} {
		for _, dt := range []DType{BF16, BF16P} {
			b.Run(fmt.Sprintf("%v_%dx%d", dt, s.rows, s.cols), func(b *testing.B) {
				m, _ := randMatrix(rng, BF16, s.rows, s.cols)
				if dt == BF16P {
					m, _, _ = PackBF16(m, nil)
				}
				x := randVec(rng, s.cols)
				out := make([]float32, s.rows)
				b.SetBytes(int64(len(m.Data)))
				for b.Loop() {
					MatVec(out, m, x)
				}
				b.ReportMetric(float64(s.rows*s.cols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gweight/s")
			})
		}
	}
}

// BenchmarkMatVecSmallStreamed streams the small preset's decode shapes
// (an expert's 3584x1024 and 1024x3584, attention's 1024x1024) from DRAM,
// as local decode on small does: weight GB/s at -cpu 1,2.
// BF16P's GB/s are of its own bytes; Gweight/s compares the two.
func BenchmarkMatVecSmallStreamed(b *testing.B) {
	for _, s := range []struct{ rows, cols int }{{3584, 1024}, {1024, 3584}, {1024, 1024}} {
		for _, dt := range []DType{BF16, BF16P} {
			b.Run(fmt.Sprintf("%v_%dx%d", dt, s.rows, s.cols), func(b *testing.B) {
				ms := benchMatrices(dt, s.rows, s.cols)
				x := randVec(rand.New(rand.NewPCG(1, 1)), s.cols)
				out := make([]float32, s.rows)
				bytes := int64(s.rows * dt.RowBytes(s.cols))
				b.SetBytes(bytes)
				next := 0
				b.ResetTimer()
				for range b.N {
					MatVec(out, ms[next%len(ms)], x)
					next++
				}
				b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				b.ReportMetric(float64(s.rows*s.cols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gweight/s")
			})
		}
	}
}

// BenchmarkMatVecWake times one BF16 product of 64K to 1M elements
// directly (ns/product) and after a 200 us pause, where the team's members
// have parked (minWakeElems).
func BenchmarkMatVecWake(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, rows := range []int{256, 512, 1024, 2048, 4096} {
		m, _ := randMatrix(rng, BF16, rows, 256)
		x := make([]float32, 256)
		out := make([]float32, rows)
		for _, pause := range []bool{false, true} {
			b.Run(fmt.Sprintf("elems=%dK/pause=%v", rows/4, pause), func(b *testing.B) {
				var busy time.Duration
				for range b.N {
					if pause {
						time.Sleep(200 * time.Microsecond)
					}
					t0 := time.Now()
					MatVec(out, m, x)
					busy += time.Since(t0)
				}
				b.ReportMetric(float64(busy.Nanoseconds())/float64(b.N), "ns/product")
			})
		}
	}
}

// BenchmarkPackedAgainstBF16 streams the small preset's decode shapes
// from DRAM as BF16 and as BF16P in alternating rounds of 64 products and
// reports the median of the rounds' time ratios (BF16 over BF16P: above 1,
// packed is faster): one figure robust to a shared machine's drift.
func BenchmarkPackedAgainstBF16(b *testing.B) {
	for _, s := range []struct{ rows, cols int }{{3584, 1024}, {1024, 3584}, {1024, 1024}} {
		b.Run(fmt.Sprintf("%dx%d", s.rows, s.cols), func(b *testing.B) {
			packedAgainstBF16(b, benchMatrices(BF16, s.rows, s.cols), benchMatrices(BF16P, s.rows, s.cols), 1)
		})
	}
}

// BenchmarkPackedAgainstBF16MatMul is BenchmarkPackedAgainstBF16 for
// MatMul of 2 to 128 vectors (batched decode, prefill) on small's expert
// shape.
func BenchmarkPackedAgainstBF16MatMul(b *testing.B) {
	const rows, cols = 3584, 1024
	plain, packed := benchMatrices(BF16, rows, cols), benchMatrices(BF16P, rows, cols)
	for _, n := range []int{2, 3, 4, 16, 128} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { packedAgainstBF16(b, plain, packed, n) })
	}
}

// packedAgainstBF16 times MatMul of n vectors (MatVec for one) over
// rotating BF16 and BF16P matrices of one shape in alternating rounds of
// 64 products' worth and reports the rounds' median time ratio.
func packedAgainstBF16(b *testing.B, plain, packed []Matrix, n int) {
	rows, cols := plain[0].Rows, plain[0].Cols
	x := randVec(rand.New(rand.NewPCG(1, 1)), n*cols)
	out := make([]float32, n*rows)
	per := max(1, 64/n)
	round := func(ms []Matrix, next int) time.Duration {
		t0 := time.Now()
		for i := range per {
			MatMul(out, ms[(next+i)%len(ms)], x, n)
		}
		return time.Since(t0)
	}
	var ratios []float64
	b.ResetTimer()
	for i := range b.N {
		tp := round(plain, per*i)
		tq := round(packed, per*i)
		ratios = append(ratios, float64(tp)/float64(tq))
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "bf16/packed")
}

// BenchmarkPackBF16 packs a 14336x4096 BF16 matrix: what packing costs a
// load, in MB/s of BF16.
func BenchmarkPackBF16(b *testing.B) {
	m := benchMatrices(BF16, 14336, 4096)[0]
	b.SetBytes(int64(len(m.Data)))
	for b.Loop() {
		if _, ok, _ := PackBF16(m, nil); !ok {
			b.Fatal("not packed")
		}
	}
}
