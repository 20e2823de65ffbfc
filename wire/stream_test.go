package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// listenStream is a stream listener on loopback, closed with the test.
func listenStream(t testing.TB, cfg *Config) *StreamListener {
	t.Helper()
	l, err := ListenStream(context.Background(), "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// acceptOne is the next stream l accepts, or the test's failure.
func acceptOne(t testing.TB, l *StreamListener) <-chan *Stream {
	ch := make(chan *Stream, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := l.Accept(ctx)
		if err != nil {
			close(ch)
			return
		}
		ch <- s
	}()
	return ch
}

// pair dials l as node name (a worker of the test cluster) and returns
// both ends of the stream, closed when the test ends; what (a refusal,
// nothing accepted) fails the test, naming what.
func pair(t testing.TB, l *StreamListener, name, what string) (dialer, accepted *Stream) {
	t.Helper()
	ch := acceptOne(t, l)
	c, err := DialStream(context.Background(), l.Addr().String(), testConfig(t, "streams", name, RoleWorker))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Cleanup(func() { c.Close() })
	s := <-ch
	if s == nil {
		t.Fatalf("%s: not accepted", what)
	}
	t.Cleanup(func() { s.Close() })
	return c, s
}

// TestAStreamCarriesRequestsAndAnswers: a worker asks a holder for a
// piece over a real TCP connection with mutual TLS and gets 16 MiB back
// whole, in order with a second answer; both ends know who the other is
// from its certificate.
func TestAStreamCarriesRequestsAndAnswers(t *testing.T) {
	l := listenStream(t, testConfig(t, "streams", "w1", RoleWorker))
	ctx := context.Background()
	c, s := pair(t, l, "w2", "w2's stream")
	if c.Identity() != (Identity{Name: "w1", Role: RoleWorker}) || s.Identity() != (Identity{Name: "w2", Role: RoleWorker}) {
		t.Fatalf("identities: dialer sees %v, listener %v", c.Identity(), s.Identity())
	}
	if err := c.Send(ctx, &FetchRequest{ID: 1, Offset: 64, Size: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := m.(*FetchRequest)
	if !ok || r.ID != 1 || r.Offset != 64 || r.Size != 16<<20 {
		t.Fatalf("request arrived as %#v", m)
	}
	piece := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7, 9}, 2<<20)
	go func() {
		s.Send(ctx, &FetchData{ID: 1, Data: piece})
		s.Send(ctx, &FetchData{ID: 2, Err: "not held here"})
	}()
	for id := uint64(1); id <= 2; id++ {
		m, err := c.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d := m.(*FetchData)
		switch {
		case d.ID != id:
			t.Fatalf("answer %d arrived as %d", id, d.ID)
		case id == 1 && !bytes.Equal(d.Data, piece):
			t.Fatalf("16 MiB arrived as %d bytes, not the same", len(d.Data))
		case id == 2 && d.Err != "not held here":
			t.Fatalf("the second answer says %q", d.Err)
		}
	}
	// a Recv whose context ends returns at once, and the stream is gone
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Recv(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv past its context: %v", err)
	}
	if _, err := s.Recv(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("the listener's side after the dialer closed: %v, want ErrClosed", err)
	}
}

// TestAStreamRefusesStrangers: a node of another cluster, a role the
// listener does not serve and a name the dialer did not ask for are all
// refused, at once (not retried) and counted; the listener goes on.
func TestAStreamRefusesStrangers(t *testing.T) {
	lcfg := testConfig(t, "streams", "w1", RoleWorker)
	l := listenStream(t, lcfg)
	ctx := context.Background()
	for _, c := range []struct {
		what string
		cfg  *Config
		want string
	}{
		{"another cluster", testConfig(t, "strangers", "w2", RoleWorker), "CA"},
		{"a role not served", testConfig(t, "streams", "main", RoleWorker), "bad certificate"}, // the listener logs why
		{"another name", func() *Config {
			c := testConfig(t, "streams", "w2", RoleWorker)
			c.PeerName = "w9"
			return c
		}(), "w9"},
	} {
		c.cfg.DialAttempts = 5
		start := time.Now()
		_, err := DialStream(ctx, l.Addr().String(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "(1 attempts)") {
			t.Fatalf("%s: dial gave %v, want a refusal naming %q after one attempt", c.what, err, c.want)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("%s: refused after %v", c.what, time.Since(start))
		}
	}
	// the role is the listener's refusal; another cluster's dialer and
	// the one asking for another name refuse first, on their side
	if n := l.Stats().Refused.Load(); n != 1 {
		t.Fatalf("listener counted %d refusals, want 1", n)
	}
	pair(t, l, "w2", "a node of the cluster after the refusals")
}

// TestAStreamListenerReadsRequestsOnly: a peer that sends a frame longer
// than a request may be has its stream closed, told why; one that never
// finishes its handshake is dropped after HandshakeTimeout; neither
// costs the next peer anything.
func TestAStreamListenerReadsRequestsOnly(t *testing.T) {
	lcfg := testConfig(t, "streams", "w1", RoleWorker)
	lcfg.HandshakeTimeout = 300 * time.Millisecond
	l := listenStream(t, lcfg)
	ctx := context.Background()

	silent, err := net.Dial("tcp", l.Addr().String()) // connects, says nothing
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := silent.Read(make([]byte, 1)); err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("a silent connection: read %v after %v, want it closed after the handshake timeout", err, time.Since(start))
	}

	c, s := pair(t, l, "w2", "w2's stream")
	big := &FetchData{ID: 1, Data: make([]byte, streamRequestBytes)} // a request's room and more
	if err := c.Send(ctx, big); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(ctx); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("the listener read a %d-byte frame: %v, want ErrFrameTooLarge", len(big.Data), err)
	}
	if _, err := c.Recv(ctx); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("the dialer was told %v, want ErrFrameTooLarge", err)
	}

	pair(t, l, "w2", "the next peer")
}

// throttle is a TCP proxy to target that passes what target sends at
// most rate bytes a second (a slow link), the other way at once.
func throttle(t *testing.T, target string, rate int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				return
			}
			go func() { io.Copy(out, in); out.Close() }()
			go func() {
				defer in.Close()
				buf := make([]byte, rate/50)
				for {
					n, err := out.Read(buf)
					if n > 0 {
						if _, err := in.Write(buf[:n]); err != nil {
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestAStreamLivesWhileBytesMove: an answer that takes several times the
// idle timeout to cross a slow link arrives whole (the stream lives while
// bytes move, either way); a stream where nothing moves for the idle
// timeout is dropped, the dialer told ErrTimeout; a listener whose peer
// asks and never reads gives its place back after the idle timeout.
func TestAStreamLivesWhileBytesMove(t *testing.T) {
	short := func(name string) *Config {
		c := testConfig(t, "streams", name, RoleWorker)
		c.IdleTimeout, c.FrameBodyTimeout = 200*time.Millisecond, 200*time.Millisecond
		return c
	}
	lcfg := short("w1")
	lcfg.MaxConns = 1
	l := listenStream(t, lcfg)
	ctx := context.Background()
	answer := make([]byte, 4<<20)
	go func() { // answers every request with 4 MiB until its stream ends
		for {
			s, err := l.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				defer s.Close()
				for {
					m, err := s.Recv(ctx)
					if err != nil {
						return
					}
					if s.Send(ctx, &FetchData{ID: m.(*FetchRequest).ID, Data: answer}) != nil {
						return
					}
				}
			}()
		}
	}()
	slow := throttle(t, l.Addr().String(), 6<<20) // 4 MiB in ~0.7 s: 3.5 idle timeouts
	c, err := DialStream(ctx, slow, short("w2"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Send(ctx, &FetchRequest{ID: 1, Size: len(answer)}); err != nil {
		t.Fatal(err)
	}
	m, err := c.Recv(ctx)
	if err != nil {
		t.Fatalf("a 4 MiB answer over a slow link (%v in): %v", time.Since(start), err)
	}
	if d := m.(*FetchData); len(d.Data) != len(answer) || time.Since(start) < 2*lcfg.IdleTimeout {
		t.Fatalf("%d bytes in %v: want 4 MiB over more than two idle timeouts", len(d.Data), time.Since(start))
	}
	if _, err := c.Recv(ctx); !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrClosed) {
		t.Fatalf("a stream where nothing moves: %v, want it dropped", err)
	}

	// a peer that asks and never reads: the listener's writes stall, and
	// its place (MaxConns 1) comes back once nothing has moved for idle
	greedy, err := DialStream(ctx, l.Addr().String(), short("w2"))
	if err != nil {
		t.Fatal(err)
	}
	defer greedy.Close()
	for i := range 8 {
		if err := greedy.Send(ctx, &FetchRequest{ID: uint64(i + 1), Size: len(answer)}); err != nil {
			break // the listener may have dropped it already
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := DialStream(ctx, l.Addr().String(), short("w2"))
		if err == nil {
			s.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a peer that never reads still holds the only place: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStrangersCannotKeepMembersOut: connections that never finish their
// handshake (anyone can open them: no certificate needed) cannot take a
// member's place, however many; Close ends those in progress at once.
func TestStrangersCannotKeepMembersOut(t *testing.T) {
	lcfg := testConfig(t, "streams", "w1", RoleWorker)
	lcfg.HandshakeTimeout = 3 * time.Second
	l, err := ListenStream(context.Background(), "127.0.0.1:0", lcfg)
	if err != nil {
		t.Fatal(err)
	}
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	for range 3 * maxPendingStreams {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	accepted := acceptOne(t, l)
	dcfg := testConfig(t, "streams", "w2", RoleWorker)
	dcfg.HandshakeTimeout = time.Second
	s, err := DialStream(context.Background(), l.Addr().String(), dcfg)
	if err != nil {
		t.Fatalf("a member after %d silent connections: %v", len(silent), err)
	}
	s.Close()
	if a := <-accepted; a == nil {
		t.Fatal("the member was not accepted")
	} else {
		a.Close()
	}
	l.mu.Lock()
	pending := len(l.pending)
	l.mu.Unlock()
	if pending > maxPendingStreams {
		t.Fatalf("%d connections held in their handshake, the cap %d", pending, maxPendingStreams)
	}
	c, err := net.Dial("tcp", l.Addr().String()) // one more, in its handshake as the listener closes
	if err != nil {
		t.Fatal(err)
	}
	silent = append(silent, c)
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	l.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v with a handshake in progress (HandshakeTimeout %v)", d, lcfg.HandshakeTimeout)
	}
}

// TestAStreamListenerCapsConnections: MaxConnsPerIdentity streams of one
// certificate's holder, MaxConns in all, then refused; a place is given
// back when its stream ends.
func TestAStreamListenerCapsConnections(t *testing.T) {
	lcfg := testConfig(t, "streams", "w1", RoleWorker)
	lcfg.MaxConnsPerIdentity, lcfg.MaxConns = 2, 3
	l := listenStream(t, lcfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // a server: each stream read until it ends, then closed
		for {
			s, err := l.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				defer s.Close()
				for {
					if _, err := s.Recv(ctx); err != nil {
						return
					}
				}
			}()
		}
	}()
	dial := func(name string) (*Stream, error) {
		return DialStream(ctx, l.Addr().String(), testConfig(t, "streams", name, RoleWorker))
	}
	var held []*Stream
	defer func() {
		for _, s := range held {
			s.Close()
		}
	}()
	for _, c := range []struct {
		name, refused string // refused: what the refusal names, "" if accepted
	}{{"w2", ""}, {"w2", ""}, {"w2", "MaxConnsPerIdentity"}, {"w1", ""}, {"w1", "MaxConns"}} {
		before := l.Stats().Refused.Load()
		s, err := dial(c.name)
		switch {
		case c.refused == "" && err != nil:
			t.Fatalf("%s's stream, %d held: %v", c.name, len(held), err)
		case c.refused == "":
			held = append(held, s)
		case err == nil:
			t.Fatalf("%s's stream, %d held, was accepted past %s", c.name, len(held), c.refused)
		case !strings.Contains(err.Error(), c.refused):
			t.Fatalf("%s's stream, %d held: %v, want a refusal naming %s", c.name, len(held), err, c.refused)
		case l.Stats().Refused.Load() != before+1:
			t.Fatalf("%s's refusal counted %d times", c.name, l.Stats().Refused.Load()-before)
		}
	}
	held[0].Close() // w2's place, and one of the listener's, given back
	held = held[1:]
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := dial("w2")
		if err == nil {
			held = append(held, s)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("w2's place was not given back when its stream closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkStreamAgainstQUIC: 16 MiB pieces asked for and answered, as
// a fetch moves them, over a stream and over a Peer (QUIC) on loopback:
// MB/s and the CPU both ends spent a MB (ns/B, user + system, the
// process's: both ends are in it).
func BenchmarkStreamAgainstQUIC(b *testing.B) {
	const piece = 16 << 20
	data := make([]byte, piece)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ctx := context.Background()
	type conn interface {
		Send(context.Context, Message) error
		Recv(context.Context) (Message, error)
	}
	// run answers every request c's peer s gets with a piece, and times
	// pieces asked for and answered one at a time
	run := func(b *testing.B, c, s conn) {
		go func() {
			for {
				m, err := s.Recv(ctx)
				if err != nil || s.Send(ctx, &FetchData{ID: m.(*FetchRequest).ID, Data: data}) != nil {
					return
				}
			}
		}()
		b.SetBytes(piece)
		cpu0 := cpuTime()
		b.ResetTimer()
		for i := range b.N {
			if err := c.Send(ctx, &FetchRequest{ID: uint64(i + 1), Size: piece}); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Recv(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N*piece), "cpu-ns/B")
	}
	b.Run("stream", func(b *testing.B) {
		c, s := pair(b, listenStream(b, testConfig(b, "streams", "w1", RoleWorker)), "w2", "w2's stream")
		run(b, c, s)
	})
	b.Run("quic", func(b *testing.B) {
		l := listen(b, testConfig(b, "streams", "w1", RoleWorker))
		c, s := connect(b, l, testConfig(b, "streams", "w2", RoleWorker))
		run(b, c, s)
	})
}
