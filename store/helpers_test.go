package store

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

// profile says what a random tensor is made of.
type profile int

const (
	weights  profile = iota // trained-like: N(0, 0.02)
	specials                // weights mixed with zeros, subnormals, infinities, NaN payloads, extremes
	noise                   // uniformly random bits: incompressible exponents
	zeros                   // all +0: one exponent value (run-length blocks)
)

var profiles = []profile{weights, specials, noise, zeros}

func (p profile) String() string {
	return [...]string{"weights", "specials", "noise", "zeros"}[p]
}

// specialBits are interesting bit patterns per dtype: signed zeros,
// smallest and largest subnormals, smallest normal, largest finite,
// infinities, quiet and signalling NaNs with payloads.
var specialBits = map[kernels.DType][]uint32{
	kernels.BF16: {0x0000, 0x8000, 0x0001, 0x807f, 0x007f, 0x0080, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x7fff, 0xffff, 0x3f80},
	kernels.F16:  {0x0000, 0x8000, 0x0001, 0x83ff, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x7fff, 0xffff, 0x3c00},
	kernels.F32:  {0, 0x80000000, 1, 0x807fffff, 0x007fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00123, 0x7f800001, 0x7fffffff, 0xffffffff, 0x3f800000},
}

// randomTensor returns n elements of dt drawn from p.
func randomTensor(rng *rand.Rand, dt kernels.DType, n int, p profile) []byte {
	es := dt.Size()
	b := make([]byte, n*es)
	for i := range n {
		var v uint32
		switch p {
		case noise:
			v = rng.Uint32()
		case zeros:
			v = 0
		case specials:
			if rng.IntN(3) == 0 {
				sp := specialBits[dt]
				v = sp[rng.IntN(len(sp))]
				break
			}
			fallthrough
		case weights:
			f := float32(0.02 * rng.NormFloat64())
			switch dt {
			case kernels.BF16:
				v = uint32(kernels.F32ToBF16(f))
			case kernels.F16:
				v = uint32(kernels.F32ToF16(f))
			default:
				v = math.Float32bits(f)
			}
		}
		switch es {
		case 2:
			binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
		case 4:
			binary.LittleEndian.PutUint32(b[4*i:], v)
		}
	}
	return b
}

// testStore describes a store of random tensors to write in a test.
type testStore struct {
	layers, experts int
	layerIDs        []int // the layers with experts, when not 0..layers-1 (a model with dense layers)
	dtype           kernels.DType
	rows, cols      func(l, e int, k Kind) int
	profile         func(l, e int, k Kind) profile
	seed            uint64
	form            Form // 0: FormSwiGLU
}

// build draws the tensors.
func (ts testStore) build() build {
	rng := rand.New(rand.NewPCG(ts.seed, 7))
	b := build{layers: ts.layerIDs, experts: ts.experts, form: ts.form}
	if b.form == 0 {
		b.form = FormSwiGLU
	}
	if b.form == FormClampedSwiGLU {
		b.limit, b.alpha = 7, 1.702
	}
	if b.layers == nil {
		for l := range ts.layers {
			b.layers = append(b.layers, l)
		}
	}
	b.identity[0] = byte(ts.seed)
	b.identity[31] = 0xa5
	for _, l := range b.layers {
		for e := range ts.experts {
			for _, k := range b.form.kinds() {
				r, c := ts.rows(l, e, k), ts.cols(l, e, k)
				p := weights
				if ts.profile != nil {
					p = ts.profile(l, e, k)
				}
				b.tensors = append(b.tensors, source{l, e, k, kernels.Matrix{DType: ts.dtype, Rows: r, Cols: c,
					Data: randomTensor(rng, ts.dtype, r*c, p)}})
			}
		}
	}
	return b
}

// write builds and writes the store into a fresh directory.
func (ts testStore) write(t testing.TB, opt ConvertOptions) (string, build) {
	t.Helper()
	b := ts.build()
	dir := filepath.Join(t.TempDir(), "store")
	if err := writeStore(context.Background(), dir, b, opt); err != nil {
		t.Fatal(err)
	}
	return dir, b
}

func fixed(n int) func(int, int, Kind) int { return func(int, int, Kind) int { return n } }

// smallStore is 2 layers x 2 experts of 24x40 BF16 weights.
var smallStore = testStore{layers: 2, experts: 2, dtype: kernels.BF16, rows: fixed(24), cols: fixed(40), seed: 1}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 11)) }
