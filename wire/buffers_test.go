package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/odmoe/odmoe/internal/procmem"
)

// claimHeader is a bulk stream's class byte and a frame header claiming
// size bytes of an Alignment.
func claimHeader(size uint32) []byte {
	h := []byte{classBulk, 0, 0, 0, 0, ProtocolVersion, byte(typeAlignment)}
	binary.BigEndian.PutUint32(h[1:], size+2)
	return h
}

// TestFrameBodyGrowsOnlyAsItsBytesArrive: a header claiming 64 MiB
// followed by less than a piece of its body and the end of the stream
// costs at most a piece or two, not what the header claimed, and is
// reported as malformed; real frames of any size still read whole.
func TestFrameBodyGrowsOnlyAsItsBytesArrive(t *testing.T) {
	for _, sent := range []int{0, 100, readPiece - 1} {
		in := append(claimHeader(64<<20 - 2)[1:], bytes.Repeat([]byte{7}, sent)...)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fr := &frameReader{r: bytes.NewReader(in), maxBytes: defaultMaxFrameBytes}
		_, _, _, err := fr.next()
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("%d bytes after a 64 MiB claim: err = %v, want a malformed frame", sent, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 2*readPiece {
			t.Errorf("reading a 64 MiB claim backed by %d bytes allocated %d bytes", sent, got)
		}
	}
	pattern := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, 2<<20)
	for _, size := range []int{1, readPiece, readPiece + 1, 3 << 20, 9<<20 + 7} {
		body := pattern[:size]
		in := append(claimHeader(uint32(size))[1:], body...)
		fr := &frameReader{r: iotest.HalfReader(bytes.NewReader(in)), maxBytes: defaultMaxFrameBytes}
		_, got, owned, err := fr.next()
		if err != nil || !owned || !bytes.Equal(got, body) {
			t.Fatalf("a frame of %d bytes: err %v, owned %v, %d bytes, equal %v", size, err, owned, len(got), bytes.Equal(got, body))
		}
	}
}

// TestConnectionBufferCapHoldsFramesBackUntilReceived: with room for one
// frame per connection, a second waits (counted) until the application
// receives the first, then every message arrives intact.
func TestConnectionBufferCapHoldsFramesBackUntilReceived(t *testing.T) {
	scfg := testConfig(t, "buf", "w1")
	scfg.MaxFrameBytes, scfg.MaxConnBufferedBytes = 1<<20, 1<<20
	l := listen(t, scfg)
	client, server := connect(t, l, testConfig(t, "buf", "main"))
	for i := range 3 {
		send(t, client, bulk(uint64(i), bytes.Repeat([]byte{byte(i)}, 600<<10)))
	}
	waitFor(t, "a frame waiting for buffer room", func() bool { return l.Stats().BufferWaits.Load() > 0 })
	if n := len(server.bulkIn); n > 1 {
		t.Fatalf("%d frames of 600 KiB queued with room for 1 MiB", n)
	}
	seen := map[uint64]bool{}
	for range 3 {
		a := recv(t, server).(*Alignment)
		if d := bulkData(a); len(d) != 600<<10 || d[0] != byte(a.Seq) {
			t.Fatalf("alignment %d: %d bytes", a.Seq, len(d))
		}
		seen[a.Seq] = true
	}
	if len(seen) != 3 {
		t.Fatalf("received %v", seen)
	}
}

// TestBufferRoomIsGivenBack: whatever becomes of a frame (received,
// refused, cut short, cancelled, never received before its connection
// ended), its room comes back to the connection and to the listener.
func TestBufferRoomIsGivenBack(t *testing.T) {
	scfg := testConfig(t, "buf", "w1")
	scfg.MaxFrameBytes = 1 << 20
	l := listen(t, scfg)
	rawBulk := func(t *testing.T, client *Peer, b []byte) {
		s, err := client.conn.OpenUniStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(b); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	t.Run("received", func(t *testing.T) {
		client, server := connect(t, l, testConfig(t, "buf", "main"))
		for i := range 3 {
			send(t, client, bulk(uint64(i), make([]byte, 300<<10)))
			send(t, client, &Prediction{Layer: i})
		}
		for range 6 {
			recv(t, server)
		}
		if !roomFree(server.bufs.conn, l.cfg.MaxConnBufferedBytes) {
			t.Error("the connection's room was not given back")
		}
		waitRoomFree(t, l)
	})
	for _, tc := range []struct {
		name  string
		input []byte
		want  error
	}{
		{"not msgpack", append([]byte{classBulk}, rawFrame(typeAlignment, []byte{0xc1, 0xc1})...), ErrMalformed},
		{"cut short", append(claimHeader(512<<10), make([]byte, 100)...), ErrMalformed},
		{"a Hello", append([]byte{classBulk}, rawFrame(typeHello, []byte{0x90})...), ErrProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := connect(t, l, testConfig(t, "buf", "shadow"))
			rawBulk(t, client, tc.input)
			if _, err := server.Recv(context.Background()); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			waitRoomFree(t, l)
		})
	}
	t.Run("cancelled", func(t *testing.T) {
		client, server := connect(t, l, testConfig(t, "buf", "main"))
		s, err := client.conn.OpenUniStream()
		if err != nil {
			t.Fatal(err)
		}
		s.Write(append(claimHeader(512<<10), make([]byte, 100)...))
		waitFor(t, "the claim to be reserved", func() bool { return !roomFree(server.bufs.conn, l.cfg.MaxConnBufferedBytes) })
		s.CancelWrite(streamCancelled)
		waitFor(t, "the connection's room", func() bool { return roomFree(server.bufs.conn, l.cfg.MaxConnBufferedBytes) })
		waitRoomFree(t, l)
		send(t, client, &Heartbeat{Seq: 1}) // the connection goes on
		if m := recv(t, server); m.(*Heartbeat).Seq != 1 {
			t.Fatalf("got %v", m)
		}
	})
	t.Run("never received", func(t *testing.T) {
		client, server := connect(t, l, testConfig(t, "buf", "main"))
		for i := range 3 {
			send(t, client, bulk(uint64(i), make([]byte, 300<<10)))
		}
		waitFor(t, "3 messages queued", func() bool { return len(server.bulkIn) == 3 })
		client.Close()
		<-server.Done()
		waitRoomFree(t, l)
	})
}

// TestStallersCannotMakeAnotherConnectionWait: connections that stall
// inside claimed frames (a shadow, or anyone holding its certificate)
// hold at most their connection's room each and the listener's pool
// together; another identity's frames within its own room never wait on
// them (a shadow stalling cannot make the main node wait), while a frame
// that needs the pool waits, and arrives when a staller's connection
// ends.
func TestStallersCannotMakeAnotherConnectionWait(t *testing.T) {
	scfg := testConfig(t, "buf", "w1")
	scfg.MaxFrameBytes, scfg.MaxConnBufferedBytes, scfg.MaxBufferedBytes = 1<<20, 1<<20, 1<<20
	scfg.ConnGuaranteedBytes, scfg.MaxConnsPerIdentity = 700<<10, 8
	l := listen(t, scfg)
	healthy, healthyServer := connect(t, l, testConfig(t, "buf", "main"))
	stall := func(streams int) *Peer {
		p, _ := connect(t, l, testConfig(t, "buf", "shadow"))
		for range streams {
			s, err := p.conn.OpenUniStream()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(append(claimHeader(1<<20-2), make([]byte, 100)...)); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	a := stall(3) // the second and third claims wait on a's own room
	waitFor(t, "the first staller's claims", func() bool { return l.Stats().BufferWaits.Load() == 2 })
	if roomFree(l.pool, l.cfg.MaxBufferedBytes) {
		t.Fatal("the staller holds none of the listener's room")
	}
	stall(1)
	stall(1)
	d := stall(1) // each takes 324 KiB of the pool: the fourth waits
	waitFor(t, "the listener's room taken", func() bool { return l.Stats().BufferWaits.Load() == 3 })
	waits := l.Stats().BufferWaits.Load()
	for seq := uint64(1); seq <= 3; seq++ { // within the main node's own room
		send(t, healthy, bulk(seq, make([]byte, 600<<10)))
		if m := recv(t, healthyServer); m.(*Alignment).Seq != seq {
			t.Fatalf("got %v", m)
		}
	}
	if w := l.Stats().BufferWaits.Load(); w != waits {
		t.Fatalf("the main node's frames waited %d times on the shadows' stalls", w-waits)
	}
	late, lateServer := connect(t, l, testConfig(t, "buf", "main"))
	send(t, late, bulk(4, make([]byte, 900<<10))) // past its own room: the pool's
	waitFor(t, "a frame past its connection's own room waiting", func() bool { return l.Stats().BufferWaits.Load() > waits })
	d.Close() // ahead of it in the queue
	a.Close()
	if m := recv(t, lateServer); m.(*Alignment).Seq != 4 {
		t.Fatalf("got %v", m)
	}
}

// TestOversizedHelloIsRefused: the Hello, read before the peer is known
// and so without buffer room, has a limit of its own far below
// MaxFrameBytes.
func TestOversizedHelloIsRefused(t *testing.T) {
	l := listen(t, testConfig(t, "buf", "w1"))
	ccfg := testConfig(t, "buf", "main")
	ccfg.Hello.Features = []string{strings.Repeat("x", maxHelloBytes)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Dial(ctx, l.Addr().String(), ccfg); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("Dial with a %d-byte Hello: %v, want ErrFrameTooLarge", maxHelloBytes, err)
	}
	if n := l.Stats().Errors(CodeFrameTooLarge); n != 1 {
		t.Errorf("listener counted %d oversized frames, want 1", n)
	}
}

func TestBufferRoomDefaults(t *testing.T) {
	cases := []struct {
		frame             int
		conn, all         int64
		wantConn, wantAll int64
	}{
		{0, 0, 0, 128 << 20, 64 << 20},
		{1 << 20, 0, 0, 2 << 20, 1 << 20},
		{1 << 20, 10 << 20, 0, 10 << 20, 1 << 20},
		{1 << 20, 0, 3 << 20, 2 << 20, 3 << 20},
		{1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20},
	}
	for _, c := range cases {
		s, err := (&Config{Insecure: true, Name: "w1", Role: RoleWorker, MaxFrameBytes: c.frame, MaxConnBufferedBytes: c.conn, MaxBufferedBytes: c.all}).settled()
		if err != nil {
			t.Errorf("%+v: %v", c, err)
			continue
		}
		if s.MaxConnBufferedBytes != c.wantConn || s.MaxBufferedBytes != c.wantAll {
			t.Errorf("frames %d, room %d/%d: settled to %d/%d, want %d/%d", c.frame, c.conn, c.all, s.MaxConnBufferedBytes, s.MaxBufferedBytes, c.wantConn, c.wantAll)
		}
	}
}

// roomFree reports whether all n bytes of s are free (taking none).
func roomFree(s interface {
	TryAcquire(int64) bool
	Release(int64)
}, n int64) bool {
	if !s.TryAcquire(n) {
		return false
	}
	s.Release(n)
	return true
}

func waitRoomFree(t *testing.T, l *Listener) {
	t.Helper()
	waitFor(t, "the listener's room given back", func() bool { return roomFree(l.pool, l.cfg.MaxBufferedBytes) })
}

// waitFor polls cond until it holds, failing the test after 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 5 s", what)
		}
	}
}

// TestAStalledFrameBodyIsDroppedAfterItsTimeout: a bulk frame whose body
// stops arriving holds its room only until FrameBodyTimeout: then its
// stream is dropped, its room given back and counted, and the connection
// goes on.
func TestAStalledFrameBodyIsDroppedAfterItsTimeout(t *testing.T) {
	scfg := testConfig(t, "buf", "w1")
	scfg.FrameBodyTimeout = 200 * time.Millisecond
	l := listen(t, scfg)
	client, server := connect(t, l, testConfig(t, "buf", "main"))
	s, err := client.conn.OpenUniStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(append(claimHeader(512<<10), make([]byte, 100)...)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim to be reserved", func() bool { return !roomFree(server.bufs.conn, l.cfg.MaxConnBufferedBytes) })
	waitFor(t, "the stalled body to time out", func() bool { return l.Stats().FramesStalled.Load() == 1 })
	waitFor(t, "the connection's room given back", func() bool { return roomFree(server.bufs.conn, l.cfg.MaxConnBufferedBytes) })
	waitRoomFree(t, l)
	send(t, client, &Heartbeat{Seq: 7}) // the connection goes on
	if m := recv(t, server); m.(*Heartbeat).Seq != 7 {
		t.Fatalf("got %v", m)
	}
	send(t, client, bulk(8, make([]byte, 300<<10))) // and so do its bulk frames
	if m := recv(t, server); m.(*Alignment).Seq != 8 {
		t.Fatalf("got %v", m)
	}
}

// TestListenerCapsConnectionsPerIdentityAndInAll: past MaxConnsPerIdentity
// connections of one certificate, a new connection replaces that
// identity's most silent one (closed, saying why: a node restarted after
// a crash comes back at once, its dead connections making room), so the
// identity never holds more than the cap; past MaxConns in all a new
// connection is closed at once, saying why, and counted as refused;
// another identity still connects under the first cap, and a closed
// connection makes room.
func TestListenerCapsConnectionsPerIdentityAndInAll(t *testing.T) {
	scfg := testConfig(t, "buf", "w1")
	scfg.MaxConns, scfg.MaxConnsPerIdentity = 3, 2
	l := listen(t, scfg)
	dial := func(name string) (*Peer, error) {
		cfg := testConfig(t, "buf", name)
		cfg.DialAttempts = 1
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := Dial(ctx, l.Addr().String(), cfg)
		if err == nil {
			t.Cleanup(func() { p.Close() })
		}
		return p, err
	}
	first, _ := connect(t, l, testConfig(t, "buf", "main"))
	second, secondServer := connect(t, l, testConfig(t, "buf", "main"))
	send(t, second, &Heartbeat{Seq: 1}) // heard from since the first was
	recv(t, secondServer)
	third, err := dial("main")
	if err != nil {
		t.Fatalf("a third main connection: %v, want it to replace the most silent", err)
	}
	select {
	case <-first.Done():
		if err := first.Err(); err == nil || !strings.Contains(err.Error(), "replaced by a newer connection") {
			t.Fatalf("the first, most silent, connection ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the most silent main connection was not closed")
	}
	waitFor(t, "the identity back at its cap", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.perID["main/main"] == 2 && len(l.peers) == 2
	})
	select {
	case <-second.Done():
		t.Fatalf("the connection heard from lately was closed: %v", second.Err())
	default:
	}
	connect(t, l, testConfig(t, "buf", "shadow")) // another identity: under its own cap, the third in all
	if _, err := dial("shadow"); err == nil || !strings.Contains(err.Error(), "too many connections") {
		t.Fatalf("a fourth connection in all: %v, want it refused as too many", err)
	}
	if got := l.Stats().Refused.Load(); got != 1 {
		t.Fatalf("%d connections counted as refused, want 1", got)
	}
	third.Close()
	waitFor(t, "the closed connection's place", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.perID["main/main"] == 1
	})
	connect(t, l, testConfig(t, "buf", "main"))
}

// TestAConnectionsOwnRoomIsNeverTaken: connections of one identity that
// stall inside claimed frames fill the listener's pool, yet another
// connection of the same identity (the real main node beside someone
// holding its certificate) still gets frames up to ConnGuaranteedBytes
// through without waiting, and the pool is whole again once they leave.
func TestAConnectionsOwnRoomIsNeverTaken(t *testing.T) {
	scfg := testConfig(t, "buf", "w1")
	scfg.MaxFrameBytes, scfg.MaxConnBufferedBytes, scfg.MaxBufferedBytes, scfg.ConnGuaranteedBytes = 1<<20, 1<<20, 2<<20, 512<<10
	scfg.MaxConnsPerIdentity = 8
	l := listen(t, scfg)
	honest, honestServer := connect(t, l, testConfig(t, "buf", "main"))
	var stallers []*Peer
	for range 4 { // each: 512 KiB of its own, the rest of its 1 MiB claim from the pool
		p, _ := connect(t, l, testConfig(t, "buf", "main"))
		s, err := p.conn.OpenUniStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(append(claimHeader(1<<20-2), make([]byte, 100)...)); err != nil {
			t.Fatal(err)
		}
		stallers = append(stallers, p)
	}
	waitFor(t, "the stallers to take the listener's pool", func() bool { return !roomFree(l.pool, 1<<10) })
	waits := l.Stats().BufferWaits.Load()
	for seq := uint64(1); seq <= 4; seq++ {
		send(t, honest, bulk(seq, make([]byte, 300<<10)))
		if m := recv(t, honestServer); m.(*Alignment).Seq != seq {
			t.Fatalf("got %v", m)
		}
	}
	if w := l.Stats().BufferWaits.Load(); w != waits {
		t.Fatalf("the honest connection's frames waited %d times on the pool", w-waits)
	}
	for _, p := range stallers {
		p.Close()
	}
	waitRoomFree(t, l)
}

// TestMemoryOfFramesLeftUnreadGoesBackToTheOS: peers that send bodies
// but their last byte make a listener hold them (room reserved, bytes
// allocated); once they leave, that memory goes back to the OS within a
// few seconds, although nothing else runs to start a collection.
func TestMemoryOfFramesLeftUnreadGoesBackToTheOS(t *testing.T) {
	const body = 8 << 20
	l := listen(t, testConfig(t, "buf", "w1"))
	runtime.GC()
	debug.FreeOSMemory()
	before := procmem.RSS()
	if before == 0 || raceDetector {
		t.Skip("no RSS on this platform, or one the race detector's memory swamps")
	}
	var peers []*Peer
	for _, name := range []string{"main", "shadow"} {
		for range 3 { // room: 4 MiB of each connection's own, the rest of the listener's pool
			p, _ := connect(t, l, testConfig(t, "buf", name))
			s, err := p.conn.OpenUniStream()
			if err != nil {
				t.Fatal(err)
			}
			go func() { // from one small buffer: what this side holds is not measured
				s.Write(claimHeader(body))
				piece := make([]byte, 1<<20)
				for left := body - 1; left > 0; left -= len(piece) {
					if _, err := s.Write(piece[:min(left, len(piece))]); err != nil {
						return
					}
				}
			}()
			peers = append(peers, p)
		}
	}
	waitFor(t, "the bodies to arrive", func() bool { return procmem.RSS() > before+48<<20 })
	held := procmem.RSS()
	for _, p := range peers {
		p.Close()
	}
	var now int64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if now = procmem.RSS(); now < before+16<<20 {
			break
		}
	}
	t.Logf("RSS before %d MiB, holding the bodies %d MiB, after they left %d MiB", before>>20, held>>20, now>>20)

	if now >= before+16<<20 {
		t.Fatalf("RSS %d MiB 10 s after the peers left, %d MiB before they came", now>>20, before>>20)
	}
}
