package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

// TestStoreReturnsOriginalBytes writes stores of every dtype with odd
// shapes, mixed profiles and K = 1..16, and reads every tensor back both
// per tensor and per expert.
func TestStoreReturnsOriginalBytes(t *testing.T) {
	shapes := [][2]int{{1, 1}, {3, 5}, {17, 9}, {33, 31}, {64, 70}}
	for _, dt := range dtypes {
		for k := 1; k <= 16; k++ {
			ts := testStore{layers: 2, experts: 3, dtype: dt, seed: uint64(k),
				rows: func(l, e int, kind Kind) int { return shapes[(l*3+e+int(kind)+k)%len(shapes)][0] },
				cols: func(l, e int, kind Kind) int { return shapes[(l*3+e+int(kind)+k)%len(shapes)][1] },
				profile: func(l, e int, kind Kind) profile {
					return profiles[(l+e+int(kind)+k)%len(profiles)]
				},
			}
			dir, b := ts.write(t, ConvertOptions{Shards: k, blockElems: 97})
			st, err := Open(dir, Options{Identity: b.identity, Parallelism: 1 + k%3, VerifyDecoded: k%2 == 0})
			if err != nil {
				t.Fatal(err)
			}
			checkStore(t, fmt.Sprintf("%v K=%d", dt, k), st, b)
			st.Close()
		}
	}
}

// checkStore reads every tensor and expert of st and compares with b.
func checkStore(t *testing.T, name string, st *Store, b build) {
	t.Helper()
	ctx := context.Background()
	for _, s := range b.tensors {
		dst := make([]byte, len(s.m.Data))
		m, err := st.ReadTensor(ctx, s.layer, s.expert, s.kind, dst)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(m.Data, s.m.Data) || m.Rows != s.m.Rows || m.Cols != s.m.Cols || m.DType != s.m.DType {
			t.Fatalf("%s: layer %d expert %d %v: wrong tensor back", name, s.layer, s.expert, s.kind)
		}
	}
	for slot, l := range b.layers {
		for e := range b.experts {
			n, err := st.ExpertBytes(l, e)
			if err != nil {
				t.Fatal(err)
			}
			ex, err := st.ReadExpert(ctx, l, e, make([]byte, n))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			base := (slot*b.experts + e) * 3
			for i, m := range []kernels.Matrix{ex.Gate, ex.Down, ex.Up} {
				if !bytes.Equal(m.Data, b.tensors[base+i].m.Data) {
					t.Fatalf("%s: ReadExpert(%d, %d) %v differs", name, l, e, FormSwiGLU.kinds()[i])
				}
			}
		}
	}
}

// TestStoreSkipsDenseLayers: a model whose layers 0 and 2 are dense
// stores the experts of layers 1, 3 and 4 under their own layer numbers;
// asking for a dense layer's expert is ErrNotFound naming the layers that
// have experts.
func TestStoreSkipsDenseLayers(t *testing.T) {
	ts := smallStore
	ts.layers, ts.layerIDs = 3, []int{1, 3, 4}
	dir, b := ts.write(t, ConvertOptions{})
	st, err := Open(dir, Options{Identity: b.identity, VerifyDecoded: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !slices.Equal(st.Layers(), []int{1, 3, 4}) || !slices.Equal(st.Report().Layers, []int{1, 3, 4}) {
		t.Fatalf("store says layers %v (report %v), wrote 1, 3, 4", st.Layers(), st.Report().Layers)
	}
	checkStore(t, "layers 1, 3, 4", st, b)
	if err := st.Verify(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	for _, l := range []int{0, 2, 5, -1} {
		if _, err := st.ExpertBytes(l, 0); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "[1 3 4]") {
			t.Errorf("layer %d: %v, want ErrNotFound naming layers [1 3 4]", l, err)
		}
	}
}

// TestStoreReadsVersion1: a store written before dense layers (format
// version 1, whose expert layers are 0..L-1 by position) still opens and
// reads back the same weights; a version 2 index whose layer numbers do
// not ascend is refused as corrupt.
func TestStoreReadsVersion1(t *testing.T) {
	dir, b := smallStore.write(t, ConvertOptions{})
	indexPath, chunkPath := filepath.Join(dir, IndexFile), filepath.Join(dir, ChunkFile)
	index, _ := os.ReadFile(indexPath)
	chunks, _ := os.ReadFile(chunkPath)
	reseal := func(ix []byte) []byte {
		le := binary.LittleEndian
		return le.AppendUint32(ix[:len(ix)-4:len(ix)-4], crc(ix[:len(ix)-4]))
	}
	v1 := append([]byte(nil), index...)
	binary.LittleEndian.PutUint32(v1[8:], 1)
	os.WriteFile(indexPath, reseal(v1), 0o644)
	c1 := append([]byte(nil), chunks...)
	binary.LittleEndian.PutUint32(c1[8:], 1)
	os.WriteFile(chunkPath, c1, 0o644)
	st, err := Open(dir, Options{Identity: b.identity})
	if err != nil {
		t.Fatalf("a version 1 store: %v", err)
	}
	checkStore(t, "version 1", st, b)
	st.Close()

	// version 2 with the second layer numbered as the first
	bad := append([]byte(nil), index...)
	second := indexHeaderLen
	for range 3 * smallStore.experts { // skip the first layer's records (FORMAT.md)
		shards, hist := binary.LittleEndian.Uint16(bad[second+10:]), binary.LittleEndian.Uint16(bad[second+20:])
		second += tensorFixedLen + int(hist)*histEntryLen + int(shards)*shardRecordLen
	}
	if got := binary.LittleEndian.Uint32(bad[second:]); got != 1 {
		t.Fatalf("test reads the second layer's first record wrong: layer %d", got)
	}
	binary.LittleEndian.PutUint32(bad[second:], 0)
	os.WriteFile(indexPath, reseal(bad), 0o644)
	os.WriteFile(chunkPath, chunks, 0o644)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "out of order") {
		t.Errorf("layers 0, 0: %v, want ErrCorrupt saying out of order", err)
	}
}

// TestStoreIsDeterministic: the same tensors and options give the same
// bytes, whatever the parallelism.
func TestStoreIsDeterministic(t *testing.T) {
	d1, _ := smallStore.write(t, ConvertOptions{Shards: 3, Parallelism: 1})
	d2, _ := smallStore.write(t, ConvertOptions{Shards: 3, Parallelism: 4})
	for _, f := range []string{IndexFile, ChunkFile} {
		a, _ := os.ReadFile(filepath.Join(d1, f))
		b, _ := os.ReadFile(filepath.Join(d2, f))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between parallelism 1 and 4", f)
		}
	}
}

// TestConcurrentReadsShareTheBoundedPool hammers one store from several
// goroutines (run with -race).
func TestConcurrentReadsShareTheBoundedPool(t *testing.T) {
	dir, b := smallStore.write(t, ConvertOptions{Shards: 4})
	st, err := Open(dir, Options{Parallelism: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 8 {
				l, e := (g+i)%2, i%2
				n, _ := st.ExpertBytes(l, e)
				ex, err := st.ReadExpert(context.Background(), l, e, make([]byte, n))
				if err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(ex.Gate.Data, b.tensors[(l*2+e)*3].m.Data) {
					t.Errorf("layer %d expert %d: wrong gate", l, e)
				}
			}
		})
	}
	wg.Wait()
}

// TestReadRejectsBadRequests: unknown experts and wrong buffer sizes are
// errors, not panics.
func TestReadRejectsBadRequests(t *testing.T) {
	dir, _ := smallStore.write(t, ConvertOptions{})
	st, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if _, err := st.ReadExpert(ctx, 2, 0, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("layer 2 of 2: %v, want ErrNotFound", err)
	}
	if _, err := st.ReadExpert(ctx, 0, -1, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("expert -1: %v, want ErrNotFound", err)
	}
	if _, err := st.ReadExpert(ctx, 0, 0, make([]byte, 10)); err == nil {
		t.Error("short buffer accepted")
	}
	if _, err := st.ReadTensor(ctx, 0, 0, Kind(4), nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("kind 4: %v, want ErrNotFound", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	n, _ := st.ExpertBytes(0, 0)
	if _, err := st.ReadExpert(cctx, 0, 0, make([]byte, n)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled read: %v", err)
	}
}

// memSource serves chunks from memory, as a remote peer would.
type memSource []byte

func (m memSource) ReadChunk(_ context.Context, ref ChunkRef, dst []byte) error {
	copy(dst, m[ref.Offset:ref.Offset+int64(ref.Size)])
	return nil
}

// TestNewReadsFromAnyChunkSource: a store built from index bytes and a
// non-file source (the remote-reader seam) reads the same weights, and
// still checks every chunk.
func TestNewReadsFromAnyChunkSource(t *testing.T) {
	dir, b := smallStore.write(t, ConvertOptions{Shards: 2})
	local, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	chunks, _ := os.ReadFile(filepath.Join(dir, ChunkFile))
	remote, err := New(local.IndexBytes(), memSource(chunks), Options{Identity: b.identity})
	if err != nil {
		t.Fatal(err)
	}
	checkStore(t, "memSource", remote, b)
	chunks[len(chunks)-1] ^= 1
	n, _ := remote.ExpertBytes(1, 1)
	if _, err := remote.ReadExpert(context.Background(), 1, 1, make([]byte, n)); !errors.Is(err, ErrChecksum) {
		t.Fatalf("flipped byte through memSource: %v, want ErrChecksum", err)
	}
}
