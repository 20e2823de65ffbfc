package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// packableMatrix returns a rows x cols BF16 matrix whose weights have 32
// high bytes (0x30-0x3f and 0xb0-0xbf: magnitudes 2^-31 to 2, both signs,
// so that sums depend on the order of additions; a full table), and where
// every rare-th row (rare > 0) holds one special weight (zero, subnormal,
// huge, Inf or NaN: a high byte outside the table, an exception row).
func packableMatrix(rng *rand.Rand, rows, cols, rare int) (m Matrix, exceptions int) {
	m = Matrix{DType: BF16, Rows: rows, Cols: cols, Data: make([]byte, 2*rows*cols)}
	w := u16View(m.Data)
	for i := range w {
		w[i] = uint16(0x30+rng.IntN(16)+0x80*rng.IntN(2))<<8 | uint16(rng.IntN(256))
	}
	for r := 0; rare > 0 && r < rows; r += rare {
		w[r*cols+rng.IntN(cols)] = specialBF16[rng.IntN(len(specialBF16))]
		exceptions++
	}
	return m, exceptions
}

func TestPackBF16KeepsEveryWeight(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	for _, s := range []struct{ rows, cols, rare int }{{1, 64, 0}, {9, 128, 0}, {67, 1024, 9}, {40, 4096, 8}, {3, 192, 0}, {17, 128, 16}} {
		m, exc := packableMatrix(rng, s.rows, s.cols, s.rare)
		p, ok, _ := PackBF16(m, nil)
		if !ok {
			t.Fatalf("%dx%d: not packed", s.rows, s.cols)
		}
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		if e := packedExceptions(p.Scales, p.Cols); e.count() != exc {
			t.Errorf("%dx%d: %d exception rows, want %d", s.rows, s.cols, e.count(), exc)
		}
		if got, want := len(p.Data), s.rows*s.cols/64*104; got != want {
			t.Errorf("%dx%d: %d bytes of blocks, want %d (13 bits a weight)", s.rows, s.cols, got, want)
		}
		for _, name := range Paths() {
			withPath(t, name, func() {
				got := make([]float32, s.rows*s.cols)
				unpackRows(got, p, 0, s.rows, cur().unpackBF16P)
				for i, h := range u16View(m.Data) {
					if math.Float32bits(got[i]) != uint32(h)<<16 {
						t.Fatalf("%s %dx%d: weight %d (row %d) unpacked as %#08x, want %#04x", name, s.rows, s.cols, i, i/s.cols, math.Float32bits(got[i]), h)
					}
				}
			})
		}
	}
}

func TestPackBF16RefusesWhatItCannotHold(t *testing.T) {
	rng := rand.New(rand.NewPCG(63, 64))
	alloc := func(n int) ([]byte, error) { t.Fatalf("allocated %d bytes for a refused matrix", n); return nil, nil }
	f32, _ := randMatrix(rng, F32, 4, 64)
	odd, _ := packableMatrix(rng, 4, 64, 0)
	odd.Cols, odd.Data = 32, odd.Data[:2*4*32]
	many, _ := packableMatrix(rng, 16, 64, 4) // 4 exception rows of 16: more than an eighth
	for name, m := range map[string]Matrix{"F32": f32, "32 columns": odd, "a quarter of the rows exceptions": many} {
		if _, ok, _ := PackBF16(m, alloc); ok {
			t.Errorf("%s: packed", name)
		}
	}
	few, _ := packableMatrix(rng, 16, 64, 8) // 2 of 16: an eighth
	if _, ok, _ := PackBF16(few, nil); !ok {
		t.Error("an eighth of the rows exceptions: refused")
	}
}

func TestValidateNamesBadPackedScales(t *testing.T) {
	rng := rand.New(rand.NewPCG(65, 66))
	m, _ := packableMatrix(rng, 20, 64, 10)
	p, _, _ := PackBF16(m, nil)
	counted := append([]byte(nil), p.Scales...)
	binary.LittleEndian.PutUint32(counted[packedTableBytes:], 3)
	for name, bad := range map[string]Matrix{
		"no table":     {DType: BF16P, Rows: 20, Cols: 64, Data: p.Data, Scales: p.Scales[:10]},
		"count off":    {DType: BF16P, Rows: 20, Cols: 64, Data: p.Data, Scales: counted},
		"short blocks": {DType: BF16P, Rows: 20, Cols: 64, Data: p.Data[:104*19], Scales: p.Scales},
		"100 columns":  {DType: BF16P, Rows: 20, Cols: 100, Data: p.Data, Scales: p.Scales},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: valid", name)
		}
	}
}

// TestPackedProductsAreTheBF16Products: on every path, MatVec and MatMul
// of a packed matrix equal those of the BF16 it was packed from, bit for
// bit, exception rows included, whatever the threads.
func TestPackedProductsAreTheBF16Products(t *testing.T) { forEachPath(t, testPackedProducts) }

func testPackedProducts(t *testing.T) {
	defer SetThreads(SetThreads(0))
	rng := rand.New(rand.NewPCG(67, 68))
	for _, s := range []struct{ rows, cols, rare int }{{1, 64, 0}, {3, 128, 0}, {17, 128, 16}, {5, 64, 0}, {67, 1024, 9}, {130, 2048, 11}, {64, 4096, 0}} {
		m, _ := packableMatrix(rng, s.rows, s.cols, s.rare)
		p, ok, _ := PackBF16(m, nil)
		if !ok {
			t.Fatalf("%dx%d: not packed", s.rows, s.cols)
		}
		for _, n := range []int{1, 2, 3, 4, 5, 9, 17} {
			x := specialVec(rng, n*s.cols, n == 9)
			for _, th := range []int{1, 3} {
				SetThreads(th)
				want, got := make([]float32, n*s.rows), make([]float32, n*s.rows)
				MatMul(want, m, x, n)
				MatMul(got, p, x, n)
				if i, ok := sameSlices(got, want); !ok {
					t.Fatalf("%dx%d n=%d threads=%d: out[%d] (row %d) = %v, BF16 gives %v", s.rows, s.cols, n, th, i, i%s.rows, got[i], want[i])
				}
			}
		}
	}
}

func TestPackedMatVecSingleThreadDoesNotAllocate(t *testing.T) {
	defer SetThreads(SetThreads(1))
	rng := rand.New(rand.NewPCG(69, 70))
	m, _ := packableMatrix(rng, 64, 1024, 16)
	p, _, _ := PackBF16(m, nil)
	x, out := randVec(rng, 1024), make([]float32, 64)
	forEachPath(t, func(t *testing.T) {
		if a := testing.AllocsPerRun(20, func() { MatVec(out, p, x) }); a != 0 {
			t.Errorf("%v allocations a MatVec", a)
		}
	})
}

// TestPackedRowsQuantizeAsTheirBF16: RowToFloat32 and Quantize read a
// packed matrix, exception rows included, as the BF16 it was packed from.
func TestPackedRowsQuantizeAsTheirBF16(t *testing.T) {
	rng := rand.New(rand.NewPCG(71, 72))
	m, _ := packableMatrix(rng, 24, 128, 8)
	for i := range u16View(m.Data) { // finite weights for Quantize: the exceptions' are subnormal or zero
		if h := u16View(m.Data)[i]; h&0x7f80 == 0x7f80 {
			u16View(m.Data)[i] = h &^ 0x7f80
		}
	}
	p, ok, _ := PackBF16(m, nil)
	if !ok {
		t.Fatal("not packed")
	}
	if packedExceptions(p.Scales, p.Cols).count() == 0 {
		t.Fatal("no exception rows to read")
	}
	got, want := make([]float32, 128), make([]float32, 128)
	for r := range m.Rows {
		RowToFloat32(got, p, r)
		RowToFloat32(want, m, r)
		if i, ok := sameSlices(got, want); !ok {
			t.Fatalf("row %d weight %d: %v, BF16 gives %v", r, i, got[i], want[i])
		}
	}
	for _, dt := range []DType{F16, Q8, NF4} {
		qp, errP := Quantize(dt, p)
		qm, errM := Quantize(dt, m)
		if (errP == nil) != (errM == nil) || errP == nil && string(qp.Data) != string(qm.Data) {
			t.Errorf("%v: packed quantizes to other bytes (errors %v, %v)", dt, errP, errM)
		}
	}
}
