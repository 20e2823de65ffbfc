package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

var (
	matRows = []int{1, 3, 64}
	matCols = []int{1, 15, 16, 17, 100, 1000}
)

// TestMatVecEqualsLaneDefinition: every row of MatVec, for every dtype, is
// the Dot definition applied to the exactly widened weights.
func TestMatVecEqualsLaneDefinition(t *testing.T) { forEachPath(t, testMatVecEqualsLaneDefinition) }

func testMatVecEqualsLaneDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range dtypes {
		for _, rows := range matRows {
			for _, cols := range matCols {
				m, wide := randMatrix(rng, dt, rows, cols)
				x := wideRangeVec(rng, cols)
				out := make([]float32, rows)
				MatVec(out, m, x)
				for r := range out {
					if want := specDot(wide[r*cols:(r+1)*cols], x); !sameBits(out[r], want) {
						t.Fatalf("%v %dx%d row %d: MatVec = %v, definition = %v", dt, rows, cols, r, out[r], want)
					}
				}
			}
		}
	}
}

func TestMatVecWithinFloat64ErrorBound(t *testing.T) {
	forEachPath(t, testMatVecWithinFloat64ErrorBound)
}

func testMatVecWithinFloat64ErrorBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, dt := range dtypes {
		for _, rows := range matRows {
			for _, cols := range matCols {
				m, wide := randMatrix(rng, dt, rows, cols)
				x := randVec(rng, cols)
				out := make([]float32, rows)
				MatVec(out, m, x)
				for r := range out {
					ref, absSum := refDot(wide[r*cols:(r+1)*cols], x)
					if err, bound := math.Abs(float64(out[r])-ref), dotErrBound(cols, absSum); err > bound {
						t.Fatalf("%v %dx%d row %d: |MatVec - exact| = %g > bound %g", dt, rows, cols, r, err, bound)
					}
				}
			}
		}
	}
}

// Shapes big enough to be split over goroutines (>= minParallelElems),
// fewer rows than goroutines, and several MatMul row blocks.
var parallelShapes = []struct{ rows, cols int }{
	{300, 1000}, {3, 30000}, {1, 70000}, {64, 1000}, {17, 33}, {129, 4097}, {71, 2048},
}

func TestMatVecIsIndependentOfThreads(t *testing.T) { forEachPath(t, testMatVecIsIndependentOfThreads) }

func testMatVecIsIndependentOfThreads(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	defer SetThreads(SetThreads(0))
	for _, dt := range dtypes {
		for _, s := range parallelShapes {
			m, _ := randMatrix(rng, dt, s.rows, s.cols)
			x := wideRangeVec(rng, s.cols)
			var first []float32
			for _, th := range []int{1, 2, 7} {
				SetThreads(th)
				out := make([]float32, s.rows)
				MatVec(out, m, x)
				if first == nil {
					first = out
					continue
				}
				for r := range out {
					if !sameBits(out[r], first[r]) {
						t.Fatalf("%v %dx%d: row %d with %d threads = %v, with 1 thread = %v", dt, s.rows, s.cols, r, th, out[r], first[r])
					}
				}
			}
		}
	}
}

// TestMatMulEqualsMatVecPerVector: each MatMul output element is the MatVec
// of its vector, bit for bit, for any thread count.
func TestMatMulEqualsMatVecPerVector(t *testing.T) { forEachPath(t, testMatMulEqualsMatVecPerVector) }

func testMatMulEqualsMatVecPerVector(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	defer SetThreads(SetThreads(0))
	for _, dt := range dtypes {
		for _, s := range parallelShapes {
			m, _ := randMatrix(rng, dt, s.rows, s.cols)
			// BF16 on AVX2: up to mmDirectVectors (16) direct, 4 at a
			// time, then the 1 left over through the row kernels or the
			// 2 or 3 at once (5, 6, 7); 17 a widened tile; on AVX-512
			// up to 4 direct (2, 3, 4), then a tile
			for _, n := range []int{1, 2, 3, 4, 5, 6, 7, 17} {
				x := wideRangeVec(rng, n*s.cols)
				want := make([]float32, n*s.rows)
				SetThreads(1)
				for i := range n {
					MatVec(want[i*s.rows:(i+1)*s.rows], m, x[i*s.cols:(i+1)*s.cols])
				}
				for _, th := range []int{1, 2, 7} {
					SetThreads(th)
					out := make([]float32, n*s.rows)
					MatMul(out, m, x, n)
					for j := range out {
						if !sameBits(out[j], want[j]) {
							t.Fatalf("%v %dx%d n=%d threads=%d: out[%d] = %v, MatVec gives %v", dt, s.rows, s.cols, n, th, j, out[j], want[j])
						}
					}
				}
			}
		}
	}
}

func TestMatVecOfEmptyShapes(t *testing.T) { forEachPath(t, testMatVecOfEmptyShapes) }

func testMatVecOfEmptyShapes(t *testing.T) {
	for _, dt := range dtypes {
		out := []float32{7, 7}
		MatVec(out, Matrix{DType: dt, Rows: 2, Cols: 0}, nil)
		if math.Float32bits(out[0]) != 0 || math.Float32bits(out[1]) != 0 {
			t.Errorf("%v: 2x0 MatVec = %v, want +0s", dt, out)
		}
		MatVec(nil, Matrix{DType: dt, Rows: 0, Cols: 5}, make([]float32, 5))
		MatMul(nil, Matrix{DType: dt, Rows: 3, Cols: 5, Data: make([]byte, 15*dt.Size())}, nil, 0)
	}
}

// TestMatVecUnalignedData: a tensor at an odd offset of a mapped file.
func TestMatVecUnalignedData(t *testing.T) { forEachPath(t, testMatVecUnalignedData) }

func testMatVecUnalignedData(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, dt := range dtypes {
		m, _ := randMatrix(rng, dt, 5, 37)
		buf := make([]byte, len(m.Data)+1)
		copy(buf[1:], m.Data)
		odd := m
		odd.Data = buf[1:]
		x := randVec(rng, 37)
		want, got := make([]float32, 5), make([]float32, 5)
		MatVec(want, m, x)
		MatVec(got, odd, x)
		for r := range got {
			if !sameBits(got[r], want[r]) {
				t.Fatalf("%v: unaligned row %d = %v, aligned = %v", dt, r, got[r], want[r])
			}
		}
	}
}

func TestMatVecSingleThreadDoesNotAllocate(t *testing.T) {
	forEachPath(t, testMatVecSingleThreadDoesNotAllocate)
}

func testMatVecSingleThreadDoesNotAllocate(t *testing.T) {
	if viewsCopy {
		t.Skip("this architecture decodes weights into a copy")
	}
	rng := rand.New(rand.NewPCG(17, 18))
	defer SetThreads(SetThreads(1))
	for _, dt := range dtypes {
		for _, s := range []struct{ rows, cols int }{{64, 1000}, {8, 100}} {
			m, _ := randMatrix(rng, dt, s.rows, s.cols)
			x := randVec(rng, s.cols)
			out := make([]float32, s.rows)
			MatVec(out, m, x) // builds the F16 table once
			if a := testing.AllocsPerRun(20, func() { MatVec(out, m, x) }); a != 0 {
				t.Errorf("%v %dx%d: %v allocations per MatVec, want 0", dt, s.rows, s.cols, a)
			}
		}
	}
}

func TestMatVecPanicsOnBadShapes(t *testing.T) {
	good := Matrix{DType: BF16, Rows: 2, Cols: 3, Data: make([]byte, 12)}
	cases := []struct {
		name string
		call func()
		want string
	}{
		{"short x", func() { MatVec(make([]float32, 2), good, make([]float32, 2)) }, "len(x) = 2"},
		{"long out", func() { MatVec(make([]float32, 3), good, make([]float32, 3)) }, "len(out) = 3"},
		{"short data", func() {
			MatVec(make([]float32, 2), Matrix{DType: F32, Rows: 2, Cols: 3, Data: make([]byte, 12)}, make([]float32, 3))
		}, "needs 24 bytes, has 12"},
		{"matmul x", func() { MatMul(make([]float32, 4), good, make([]float32, 3), 2) }, "MatMul"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				msg := fmt.Sprint(recover())
				if !strings.Contains(msg, tc.want) {
					t.Fatalf("panic %q, want it to contain %q", msg, tc.want)
				}
			}()
			tc.call()
		})
	}
}

func TestSetThreadsReturnsPrevious(t *testing.T) {
	defer SetThreads(SetThreads(0))
	SetThreads(3)
	if got := Threads(); got != 3 {
		t.Fatalf("Threads() = %d after SetThreads(3)", got)
	}
	if prev := SetThreads(-1); prev != 3 {
		t.Fatalf("SetThreads returned %d, want 3", prev)
	}
	if got := Threads(); got < 1 {
		t.Fatalf("default Threads() = %d", got)
	}
}
