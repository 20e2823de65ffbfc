package fetch_test

import (
	"bytes"
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	for e := range 5 { // what it holds now: the three it read, no other
		if got := b.HoldsExpert(layer, e); got != (e < 3) {
			t.Fatalf("HoldsExpert(%d, %d) = %v after reading experts 0-2", layer, e, got)
		}
	}
	if b.Fetched() != want {
		t.Fatalf("HoldsExpert fetched: %d bytes, want %d", b.Fetched(), want)
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
// fetch.Serve does: a chunk it lacks is refused. Where after is set, it
// is asked nothing before after is closed.
type holding struct {
	h     fetch.Holder
	after chan struct{}
}

func (holding) Name() string { return "peer" }
func (s holding) Index(context.Context) ([]byte, error) {
	return s.h.IndexBytes(), nil
}
func (s holding) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	if s.after != nil {
		<-s.after
	}
	if err := s.h.ReadChunk(ctx, ref, dst); err != nil {
		return err
	}
	return s.h.CheckChunk(ref, dst)
}

// TestTwoNodesFillingTheSameShareFetchEachChunkOnce: nodes A and B fill
// the same share at the same time, each owning every other chunk
// ((expert+k) % 2, as a worker's group does: worker.fillOwner) and asking
// the other first for the rest. The other holds a request for a chunk
// its fill will bring until it has (Local), so the main source serves
// each chunk once, about half to each, and both then hold it all.
// Without the hold a request that comes before the owner's fetch is
// refused and goes to the main source.
func TestTwoNodesFillingTheSameShareFetchEachChunkOnce(t *testing.T) {
	ctx := context.Background()
	src := source(t)
	whole, err := store.Open(src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	open := func(name string, main fetch.Source) *fetch.Backfill {
		st, b, err := fetch.OpenBackfill(ctx, filepath.Join(t.TempDir(), name), []fetch.Source{main}, store.Options{Identity: whole.Identity()}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close(); b.Close() })
		return b
	}
	// a node is asked for chunks only once its fill runs (its first
	// fetch from the main source): one not filling refuses at once
	aFills, bFills := make(chan struct{}), make(chan struct{})
	mainA := &countingSource{Source: slowSource{fetch.DirSource{Dir: src}, aFills, new(sync.Once)}}
	mainB := &countingSource{Source: slowSource{fetch.DirSource{Dir: src}, bFills, new(sync.Once)}}
	a, b := open("a", mainA), open("b", mainB)
	fill := func(n *fetch.Backfill, mine int, other fetch.Source) (fetch.Result, error) {
		return n.Fill(ctx, nil, fetch.Options{Parallel: 4, Log: zerolog.Nop(), SourcesFor: func(layer, expert, k int) []fetch.Source {
			if (expert+k)%2 != mine {
				return []fetch.Source{other}
			}
			return nil
		}})
	}
	var wg sync.WaitGroup
	var ra, rb fetch.Result
	var ea, eb error
	wg.Go(func() { ra, ea = fill(a, 0, holding{b.Local(), bFills}) })
	wg.Go(func() { rb, eb = fill(b, 1, holding{a.Local(), aFills}) })
	wg.Wait()
	if ea != nil || eb != nil || ra.Fetched != ra.Share || rb.Fetched != rb.Share {
		t.Fatalf("A %+v, %v; B %+v, %v", ra, ea, rb, eb)
	}
	sa, sb := mainA.served.Load(), mainB.served.Load()
	if sa+sb != ra.Share {
		t.Fatalf("the main source served %d + %d bytes for a share of %d: want each chunk once", sa, sb, ra.Share)
	}
	if got := float64(sa) / float64(ra.Share); got < 0.3 || got > 0.7 {
		t.Fatalf("the main source served A %d of the share's %d: want about its half", sa, ra.Share)
	}
}

// slowSource is a source whose chunks take a millisecond, which says
// when it is first asked (closing asked).
type slowSource struct {
	fetch.Source
	asked chan struct{}
	once  *sync.Once
}

func (s slowSource) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	s.once.Do(func() { close(s.asked) })
	time.Sleep(time.Millisecond)
	return s.Source.ReadChunk(ctx, ref, dst)
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
	if _, err := b.Fill(ctx, nil, fetch.Options{Parallel: 4, Log: zerolog.Nop(), SourcesFor: func(layer, expert, k int) []fetch.Source {
		q := (expert + k) % 2
		return members[q : q+1] // spare capacity: an append would write into members
	}}); err != nil {
		t.Fatal(err)
	}
	if members[1] != c || members[2] != a {
		t.Fatalf("Fill wrote its sources into SourcesFor's array: %v", members)
	}
	if a.served.Load() == 0 || c.served.Load() == 0 || main.served.Load() != 0 {
		t.Fatalf("served: first part's %d, second part's %d, main %d: want each part from its member alone", a.served.Load(), c.served.Load(), main.served.Load())
	}
}
