package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestAttendIsTheLoopOfDotSoftmaxAxpy(t *testing.T) { forEachPath(t, testAttendIsTheLoop) }

// testAttendIsTheLoop: Attend gives the bits of the per-position calls
// it replaces, computed on the pure-Go path (the definition), for head
// widths a multiple of 16 and not, one position to hundreds, KV rows
// wider than a head (grouped-query caches) at every head's offset; and
// its output stays within float64 reference bounds.
func testAttendIsTheLoop(t *testing.T) {
	rng := rand.New(rand.NewPCG(81, 82))
	for _, c := range []struct{ hd, kvHeads, n int }{{64, 4, 1}, {64, 4, 300}, {128, 8, 37}, {16, 1, 5}, {48, 2, 64}, {40, 3, 17}, {20, 2, 9}, {64, 1, 1000}} {
		stride := c.hd * c.kvHeads
		keys, values := wideRangeVec(rng, c.n*stride), randVec(rng, c.n*stride)
		for i := range keys { // scores of a few units: softmax far from one-hot
			keys[i] = float32(math.Mod(float64(keys[i]), 1))
		}
		q := randVec(rng, c.hd)
		scale := float32(1 / math.Sqrt(float64(c.hd)))
		for head := range c.kvHeads {
			off := head * c.hd
			got, scores := make([]float32, c.hd), make([]float32, c.n)
			Attend(got, scores, q, keys, values, stride, off, scale)

			want, ref := make([]float32, c.hd), make([]float32, c.n)
			func() { // the definition: the calls one position at a time, on "go"
				prev := Path()
				defer SetPath(prev)
				if err := SetPath("go"); err != nil {
					t.Fatal(err)
				}
				for j := range ref {
					ref[j] = float32(Dot(q, keys[off+j*stride:off+j*stride+c.hd]) * scale)
				}
				Softmax(ref)
				for j, p := range ref {
					Axpy(want, p, values[off+j*stride:off+j*stride+c.hd])
				}
			}()
			for j := range ref {
				if !sameBits(scores[j], ref[j]) {
					t.Fatalf("hd %d, %d positions, head %d: probability %d = %v, definition %v", c.hd, c.n, head, j, scores[j], ref[j])
				}
			}
			for i := range want {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("hd %d, %d positions, head %d: out[%d] = %v, definition %v", c.hd, c.n, head, i, got[i], want[i])
				}
				var ref64, bound float64 // the weighted sum in float64
				for j, p := range scores {
					v := float64(p) * float64(values[off+j*stride+i])
					ref64 += v
					bound += math.Abs(v)
				}
				if math.Abs(float64(got[i])-ref64) > float64(c.n+2)*0x1p-24*bound+1e-30 {
					t.Fatalf("hd %d, %d positions: out[%d] = %v, float64 %v", c.hd, c.n, i, got[i], ref64)
				}
			}
		}
	}
}

// TestAttendRefusesRowsPastTheCache: a position whose row runs past keys
// or values is refused, not read.
func TestAttendRefusesRowsPastTheCache(t *testing.T) {
	keys, values := make([]float32, 4*64), make([]float32, 4*64)
	q, out := make([]float32, 32), make([]float32, 32)
	for _, c := range []struct{ n, off int }{{5, 0}, {4, 33}, {2, -1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%d positions at offset %d of a 4-position cache: no panic", c.n, c.off)
				}
			}()
			Attend(out, make([]float32, c.n), q, keys, values, 64, c.off, 1)
		}()
	}
}

// BenchmarkAttend times one head's attention over 256 cached positions of
// small's shape (64-wide heads, 4 KV heads), as the per-position calls
// did it and as Attend does.
func BenchmarkAttend(b *testing.B) {
	const hd, kvHeads, n = 64, 4, 256
	rng := rand.New(rand.NewPCG(1, 2))
	stride := hd * kvHeads
	keys, values, q := randVec(rng, n*stride), randVec(rng, n*stride), randVec(rng, hd)
	out, scores := make([]float32, hd), make([]float32, n)
	b.Run("per-position", func(b *testing.B) {
		for range b.N {
			for j := range scores {
				scores[j] = float32(Dot(q, keys[j*stride:j*stride+hd]) * 0.125)
			}
			Softmax(scores)
			clear(out)
			for j, p := range scores {
				Axpy(out, p, values[j*stride:j*stride+hd])
			}
		}
	})
	b.Run("Attend", func(b *testing.B) {
		for range b.N {
			Attend(out, scores, q, keys, values, stride, 0, 0.125)
		}
	})
}

func TestAttendSinkTakesItsShareOnEveryPath(t *testing.T) { forEachPath(t, testAttendSink) }

// testAttendSink: AttendSink's weights are the float64 softmax of the
// scores and the sink with the sink's share dropped (within float32
// rounding), and its output their mix of the values; with a sink of -Inf
// it gives Attend's bits; a sink far above the scores takes nearly all
// the weight.
func testAttendSink(t *testing.T) {
	rng := rand.New(rand.NewPCG(83, 84))
	for _, c := range []struct {
		hd, n int
		sink  float32
	}{{64, 1, 0.5}, {64, 37, -1}, {48, 200, 2}, {20, 9, 0}, {64, 64, 30}} {
		keys, values, q := randVec(rng, c.n*c.hd), randVec(rng, c.n*c.hd), randVec(rng, c.hd)
		scale := float32(1 / math.Sqrt(float64(c.hd)))
		got, scores := make([]float32, c.hd), make([]float32, c.n)
		AttendSink(got, scores, q, keys, values, c.hd, 0, scale, c.sink)
		// float64: softmax over [scores, sink], the sink's share dropped
		raw := make([]float64, c.n)
		m := float64(c.sink)
		for j := range raw {
			for i := range c.hd {
				raw[j] += float64(q[i]) * float64(keys[j*c.hd+i])
			}
			raw[j] *= float64(scale)
			m = math.Max(m, raw[j])
		}
		sum := math.Exp(float64(c.sink) - m)
		for _, r := range raw {
			sum += math.Exp(r - m)
		}
		var mass float64
		for j, r := range raw {
			p := math.Exp(r-m) / sum
			mass += p
			if math.Abs(float64(scores[j])-p) > 1e-6*math.Max(p, 1e-6) {
				t.Fatalf("hd %d, %d positions, sink %v: weight %d = %v, float64 %v", c.hd, c.n, c.sink, j, scores[j], p)
			}
		}
		for i := range got {
			var want, bound float64
			for j := range raw {
				v := float64(scores[j]) * float64(values[j*c.hd+i])
				want += v
				bound += math.Abs(v)
			}
			if math.Abs(float64(got[i])-want) > float64(c.n+2)*0x1p-24*bound+1e-30 {
				t.Fatalf("hd %d, %d positions: out[%d] = %v, float64 %v", c.hd, c.n, i, got[i], want)
			}
		}
		if c.sink >= 30 && mass > 1e-6 {
			t.Fatalf("a sink of %v left the positions %v of the weight", c.sink, mass)
		}
		plain, psc := make([]float32, c.hd), make([]float32, c.n)
		Attend(plain, psc, q, keys, values, c.hd, 0, scale)
		noSink, nsc := make([]float32, c.hd), make([]float32, c.n)
		AttendSink(noSink, nsc, q, keys, values, c.hd, 0, scale, float32(math.Inf(-1)))
		for i := range plain {
			if !sameBits(plain[i], noSink[i]) {
				t.Fatalf("a sink of -Inf: out[%d] = %v, Attend's %v", i, noSink[i], plain[i])
			}
		}
	}
}
