package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// quantBenchMatrices returns matrices of dt, rows x cols, totalling at
// least benchSetBytes of stored bytes: 64 rows of N(0, 0.02) weights with
// outliers, quantized once (F16, Q8, NF4) or rounded (BF16), copied
// row by row at a shift that differs per matrix.
func quantBenchMatrices(b *testing.B, dt DType, rows, cols int) []Matrix {
	const patternRows = 64
	src, w := quantSource(rand.New(rand.NewPCG(73, 74)), patternRows, cols)
	var pat Matrix
	if dt == BF16 {
		pat = Matrix{DType: BF16, Rows: patternRows, Cols: cols, Data: encode(BF16, w)}
	} else {
		pat = mustQuantize(b, dt, src)
	}
	rb := dt.RowBytes(cols)
	size := rows * rb
	ms := make([]Matrix, (benchSetBytes+size-1)/size)
	for k := range ms {
		data := make([]byte, size)
		for r := range rows {
			p := (r + 7*k) % patternRows
			copy(data[r*rb:(r+1)*rb], pat.Data[p*rb:(p+1)*rb])
		}
		ms[k] = Matrix{DType: dt, Rows: rows, Cols: cols, Data: data}
	}
	return ms
}

// BenchmarkMatVecQuant streams a Mixtral w2-shaped matrix (4096x14336) in
// the shadow node's dtypes and BF16, on 1 and 2 goroutines, rotating
// through >= 512 MiB of stored matrices. SetBytes (MB/s) and "GB/s" count
// the stored bytes; "eff-GB/s" counts the BF16 bytes of the same weights
// per second, i.e. how fast the weights are consumed next to BF16.
func BenchmarkMatVecQuant(b *testing.B) {
	const rows, cols = 4096, 14336
	defer SetThreads(SetThreads(0))
	for _, dt := range []DType{Q8, NF4, F16, BF16} {
		b.Run(dt.String(), func(b *testing.B) {
			var ms []Matrix
			next := 0
			for _, th := range []int{1, 2} {
				b.Run(fmt.Sprintf("threads=%d", th), func(b *testing.B) {
					if ms == nil {
						ms = quantBenchMatrices(b, dt, rows, cols)
					}
					SetThreads(th)
					x := randVec(rand.New(rand.NewPCG(1, 1)), cols)
					out := make([]float32, rows)
					stored := int64(len(ms[0].Data))
					b.SetBytes(stored)
					b.ResetTimer()
					for range b.N {
						MatVec(out, ms[next%len(ms)], x)
						next++
					}
					secs := b.Elapsed().Seconds()
					b.ReportMetric(float64(stored)*float64(b.N)/secs/1e9, "GB/s")
					b.ReportMetric(float64(rows*cols*2)*float64(b.N)/secs/1e9, "eff-GB/s")
				})
			}
		})
	}
}

// BenchmarkMatMulQuant applies a 4096x14336 matrix of each dtype to a
// mini-batch of 16 vectors (the shadow's prefill): each tile is
// dequantized to float32 once for all vectors.
func BenchmarkMatMulQuant(b *testing.B) {
	const rows, cols, n = 4096, 14336, 16
	for _, dt := range []DType{Q8, NF4, BF16} {
		b.Run(dt.String(), func(b *testing.B) {
			src, w := quantSource(rand.New(rand.NewPCG(75, 76)), rows, cols)
			m := Matrix{DType: BF16, Rows: rows, Cols: cols, Data: encode(BF16, w)}
			if dt != BF16 {
				m = mustQuantize(b, dt, src)
			}
			x := randVec(rand.New(rand.NewPCG(1, 1)), n*cols)
			out := make([]float32, n*rows)
			b.ResetTimer()
			for range b.N {
				MatMul(out, m, x, n)
			}
			b.ReportMetric(float64(2*rows*cols*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkMatVecNative streams the native formats at their models'
// shapes against BF16 at the same shapes: MXFP4 at gpt-oss's gate_up
// (5760 x 2880, one row per output), F8E4M3 at DeepSeek-V3's expert
// gate (2048 x 7168), on 1 and 2 goroutines, rotating through >= 512 MiB
// of stored matrices. "GB/s" counts the stored bytes (codes and scales);
// "eff-GB/s" the BF16 bytes of the same weights, i.e. how fast the
// weights are consumed next to BF16.
func BenchmarkMatVecNative(b *testing.B) {
	defer SetThreads(SetThreads(0))
	for _, c := range []struct {
		dt         DType
		rows, cols int
		model      string
	}{{MXFP4, 5760, 2880, "gpt-oss"}, {BF16, 5760, 2880, "gpt-oss"}, {F8E4M3, 2048, 7168, "deepseek"}, {BF16, 2048, 7168, "deepseek"}} {
		b.Run(c.model+"/"+c.dt.String(), func(b *testing.B) {
			var ms []Matrix
			next := 0
			for _, th := range []int{1, 2} {
				b.Run(fmt.Sprintf("threads=%d", th), func(b *testing.B) {
					rng := rand.New(rand.NewPCG(77, 78))
					for len(ms) == 0 || len(ms)*ms[0].Bytes() < benchSetBytes {
						switch c.dt {
						case MXFP4:
							ms = append(ms, randMXFP4(rng, c.rows, c.cols, false))
						case F8E4M3:
							ms = append(ms, randF8(rng, c.rows, c.cols))
						default:
							m, _ := randMatrix(rng, BF16, c.rows, c.cols)
							ms = append(ms, m)
						}
					}
					SetThreads(th)
					x := randVec(rand.New(rand.NewPCG(1, 1)), c.cols)
					out := make([]float32, c.rows)
					stored := int64(ms[0].Bytes())
					b.SetBytes(stored)
					b.ResetTimer()
					for range b.N {
						MatVec(out, ms[next%len(ms)], x)
						next++
					}
					secs := b.Elapsed().Seconds()
					b.ReportMetric(float64(stored)*float64(b.N)/secs/1e9, "GB/s")
					b.ReportMetric(float64(c.rows*c.cols*2)*float64(b.N)/secs/1e9, "eff-GB/s")
				})
			}
		})
	}
}

// BenchmarkQuantize is the shadow's start: a 768x2048 BF16 matrix (one
// of the small preset's expert tensors) quantized to Q8 and to NF4 on
// every core, bytes of BF16 in a second.
func BenchmarkQuantize(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	const rows, cols = 768, 2048
	src := Matrix{DType: BF16, Rows: rows, Cols: cols, Data: make([]byte, 2*rows*cols)}
	for i := range rows * cols {
		binary.LittleEndian.PutUint16(src.Data[2*i:], uint16(math.Float32bits(float32(rng.NormFloat64()*0.02))>>16))
	}
	for _, dt := range []DType{Q8, NF4} {
		b.Run(dt.String(), func(b *testing.B) {
			dst := make([]byte, rows*dt.RowBytes(cols))
			b.SetBytes(int64(len(src.Data)))
			for b.Loop() {
				if _, err := QuantizeInto(dst, dt, src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
