package kernels

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json from this machine's results")

const goldenFile = "testdata/golden.json"

// TestGoldenBitsAcrossArchitectures holds the "one arithmetic" invariant
// itself: every portable kernel, on fixed inputs, must produce exactly the
// bits recorded in testdata/golden.json, whatever the architecture or the
// path (pure Go, assembly, GPU). Inputs are built from integer bits only
// (no math functions, whose results may differ between architectures), and
// none produces a NaN (NaN payloads are not specified). Run it on every
// architecture, e.g. GOARCH=arm64 go test -c and qemu-aarch64; regenerate
// with -update only when a definition changes on purpose.
func TestGoldenBitsAcrossArchitectures(t *testing.T) {
	forEachPath(t, testGoldenBitsAcrossArchitectures)
}

func testGoldenBitsAcrossArchitectures(t *testing.T) {
	got := goldenResults()
	if *update {
		if Path() != goPath.name {
			t.Skip("-update records the pure-Go path's results")
		}
		b, err := json.MarshalIndent(got, "", "\t")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenFile, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("%v (create it with go test -run Golden -update)", err)
	}
	var want map[string]string
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range got {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		if w, ok := want[name]; !ok {
			t.Errorf("%s: no golden value (run with -update)", name)
		} else if got[name] != w {
			t.Errorf("%s: bits hash %s, golden %s", name, got[name], w)
		}
	}
	if len(want) != len(got) {
		t.Errorf("golden file has %d cases, test computes %d", len(want), len(got))
	}
}

// portableWide returns floats of magnitude 2^-20..2^21 with random sign and
// mantissa, built from bits.
func portableWide(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		r := rng.Uint32()
		exp := 127 - 20 + rng.Uint32N(41)
		v[i] = math.Float32frombits(r&0x80000000 | exp<<23 | r&0x7fffff)
	}
	return v
}

// portableUnit returns floats uniform on [-scale, scale), exactly.
func portableUnit(rng *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(int32(rng.Uint32()>>8)-1<<23) * (scale / (1 << 23))
	}
	return v
}

func hashBits(vals ...[]float32) string {
	h := sha256.New()
	var b [4]byte
	for _, v := range vals {
		for _, f := range v {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(f))
			h.Write(b[:])
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

func hashU16(v []uint16) string {
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, v)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

func goldenResults() map[string]string {
	rng := rand.New(rand.NewPCG(2026, 11))
	res := map[string]string{}
	for _, dt := range dtypes {
		for _, s := range []struct{ rows, cols int }{{3, 17}, {64, 1000}, {40, 4099}} {
			scale := float32(1)
			if dt == F16 {
				scale = 1.0 / 256 // keep F16 weights in range
			}
			w := portableUnit(rng, s.rows*s.cols, 4*scale)
			m := Matrix{DType: dt, Rows: s.rows, Cols: s.cols, Data: encode(dt, w)}
			x := portableWide(rng, s.cols)
			out := make([]float32, s.rows)
			MatVec(out, m, x)
			res[fmt.Sprintf("MatVec/%v/%dx%d", dt, s.rows, s.cols)] = hashBits(out)
			xs := portableWide(rng, 3*s.cols)
			outs := make([]float32, 3*s.rows)
			MatMul(outs, m, xs, 3)
			res[fmt.Sprintf("MatMul/%v/%dx%d/n=3", dt, s.rows, s.cols)] = hashBits(outs)
		}
	}
	a, b := portableWide(rng, 4099), portableWide(rng, 4099)
	res["Dot/4099"] = hashBits([]float32{Dot(a, b), Dot(a[:15], b[:15]), Sum(a)})

	var ex []float32
	for bits := uint64(0); bits < 1<<32; bits += 65537 {
		f := math.Float32frombits(uint32(bits))
		if f == f {
			ex = append(ex, Exp(f))
		}
	}
	res["Exp/stride"] = hashBits(ex)
	xs := portableUnit(rng, 20000, 110)
	si := make([]float32, len(xs))
	for i, x := range xs {
		si[i] = SiLU(x)
	}
	res["SiLU"] = hashBits(si)
	gate, up := portableUnit(rng, 14336, 8), portableUnit(rng, 14336, 2)
	sw := make([]float32, len(gate))
	SwiGLU(sw, gate, up)
	res["SwiGLU"] = hashBits(sw)

	d, y := portableUnit(rng, 4096, 3), portableUnit(rng, 4096, 3)
	Axpy(d, 0.7071068, y)
	res["Axpy"] = hashBits(d)
	Add(d, y)
	res["Add"] = hashBits(d)

	logits := portableUnit(rng, 1000, 20)
	Softmax(logits)
	res["Softmax/1000"] = hashBits(logits)
	hid, nw := portableWide(rng, 4096), portableUnit(rng, 4096, 2)
	RMSNorm(hid, hid, nw, 1e-5)
	res["RMSNorm/4096"] = hashBits(hid)
	q := portableUnit(rng, 32*128, 4)
	c, s := portableUnit(rng, 64, 1), portableUnit(rng, 64, 1)
	RoPE(q, 32, 128, c, s)
	res["RoPE/32x128"] = hashBits(q)

	fs := portableWide(rng, 10000)
	fs = append(fs, portableUnit(rng, 10000, 1e-4)...) // F16 subnormals
	bf, hf := make([]uint16, len(fs)), make([]uint16, len(fs))
	for i, f := range fs {
		bf[i], hf[i] = F32ToBF16(f), F32ToF16(f)
	}
	res["F32ToBF16"] = hashU16(bf)
	res["F32ToF16"] = hashU16(hf)
	var wide []float32
	for h := range 1 << 16 {
		if f := F16ToF32(uint16(h)); f == f {
			wide = append(wide, f)
		}
	}
	res["F16ToF32"] = hashBits(wide)
	quantGolden(res)
	return res
}
