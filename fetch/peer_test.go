package fetch_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// TestAShareComesOverTheWire: a node (w2) fetches its share from another
// that holds the store (w1) over a real TCP connection with mutual TLS (a wire.Stream):
// the share opens with the model's identity and every chunk of it passes
// its check; a request outside the store is answered with why. Stores of
// MXFP4 and FP8 experts too, whose empty chunks start where the next do.
func TestAShareComesOverTheWire(t *testing.T) {
	for _, preset := range []string{"qwen3-moe-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny-fp8"} {
		t.Run(preset, func(t *testing.T) { shareOverTheWire(t, preset) })
	}
}

// holder is a generated preset's store, open until the test ends, and
// the workers' configs of its cluster (each one's as tune says).
func holder(t *testing.T, preset string, tune func(*wire.Config)) (*store.Store, func(name string) *wire.Config) {
	t.Helper()
	f, err := inproc.Generate(context.Background(), t.TempDir(), preset, 5, 3)
	if err != nil {
		t.Fatal(err)
	}
	held, err := store.Open(f.Store, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	return held, func(name string) *wire.Config {
		c, err := wire.LoadCerts(f.Certs, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := &wire.Config{Certs: c, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop()}
		if tune != nil {
			tune(cfg)
		}
		return cfg
	}
}

func shareOverTheWire(t *testing.T, preset string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, certs := holder(t, preset, nil)
	ln, err := wire.ListenStream(ctx, "127.0.0.1:0", certs("w1"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serve := func(ln *wire.StreamListener, h fetch.Holder) {
		for {
			p, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				fetch.Serve(ctx, p, fetch.Served{Store: h}, nil)
				p.Close()
			}()
		}
	}
	go serve(ln, held)
	p, err := wire.DialStream(ctx, ln.Addr().String(), certs("w2"))
	if err != nil {
		t.Fatal(err)
	}
	src := fetch.NewPeerSource(p)
	defer src.Close()
	if src.Name() != "w1" {
		t.Fatalf("source named %q, want w1", src.Name())
	}
	layer := held.Layers()[len(held.Layers())-1]
	dir := filepath.Join(t.TempDir(), "share")
	res, err := fetch.Share(ctx, dir, []fetch.Source{src}, fetch.Options{Layers: func(l int) bool { return l == layer }, Log: zerolog.Nop()})
	if err != nil || res.Fetched != res.Share || res.Bad != 0 {
		t.Fatalf("fetch over the wire: %+v, %v", res, err)
	}
	share, err := store.Open(dir, store.Options{Identity: held.Identity()})
	if err != nil {
		t.Fatal(err)
	}
	defer share.Close()
	for e := range held.Experts() {
		n, _ := held.ExpertBytes(layer, e)
		if _, err := share.ReadExpert(ctx, layer, e, make([]byte, n)); err != nil {
			t.Fatalf("the fetched share's layer %d expert %d: %v", layer, e, err)
		}
	}
	err = src.ReadChunk(ctx, store.ChunkRef{Offset: held.ChunkFileSize(), Size: 8}, make([]byte, 8))
	if err == nil || !strings.Contains(err.Error(), "no chunk of the store") {
		t.Fatalf("a chunk past the store's end: %v, want the holder's reason", err)
	}

	// w2 now serves its share (one layer) to w3, which fetches the whole
	// store from w2 first, then w1: what w2 lacks it says so and w1
	// gives, nobody named for a bad chunk
	ln2, err := wire.ListenStream(ctx, "127.0.0.1:0", certs("w2"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	go serve(ln2, share)
	dial := func(addr string) *fetch.PeerSource {
		p, err := wire.DialStream(ctx, addr, certs("w3"))
		if err != nil {
			t.Fatal(err)
		}
		return fetch.NewPeerSource(p)
	}
	fromShare, fromWhole := dial(ln2.Addr().String()), dial(ln.Addr().String())
	defer fromShare.Close()
	defer fromWhole.Close()
	all, err := fetch.Share(ctx, filepath.Join(t.TempDir(), "w3"), []fetch.Source{fromShare, fromWhole}, fetch.Options{Log: zerolog.Nop()})
	if err != nil || all.Bad != 0 || all.Fetched != all.Share || all.Share != held.ChunkFileSize()-int64(len(held.ChunkFileHeader())) {
		t.Fatalf("the whole store from w2's share, then w1: %+v, %v", all, err)
	}
}

// TestADialedSourceOutlivesTheHoldersIdleTimeout: a holder drops a
// stream nothing moved on for its idle timeout (a fetcher pacing
// itself); the fetcher's next request goes over a new stream, as if
// nothing had happened.
func TestADialedSourceOutlivesTheHoldersIdleTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, certs := holder(t, "tiny", func(c *wire.Config) {
		c.IdleTimeout, c.FrameBodyTimeout = 100*time.Millisecond, 100*time.Millisecond
	})
	ln, err := wire.ListenStream(ctx, "127.0.0.1:0", certs("w1"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var streams atomic.Int64
	go func() {
		for {
			p, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			streams.Add(1)
			go func() {
				fetch.Serve(ctx, p, fetch.Served{Store: held}, nil)
				p.Close()
			}()
		}
	}()
	src := fetch.Dial(ln.Addr().String(), certs("w2"))
	defer src.Close()
	layer := held.Layers()[0]
	chunks, err := held.ExpertChunks(layer, 0)
	if err != nil || len(chunks) == 0 {
		t.Fatalf("chunks of layer %d expert 0: %v", layer, err)
	}
	for i := range 3 {
		buf := make([]byte, chunks[0].Ref.Size)
		if err := src.ReadChunk(ctx, chunks[0].Ref, buf); err != nil {
			t.Fatalf("read %d, after %v of silence: %v", i+1, time.Duration(i)*300*time.Millisecond, err)
		}
		if err := held.CheckChunk(chunks[0].Ref, buf); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // three idle timeouts
	}
	if n := streams.Load(); n < 2 {
		t.Fatalf("%d streams: the holder did not drop the silent one", n)
	}
}

// TestADownSourceCostsOneDialNotOneAChunk: a source whose host does not
// answer (a TCP port that never completes the handshake) costs its dial
// timeout once; after its dial failed, an asker that comes while it is
// dialled again is told so at once (and asks its next source) rather than
// waiting that dial out behind it.
func TestADownSourceCostsOneDialNotOneAChunk(t *testing.T) {
	held, certs := holder(t, "qwen3-moe-tiny", nil)
	stuck, err := net.Listen("tcp", "127.0.0.1:0") // never accepts: the TLS handshake hangs
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	cfg := certs("w2")
	cfg.DialAttempts, cfg.DialTimeout = 1, 2*time.Second
	d := fetch.Dial(stuck.Addr().String(), cfg)
	defer d.Close()
	layer := held.Layers()[0]
	cs, _ := held.ExpertChunks(layer, 0)
	ref := cs[0].Ref
	ask := func() (time.Duration, error) {
		t0 := time.Now()
		err := d.ReadChunk(context.Background(), ref, make([]byte, ref.Size))
		return time.Since(t0), err
	}
	if took, err := ask(); err == nil || took < time.Second {
		t.Fatalf("the first ask of a source that does not answer: %v in %v, want its dial's timeout", err, took)
	}
	if took, err := ask(); err == nil || took > 700*time.Millisecond {
		t.Fatalf("an ask right after the dial failed: %v in %v, want a refusal at once", err, took)
	}
	time.Sleep(2100 * time.Millisecond) // (redialAfter: it is dialled again)
	redial := make(chan error, 1)
	go func() { _, err := ask(); redial <- err }()
	time.Sleep(100 * time.Millisecond)
	if took, err := ask(); err == nil || took > 700*time.Millisecond {
		t.Fatalf("an ask while the source is dialled again: %v in %v, want a refusal at once (not its 2 s dial)", err, took)
	}
	if err := <-redial; err == nil {
		t.Fatal("the redial of a source that does not answer succeeded")
	}
}
