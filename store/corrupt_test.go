package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

// chunkSite is one chunk of a store, named as errors should name it.
type chunkSite struct {
	layer, expert int
	kind          Kind
	shard         int
	part          string
	ref           ChunkRef
}

func chunkSites(t *testing.T, dir string) []chunkSite {
	t.Helper()
	st, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var sites []chunkSite
	for _, te := range st.ix.tensors {
		for s, sh := range te.shards {
			sites = append(sites,
				chunkSite{te.layer, te.expert, te.kind, s, "exponent", sh.exp},
				chunkSite{te.layer, te.expert, te.kind, s, "sign-mantissa", sh.sm})
		}
	}
	return sites
}

// names reports whether err names the site's tensor, as a TensorError and
// in its text.
func (c chunkSite) names(err error) bool {
	var te *TensorError
	want := fmt.Sprintf("layer %d expert %d %v", c.layer, c.expert, c.kind)
	return errors.As(err, &te) && te.Layer == c.layer && te.Expert == c.expert && te.Kind == c.kind &&
		te.Shard == c.shard && strings.Contains(err.Error(), want)
}

func readExpert(st *Store, l, e int) error {
	n, err := st.ExpertBytes(l, e)
	if err != nil {
		return err
	}
	_, err = st.ReadExpert(context.Background(), l, e, make([]byte, n))
	return err
}

// TestStoreDetectsFlippedByteInEveryChunk flips the first, a middle and
// the last byte of every chunk in turn: reading that expert fails with
// ErrChecksum naming layer, expert, tensor, shard and chunk, and the
// other experts still read.
func TestStoreDetectsFlippedByteInEveryChunk(t *testing.T) {
	dir, _ := smallStore.write(t, ConvertOptions{Shards: 2})
	chunkPath := filepath.Join(dir, ChunkFile)
	orig, err := os.ReadFile(chunkPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunkSites(t, dir) {
		for _, at := range []int{0, c.ref.Size / 2, c.ref.Size - 1} {
			bad := append([]byte(nil), orig...)
			bad[c.ref.Offset+int64(at)] ^= 0x10
			if err := os.WriteFile(chunkPath, bad, 0o644); err != nil {
				t.Fatal(err)
			}
			st, err := Open(dir, Options{VerifyDecoded: at == 0})
			if err != nil {
				t.Fatal(err)
			}
			err = readExpert(st, c.layer, c.expert)
			if !errors.Is(err, ErrChecksum) || !c.names(err) || !strings.Contains(err.Error(), c.part+" chunk") {
				t.Fatalf("flipped byte %d of %+v: got %v", at, c, err)
			}
			if err := readExpert(st, 1-c.layer, c.expert); err != nil {
				t.Fatalf("flipped byte in layer %d broke layer %d: %v", c.layer, 1-c.layer, err)
			}
			verr := st.Verify(context.Background(), nil)
			if !errors.Is(verr, ErrChecksum) || !c.names(verr) {
				t.Fatalf("Verify after flipping %+v: %v", c, verr)
			}
			st.Close()
		}
	}
}

// TestStoreDetectsTruncatedChunkFile cuts the chunk file inside chunks
// all over the file: Open refuses it naming the first tensor cut off. A
// file that shrinks after Open fails the read, naming the tensor.
func TestStoreDetectsTruncatedChunkFile(t *testing.T) {
	dir, _ := smallStore.write(t, ConvertOptions{Shards: 2})
	chunkPath := filepath.Join(dir, ChunkFile)
	orig, _ := os.ReadFile(chunkPath)
	sites := chunkSites(t, dir)
	for i, c := range sites {
		if i%5 != 0 && i != len(sites)-1 {
			continue
		}
		cut := c.ref.Offset + int64(c.ref.Size)/2
		if err := os.WriteFile(chunkPath, orig[:cut], 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(dir, Options{})
		if !errors.Is(err, ErrTruncated) || !c.names(err) {
			t.Fatalf("cut inside %+v: Open gave %v", c, err)
		}
	}
	if err := os.WriteFile(chunkPath, orig[:10], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrTruncated) {
		t.Fatalf("10-byte chunk file: %v", err)
	}

	if err := os.WriteFile(chunkPath, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	last := sites[len(sites)-1]
	if err := os.Truncate(chunkPath, last.ref.Offset+1); err != nil {
		t.Fatal(err)
	}
	if err := readExpert(st, last.layer, last.expert); !errors.Is(err, ErrTruncated) || !last.names(err) {
		t.Fatalf("file truncated after Open: %v", err)
	}
}

// TestCheckSeesTheChunkFileAtItsPath: Check passes on a whole store,
// fails naming the store and the cut when the chunk file is cut short
// under the open store (or removed), and passes again once a good copy is
// renamed over the path, the store then reading every expert from the
// new file.
func TestCheckSeesTheChunkFileAtItsPath(t *testing.T) {
	dir, _ := smallStore.write(t, ConvertOptions{Shards: 2})
	chunkPath := filepath.Join(dir, ChunkFile)
	orig, _ := os.ReadFile(chunkPath)
	st, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Check(); err != nil {
		t.Fatalf("a whole store: %v", err)
	}
	last := chunkSites(t, dir)
	lastSite := last[len(last)-1]
	if err := os.Truncate(chunkPath, lastSite.ref.Offset+1); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(); !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("chunk file cut short: Check gave %v", err)
	}
	if err := os.Remove(chunkPath); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("chunk file removed: Check gave %v", err)
	}
	fixed := filepath.Join(t.TempDir(), "chunks")
	if err := os.WriteFile(fixed, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fixed, chunkPath); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(); err != nil {
		t.Fatalf("a good copy renamed over it: %v", err)
	}
	for _, c := range last {
		if err := readExpert(st, c.layer, c.expert); err != nil {
			t.Fatalf("after the good copy came back: %v", err)
		}
	}
}

// TestOpenRefusesWrongVersionOtherModelAndDamagedIndex.
func TestOpenRefusesWrongVersionOtherModelAndDamagedIndex(t *testing.T) {
	dir, b := smallStore.write(t, ConvertOptions{})
	indexPath, chunkPath := filepath.Join(dir, IndexFile), filepath.Join(dir, ChunkFile)
	index, _ := os.ReadFile(indexPath)
	chunks, _ := os.ReadFile(chunkPath)
	restore := func() {
		os.WriteFile(indexPath, index, 0o644)
		os.WriteFile(chunkPath, chunks, 0o644)
	}

	other := b.identity
	other[5] ^= 1
	if _, err := Open(dir, Options{Identity: other}); !errors.Is(err, ErrModelMismatch) || !strings.Contains(err.Error(), dir) {
		t.Errorf("other model: %v", err)
	}
	if st, err := Open(dir, Options{Identity: b.identity}); err != nil {
		t.Errorf("own model: %v", err)
	} else {
		st.Close()
	}

	v2 := append([]byte(nil), index...)
	binary.LittleEndian.PutUint32(v2[8:], Version+1)
	os.WriteFile(indexPath, v2, 0o644)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), fmt.Sprintf("version %d", Version+1)) {
		t.Errorf("index version %d: %v", Version+1, err)
	}
	restore()
	c2 := append([]byte(nil), chunks...)
	binary.LittleEndian.PutUint32(c2[8:], Version+1)
	os.WriteFile(chunkPath, c2, 0o644)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrVersion) {
		t.Errorf("chunk file version %d: %v", Version+1, err)
	}
	restore()

	for _, cut := range []int{0, 10, len(index) / 2, len(index) - 1} {
		os.WriteFile(indexPath, index[:cut], 0o644)
		if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("index cut to %d bytes: %v", cut, err)
		}
	}
	restore()

	// Any single flipped byte of the index is refused.
	for i := range index {
		bad := append([]byte(nil), index...)
		bad[i] ^= 0x01
		os.WriteFile(indexPath, bad, 0o644)
		if st, err := Open(dir, Options{}); err == nil {
			st.Close()
			t.Fatalf("index with byte %d flipped was accepted", i)
		} else if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
			t.Fatalf("index with byte %d flipped: %v", i, err)
		}
	}
	restore()

	// A chunk file from a store of another model is refused.
	otherDir, _ := testStore{layers: 2, experts: 2, dtype: kernels.BF16, rows: fixed(24), cols: fixed(40), seed: 9}.write(t, ConvertOptions{})
	foreign, _ := os.ReadFile(filepath.Join(otherDir, ChunkFile))
	os.WriteFile(chunkPath, foreign, 0o644)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("foreign chunk file: %v", err)
	}
	restore()
	os.WriteFile(chunkPath, append(append([]byte(nil), chunks...), 0), 0o644)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("chunk file with a trailing byte: %v", err)
	}
}

// FuzzParseIndex: no index bytes make the parser panic, and whatever it
// accepts is internally consistent enough to find every tensor.
func FuzzParseIndex(f *testing.F) {
	for _, ts := range []testStore{smallStore, {layers: 1, experts: 1, dtype: kernels.F32, rows: fixed(3), cols: fixed(5), seed: 2},
		{layers: 2, experts: 2, dtype: kernels.BF16, rows: fixed(4), cols: fixed(6), seed: 3, form: FormClampedSwiGLU}} {
		b := ts.build()
		dir := filepath.Join(f.TempDir(), fmt.Sprint(ts.seed))
		if err := writeStore(context.Background(), dir, b, ConvertOptions{Shards: 3}); err != nil {
			f.Fatal(err)
		}
		raw, _ := os.ReadFile(filepath.Join(dir, IndexFile))
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		// Let mutations through the checksum so the parser's checks run.
		if len(raw) >= indexHeaderLen+4 {
			binary.LittleEndian.PutUint32(raw[len(raw)-4:], crc(raw[:len(raw)-4]))
		}
		ix, err := parseIndex(raw)
		if err != nil {
			return
		}
		for l := range ix.layers {
			for e := range ix.experts {
				for _, k := range ix.form.kinds() {
					if _, err := ix.find(l, e, k); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	})
}

// FuzzDecodeShard: no exponent chunk makes the decoder panic or write
// outside the shard.
func FuzzDecodeShard(f *testing.F) {
	var enc encoder
	var hist [256]uint64
	for i, p := range profiles {
		raw := randomTensor(newRand(uint64(i)), kernels.BF16, 300, p)
		exp, _, err := enc.encodeShard(kernels.BF16, raw, 128, &hist)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(exp, uint16(300), uint16(128), uint8(kernels.BF16))
	}
	f.Fuzz(func(t *testing.T, chunk []byte, n, block uint16, dt uint8) {
		d := kernels.DType(dt % 3)
		if block == 0 {
			block = 1
		}
		out := make([]byte, int(n)*d.Size()+16)
		var dec decoder
		dec.decodeShard(d, chunk, out[:int(n)*d.Size()], int(n), int(block))
		for _, c := range out[int(n)*d.Size():] {
			if c != 0 {
				t.Fatal("decoder wrote past the shard")
			}
		}
	})
}
