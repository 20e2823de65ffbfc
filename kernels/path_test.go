package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// forEachPath runs f as a subtest on every path this CPU can run, the
// pure-Go reference included, and restores the active path afterwards.
func forEachPath(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	prev := Path()
	t.Cleanup(func() { SetPath(prev) })
	for _, name := range Paths() {
		t.Run(name, func(t *testing.T) {
			if err := SetPath(name); err != nil {
				t.Fatal(err)
			}
			f(t)
		})
	}
}

// simdPathNames lists the paths other than the pure-Go one.
func simdPathNames() []string {
	return slices.DeleteFunc(Paths(), func(s string) bool { return s == goPath.name })
}

func TestPathSelection(t *testing.T) {
	prev := Path()
	defer SetPath(prev)
	names := Paths()
	if names[len(names)-1] != "go" {
		t.Fatalf("Paths() = %v, want \"go\" last", names)
	}
	for _, name := range names {
		if err := SetPath(name); err != nil {
			t.Fatalf("SetPath(%q): %v", name, err)
		}
		if Path() != name {
			t.Fatalf("Path() = %q after SetPath(%q)", Path(), name)
		}
	}
	for _, bad := range []string{"sse9", "GO", "neon-ish"} {
		if err := SetPath(bad); err == nil {
			t.Errorf("SetPath(%q) succeeded", bad)
		}
	}
	if Path() != names[len(names)-1] {
		t.Fatalf("a failed SetPath changed the path to %q", Path())
	}
	t.Setenv(pathEnv, "")
	if err := SetPath(""); err != nil || Path() != names[0] {
		t.Fatalf("SetPath(\"\") = %v, path %q; want the fastest, %q", err, Path(), names[0])
	}
	t.Setenv(pathEnv, "go")
	if err := SetPath(""); err != nil || Path() != "go" {
		t.Fatalf("SetPath(\"\") with %s=go: %v, path %q", pathEnv, err, Path())
	}
	t.Setenv(pathEnv, "no-such-path")
	if err := SetPath(""); err == nil {
		t.Fatalf("SetPath(\"\") with %s=no-such-path succeeded", pathEnv)
	}
}

// Awkward shapes: tails of every kind, row counts that are not multiples
// of the kernels' 4-row groups or of the thread counts below.
var (
	cmpRows = []int{1, 3, 5, 64, 67}
	cmpCols = []int{1, 15, 16, 17, 31, 4095, 4097}
)

// Special bit patterns mixed into the inputs: ±0, subnormals, the largest
// finite values, ±Inf and NaNs (quiet and signalling).
var (
	specialF32 = []uint32{0, 0x80000000, 1, 0x80000001, 0x007fffff, 0x00800000, 0x7f7fffff, 0xff7fffff,
		0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x3f800000}
	specialBF16 = []uint16{0, 0x8000, 1, 0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81}
	specialF16  = []uint16{0, 0x8000, 1, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01}
)

// specialMatrix returns a rows x cols matrix of dt: N(0,1) values, except
// that rows with odd index get one element in 64 replaced by a special
// bit pattern (even rows stay finite so that their sums are compared as
// numbers, not as NaN).
func specialMatrix(rng *rand.Rand, dt DType, rows, cols int) Matrix {
	m := Matrix{DType: dt, Rows: rows, Cols: cols, Data: encode(dt, wideRangeVec(rng, rows*cols))}
	for r := 1; r < rows; r += 2 {
		for c := range cols {
			if rng.IntN(64) != 0 {
				continue
			}
			i := r*cols + c
			switch dt {
			case F32:
				putU32(m.Data[4*i:], specialF32[rng.IntN(len(specialF32))])
			case BF16:
				putU16(m.Data[2*i:], specialBF16[rng.IntN(len(specialBF16))])
			case F16:
				putU16(m.Data[2*i:], specialF16[rng.IntN(len(specialF16))])
			}
		}
	}
	return m
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
func putU16(b []byte, v uint16) { b[0], b[1] = byte(v), byte(v>>8) }

// specialVec returns n wide-range values; with specials, one in 32 is a
// special float32 (zeros, subnormals, huge, Inf, NaN).
func specialVec(rng *rand.Rand, n int, specials bool) []float32 {
	v := wideRangeVec(rng, n)
	if specials {
		for i := range v {
			if rng.IntN(32) == 0 {
				v[i] = math.Float32frombits(specialF32[rng.IntN(len(specialF32))])
			}
		}
	}
	return v
}

func sameSlices(a, b []float32) (int, bool) {
	for i := range a {
		if !sameBits(a[i], b[i]) {
			return i, false
		}
	}
	return -1, true
}

// againstGo runs f on the pure-Go path and on the named one and returns
// the first result where they differ (sameBits) and the two values there;
// -1 where none does.
func againstGo(t *testing.T, name string, f func() []float32) (i int, got, want float32) {
	t.Helper()
	var gots, wants []float32
	withPath(t, "go", func() { wants = f() })
	withPath(t, name, func() { gots = f() })
	if i, ok := sameSlices(gots, wants); !ok {
		return i, gots[i], wants[i]
	}
	return -1, 0, 0
}

// withPath runs f on the named path and restores the previous one.
func withPath(t *testing.T, name string, f func()) {
	t.Helper()
	prev := Path()
	if err := SetPath(name); err != nil {
		t.Fatal(err)
	}
	defer SetPath(prev)
	f()
}

// TestPathsMatchGoMatVec: every path's MatVec equals the pure-Go path's
// bit for bit, for every dtype, awkward shapes, special values, and
// thread counts that do not divide the rows.
func TestPathsMatchGoMatVec(t *testing.T) {
	defer SetThreads(SetThreads(0))
	for _, name := range simdPathNames() {
		rng := rand.New(rand.NewPCG(101, 102))
		for _, dt := range dtypes {
			for _, rows := range cmpRows {
				for _, cols := range cmpCols {
					for _, specials := range []bool{false, true} {
						var m Matrix
						if specials {
							m = specialMatrix(rng, dt, rows, cols)
						} else {
							m, _ = randMatrix(rng, dt, rows, cols)
						}
						x := specialVec(rng, cols, specials)
						for _, th := range []int{1, 3} {
							SetThreads(th)
							want, got := make([]float32, rows), make([]float32, rows)
							withPath(t, "go", func() { MatVec(want, m, x) })
							withPath(t, name, func() { MatVec(got, m, x) })
							if i, ok := sameSlices(got, want); !ok {
								t.Fatalf("%s %v %dx%d specials=%v threads=%d: row %d = %v (%#08x), go path %v (%#08x)",
									name, dt, rows, cols, specials, th, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
							}
						}
					}
				}
			}
		}
	}
}

// TestPathsMatchGoMatMul: MatMul on every path equals the pure-Go path
// (and so MatVec per vector), through the tiled micro-kernel (columns a
// multiple of 16, several tiles, leftover rows and vectors) and the
// by-vector fallback, with thread counts that split tiles unevenly.
func TestPathsMatchGoMatMul(t *testing.T) {
	defer SetThreads(SetThreads(0))
	shapes := []struct{ rows, cols int }{
		{1, 16}, {3, 17}, {5, 32}, {67, 1024}, {64, 4096}, {9, 16400}, {67, 31}, {5, 4097},
	}
	for _, name := range simdPathNames() {
		rng := rand.New(rand.NewPCG(103, 104))
		for _, dt := range dtypes {
			for _, s := range shapes {
				for _, n := range []int{1, 2, 3, 4, 5, 9} {
					specials := n%2 == 1
					var m Matrix
					if specials {
						m = specialMatrix(rng, dt, s.rows, s.cols)
					} else {
						m, _ = randMatrix(rng, dt, s.rows, s.cols)
					}
					x := specialVec(rng, n*s.cols, specials)
					for _, th := range []int{1, 3} {
						SetThreads(th)
						want, got := make([]float32, n*s.rows), make([]float32, n*s.rows)
						withPath(t, "go", func() { MatMul(want, m, x, n) })
						withPath(t, name, func() { MatMul(got, m, x, n) })
						if i, ok := sameSlices(got, want); !ok {
							t.Fatalf("%s %v %dx%d n=%d threads=%d: out[%d] (vector %d row %d) = %v, go path %v",
								name, dt, s.rows, s.cols, n, th, i, i/s.rows, i%s.rows, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

// TestPathsMatchGoVectorKernels: Dot, Sum, Axpy, Add and RMSNorm on every
// path equal the pure-Go path for every length up to 70 and a few long
// ones, with special values.
func TestPathsMatchGoVectorKernels(t *testing.T) {
	sizes := []int{}
	for n := range 71 {
		sizes = append(sizes, n)
	}
	sizes = append(sizes, 127, 128, 129, 1000, 4095, 4096, 4097)
	for _, name := range simdPathNames() {
		rng := rand.New(rand.NewPCG(105, 106))
		for _, n := range sizes {
			for _, specials := range []bool{false, true} {
				a, b := specialVec(rng, n, specials), specialVec(rng, n, specials)
				s := float32(rng.NormFloat64())
				check := func(what string, f func() []float32) {
					t.Helper()
					if i, got, want := againstGo(t, name, f); i >= 0 {
						t.Fatalf("%s %s n=%d specials=%v: [%d] = %v (%#08x), go path %v (%#08x)",
							name, what, n, specials, i, got, math.Float32bits(got), want, math.Float32bits(want))
					}
				}
				check("Dot", func() []float32 { return []float32{Dot(a, b), Dot(b, a), Dot(a, a)} })
				check("Sum", func() []float32 { return []float32{Sum(a), Sum(b)} })
				check("Axpy", func() []float32 {
					d := slices.Clone(a)
					Axpy(d, s, b)
					return d
				})
				check("Add", func() []float32 {
					d := slices.Clone(a)
					Add(d, b)
					return d
				})
				if n > 0 {
					check("RMSNorm", func() []float32 {
						out := make([]float32, n)
						RMSNorm(out, a, b, 1e-5)
						in := slices.Clone(a)
						RMSNorm(in, in, b, 1e-6) // in place
						return append(out, in...)
					})
					check("Softmax", func() []float32 {
						d := slices.Clone(a)
						Softmax(d)
						return d
					})
				}
			}
		}
	}
}

// TestPathsRefuseFusedMultiplyAdd: the classic FMA detector (see
// TestDotRoundsProductsBeforeAdding) in lane 0 of the first two 16-blocks
// of every row, so that the assembly's 4-row groups, its single rows and
// its MatMul micro-kernel compute it, not the Go tail; and in Axpy.
func TestPathsRefuseFusedMultiplyAdd(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		a := float32(1 + 1.0/(1<<12))
		neg := -(1 + float32(1.0/(1<<11)))
		for _, n := range []int{32, 64} {
			const rows, vecs = 5, 4
			w := make([]float32, rows*n)
			for r := range rows {
				w[r*n], w[r*n+16] = neg, a
			}
			x := make([]float32, vecs*n)
			for v := range vecs {
				x[v*n], x[v*n+16] = 1, a
			}
			m := Matrix{DType: F32, Rows: rows, Cols: n, Data: encode(F32, w)}
			out := make([]float32, vecs*rows)
			MatVec(out[:rows], m, x[:n])
			for r, v := range out[:rows] {
				if v != 0 {
					t.Fatalf("n=%d row %d: MatVec = %g, want exactly 0 (fused?)", n, r, v)
				}
			}
			MatMul(out, m, x, vecs)
			for i, v := range out {
				if v != 0 {
					t.Fatalf("n=%d: MatMul out[%d] = %g, want exactly 0 (fused?)", n, i, v)
				}
			}
			d := make([]float32, n)
			for i := range d {
				d[i] = neg
			}
			Axpy(d, a, slices.Repeat([]float32{a}, n))
			for i, v := range d {
				if v != 0 {
					t.Fatalf("n=%d: Axpy[%d] = %g, want exactly 0 (fused?)", n, i, v)
				}
			}
		}
	})
}

func ExamplePaths() {
	// Every CPU has the pure-Go reference path; it is listed last.
	p := Paths()
	fmt.Println(p[len(p)-1])
	// Output: go
}

// TestMatMulRouteSaysWhichWayMatMulTakes: every path names itself and the
// way its MatMul takes (matMulSIMD's switch): one vector, or columns not
// a multiple of 16, go through the row kernel; BF16 widens in registers
// for up to 16 vectors on AVX2 and 4 on AVX-512, a float32 tile beyond
// (and on NEON); and the
// features listed agree with the paths this CPU runs.
func TestMatMulRouteSaysWhichWayMatMulTakes(t *testing.T) {
	defer SetPath("")
	for _, name := range Paths() {
		if err := SetPath(name); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			dt      DType
			cols, n int
			want    string
		}{
			{BF16, 1024, 1, "row kernel once per vector"},
			{BF16, 1000, 8, "row kernel once per vector"},
			{BF16, 1024, 4, map[string]string{"avx2": "in registers", "avx512": "in registers", "neon": "float32 tile"}[name]},
			{BF16, 1024, 8, map[string]string{"avx2": "in registers", "avx512": "float32 tile", "neon": "float32 tile"}[name]},
			{F32, 1024, 64, "float32 tile"},
		} {
			got := MatMulRoute(c.dt, c.cols, c.n)
			if name == "go" {
				c.want = "go: "
			}
			if !strings.HasPrefix(got, name+": ") || !strings.Contains(got, c.want) {
				t.Errorf("path %s, %v %d columns, %d vectors: route %q, want %q", name, c.dt, c.cols, c.n, got, c.want)
			}
		}
	}
	feats := Features()
	for path, need := range map[string][]string{"avx512": {"avx512f", "avx2", "f16c"}, "avx2": {"avx2", "f16c"}, "neon": {"asimd"}} {
		if !slices.Contains(Paths(), path) {
			continue
		}
		for _, f := range need {
			if !slices.Contains(feats, f) {
				t.Errorf("path %s runs here, yet the features %v lack %s", path, feats, f)
			}
		}
	}
}

// TestPathsMatchGoExponentials: Softmax's exponentials (Exp(x - m)),
// SwiGLU's (SiLU(gate) * up) and ClampedSwiGLU's (its clamps' NaNs
// included) on every path equal the pure-Go path's bit
// for bit over a million float32 bit patterns spread over all 2^32 (NaNs
// of both signs and any payload, infinities, zeros, subnormals), around
// Exp's thresholds (88.8 above, -104 below) and where its results turn
// subnormal, at lengths that leave the Go tail a part.
func TestPathsMatchGoExponentials(t *testing.T) {
	var xs []float32
	for b := uint64(0); b < 1<<32; b += 4093 {
		xs = append(xs, math.Float32frombits(uint32(b)))
	}
	for _, edge := range []float32{88.8, -104, -87.33655, -103.27893, 0, 1} {
		for d := -64; d <= 64; d++ {
			xs = append(xs, math.Float32frombits(uint32(int32(math.Float32bits(edge))+int32(d))))
		}
	}
	xs = append(xs, 88.72284, 88.72283, -103.972084, -103.97209, float32(math.Inf(1)), float32(math.Inf(-1)))
	// ClampedSwiGLU's pairs with a NaN in the gate, the up or both, first
	// (where the assembly, not the Go tail, computes them): a NaN must come
	// out a NaN (sameBits holds NaNs alike, as the package's definition
	// does)
	var pairs []float32
	for _, pair := range [][2]uint32{{0x7f800123, 0xffc45600}, {0xffc45600, 0x7f800123}, {0x7fc00001, 0x40000000}, {0xc0000000, 0xff800001}} {
		pairs = append(pairs, math.Float32frombits(pair[0]), math.Float32frombits(pair[1]))
	}
	xs = append(pairs, xs...)
	rng := rand.New(rand.NewPCG(107, 108))
	up := specialVec(rng, len(xs), true)
	for _, name := range simdPathNames() {
		for _, n := range []int{len(xs) &^ 1, 1, 7, 9, 31, 34} {
			x := xs[:n]
			// check compares f's results on the two paths; result i is
			// computed from x[stride*i] (and the rest of its pair)
			check := func(what string, stride int, f func() []float32) {
				t.Helper()
				if i, got, want := againstGo(t, name, f); i >= 0 {
					in := x[stride*i]
					t.Fatalf("%s %s n=%d: x %v (%#08x): %v (%#08x), go path %v (%#08x)",
						name, what, n, in, math.Float32bits(in), got, math.Float32bits(got), want, math.Float32bits(want))
				}
			}
			for _, m := range []float32{0, 3.5, -80} {
				check(fmt.Sprintf("Exp(x - %v)", m), 1, func() []float32 {
					d := slices.Clone(x)
					cur().expShift(d, m)
					return d
				})
			}
			check("SwiGLU", 1, func() []float32 {
				d := make([]float32, n)
				cur().siluMul(d, x, up[:n])
				return d
			})
			check("SwiGLU in place", 1, func() []float32 {
				d := slices.Clone(x)
				cur().siluMul(d, d, up[:n])
				return d
			})
			if n%2 == 0 {
				// pairs of x (gate and up interleaved, NaNs in both)
				for _, la := range [][2]float32{{7, 1.702}, {1e-3, -3}, {88, 40}} {
					check(fmt.Sprintf("ClampedSwiGLU(limit %v, alpha %v)", la[0], la[1]), 2, func() []float32 {
						d := make([]float32, n/2)
						ClampedSwiGLU(d, x, la[0], la[1])
						return d
					})
					check("ClampedSwiGLU in place", 2, func() []float32 {
						d := slices.Clone(x)
						ClampedSwiGLU(d[:n/2], d, la[0], la[1])
						return d[:n/2]
					})
				}
			}
		}
	}
}
