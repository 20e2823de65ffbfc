package fetch_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// TestAFillingStoreRelaysWhatItFetches: a node (a shadow) fetches every
// layer but the last into its directory with Share, serving it over a
// stream as it fills (a Filling); a worker that starts filling the
// whole store first, asking that node before the main node, gets every
// chunk of the relayed layers from it, held until it has arrived (asked
// even before the node had the index), and the last layer's, which the
// node will never hold, from the main node at once: the main node sends
// each chunk once.
func TestAFillingStoreRelaysWhatItFetches(t *testing.T) {
	defer fetch.SetHoldWait(time.Hour)() // a refusal that waited for a chunk not coming fails the fill's deadline
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := inproc.Generate(ctx, t.TempDir(), "qwen3-moe-tiny", 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	src := f.Store
	held, err := store.Open(src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	certs := func(name string) *wire.Config {
		c, err := wire.LoadCerts(f.Certs, name)
		if err != nil {
			t.Fatal(err)
		}
		return &wire.Config{Certs: c, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop()}
	}
	last := held.Layers()[len(held.Layers())-1]
	var lastBytes int64
	for e := range held.Experts() {
		cs, _ := held.ExpertChunks(last, e)
		for _, c := range cs {
			lastBytes += int64(c.Ref.Size)
		}
	}

	relay := fetch.NewFilling()
	defer relay.Close()
	ln, err := wire.ListenStream(ctx, "127.0.0.1:0", certs("w1"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var serving sync.WaitGroup
	defer func() { cancel(); serving.Wait() }()
	serving.Go(func() { fetch.ServeStreams(ctx, ln, fetch.Served{Store: relay}, nil, nil, nil) })

	toWorker := &countingSource{Source: fetch.DirSource{Dir: src}}
	st, b, err := fetch.OpenBackfill(ctx, filepath.Join(t.TempDir(), "worker"), []fetch.Source{toWorker}, store.Options{Identity: held.Identity()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	defer b.Close()
	d := fetch.Dial(ln.Addr().String(), certs("w2"))
	defer d.Close()
	var res fetch.Result
	var ferr error
	var filling sync.WaitGroup
	filling.Go(func() {
		res, ferr = b.Fill(ctx, nil, fetch.Options{Parallel: 4, Log: zerolog.Nop(), SourcesFor: func(int, int, int) []fetch.Source { return []fetch.Source{d} }})
	})
	time.Sleep(50 * time.Millisecond) // the worker asks before the relay has the index
	toRelay := &countingSource{Source: slowSource{fetch.DirSource{Dir: src}, make(chan struct{}), new(sync.Once)}}
	rr, err := fetch.Share(ctx, filepath.Join(t.TempDir(), "relay"), []fetch.Source{toRelay}, fetch.Options{Layers: func(l int) bool { return l != last }, Filling: relay, Log: zerolog.Nop()})
	if err != nil || rr.Fetched != rr.Share {
		t.Fatalf("the relay's fill: %+v, %v", rr, err)
	}
	filling.Wait()
	if ferr != nil || res.Fetched != res.Share {
		t.Fatalf("the worker's fill: %+v, %v", res, ferr)
	}
	if rr.Share+lastBytes != res.Share {
		t.Fatalf("the relay's share %d and the last layer's %d are not the whole store's %d", rr.Share, lastBytes, res.Share)
	}
	if got := toWorker.served.Load(); got != lastBytes {
		t.Fatalf("the main node served the worker %d bytes: want the last layer's %d alone, the rest relayed", got, lastBytes)
	}
	if got := toRelay.served.Load(); got != rr.Share {
		t.Fatalf("the main node served the relay %d bytes for its share of %d", got, rr.Share)
	}
}
