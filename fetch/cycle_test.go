package fetch_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// TestTwoNodesFetchingFromEachOtherServeOnlyWhatTheyHold: two nodes
// fetch from each other first, then from a node holding the whole
// store. Each serves the other only the chunks its directory holds
// (Backfill.Local), so a chunk neither holds comes from the third at
// once, instead of each asking the other for ever.
func TestTwoNodesFetchingFromEachOtherServeOnlyWhatTheyHold(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := inproc.Generate(ctx, t.TempDir(), "qwen3-moe-tiny", 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	certs := func(name string) *wire.Config {
		c, err := wire.LoadCerts(f.Certs, name)
		if err != nil {
			t.Fatal(err)
		}
		return &wire.Config{Certs: c, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop()}
	}
	index, err := os.ReadFile(filepath.Join(f.Store, store.IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name string) string {
		d := filepath.Join(t.TempDir(), name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, store.IndexFile), index, 0o644)
		return d
	}
	lnA, err := wire.ListenStream(ctx, "127.0.0.1:0", certs("w2"))
	if err != nil {
		t.Fatal(err)
	}
	defer lnA.Close()
	lnB, err := wire.ListenStream(ctx, "127.0.0.1:0", certs("w1"))
	if err != nil {
		t.Fatal(err)
	}
	defer lnB.Close()
	whole := fetch.DirSource{Dir: f.Store}
	dA, dB := fetch.Dial(lnB.Addr().String(), certs("w2")), fetch.Dial(lnA.Addr().String(), certs("w1"))
	stA, bA, err := fetch.OpenBackfill(ctx, mk("a"), []fetch.Source{dA, whole}, store.Options{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	stB, bB, err := fetch.OpenBackfill(ctx, mk("b"), []fetch.Source{dB, whole}, store.Options{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stA.Close(); stB.Close(); bA.Close(); bB.Close() }()
	serve := func(ln *wire.StreamListener, h fetch.Holder) {
		for {
			p, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() { fetch.Serve(ctx, p, fetch.Served{Store: h}, nil); p.Close() }()
		}
	}
	go serve(lnA, bA.Local())
	go serve(lnB, bB.Local())
	layer := stA.Layers()[0]
	n, _ := stA.ExpertBytes(layer, 0)
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	t0 := time.Now()
	_, err = stA.ReadExpert(rctx, layer, 0, make([]byte, n))
	t.Logf("read on A: %v after %v; A fetched %d, B fetched %d", err, time.Since(t0), bA.Fetched(), bB.Fetched())
	if err != nil {
		t.Fatalf("an expert that the whole-store source holds, read on A: %v", err)
	}
	if bB.Fetched() != 0 {
		t.Fatalf("B fetched %d bytes on A's behalf", bB.Fetched())
	}
	// the Dialed source that answers nobody is passed over after one try
	dead := fetch.Dial("127.0.0.1:9", certs("w2")) // discard: nobody answers there
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	defer dcancel()
	if _, err := dead.Index(dctx); err == nil {
		t.Fatal("a dead source gave an index")
	}
	if _, err := dead.Index(ctx); err == nil || !strings.Contains(err.Error(), "did not answer lately") {
		t.Fatalf("the dead source asked again at once: %v, want it passed over", err)
	}
	dead.Close()
}
