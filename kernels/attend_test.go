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
