//go:build cuda

package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
)

// These tests need a GPU: `go test -tags cuda` is for a machine with one
// (the default build has none of this package's code).

var (
	gpuOnce sync.Once
	gpu     *Device
	gpuErr  error
)

func testDevice(t testing.TB) *Device {
	t.Helper()
	gpuOnce.Do(func() { gpu, gpuErr = Open(0) })
	if gpuErr != nil {
		t.Fatalf("the cuda tag's tests need a CUDA GPU: %v", gpuErr)
	}
	return gpu
}

// special are float32 values that break careless kernels: signed zeros,
// subnormals, the extremes of the normal range, infinities.
var special = []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32,
	math.Float32frombits(0x007fffff), -math.Float32frombits(0x007fffff), math.Float32frombits(0x00800000),
	math.MaxFloat32, -math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), 1, -1}

// randomMatrix is a rows x cols matrix of dt with weights of varied
// magnitude; a few are special (subnormal, huge, infinite) when wild.
func randomMatrix(rng *rand.Rand, dt kernels.DType, rows, cols int, wild bool) kernels.Matrix {
	m := kernels.Matrix{DType: dt, Rows: rows, Cols: cols, Data: make([]byte, rows*dt.RowBytes(cols))}
	for i := range rows * cols {
		v := float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(12)-8)))
		if wild && rng.IntN(50) == 0 {
			v = special[rng.IntN(len(special))]
		}
		if wild && rng.IntN(40) == 0 { // subnormal in every format
			v = float32(rng.NormFloat64()) * 1e-40
		}
		switch dt {
		case kernels.F32:
			binary.LittleEndian.PutUint32(m.Data[4*i:], math.Float32bits(v))
		case kernels.F16:
			if wild && rng.IntN(40) == 0 {
				binary.LittleEndian.PutUint16(m.Data[2*i:], uint16(rng.IntN(0x400))|uint16(rng.IntN(2))<<15) // F16 subnormal
				continue
			}
			if math.Abs(float64(v)) > 65504 {
				v = float32(math.Copysign(65504, float64(v)))
			}
			binary.LittleEndian.PutUint16(m.Data[2*i:], kernels.F32ToF16(v))
		case kernels.BF16:
			binary.LittleEndian.PutUint16(m.Data[2*i:], kernels.F32ToBF16(v))
		}
	}
	return m
}

func randomVectors(rng *rand.Rand, n int, wild bool) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
		if wild && rng.IntN(60) == 0 {
			x[i] = special[rng.IntN(len(special))]
		}
		if wild && rng.IntN(30) == 0 {
			x[i] *= 1e-39
		}
	}
	return x
}

func bytesOf(f []float32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f)) }

// sameBits reports the first element where got and want differ in bits
// (NaN equals NaN: its payload is not part of the definition).
func sameBits(got, want []float32) (int, bool) {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] != got[i] && want[i] != want[i]) {
			return i, false
		}
	}
	return 0, true
}

// upload copies m to fresh device memory, freed at the test's end.
func upload(t *testing.T, d *Device, s *Stream, data []byte) Ptr {
	t.Helper()
	p, err := d.Alloc(int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	if err := s.CopyToDevice(p, data); err != nil {
		t.Fatal(err)
	}
	return p
}

// poisoned is n float32 of device memory set to NaN bits, so that an
// element the kernel forgets to write cannot pass.
func poisoned(t *testing.T, d *Device, n int) Ptr {
	t.Helper()
	p, err := d.Alloc(int64(4 * n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	if err := d.Memset(p, 0xff, int64(4*n)); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestForwardIsTheCPUExpertBitForBit(t *testing.T) {
	d := testDevice(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(7, 41))
	// rows shorter than a lane's unrolled step (16 x 8 elements), one
	// element either side of it, and real experts' shapes
	shapes := []struct{ hidden, inter int }{{16, 16}, {1, 1}, {17, 5}, {5, 17}, {64, 48}, {100, 37}, {128, 127}, {129, 200}, {257, 130}, {512, 1408}, {2048, 768}}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16, kernels.F32} {
		for _, sh := range shapes {
			for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 17} {
				for _, wild := range []bool{false, true} {
					name := fmt.Sprintf("%v/%dx%d/n%d/wild=%v", dt, sh.hidden, sh.inter, n, wild)
					ex := model.Expert{Gate: randomMatrix(rng, dt, sh.inter, sh.hidden, wild), Up: randomMatrix(rng, dt, sh.inter, sh.hidden, wild),
						Down: randomMatrix(rng, dt, sh.hidden, sh.inter, wild)}
					x := randomVectors(rng, n*sh.hidden, wild)
					want := make([]float32, n*sh.hidden)
					ex.Forward(want, x, n, &model.ExpertScratch{})

					g := Expert{Gate: Matrix{upload(t, d, s, ex.Gate.Data), dt, sh.inter, sh.hidden, 0},
						Up:   Matrix{upload(t, d, s, ex.Up.Data), dt, sh.inter, sh.hidden, 0},
						Down: Matrix{upload(t, d, s, ex.Down.Data), dt, sh.hidden, sh.inter, 0}}
					xd, act, out := upload(t, d, s, bytesOf(x)), poisoned(t, d, n*sh.inter), poisoned(t, d, n*sh.hidden)
					if err := s.Forward(g, xd, act, out, n); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					got := make([]float32, n*sh.hidden)
					if err := s.CopyToHost(bytesOf(got), out); err != nil {
						t.Fatal(err)
					}
					if err := s.Sync(); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if i, ok := sameBits(got, want); !ok {
						t.Fatalf("%s: element %d (token %d, row %d) is %v (%08x) on the GPU, %v (%08x) on the CPU",
							name, i, i/sh.hidden, i%sh.hidden, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
					}
				}
			}
		}
	}
}

func TestMatMulIsTheCPUsOnLongRows(t *testing.T) {
	d := testDevice(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(3, 5))
	for _, sh := range []struct{ rows, cols, n int }{{3, 14336, 3}, {4096, 31, 2}, {1, 100003, 9}} {
		w := randomMatrix(rng, kernels.BF16, sh.rows, sh.cols, true)
		x := randomVectors(rng, sh.n*sh.cols, true)
		want := make([]float32, sh.n*sh.rows)
		kernels.MatMul(want, w, x, sh.n)
		out := poisoned(t, d, len(want))
		if err := s.MatMul(Matrix{upload(t, d, s, w.Data), w.DType, w.Rows, w.Cols, 0}, upload(t, d, s, bytesOf(x)), out, sh.n); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, len(want))
		if err := s.CopyToHost(bytesOf(got), out); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		if i, ok := sameBits(got, want); !ok {
			t.Fatalf("%dx%d, %d vectors: element %d is %08x on the GPU, %08x on the CPU", sh.rows, sh.cols, sh.n, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
}

// TestSwiGLUIsTheCPUsOnEveryKindOfInput holds the GPU's Exp and SiLU to
// the CPU's on the special values, the cutoffs and their neighbours, a
// dense sweep of the range where exp is finite and nonzero, and random
// bit patterns (NaNs and infinities included).
func TestSwiGLUIsTheCPUsOnEveryKindOfInput(t *testing.T) {
	d := testDevice(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var gate []float32
	gate = append(gate, special...)
	gate = append(gate, float32(math.NaN()))
	for _, c := range []float32{88.8, -88.8, 104, -104, 88.72284, -88.72284, 87.33655, -87.33655, 103.97208, -103.97208, 0.5, -0.5, 1e-8, -1e-8} {
		for u := math.Float32bits(c) - 4; u <= math.Float32bits(c)+4; u++ {
			gate = append(gate, math.Float32frombits(u))
		}
	}
	for v := -110.0; v <= 100; v += 1.0 / 1024 {
		gate = append(gate, float32(v))
	}
	rng := rand.New(rand.NewPCG(11, 13))
	for range 1 << 20 {
		gate = append(gate, math.Float32frombits(rng.Uint32()))
	}
	up := make([]float32, len(gate))
	for i := range up {
		up[i] = float32(rng.NormFloat64())
		if i%7 == 0 {
			up[i] = math.Float32frombits(rng.Uint32())
		}
	}
	want := make([]float32, len(gate))
	kernels.SwiGLU(want, gate, up)
	out := poisoned(t, d, len(gate))
	if err := s.SwiGLU(out, upload(t, d, s, bytesOf(gate)), upload(t, d, s, bytesOf(up)), len(gate)); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(gate))
	if err := s.CopyToHost(bytesOf(got), out); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if i, ok := sameBits(got, want); !ok {
		t.Fatalf("SwiGLU(%v [%08x], %v): GPU %v (%08x), CPU %v (%08x)", gate[i], math.Float32bits(gate[i]), up[i], got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
	}
	t.Logf("%d inputs, every output the CPU's bits", len(gate))
}

func TestOpenNamesWhatIsWrong(t *testing.T) {
	testDevice(t)
	if _, err := Open(1 << 20); err == nil {
		t.Fatal("opening device 1048576 succeeded")
	} else {
		t.Log(err)
	}
}

// randomMXFP4 is a rows x cols MXFP4 matrix: any codes, scales around
// 2^0, or when wild any scale byte (2^-127 to 255's infinities) on some
// blocks.
func randomMXFP4(rng *rand.Rand, rows, cols int, wild bool) kernels.Matrix {
	m := kernels.Matrix{DType: kernels.MXFP4, Rows: rows, Cols: cols, Data: make([]byte, rows*cols/2), Scales: make([]byte, rows*cols/32)}
	for i := range m.Data {
		m.Data[i] = byte(rng.IntN(256))
	}
	for i := range m.Scales {
		m.Scales[i] = byte(120 + rng.IntN(8))
		if wild && rng.IntN(8) == 0 {
			m.Scales[i] = byte(rng.IntN(256))
		}
	}
	return m
}

// device is m in device memory: its weights, and its scales where its
// format has them.
func device(t *testing.T, d *Device, s *Stream, m kernels.Matrix) Matrix {
	dm := Matrix{Ptr: upload(t, d, s, m.Data), DType: m.DType, Rows: m.Rows, Cols: m.Cols}
	if m.DType.HasScales() {
		dm.Scales = upload(t, d, s, m.Scales)
	}
	return dm
}

// gpuMatMul runs MatMul on the GPU and reads the result back.
func gpuMatMul(t *testing.T, d *Device, s *Stream, w kernels.Matrix, x []float32, n int) []float32 {
	t.Helper()
	out := poisoned(t, d, n*w.Rows)
	if err := s.MatMul(device(t, d, s, w), upload(t, d, s, bytesOf(x)), out, n); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n*w.Rows)
	if err := s.CopyToHost(bytesOf(got), out); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestMatMulMXFP4IsTheCPUsOnEveryCodeAndScale: every code under every
// scale byte (256 rows of 16 codes twice, rows of 32) and gpt-oss's row
// length, on one token and on batches, with special inputs: kernels'
// MatMul on the dequantized values, bit for bit.
func TestMatMulMXFP4IsTheCPUsOnEveryCodeAndScale(t *testing.T) {
	d := testDevice(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(17, 19))
	every := kernels.Matrix{DType: kernels.MXFP4, Rows: 256, Cols: 32, Data: make([]byte, 256*16), Scales: make([]byte, 256)}
	for r := range 256 {
		every.Scales[r] = byte(r)
		for j := range 16 {
			every.Data[16*r+j] = byte(j) | byte(15-j)<<4
		}
	}
	cases := []struct {
		name string
		w    kernels.Matrix
	}{{"every code and scale", every}, {"gpt-oss gate_up rows", randomMXFP4(rng, 96, 2880, true)}, {"wide scales", randomMXFP4(rng, 33, 320, true)}}
	for _, c := range cases {
		for _, n := range []int{1, 2, 4, 5, 8, 9} {
			x := randomVectors(rng, n*c.w.Cols, true)
			want := make([]float32, n*c.w.Rows)
			kernels.MatMul(want, c.w, x, n)
			if i, ok := sameBits(gpuMatMul(t, d, s, c.w, x, n), want); !ok {
				t.Fatalf("%s, n=%d: element %d (token %d, row %d) differs from the CPU's %08x", c.name, n, i, i/c.w.Rows, i%c.w.Rows, math.Float32bits(want[i]))
			}
		}
	}
}

// randomFused is a gpt-oss expert of hidden x inter: GateUp and Down in
// dt (MXFP4 or a float format), biases in bdt.
func randomFused(rng *rand.Rand, dt, bdt kernels.DType, hidden, inter int, wild bool) model.Expert {
	mat := func(rows, cols int) kernels.Matrix {
		if dt == kernels.MXFP4 {
			return randomMXFP4(rng, rows, cols, wild)
		}
		return randomMatrix(rng, dt, rows, cols, wild)
	}
	return model.Expert{GateUp: mat(2*inter, hidden), Down: mat(hidden, inter),
		GateUpBias: randomMatrix(rng, bdt, 1, 2*inter, wild), DownBias: randomMatrix(rng, bdt, 1, hidden, wild), Limit: 7, Alpha: 1.702}
}

// TestForwardFusedIsTheCPUExpertBitForBit: gpt-oss's experts (gate and
// up interleaved, biases, the clamped activation), MXFP4 as published
// and BF16, at small shapes and gpt-oss-120b's, on one token and on
// batches: model.Expert.Forward's bits.
func TestForwardFusedIsTheCPUExpertBitForBit(t *testing.T) {
	d := testDevice(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(23, 29))
	shapes := []struct{ hidden, inter int }{{32, 32}, {64, 96}, {160, 32}, {2880, 2880}}
	for _, dt := range []kernels.DType{kernels.MXFP4, kernels.BF16} {
		for _, bdt := range []kernels.DType{kernels.BF16, kernels.F32} {
			for _, sh := range shapes {
				for _, n := range []int{1, 3, 4, 8, 9} {
					for _, wild := range []bool{false, true} {
						if sh.hidden > 1000 && (wild || n > 4 || bdt != kernels.BF16) {
							continue // the real shape: as gpt-oss runs it
						}
						name := fmt.Sprintf("%v/bias %v/%dx%d/n%d/wild=%v", dt, bdt, sh.hidden, sh.inter, n, wild)
						ex := randomFused(rng, dt, bdt, sh.hidden, sh.inter, wild)
						x := randomVectors(rng, n*sh.hidden, wild)
						want := make([]float32, n*sh.hidden)
						ex.Forward(want, x, n, &model.ExpertScratch{})
						g := FusedExpert{GateUp: device(t, d, s, ex.GateUp), Down: device(t, d, s, ex.Down),
							GateUpBias: device(t, d, s, ex.GateUpBias), DownBias: device(t, d, s, ex.DownBias), Limit: ex.Limit, Alpha: ex.Alpha}
						xd, gu, act, out := upload(t, d, s, bytesOf(x)), poisoned(t, d, 2*n*sh.inter), poisoned(t, d, n*sh.inter), poisoned(t, d, n*sh.hidden)
						if err := s.ForwardFused(g, xd, gu, act, out, n); err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						got := make([]float32, n*sh.hidden)
						if err := s.CopyToHost(bytesOf(got), out); err != nil {
							t.Fatal(err)
						}
						if err := s.Sync(); err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						if i, ok := sameBits(got, want); !ok {
							t.Fatalf("%s: element %d (token %d, row %d) is %v (%08x) on the GPU, %v (%08x) on the CPU",
								name, i, i/sh.hidden, i%sh.hidden, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
						}
					}
				}
			}
		}
	}
}

// TestClampedSwiGLUIsTheCPUsOnEveryKindOfInput holds gpt-oss's clamped
// activation to the CPU's on special values, NaNs, the clamp's limits
// and their neighbours, a sweep through the range and random bits.
func TestClampedSwiGLUIsTheCPUsOnEveryKindOfInput(t *testing.T) {
	d := testDevice(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const limit, alpha = 7, 1.702
	var vals []float32
	vals = append(vals, special...)
	vals = append(vals, float32(math.NaN()), float32(math.Copysign(math.NaN(), -1)))
	for _, c := range []float32{limit, -limit, 88.8 / alpha, -88.8 / alpha, 104 / alpha, -104 / alpha, 0.5, -1} {
		for u := math.Float32bits(c) - 3; u <= math.Float32bits(c)+3; u++ {
			vals = append(vals, math.Float32frombits(u))
		}
	}
	for v := -80.0; v <= 80; v += 1.0 / 256 {
		vals = append(vals, float32(v))
	}
	rng := rand.New(rand.NewPCG(31, 37))
	for range 1 << 18 {
		vals = append(vals, math.Float32frombits(rng.Uint32()))
	}
	// every value as a gate beside a random up, and as an up beside a
	// random gate
	gu := make([]float32, 0, 4*len(vals))
	for _, v := range vals {
		gu = append(gu, v, float32(rng.NormFloat64()*8), float32(rng.NormFloat64()*8), v)
	}
	n := len(gu) / 2
	want := make([]float32, n)
	kernels.ClampedSwiGLU(want, gu, limit, alpha)
	out := poisoned(t, d, n)
	if err := s.ClampedSwiGLU(out, upload(t, d, s, bytesOf(gu)), n, limit, alpha); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := s.CopyToHost(bytesOf(got), out); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if i, ok := sameBits(got, want); !ok {
		t.Fatalf("ClampedSwiGLU(gate %08x, up %08x): GPU %08x, CPU %08x", math.Float32bits(gu[2*i]), math.Float32bits(gu[2*i+1]), math.Float32bits(got[i]), math.Float32bits(want[i]))
	}
	t.Logf("%d inputs, every output the CPU's bits", n)
}
