package fetch_test

import (
	"bytes"
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/store"
	"github.com/rs/zerolog"
)

// TestABackfilledStoreFillsItselfAsItReads: a store opened on an empty
// directory through a Backfill reads every expert as the source's, each
// fetched the first time only (the bytes fetched are those experts'
// chunks); opened again with no source that answers, it reads those
// experts from its directory, and any other fails.
func TestABackfilledStoreFillsItselfAsItReads(t *testing.T) {
	for _, preset := range []string{"qwen3-moe-tiny", "gpt-oss-tiny-mxfp4"} { // MXFP4: empty chunks
		t.Run(preset, func(t *testing.T) {
			f, err := inproc.Generate(context.Background(), t.TempDir(), preset, 5, 1)
			if err != nil {
				t.Fatal(err)
			}
			backfills(t, f.Store)
		})
	}
}

func backfills(t *testing.T, src string) {
	ctx := context.Background()
	whole, err := store.Open(src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	dir := filepath.Join(t.TempDir(), "lazy")
	st, b, err := fetch.OpenBackfill(ctx, dir, []fetch.Source{fetch.DirSource{Dir: src}}, store.Options{Identity: whole.Identity()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	layer := whole.Layers()[0]
	read := func(st *store.Store, e int) ([]byte, error) {
		n, _ := whole.ExpertBytes(layer, e)
		dst := make([]byte, n)
		_, err := st.ReadExpert(ctx, layer, e, dst)
		return dst, err
	}
	var want int64
	for e := range 3 {
		cs, _ := whole.ExpertChunks(layer, e)
		for _, c := range cs {
			want += int64(c.Ref.Size)
		}
		for range 2 { // the second read finds it there
			got, err := read(st, e)
			w, _ := read(whole, e)
			if err != nil || !bytes.Equal(got, w) {
				t.Fatalf("expert %d through the backfill: %v, or other bytes than the source's", e, err)
			}
		}
	}
	if b.Fetched() != want {
		t.Fatalf("fetched %d bytes, want the three experts' %d, once", b.Fetched(), want)
	}
	st.Close()
	b.Close()
	st, b, err = fetch.OpenBackfill(ctx, dir, []fetch.Source{fetch.DirSource{Dir: filepath.Join(t.TempDir(), "gone")}}, store.Options{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer st.Close()
	for e := range 3 {
		if _, err := read(st, e); err != nil {
			t.Fatalf("expert %d, kept from before, with no source: %v", e, err)
		}
	}
	if _, err := read(st, 3); err == nil {
		t.Fatal("an expert never fetched read with no source answering")
	}
}

// TestAFillAndReadsFetchEachChunkOnce: a Backfill on an empty directory
// filling a share (every expert of the first layer) while reads of
// those experts run beside it fetches each chunk once: the bytes fetched
// are the share's, and a second fill keeps them all.
func TestAFillAndReadsFetchEachChunkOnce(t *testing.T) {
	ctx := context.Background()
	src := source(t)
	whole, err := store.Open(src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	layer := whole.Layers()[0]
	mine := func(l, _ int) bool { return l == layer }
	st, b, err := fetch.OpenBackfill(ctx, filepath.Join(t.TempDir(), "fill"), []fetch.Source{fetch.DirSource{Dir: src}}, store.Options{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer st.Close()
	var share int64
	for e := range whole.Experts() {
		cs, _ := whole.ExpertChunks(layer, e)
		for _, c := range cs {
			share += int64(c.Ref.Size)
		}
	}
	var wg sync.WaitGroup
	for e := range whole.Experts() {
		wg.Go(func() {
			n, _ := whole.ExpertBytes(layer, e)
			if _, err := st.ReadExpert(ctx, layer, e, make([]byte, n)); err != nil {
				t.Errorf("expert %d read beside the fill: %v", e, err)
			}
		})
	}
	var most atomic.Int64 // the progress's
	res, err := b.Fill(ctx, mine, fetch.Options{Parallel: 8, Spread: true, Progress: func(done, total int64) {
		if total != share {
			t.Errorf("progress of %d bytes, the share is %d", total, share)
		}
		for v := most.Load(); done > v && !most.CompareAndSwap(v, done); v = most.Load() {
		}
	}})
	wg.Wait()
	if err != nil || res.Share != share || b.Fetched() != share || res.Fetched > share || most.Load() != share {
		t.Fatalf("fill %+v, %v; fetched %d in all, progress to %d: want the share's %d bytes fetched once, and done", res, err, b.Fetched(), most.Load(), share)
	}
	again, err := b.Fill(ctx, mine, fetch.Options{})
	if err != nil || again.Kept != share || again.Fetched != 0 {
		t.Fatalf("a second fill %+v, %v: want all kept", again, err)
	}
}

// countingSource is a source that counts the chunk bytes it served.
type countingSource struct {
	fetch.Source
	served atomic.Int64
}

func (c *countingSource) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	err := c.Source.ReadChunk(ctx, ref, dst)
	if err == nil {
		c.served.Add(int64(ref.Size))
	}
	return err
}

// holding serves a node's store from what it holds (Backfill.Local), as
// fetch.Serve does: a chunk it lacks is refused.
type holding struct{ h fetch.Holder }

func (holding) Name() string { return "peer" }
func (s holding) Index(context.Context) ([]byte, error) {
	return s.h.IndexBytes(), nil
}
func (s holding) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	if err := s.h.ReadChunk(ctx, ref, dst); err != nil {
		return err
	}
	return s.h.CheckChunk(ref, dst)
}

// TestTwoNodesFillingTheSameShareFetchEachOthersHalves: node A fills a
// share from its first chunk, node B, filling the same share, from its
// middle (Options.Start), asking A first for A's half (SourcesFor): the
// main source serves B only B's half; B then holds it all.
func TestTwoNodesFillingTheSameShareFetchEachOthersHalves(t *testing.T) {
	ctx := context.Background()
	src := source(t)
	whole, err := store.Open(src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	open := func(name string, main fetch.Source) (*store.Store, *fetch.Backfill) {
		st, b, err := fetch.OpenBackfill(ctx, filepath.Join(t.TempDir(), name), []fetch.Source{main}, store.Options{Identity: whole.Identity()}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close(); b.Close() })
		return st, b
	}
	mainA, mainB := &countingSource{Source: fetch.DirSource{Dir: src}}, &countingSource{Source: fetch.DirSource{Dir: src}}
	_, a := open("a", mainA)
	_, b := open("b", mainB)
	ra, err := a.Fill(ctx, nil, fetch.Options{Log: zerolog.Nop()})
	if err != nil || ra.Fetched != ra.Share || mainA.served.Load() != ra.Share {
		t.Fatalf("A: %+v, %v; main served %d", ra, err, mainA.served.Load())
	}
	rb, err := b.Fill(ctx, nil, fetch.Options{Start: 0.5, Log: zerolog.Nop(), SourcesFor: func(i, n, layer, expert int) []fetch.Source {
		if i < n/2 { // A's part: A fetched it first
			return []fetch.Source{holding{a.Local()}}
		}
		return nil
	}})
	if err != nil || rb.Fetched != rb.Share {
		t.Fatalf("B: %+v, %v", rb, err)
	}
	if got := float64(mainB.served.Load()) / float64(rb.Share); got < 0.3 || got > 0.7 {
		t.Fatalf("main served B %d of its share %d: want its own half alone", mainB.served.Load(), rb.Share)
	}
}

// TestFillLeavesTheSourcesForSliceAlone: SourcesFor may hand out parts
// of one array of sources (a worker's group members); Fill puts its own
// sources after them in a slice of its own, never into that array.
func TestFillLeavesTheSourcesForSliceAlone(t *testing.T) {
	ctx := context.Background()
	src := source(t)
	whole, err := store.Open(src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	main := &countingSource{Source: fetch.DirSource{Dir: src}}
	st, b, err := fetch.OpenBackfill(ctx, filepath.Join(t.TempDir(), "w"), []fetch.Source{main}, store.Options{Identity: whole.Identity()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	defer b.Close()
	a, c := &countingSource{Source: fetch.DirSource{Dir: src}}, &countingSource{Source: fetch.DirSource{Dir: src}}
	members := []fetch.Source{a, c, a} // what each part is asked of first
	if _, err := b.Fill(ctx, nil, fetch.Options{Parallel: 4, Log: zerolog.Nop(), SourcesFor: func(i, n, layer, expert int) []fetch.Source {
		q := i * 2 / n
		return members[q : q+1] // spare capacity: an append would write into members
	}}); err != nil {
		t.Fatal(err)
	}
	if members[1] != c || members[2] != a {
		t.Fatalf("Fill wrote its sources into SourcesFor's array: %v", members)
	}
	if a.served.Load() == 0 || c.served.Load() == 0 || main.served.Load() != 0 {
		t.Fatalf("served: first half's %d, second half's %d, main %d: want each half from its member alone", a.served.Load(), c.served.Load(), main.served.Load())
	}
}
