package kernels

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// The test's own reading of the Q8 and NF4 layouts of the package doc,
// independent of quant.go.

// refNF4 is the NF4 table as printed in the QLoRA paper's appendix and
// bitsandbytes (nf4_dequantization_lut), in float64.
var refNF4 = [16]float64{
	-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
	-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
	0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
	0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
}

// quantRow is one decoded Q8 or NF4 row: per-element code and scale.
type quantRow struct {
	code  []int     // Q8: the int8; NF4: the 4-bit index
	scale []float32 // the element's group scale (Q8) or block absmax (NF4)
}

// decodeQuantRow decodes row r of a Q8 or NF4 matrix by the layout alone.
func decodeQuantRow(m Matrix, r int) quantRow {
	cols := m.Cols
	group, codeBytes := 32, cols
	if m.DType == NF4 {
		group, codeBytes = 64, (cols+1)/2
	}
	ng := (cols + group - 1) / group
	rb := 4*ng + codeBytes
	row := m.Data[r*rb : (r+1)*rb]
	q := quantRow{code: make([]int, cols), scale: make([]float32, cols)}
	for i := range cols {
		q.scale[i] = math.Float32frombits(binary.LittleEndian.Uint32(row[4*(i/group):]))
		if m.DType == Q8 {
			q.code[i] = int(int8(row[4*ng+i]))
		} else {
			q.code[i] = int(row[4*ng+i/2]>>(4*(i%2))) & 15
		}
	}
	return q
}

// refDequant returns the float32 weights of a Q8 or NF4 matrix: the exact
// product code*scale, rounded once to float32 (what a float32 multiply
// gives).
func refDequant(m Matrix) []float32 {
	w := make([]float32, m.Rows*m.Cols)
	for r := range m.Rows {
		q := decodeQuantRow(m, r)
		for i := range m.Cols {
			c := float64(q.code[i])
			if m.DType == NF4 {
				c = refNF4[q.code[i]]
			}
			w[r*m.Cols+i] = float32(c * float64(q.scale[i]))
		}
	}
	return w
}

// quantSource returns a rows x cols F32 matrix of N(0, 0.02) weights (a
// transformer's), with one in 97 an outlier 20x larger, and its values.
func quantSource(rng *rand.Rand, rows, cols int) (Matrix, []float32) {
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * 0.02)
		if rng.IntN(97) == 0 {
			w[i] *= 20
		}
	}
	return Matrix{DType: F32, Rows: rows, Cols: cols, Data: encode(F32, w)}, w
}

func mustQuantize(t testing.TB, dt DType, m Matrix) Matrix {
	t.Helper()
	q, err := Quantize(dt, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Validate(); err != nil {
		t.Fatal(err)
	}
	return q
}

// ulp32 returns the distance from |f| to the next float32 up.
func ulp32(f float32) float64 {
	a := float32(math.Abs(float64(f)))
	return float64(math.Nextafter32(a, float32(math.Inf(1))) - a)
}

var quantShapes = []struct{ rows, cols int }{{2, 0}, {1, 1}, {3, 31}, {3, 33}, {2, 63}, {5, 65}, {67, 100}, {3, 4097}}

func TestRowBytesOfEveryDType(t *testing.T) {
	for _, tc := range []struct {
		dt         DType
		cols, want int
	}{
		{F32, 3, 12}, {BF16, 3, 6}, {F16, 0, 0},
		{Q8, 0, 0}, {Q8, 1, 5}, {Q8, 32, 36}, {Q8, 33, 41}, {Q8, 4096, 4096 + 512},
		{NF4, 0, 0}, {NF4, 1, 5}, {NF4, 64, 36}, {NF4, 65, 41}, {NF4, 4096, 2048 + 256},
		{DType(9), 4, 0},
	} {
		if got := tc.dt.RowBytes(tc.cols); got != tc.want {
			t.Errorf("%v.RowBytes(%d) = %d, want %d", tc.dt, tc.cols, got, tc.want)
		}
	}
	for _, dt := range []DType{Q8, NF4} {
		if s, err := ParseDType(dt.String()); err == nil {
			t.Errorf("ParseDType(%q) = %v: not a safetensors dtype", dt.String(), s)
		}
	}
}

func TestMatrixValidateQuantSizes(t *testing.T) {
	for _, tc := range []struct {
		m    Matrix
		want string
	}{
		{Matrix{DType: Q8, Rows: 2, Cols: 33, Data: make([]byte, 82)}, ""},
		{Matrix{DType: Q8, Rows: 2, Cols: 33, Data: make([]byte, 66)}, "2x33 Q8 matrix needs 82 bytes, has 66"},
		{Matrix{DType: NF4, Rows: 3, Cols: 65, Data: make([]byte, 123)}, ""},
		{Matrix{DType: NF4, Rows: 3, Cols: 65, Data: make([]byte, 122)}, "needs 123 bytes, has 122"},
		{Matrix{DType: NF4, Rows: 3, Cols: 65, Data: make([]byte, 3*65/2)}, "needs 123 bytes"},
		{Matrix{DType: Q8, Rows: math.MaxInt / 8, Cols: 9}, "overflows"},
		{Matrix{DType: NF4, Rows: 1, Cols: math.MaxInt / 2}, "overflows"},
	} {
		err := tc.m.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v %dx%d, %d bytes: Validate() = %v, want %q", tc.m.DType, tc.m.Rows, tc.m.Cols, len(tc.m.Data), err, tc.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("MatVec on a Q8 matrix of the wrong size did not panic")
		}
	}()
	MatVec(make([]float32, 2), Matrix{DType: Q8, Rows: 2, Cols: 32, Data: make([]byte, 64)}, make([]float32, 32))
}

// TestQuantizeQ8WithinHalfScale: every group's scale is absmax/127, every
// code the nearest integer to w/scale within [-127, 127], so that the
// dequantized weight is within scale/2 of w, plus the float32 rounding of
// the product code*scale (half an ulp of the result).
func TestQuantizeQ8WithinHalfScale(t *testing.T) {
	rng := rand.New(rand.NewPCG(201, 202))
	for _, s := range quantShapes {
		src, w := quantSource(rng, s.rows, s.cols)
		m := mustQuantize(t, Q8, src)
		deq := refDequant(m)
		for r := range s.rows {
			q := decodeQuantRow(m, r)
			for i := range s.cols {
				g := i / 32
				var amax float64
				for _, v := range w[r*s.cols+32*g : r*s.cols+min(32*g+32, s.cols)] {
					amax = max(amax, math.Abs(float64(v)))
				}
				sc := q.scale[i]
				if want := float32(amax) / 127; sc != want {
					t.Fatalf("%dx%d row %d group %d: scale %g, want absmax/127 = %g", s.rows, s.cols, r, g, sc, want)
				}
				v, d, c := w[r*s.cols+i], deq[r*s.cols+i], q.code[i]
				if c < -127 || c > 127 {
					t.Fatalf("code %d out of [-127, 127]", c)
				}
				if dist := math.Abs(float64(v)/float64(sc) - float64(c)); dist > 0.5 {
					t.Fatalf("%dx%d [%d,%d]: w/scale = %g, code %d is not the nearest integer", s.rows, s.cols, r, i, float64(v)/float64(sc), c)
				}
				if err, bound := math.Abs(float64(v)-float64(d)), float64(sc)/2+ulp32(d)/2; err > bound {
					t.Fatalf("%dx%d [%d,%d]: |w - deq| = |%g - %g| = %g > scale/2 + ulp/2 = %g", s.rows, s.cols, r, i, v, d, err, bound)
				}
			}
		}
	}
}

// TestQuantizeNF4PicksNearestCode: every block's absmax is max |w|, every
// code the NF4 value nearest to w/absmax (no other code is nearer), the
// padding nibble of an odd row is 0.
func TestQuantizeNF4PicksNearestCode(t *testing.T) {
	rng := rand.New(rand.NewPCG(203, 204))
	for _, s := range quantShapes {
		src, w := quantSource(rng, s.rows, s.cols)
		m := mustQuantize(t, NF4, src)
		rb := NF4.RowBytes(s.cols)
		for r := range s.rows {
			q := decodeQuantRow(m, r)
			for i := range s.cols {
				b := i / 64
				var amax float64
				for _, v := range w[r*s.cols+64*b : r*s.cols+min(64*b+64, s.cols)] {
					amax = max(amax, math.Abs(float64(v)))
				}
				if float64(q.scale[i]) != amax {
					t.Fatalf("%dx%d row %d block %d: absmax %g, want %g", s.rows, s.cols, r, b, q.scale[i], amax)
				}
				n := float64(w[r*s.cols+i]) / amax
				best := math.Abs(n - refNF4[q.code[i]])
				for k, c := range refNF4 {
					if d := math.Abs(n - c); d < best {
						t.Fatalf("%dx%d [%d,%d]: w/absmax = %g got code %d (%g), code %d (%g) is nearer",
							s.rows, s.cols, r, i, n, q.code[i], refNF4[q.code[i]], k, c)
					}
				}
			}
			if s.cols%2 == 1 {
				if last := m.Data[(r+1)*rb-1]; last>>4 != 0 {
					t.Fatalf("%dx%d row %d: padding nibble %#x, want 0", s.rows, s.cols, r, last>>4)
				}
			}
		}
	}
}

func TestQuantizeF16RoundsEachWeight(t *testing.T) {
	rng := rand.New(rand.NewPCG(205, 206))
	for _, srcDT := range []DType{F32, BF16} {
		vals := randVec(rng, 3*77)
		src := Matrix{DType: srcDT, Rows: 3, Cols: 77, Data: encode(srcDT, vals)}
		m := mustQuantize(t, F16, src)
		for i := range vals {
			v := float32(refWiden(srcDT, src.Data, i))
			if got, want := binary.LittleEndian.Uint16(m.Data[2*i:]), F32ToF16(v); got != want {
				t.Fatalf("%v -> F16 [%d] = %#04x, want %#04x", srcDT, i, got, want)
			}
		}
	}
}

// TestQuantizeEdgeBlocks: all-zero blocks, a block of one value, the
// largest finite float32 and subnormals quantize to the codes the
// definition gives.
func TestQuantizeEdgeBlocks(t *testing.T) {
	max32 := float32(math.MaxFloat32)
	sub := math.Float32frombits(3)
	w := make([]float32, 4*64) // [0, 64) zero; Q8 group 2; NF4 block 2 and Q8 group 4
	copy(w[64:], []float32{127, -127, 63.5, 62.5, -0.5, 1.49})
	copy(w[128:], []float32{max32, -max32, sub, -sub, math.Float32frombits(1)})
	src := Matrix{DType: F32, Rows: 1, Cols: len(w), Data: encode(F32, w)}
	q8 := decodeQuantRow(mustQuantize(t, Q8, src), 0)
	nf := decodeQuantRow(mustQuantize(t, NF4, src), 0)
	for i := range 64 {
		if q8.code[i] != 0 || q8.scale[i] != 0 || nf.code[i] != 7 || nf.scale[i] != 0 {
			t.Fatalf("zero block [%d]: Q8 %d*%g, NF4 %d*%g; want 0*0 and 7*0", i, q8.code[i], q8.scale[i], nf.code[i], nf.scale[i])
		}
	}
	if got := q8.code[64:70]; fmt.Sprint(got) != "[127 -127 64 62 0 1]" || q8.scale[64] != 1 { // scale 1: ties to even
		t.Errorf("Q8 codes of 127 -127 63.5 62.5 -0.5 1.49 = %v, scale %g", got, q8.scale[64])
	}
	if got := nf.code[128:133]; fmt.Sprint(got) != "[15 0 7 7 7]" || nf.scale[128] != max32 {
		t.Errorf("NF4 codes of max -max sub -sub sub = %v, absmax %g", got, nf.scale[128])
	}
	if got := q8.code[128:130]; fmt.Sprint(got) != "[127 -127]" || math.IsInf(float64(q8.scale[128]), 0) {
		t.Errorf("Q8 of ±MaxFloat32 = %v scale %g", got, q8.scale[128])
	}
}

func TestQuantizeRejectsBadInput(t *testing.T) {
	good, _ := quantSource(rand.New(rand.NewPCG(1, 2)), 4, 40)
	bad := func(v float32) Matrix {
		w := make([]float32, 4*40)
		w[2*40+7], w[3*40] = v, v
		return Matrix{DType: F32, Rows: 4, Cols: 40, Data: encode(F32, w)}
	}
	for _, tc := range []struct {
		dt   DType
		m    Matrix
		dst  []byte
		want string
	}{
		{Q8, bad(float32(math.NaN())), nil, "row 2 column 7: weight NaN is not finite"},
		{NF4, bad(float32(math.Inf(-1))), nil, "row 2 column 7: weight -Inf is not finite"},
		{F16, bad(float32(math.Inf(1))), nil, "row 2 column 7: weight +Inf is not finite"},
		{F16, bad(70000), nil, "row 2 column 7: weight 70000 overflows F16"},
		{BF16, good, nil, "target BF16"},
		{Q8, mustQuantize(t, NF4, good), nil, "source NF4"},
		{Q8, Matrix{DType: F32, Rows: 2, Cols: 2, Data: make([]byte, 3)}, nil, "needs 16 bytes"},
		{Q8, good, make([]byte, Q8.RowBytes(40)*4-1), "needs 192 bytes, dst has 191"},
	} {
		for _, th := range []int{1, 3} {
			prev := SetThreads(th)
			_, err := QuantizeInto(tc.dst, tc.dt, tc.m)
			SetThreads(prev)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Quantize(%v, %v): %v, want an error containing %q", tc.dt, tc.m.DType, err, tc.want)
			}
		}
	}
}

// TestQuantizeIsDeterministic: the bytes do not depend on the number of
// goroutines, and QuantizeInto writes every byte of a dirty buffer.
func TestQuantizeIsDeterministic(t *testing.T) {
	defer SetThreads(SetThreads(0))
	src, _ := quantSource(rand.New(rand.NewPCG(207, 208)), 67, 1001) // > minParallelElems
	for _, dt := range []DType{F16, Q8, NF4} {
		SetThreads(1)
		want := mustQuantize(t, dt, src)
		for _, th := range []int{2, 7} {
			SetThreads(th)
			dst := bytes.Repeat([]byte{0xff}, len(want.Data)+5)
			got, err := QuantizeInto(dst, dt, src)
			if err != nil || !bytes.Equal(got.Data, want.Data) || &got.Data[0] != &dst[0] {
				t.Fatalf("%v with %d threads into a dirty buffer: %v, differs from 1 thread", dt, th, err)
			}
		}
	}
}

func TestRowToFloat32DequantizesAsTheLayoutSays(t *testing.T) {
	rng := rand.New(rand.NewPCG(209, 210))
	for _, dt := range []DType{Q8, NF4} {
		src, _ := quantSource(rng, 3, 129)
		m := mustQuantize(t, dt, src)
		want := refDequant(m)
		for r := range m.Rows {
			got := make([]float32, m.Cols)
			RowToFloat32(got, m, r)
			if i, ok := sameSlices(got, want[r*m.Cols:(r+1)*m.Cols]); !ok {
				t.Fatalf("%v row %d [%d] = %g, want %g", dt, r, i, got[i], want[r*m.Cols+i])
			}
		}
	}
	f := Matrix{DType: BF16, Rows: 2, Cols: 3, Data: encode(BF16, []float32{1, 2, 3, 4, 5, 6})}
	got := make([]float32, 3)
	RowToFloat32(got, f, 1)
	if fmt.Sprint(got) != "[4 5 6]" {
		t.Errorf("BF16 row 1 = %v", got)
	}
}

// quantTestMatrix returns a Q8 or NF4 (or F16) matrix quantized from
// transformer-like weights, and its dequantized float32 weights.
func quantTestMatrix(t testing.TB, rng *rand.Rand, dt DType, rows, cols int) (Matrix, []float32) {
	src, w := quantSource(rng, rows, cols)
	m := mustQuantize(t, dt, src)
	if dt == F16 {
		for i := range w {
			w[i] = F16ToF32(F32ToF16(w[i]))
		}
		return m, w
	}
	return m, refDequant(m)
}

var quantDTypes = []DType{Q8, NF4}

// TestMatVecQuantEqualsLaneDefinition: a Q8 or NF4 MatVec row is the Dot
// definition on the dequantized weights, bit for bit, on every path.
func TestMatVecQuantEqualsLaneDefinition(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(211, 212))
		for _, dt := range quantDTypes {
			for _, s := range quantShapes {
				m, deq := quantTestMatrix(t, rng, dt, s.rows, s.cols)
				x := wideRangeVec(rng, s.cols)
				out := make([]float32, s.rows)
				MatVec(out, m, x)
				for r := range out {
					if want := specDot(deq[r*s.cols:(r+1)*s.cols], x); !sameBits(out[r], want) {
						t.Fatalf("%v %dx%d row %d: MatVec = %v, definition = %v", dt, s.rows, s.cols, r, out[r], want)
					}
				}
			}
		}
	})
}

// TestMatVecQuantWithinFloat64Bounds: against the float64 dot product of
// the dequantized weights, MatVec is within the float32 rounding bound of
// every MatVec (dotErrBound); against the float64 dot product of the
// ORIGINAL weights it is within that plus the quantization error,
// sum |x_i| * e_i, with e_i the per-weight bound: Q8 scale/2 + ulp/2, NF4
// absmax * (the half gap to the next code) + ulp/2, F16 half an F16 ulp.
func TestMatVecQuantWithinFloat64Bounds(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(213, 214))
		for _, dt := range []DType{Q8, NF4, F16} {
			for _, s := range quantShapes {
				src, orig := quantSource(rng, s.rows, s.cols)
				m := mustQuantize(t, dt, src)
				deq := make([]float32, s.rows*s.cols)
				for r := range s.rows {
					RowToFloat32(deq[r*s.cols:(r+1)*s.cols], m, r)
				}
				x := randVec(rng, s.cols)
				out := make([]float32, s.rows)
				MatVec(out, m, x)
				for r := range out {
					wr, or := deq[r*s.cols:(r+1)*s.cols], orig[r*s.cols:(r+1)*s.cols]
					ref, absSum := refDot(wr, x)
					bound := dotErrBound(s.cols, absSum)
					if err := math.Abs(float64(out[r]) - ref); err > bound {
						t.Fatalf("%v %dx%d row %d: |MatVec - exact(dequantized)| = %g > %g", dt, s.rows, s.cols, r, err, bound)
					}
					exact, _ := refDot(or, x)
					var q quantRow
					if dt != F16 {
						q = decodeQuantRow(m, r)
					}
					qbound := 0.0
					for i := range wr {
						qbound += math.Abs(float64(x[i])) * quantErrBound(dt, q, i, wr[i])
					}
					if err := math.Abs(float64(out[r]) - exact); err > bound+qbound {
						t.Fatalf("%v %dx%d row %d: |MatVec - exact(original)| = %g > %g + %g", dt, s.rows, s.cols, r, err, bound, qbound)
					}
				}
			}
		}
	})
}

// quantErrBound bounds |original - dequantized| for weight i of the
// decoded row q.
func quantErrBound(dt DType, q quantRow, i int, deq float32) float64 {
	switch dt {
	case F16:
		return max(math.Abs(float64(deq))/(1<<11), 1.0/(1<<25)) // half an F16 ulp
	case Q8:
		return float64(q.scale[i])/2 + ulp32(deq)/2
	}
	c := q.code[i]
	gap := 0.0
	if c > 0 {
		gap = refNF4[c] - refNF4[c-1]
	}
	if c < 15 {
		gap = max(gap, refNF4[c+1]-refNF4[c])
	}
	return float64(q.scale[i])*gap/2 + ulp32(deq)/2
}

// TestPathsMatchGoQuant: every SIMD path computes Q8 and NF4 MatVec and
// MatMul with the same bits as the pure-Go path, on awkward shapes, both
// on quantized weights and on arbitrary bytes (scales that are subnormal,
// huge, Inf or NaN; NF4 padding nibbles set), with special x values.
func TestPathsMatchGoQuant(t *testing.T) {
	defer SetThreads(SetThreads(0))
	cols := []int{1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 4097}
	rows := []int{1, 3, 5, 67}
	for _, name := range simdPathNames() {
		rng := rand.New(rand.NewPCG(215, 216))
		for _, dt := range quantDTypes {
			for _, c := range cols {
				for _, r := range rows {
					if r*c > 70000 {
						continue
					}
					for _, arbitrary := range []bool{false, true} {
						var m Matrix
						if arbitrary {
							m = Matrix{DType: dt, Rows: r, Cols: c, Data: make([]byte, r*dt.RowBytes(c))}
							for i := range m.Data {
								m.Data[i] = byte(rng.Uint32())
							}
						} else {
							m, _ = quantTestMatrix(t, rng, dt, r, c)
						}
						n := 1 + (r+c)%4
						x := specialVec(rng, n*c, arbitrary)
						for _, th := range []int{1, 3} {
							SetThreads(th)
							want, got := make([]float32, n*r), make([]float32, n*r)
							withPath(t, "go", func() { MatVec(want[:r], m, x[:c]) })
							withPath(t, name, func() { MatVec(got[:r], m, x[:c]) })
							if i, ok := sameSlices(got[:r], want[:r]); !ok {
								t.Fatalf("%s %v %dx%d arbitrary=%v threads=%d: MatVec row %d = %v (%#08x), go path %v (%#08x)",
									name, dt, r, c, arbitrary, th, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
							}
							withPath(t, "go", func() { MatMul(want, m, x, n) })
							withPath(t, name, func() { MatMul(got, m, x, n) })
							if i, ok := sameSlices(got, want); !ok {
								t.Fatalf("%s %v %dx%d n=%d arbitrary=%v threads=%d: MatMul out[%d] = %v, go path %v",
									name, dt, r, c, n, arbitrary, th, i, got[i], want[i])
							}
						}
					}
				}
			}
		}
	}
}

// TestMatVecQuantIsIndependentOfThreads and MatMul equal per vector: the
// float dtypes' guarantees hold for Q8 and NF4.
func TestMatVecQuantIsIndependentOfThreads(t *testing.T) {
	defer SetThreads(SetThreads(0))
	forEachPath(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(217, 218))
		for _, dt := range quantDTypes {
			// 3 to 7 vectors (3 + rows%5). Q8 on AVX2 applies 2 to 4 at
			// once where cols is a multiple of 16: 4 + 1 (302x1024, two L2
			// tiles of rows), 4 + 3 (304x1024) and 4 + 2 (3x30000)
			for _, s := range []struct{ rows, cols int }{{300, 1000}, {302, 1024}, {304, 1024}, {3, 30000}, {17, 33}, {129, 4097}} {
				m, _ := quantTestMatrix(t, rng, dt, s.rows, s.cols)
				n := 3 + s.rows%5
				x := wideRangeVec(rng, n*s.cols)
				SetThreads(1)
				want := make([]float32, n*s.rows)
				for v := range n {
					MatVec(want[v*s.rows:(v+1)*s.rows], m, x[v*s.cols:(v+1)*s.cols])
				}
				for _, th := range []int{1, 2, 7} {
					SetThreads(th)
					got := make([]float32, s.rows)
					MatVec(got, m, x[:s.cols])
					if i, ok := sameSlices(got, want[:s.rows]); !ok {
						t.Fatalf("%v %dx%d threads=%d: MatVec row %d = %v, 1 thread %v", dt, s.rows, s.cols, th, i, got[i], want[i])
					}
					got = make([]float32, n*s.rows)
					MatMul(got, m, x, n)
					if i, ok := sameSlices(got, want); !ok {
						t.Fatalf("%v %dx%d threads=%d: MatMul out[%d] = %v, MatVec %v", dt, s.rows, s.cols, th, i, got[i], want[i])
					}
				}
			}
		}
	})
}

// quantGolden adds to the golden results (golden_test.go) the bytes that
// Quantize makes and the Q8 and NF4 MatVec and MatMul bits: a node that
// quantizes its own copy must get the same bytes on any architecture.
func quantGolden(res map[string]string) {
	rng := rand.New(rand.NewPCG(2026, 7))
	for _, s := range []struct{ rows, cols int }{{3, 17}, {40, 4099}} {
		w := portableUnit(rng, s.rows*s.cols, 1.0/16)
		for i := range w {
			if rng.IntN(50) == 0 {
				w[i] *= 30 // outliers
			}
		}
		src := Matrix{DType: F32, Rows: s.rows, Cols: s.cols, Data: encode(F32, w)}
		for _, dt := range []DType{F16, Q8, NF4} {
			m, err := Quantize(dt, src)
			if err != nil {
				panic(err)
			}
			sum := sha256.Sum256(m.Data)
			res[fmt.Sprintf("Quantize/%v/%dx%d", dt, s.rows, s.cols)] = hex.EncodeToString(sum[:12])
			if dt == F16 {
				continue
			}
			x := portableWide(rng, 3*s.cols)
			out := make([]float32, 3*s.rows)
			MatVec(out[:s.rows], m, x[:s.cols])
			res[fmt.Sprintf("MatVec/%v/%dx%d", dt, s.rows, s.cols)] = hashBits(out[:s.rows])
			MatMul(out, m, x, 3)
			res[fmt.Sprintf("MatMul/%v/%dx%d/n=3", dt, s.rows, s.cols)] = hashBits(out)
		}
	}
}

// TestQuantizeQ8RowIsItsDefinition: quantizeQ8Row's codes and scales are
// byte for byte those of its definition written plainly (absmax as a
// float32 max of |w|, scale = absmax/127, code = RoundToEven(w/scale) in
// float64 clamped to [-127, 127], 0 where scale is 0), on random rows
// and on groups made to hit its edges: ties between two codes (w exactly
// half way, so the even code wins), all zeros, signed zeros, subnormals,
// a group's largest weight negative, a short last group.
func TestQuantizeQ8RowIsItsDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(205, 206))
	var rows [][]float32
	for range 200 {
		n := 1 + rng.IntN(300)
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(12)-8)))
		}
		rows = append(rows, w)
	}
	ties := make([]float32, 64)
	for i := range ties { // scale 1: absmax 127 at the end of each group; w = k + 0.5
		ties[i] = float32(i%31) + 0.5 - float32(i%2)*float32(i%7)
	}
	ties[31], ties[63] = 127, -127
	sub := make([]float32, 40)
	for i := range sub {
		sub[i] = math.Float32frombits(uint32(i*37+1)) * float32(1-2*(i%2))
	}
	rows = append(rows, ties, make([]float32, 70), []float32{float32(math.Copysign(0, -1)), 0, -3, 2}, sub)
	for r, w := range rows {
		got := make([]byte, Q8.RowBytes(len(w)))
		if bad := quantizeQ8Row(got, w); bad >= 0 {
			t.Fatalf("row %d: weight %d called not finite", r, bad)
		}
		want := make([]byte, len(got))
		ng := (len(w) + 31) / 32
		for g := range ng {
			blk := w[32*g : min(32*g+32, len(w))]
			var amax float32
			for _, v := range blk {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			scale := amax / 127
			binary.LittleEndian.PutUint32(want[4*g:], math.Float32bits(scale))
			for i, v := range blk {
				var q float64
				if scale != 0 {
					q = max(-127, min(127, math.RoundToEven(float64(v)/float64(scale))))
				}
				want[4*ng+32*g+i] = byte(int8(q))
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("row %d (%d weights): %x, want %x", r, len(w), got, want)
		}
	}
}
