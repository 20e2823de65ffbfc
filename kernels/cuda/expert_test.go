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

					g := Expert{Gate: Matrix{upload(t, d, s, ex.Gate.Data), dt, sh.inter, sh.hidden},
						Up:   Matrix{upload(t, d, s, ex.Up.Data), dt, sh.inter, sh.hidden},
						Down: Matrix{upload(t, d, s, ex.Down.Data), dt, sh.hidden, sh.inter}}
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
		if err := s.MatMul(Matrix{upload(t, d, s, w.Data), w.DType, w.Rows, w.Cols}, upload(t, d, s, bytesOf(x)), out, sh.n); err != nil {
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
