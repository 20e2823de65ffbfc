package fetch_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/store"
	"github.com/rs/zerolog"
)

// source is a store generated once for the package's tests.
func source(t *testing.T) string {
	t.Helper()
	f, err := inproc.Generate(context.Background(), t.TempDir(), "qwen3-moe-tiny", 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	return f.Store
}

// TestAShareReadsAsTheWholeStoreDoes: a share of some layers fetched into
// an empty directory opens as a store, and every expert of its layers
// reads bit for bit as from the source; the bytes fetched are the
// share's, less than the whole chunk file; a second fetch keeps them all
// and fetches nothing.
func TestAShareReadsAsTheWholeStoreDoes(t *testing.T) {
	src := source(t)
	whole, err := store.Open(src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	layers := whole.Layers()
	mine := func(l int) bool { return l == layers[0] } // one layer of the store's
	dir := filepath.Join(t.TempDir(), "share")
	var last atomic.Int64
	res, err := fetch.Share(context.Background(), dir, []fetch.Source{fetch.DirSource{Dir: src}}, fetch.Options{Layers: mine, Log: zerolog.Nop(),
		Progress: func(done, total int64) { storeMax(&last, done) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Kept != 0 || res.Fetched != res.Share || res.Share <= 0 || res.Share >= whole.ChunkFileSize() || last.Load() != res.Share {
		t.Fatalf("first fetch %+v (progress said %d), the whole chunk file %d bytes: want the share alone fetched", res, last.Load(), whole.ChunkFileSize())
	}
	share, err := store.Open(dir, store.Options{Identity: whole.Identity()})
	if err != nil {
		t.Fatal(err)
	}
	defer share.Close()
	read := func(st *store.Store, l, e int) ([]byte, error) {
		n, err := st.ExpertBytes(l, e)
		if err != nil {
			return nil, err
		}
		dst := make([]byte, n)
		_, err = st.ReadExpert(context.Background(), l, e, dst)
		return dst, err
	}
	for e := range whole.Experts() {
		want, err := read(whole, layers[0], e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := read(share, layers[0], e)
		if err != nil {
			t.Fatalf("the share's layer %d expert %d: %v", layers[0], e, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("layer %d expert %d differs from the source's", layers[0], e)
		}
	}
	if len(layers) > 1 {
		if _, err := read(share, layers[1], 0); !errors.Is(err, store.ErrChecksum) {
			t.Fatalf("an expert outside the share read as %v, want a checksum error (it was never fetched)", err)
		}
	}
	again, err := fetch.Share(context.Background(), dir, []fetch.Source{fetch.DirSource{Dir: src}}, fetch.Options{Layers: mine, Log: zerolog.Nop()})
	if err != nil || again.Fetched != 0 || again.Kept != res.Share {
		t.Fatalf("second fetch %+v, %v: want every byte kept, none fetched", again, err)
	}
}

// flaky is a source that serves src's chunks, flipping a byte of the one
// at offset flip (if set), or failing every chunk after the first n
// (if n is set) while cancelling the fetch (a node killed halfway).
type flaky struct {
	fetch.DirSource
	name   string
	flip   int64
	n      int64
	served atomic.Int64
	cancel context.CancelFunc
}

func (f *flaky) Name() string { return f.name }

func (f *flaky) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	if f.n > 0 && f.served.Add(1) > f.n {
		f.cancel()
		return context.Canceled
	}
	if err := f.DirSource.ReadChunk(ctx, ref, dst); err != nil {
		return err
	}
	if ref.Offset == f.flip && ref.Size > 0 {
		dst[0] ^= 0x40
	}
	return nil
}

// TestAFetchResumesRepairsAndNamesABadSource: a fetch cut short halfway
// leaves what it wrote, and the next fetches the rest only; a chunk
// damaged on disk is fetched again, alone; a source that serves a
// flipped chunk is named, the chunk taken from the next source, and the
// share reads as the source's; a directory holding another store's share
// starts afresh.
func TestAFetchResumesRepairsAndNamesABadSource(t *testing.T) {
	src := source(t)
	whole, err := store.Open(src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	dir := filepath.Join(t.TempDir(), "share")
	good := fetch.DirSource{Dir: src}
	opt := fetch.Options{Log: zerolog.Nop(), Parallel: 1}

	// cut short after 10 chunks
	ctx, cancel := context.WithCancel(context.Background())
	cut := &flaky{DirSource: good, name: "cut", n: 10, cancel: cancel}
	first, err := fetch.Share(ctx, dir, []fetch.Source{cut}, opt)
	if err == nil || first.Fetched == 0 || first.Fetched >= first.Share {
		t.Fatalf("a fetch cut short: %+v, %v; want an error after some chunks", first, err)
	}
	rest, err := fetch.Share(context.Background(), dir, []fetch.Source{good}, opt)
	if err != nil || rest.Kept != first.Fetched || rest.Kept+rest.Fetched != rest.Share {
		t.Fatalf("the fetch after it: %+v, %v; want the %d bytes fetched before kept and the rest fetched", rest, err, first.Fetched)
	}

	// a chunk damaged on disk
	cs, err := whole.ExpertChunks(whole.Layers()[0], 1)
	if err != nil {
		t.Fatal(err)
	}
	damaged := cs[0]
	flipByte(t, filepath.Join(dir, store.ChunkFile), damaged.Ref.Offset)
	repair, err := fetch.Share(context.Background(), dir, []fetch.Source{good}, opt)
	if err != nil || repair.Fetched != int64(damaged.Ref.Size) || repair.Kept != repair.Share-int64(damaged.Ref.Size) {
		t.Fatalf("after damaging a %d-byte chunk: %+v, %v; want that chunk alone fetched", damaged.Ref.Size, repair, err)
	}

	// a source serving a flipped chunk, then a good one
	fresh := filepath.Join(t.TempDir(), "fresh")
	liar := &flaky{DirSource: good, name: "w3", flip: damaged.Ref.Offset}
	res, err := fetch.Share(context.Background(), fresh, []fetch.Source{liar, good}, opt)
	if err != nil || res.Bad != 1 || len(res.BadSources) != 1 || res.BadSources[0] != "w3" || res.Fetched != res.Share+int64(damaged.Ref.Size) {
		t.Fatalf("with a source flipping a chunk: %+v, %v; want it named, the chunk fetched again from the next", res, err)
	}
	share, err := store.Open(fresh, store.Options{Identity: whole.Identity()})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := whole.ExpertBytes(whole.Layers()[0], 1)
	got, want := make([]byte, n), make([]byte, n)
	if _, err := share.ReadExpert(context.Background(), whole.Layers()[0], 1, got); err != nil {
		t.Fatal(err)
	}
	share.Close()
	if _, err := whole.ReadExpert(context.Background(), whole.Layers()[0], 1, want); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the expert whose chunk was flipped reads otherwise than the source's (%v)", err)
	}
	// only the liar: the chunk comes from nobody
	if _, err := fetch.Share(context.Background(), filepath.Join(t.TempDir(), "x"), []fetch.Source{liar}, opt); !errors.Is(err, fetch.ErrNoSource) {
		t.Fatalf("with the lying source alone: %v, want ErrNoSource", err)
	}

	// another store's share in the directory
	other, err := inproc.Generate(context.Background(), t.TempDir(), "qwen3-moe-tiny", 6, 1)
	if err != nil {
		t.Fatal(err)
	}
	res, err = fetch.Share(context.Background(), dir, []fetch.Source{fetch.DirSource{Dir: other.Store}}, opt)
	if err != nil || res.Kept != 0 || res.Fetched != res.Share {
		t.Fatalf("over another store's share: %+v, %v; want all fetched, nothing kept", res, err)
	}
}

func flipByte(t *testing.T, path string, at int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

// TestAFetchKeepsToItsRate: with a rate of a quarter of the share a
// second, a fetch takes at least the time its bytes after the first
// chunk need at that rate (a lower bound only: how much longer is the
// machine's).
func TestAFetchKeepsToItsRate(t *testing.T) {
	src := source(t)
	first, err := fetch.Share(context.Background(), filepath.Join(t.TempDir(), "a"), []fetch.Source{fetch.DirSource{Dir: src}}, fetch.Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	rate := float64(first.Share) * 4 // bytes a second: the share in 250 ms
	t0 := time.Now()
	res, err := fetch.Share(context.Background(), filepath.Join(t.TempDir(), "b"), []fetch.Source{fetch.DirSource{Dir: src}}, fetch.Options{Rate: rate, Log: zerolog.Nop()})
	took := time.Since(t0)
	if err != nil || res.Fetched != first.Share {
		t.Fatalf("%+v, %v", res, err)
	}
	if took < 200*time.Millisecond {
		t.Fatalf("%d bytes at %.0f B/s took %v, under the 250 ms the rate allows (less the first chunks')", res.Fetched, rate, took)
	}
}

// counting is a source that counts the chunks it serves.
type counting struct {
	fetch.DirSource
	name   string
	served atomic.Int64
}

func (c *counting) Name() string { return c.name }

func (c *counting) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	c.served.Add(1)
	return c.DirSource.ReadChunk(ctx, ref, dst)
}

// TestSpreadAsksEverySourceInTurn: with Spread, two sources holding the
// store each serve half the chunks (one more at most); without it, the
// first serves them all.
func TestSpreadAsksEverySourceInTurn(t *testing.T) {
	src := source(t)
	for _, spread := range []bool{true, false} {
		a, b := &counting{DirSource: fetch.DirSource{Dir: src}, name: "a"}, &counting{DirSource: fetch.DirSource{Dir: src}, name: "b"}
		res, err := fetch.Share(context.Background(), filepath.Join(t.TempDir(), "s"), []fetch.Source{a, b}, fetch.Options{Spread: spread, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		na, nb := a.served.Load(), b.served.Load()
		if na+nb != int64(res.Chunks) {
			t.Fatalf("spread %v: %d + %d chunks served, the share has %d", spread, na, nb, res.Chunks)
		}
		if spread && (na-nb > 1 || nb-na > 1) || !spread && nb != 0 {
			t.Fatalf("spread %v: a served %d chunks, b %d", spread, na, nb)
		}
	}
}

// storeMax keeps the most done a progress report said: reports may come
// concurrently, so the last one called need not be the last made.
func storeMax(v *atomic.Int64, done int64) {
	for {
		old := v.Load()
		if done <= old || v.CompareAndSwap(old, done) {
			return
		}
	}
}
