package store

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
)

// BenchmarkCoders measures the candidate exponent coders on one goroutine
// (the table in FORMAT.md comes from here; not part of `make bench`):
//
//	ODMOE_BENCH_PRESET=small go test -run '^$' -bench Coders -benchtime 5x ./store/
//
// Data sets: "model", the bench model's first 32 Mi expert weights (N(0,
// 0.02) as synth draws them), and "heavy", 16 Mi heavy-tailed weights
// (Student-t, 5 degrees of freedom, per-row scale lognormal) standing in
// for trained weights' outliers. Metrics: ratio (exponent coded + sign-
// mantissa raw, over BF16), bound (the same with exponents at their
// entropy), enc-MB/s (exponent bytes encoded per second), and MB/s of
// reconstructed BF16 (decode + merge).
func BenchmarkCoders(b *testing.B) {
	sets := []struct {
		name string
		raw  []byte
	}{{"model", benchWeights(b, 32<<20)}, {"heavy", heavyTailed(16 << 20)}}
	for _, set := range sets {
		raw := set.raw
		n := len(raw) / 2
		exp, sm := make([]byte, n), make([]byte, n)
		split(kernels.BF16, exp, sm, raw)
		var hist [256]uint64
		for _, e := range exp {
			hist[e]++
		}
		bound := (float64(n)*entropy(&hist)/8 + float64(n)) / float64(len(raw))
		coders := []coderCase{
			zstdCase("zstd-unsplit-default", zstd.SpeedDefault, true),
			zstdCase("zstd-fastest", zstd.SpeedFastest, false),
			zstdCase("zstd-default", zstd.SpeedDefault, false),
			zstdCase("zstd-better", zstd.SpeedBetterCompression, false),
			zstdCase("zstd-best", zstd.SpeedBestCompression, false),
			huff0Case(16<<10, 11), huff0Case(64<<10, 11), huff0Case(255<<10, 11),
			huff0Case(16<<10, 8), huff0Case(64<<10, 8), huff0Case(128<<10, 8), huff0Case(255<<10, 8),
		}
		for _, c := range coders {
			b.Run(set.name+"/"+c.name, func(b *testing.B) {
				t0 := time.Now()
				stored, decode := c.prepare(b, raw, exp, sm)
				enc := time.Since(t0)
				out := make([]byte, len(raw))
				decode(out) // warm
				if string(out) != string(raw) {
					b.Fatal("round trip differs")
				}
				b.SetBytes(int64(len(raw)))
				cpu0, ops := cpuTime(), 0
				for b.Loop() {
					decode(out)
					ops++
				}
				reportCPU(b, cpuTime()-cpu0, int64(ops)*int64(len(raw)))
				b.ReportMetric(float64(stored)/float64(len(raw)), "ratio")
				b.ReportMetric(bound, "bound")
				b.ReportMetric(float64(n)/enc.Seconds()/1e6, "enc-MB/s")
			})
		}
	}
}

// coderCase encodes once (prepare) and returns the stored size and a
// decoder into out.
type coderCase struct {
	name    string
	prepare func(b *testing.B, raw, exp, sm []byte) (stored int, decode func(out []byte))
}

// zstd in frames of 512 KiB exponents (a shard of the small model's
// tensors at K=8), or on the unsplit BF16 bytes.
func zstdCase(name string, level zstd.EncoderLevel, unsplit bool) coderCase {
	return coderCase{name, func(b *testing.B, raw, exp, sm []byte) (int, func([]byte)) {
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(false))
		if err != nil {
			b.Fatal(err)
		}
		dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
		if err != nil {
			b.Fatal(err)
		}
		const frame = 512 << 10
		src, stored := exp, len(sm)
		if unsplit {
			src, stored = raw, 0
		}
		var frames [][]byte
		for lo := 0; lo < len(src); lo += frame {
			f := enc.EncodeAll(src[lo:min(lo+frame, len(src))], nil)
			frames = append(frames, f)
			stored += len(f)
		}
		buf := make([]byte, frame)
		return stored, func(out []byte) {
			lo := 0
			for _, f := range frames {
				d, err := dec.DecodeAll(f, buf[:0])
				if err != nil {
					b.Fatal(err)
				}
				if unsplit {
					copy(out[lo:], d)
				} else {
					merge(kernels.BF16, out[2*lo:2*(lo+len(d))], d, sm[lo:lo+len(d)])
				}
				lo += len(d)
			}
		}
	}}
}

// huff0 through the store's own encoder and decoder (4X streams, a table
// per block), code lengths capped at tableLog bits (11: huff0's own
// choice; 8: the store's).
func huff0Case(block int, tableLog uint8) coderCase {
	name := fmt.Sprintf("huff0-%dK-tablelog%d", block>>10, tableLog)
	return coderCase{name, func(b *testing.B, raw, exp, sm []byte) (int, func([]byte)) {
		enc := encoder{tableLog: tableLog}
		const shard = 512 << 10
		var chunks [][]byte
		stored := len(sm)
		for lo := 0; lo < len(exp); lo += shard {
			var c []byte
			for blo := lo; blo < min(lo+shard, len(exp)); blo += block {
				var err error
				if c, err = enc.appendBlock(c, exp[blo:min(blo+block, lo+shard, len(exp))]); err != nil {
					b.Fatal(err)
				}
			}
			chunks = append(chunks, c)
			stored += len(c)
		}
		var dec decoder
		return stored, func(out []byte) {
			for i, c := range chunks {
				lo := i * shard
				n := min(shard, len(exp)-lo)
				o := out[2*lo : 2*(lo+n)]
				copy(o[n:], sm[lo:lo+n])
				if err := dec.decodeShard(kernels.BF16, c, o, n, block); err != nil {
					b.Fatal(err)
				}
			}
		}
	}}
}

// benchWeights returns the first n expert weights (BF16 bytes) of the
// bench model.
func benchWeights(b *testing.B, n int) []byte {
	dir, _ := benchDirs(b)
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	out := make([]byte, 0, 2*n)
	for _, l := range m.Layers {
		for _, e := range l.MoE.Experts {
			for _, t := range []kernels.Matrix{e.Gate, e.Up, e.Down} {
				out = append(out, t.Data[:min(len(t.Data), 2*n-len(out))]...)
				if len(out) == 2*n {
					return out
				}
			}
		}
	}
	fmt.Fprintf(os.Stderr, "bench model has only %d expert weights\n", len(out)/2)
	return out
}

// heavyTailed draws n BF16 weights: Student-t (5 degrees of freedom),
// times a per-row (4096 elements) scale of 0.01*exp(0.5*N(0,1)).
func heavyTailed(n int) []byte {
	rng := rand.New(rand.NewPCG(42, 43))
	out := make([]byte, 2*n)
	scale := 0.0
	for i := range n {
		if i%4096 == 0 {
			scale = 0.01 * math.Exp(0.5*rng.NormFloat64())
		}
		var chi2 float64
		for range 5 {
			z := rng.NormFloat64()
			chi2 += z * z
		}
		v := kernels.F32ToBF16(float32(scale * rng.NormFloat64() / math.Sqrt(chi2/5)))
		out[2*i], out[2*i+1] = byte(v), byte(v>>8)
	}
	return out
}
