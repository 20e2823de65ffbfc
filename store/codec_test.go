package store

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

var dtypes = []kernels.DType{kernels.BF16, kernels.F16, kernels.F32}

// oddSizes are element counts around the SIMD (16), SWAR (8) and block
// boundaries.
var oddSizes = []int{0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 255, 1000, 4097}

// TestMergeInvertsSplitInPlace checks merge(split(x)) == x for every dtype
// and profile, with the sign-mantissa bytes in the tail of the output as
// the reader lays them out, and the SIMD merge against the portable one.
func TestMergeInvertsSplitInPlace(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range dtypes {
		for _, p := range profiles {
			for _, n := range oddSizes {
				raw := randomTensor(rng, dt, n, p)
				exp, sm := make([]byte, n), make([]byte, n*smWidth(dt))
				split(dt, exp, sm, raw)
				out := make([]byte, len(raw))
				copy(out[n:], sm)
				merge(dt, out, exp, out[n:])
				if !bytes.Equal(out, raw) {
					t.Fatalf("%v %v n=%d: in-place merge differs from the original", dt, p, n)
				}
				if dt == kernels.BF16 {
					ref := make([]byte, len(raw))
					mergeBF16Go(ref, exp, sm)
					if !bytes.Equal(ref, raw) {
						t.Fatalf("%v %v n=%d: portable merge differs from the original", dt, p, n)
					}
				}
			}
		}
	}
}

// TestSplitPutsExponentInTheCodedStream pins the bit layout of FORMAT.md.
func TestSplitPutsExponentInTheCodedStream(t *testing.T) {
	cases := []struct {
		dt       kernels.DType
		raw      []byte
		exp      byte
		sm       []byte
		describe string
	}{
		{kernels.BF16, []byte{0x80, 0x3f}, 0x7f, []byte{0x00}, "1.0: exponent 127"},
		{kernels.BF16, []byte{0x81, 0xbf}, 0x7f, []byte{0x03}, "-1.0078125: mantissa 1, sign in bit 0"},
		{kernels.F16, []byte{0x00, 0x3c}, 0x3c, []byte{0x00}, "1.0: high byte"},
		{kernels.F32, []byte{0x01, 0x00, 0x80, 0xbf}, 0x7f, []byte{0x03, 0x00, 0x00}, "-1.0000001"},
	}
	for _, c := range cases {
		exp, sm := make([]byte, 1), make([]byte, smWidth(c.dt))
		split(c.dt, exp, sm, c.raw)
		if exp[0] != c.exp || !bytes.Equal(sm, c.sm) {
			t.Errorf("%v %s: exponent %#x sm %x, want %#x %x", c.dt, c.describe, exp[0], sm, c.exp, c.sm)
		}
	}
}

// TestShardRoundTripIsBitExact codes shards through every block mode
// (huff0, run, raw) with odd sizes and block sizes.
func TestShardRoundTripIsBitExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var enc encoder
	var dec decoder
	for _, dt := range dtypes {
		for _, p := range profiles {
			for _, n := range []int{1, 5, 17, 300, 5000, 70000} {
				for _, block := range []int{1, 7, 256, defaultBlockElems} {
					if n/block > 2000 {
						continue
					}
					name := fmt.Sprintf("%v/%v/n=%d/block=%d", dt, p, n, block)
					raw := randomTensor(rng, dt, n, p)
					var hist [256]uint64
					expChunk, sm, err := enc.encodeShard(dt, raw, block, &hist)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					var count uint64
					for _, c := range hist {
						count += c
					}
					if count != uint64(n) {
						t.Fatalf("%s: histogram counts %d, want %d", name, count, n)
					}
					out := make([]byte, len(raw))
					copy(out[n:], sm)
					if err := dec.decodeShard(dt, expChunk, out, n, block); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if !bytes.Equal(out, raw) {
						t.Fatalf("%s: decoded bytes differ", name)
					}
				}
			}
		}
	}
}

// TestCodedWeightsApproachEntropyBound: N(0, 0.02) BF16 should code within
// 1% of the bound (FORMAT.md's measurements: about 0.66 of BF16).
func TestCodedWeightsApproachEntropyBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 1 << 18
	raw := randomTensor(rng, kernels.BF16, n, weights)
	var enc encoder
	var hist [256]uint64
	expChunk, sm, err := enc.encodeShard(kernels.BF16, raw, defaultBlockElems, &hist)
	if err != nil {
		t.Fatal(err)
	}
	bound := float64(n)*entropy(&hist)/8 + float64(len(sm))
	stored := float64(len(expChunk) + len(sm))
	if stored > 1.01*bound || stored/float64(len(raw)) > 0.68 {
		t.Fatalf("stored %.4f of BF16, bound %.4f", stored/float64(len(raw)), bound/float64(len(raw)))
	}
}
