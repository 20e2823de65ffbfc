package wire

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRoundTripEveryMessageTypeOverQUIC(t *testing.T) {
	scfg := testConfig(t, "a", "w1", RoleMain, RoleShadow)
	scfg.Hello.DeviceMemBytes = 1 << 30
	scfg.Hello.Version = "test"
	l := listen(t, scfg)
	client, server := connect(t, l, testConfig(t, "a", "main", RoleWorker))

	if got, want := client.Identity(), (Identity{"w1", RoleWorker}); got != want {
		t.Errorf("client sees %v, want %v", got, want)
	}
	if got, want := server.Identity(), (Identity{"main", RoleMain}); got != want {
		t.Errorf("server sees %v, want %v", got, want)
	}
	if h := client.Hello(); h.DeviceMemBytes != 1<<30 || h.Version != "test" || h.Arch == "" {
		t.Errorf("worker's hello as the main node sees it: %+v", h)
	}
	msgs := sampleMessages(4096)
	for _, m := range msgs {
		send(t, client, m)
		got := recv(t, server)
		if !reflect.DeepEqual(got, m) {
			t.Errorf("main -> worker %v: got %+v", m.Type(), got)
		}
		send(t, server, got)
		back := recv(t, client)
		if !reflect.DeepEqual(back, m) {
			t.Errorf("worker -> main %v: got %+v", m.Type(), back)
		}
	}
	// every message once each way, and the Hellos
	if s := l.Stats().Snapshot(); s.PeersAccepted != 1 || s.FramesReceived != uint64(len(msgs)+1) || s.FramesSent != uint64(len(msgs)+1) || len(s.Errors) != 0 {
		t.Errorf("listener stats %+v", s)
	}
}

func TestManyConcurrentStreams(t *testing.T) {
	l := listen(t, testConfig(t, "a", "w1"))
	client, server := connect(t, l, testConfig(t, "a", "shadow"))
	const senders, each = 24, 6
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				var m Message = &Prediction{Pass: int64(g), Layer: i, Experts: []int32{int32(g), int32(i)}}
				if i%2 == 1 { // a bulk stream of its own
					data := make([]byte, 64<<10+2*g)
					for j := range data {
						data[j] = byte(g + i + j)
					}
					m = bulk(uint64(g), data)
					m.(*Alignment).Pass = int64(i)
				}
				if err := client.Send(context.Background(), m); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	seen := map[[2]int]bool{}
	for range senders * each {
		switch m := recv(t, server).(type) {
		case *Prediction:
			seen[[2]int{int(m.Pass), m.Layer}] = true
			if m.Experts[0] != int32(m.Pass) || m.Experts[1] != int32(m.Layer) {
				t.Errorf("prediction %+v mixed up", m)
			}
		case *Alignment:
			g, i := int(m.Seq), int(m.Pass)
			seen[[2]int{g, i}] = true
			data := bulkData(m)
			if len(data) != 64<<10+2*g {
				t.Fatalf("chunk %d/%d has %d bytes", g, i, len(data))
			}
			for j, b := range data {
				if b != byte(g+i+j) {
					t.Fatalf("chunk %d/%d byte %d corrupted", g, i, j)
				}
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(seen) != senders*each {
		t.Errorf("received %d distinct messages, want %d", len(seen), senders*each)
	}
}

// TestUrgentMessageOvertakesBulkTransfer: a prediction sent once a 24 MiB
// chunk's stream has started arriving reaches the receiver before the
// chunk does.
func TestUrgentMessageOvertakesBulkTransfer(t *testing.T) {
	lcfg := testConfig(t, "a", "w1")
	arrived := make(chan struct{}, 1)
	lcfg.bulkArrived = func() {
		select {
		case arrived <- struct{}{}:
		default:
		}
	}
	l := listen(t, lcfg)
	client, server := connect(t, l, testConfig(t, "a", "main"))
	bulkDone := make(chan error, 1)
	go func() {
		bulkDone <- client.Send(context.Background(), bulk(0, make([]byte, 24<<20)))
	}()
	select { // the chunk is on its way
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the chunk's stream never arrived")
	}
	send(t, client, &Prediction{Layer: 1})
	if m := recv(t, server); m.Type() != typePrediction {
		t.Errorf("first message is %v: the prediction waited behind the 24 MiB chunk", m.Type())
	}
	if err := <-bulkDone; err != nil {
		t.Fatal(err)
	}
	if m := recv(t, server); m.Type() != typeAlignment {
		t.Errorf("second message is %v, want the chunk", m.Type())
	}
}

func TestPeerOfAnotherClusterIsRefused(t *testing.T) {
	t.Run("client of another CA", func(t *testing.T) {
		// An intruder with the cluster's public ca.pem but a certificate
		// signed by its own CA.
		l := listen(t, testConfig(t, "a", "w1"))
		dcfg := testConfig(t, "b", "main")
		dcfg.Certs.pool = testConfig(t, "a", "main").Certs.pool
		dcfg.DialAttempts = 5
		dcfg.Stats = new(Stats)
		_, err := Dial(context.Background(), l.Addr().String(), dcfg)
		if err == nil {
			t.Fatal("a node of another cluster connected")
		}
		if got := l.Stats().Refused.Load(); got != 1 {
			t.Errorf("listener counted %d refusals, want 1", got)
		}
		if got := dcfg.Stats.DialRetries.Load(); got != 0 {
			t.Errorf("dialer retried a refusal %d times", got)
		}
		t.Logf("dialer sees: %v", err)
	})
	t.Run("server of another CA", func(t *testing.T) {
		l := listen(t, testConfig(t, "b", "w1"))
		dcfg := testConfig(t, "a", "main")
		dcfg.Stats = new(Stats)
		dcfg.DialAttempts = 5
		_, err := Dial(context.Background(), l.Addr().String(), dcfg)
		if err == nil {
			t.Fatal("connected to a node of another cluster")
		}
		if r, retries := dcfg.Stats.Refused.Load(), dcfg.Stats.DialRetries.Load(); r != 1 || retries != 0 {
			t.Errorf("dialer counted %d refusals and %d retries, want 1 and 0", r, retries)
		}
		t.Logf("dialer sees: %v", err)
	})
}

func TestPeerWithWrongRoleIsRefused(t *testing.T) {
	cases := []struct {
		name         string
		server       string
		serverAccept []Role
		client       string
		clientAccept []Role
		clientWants  string // PeerName
	}{
		{"a worker dials a worker that accepts main and shadow", "w1", []Role{RoleMain, RoleShadow}, "w2", nil, ""},
		{"the main node dials what it expects to be a worker", "shadow", nil, "main", []Role{RoleWorker}, ""},
		{"the main node dials w2 and finds w1", "w1", nil, "main", []Role{RoleWorker}, "w2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := listen(t, testConfig(t, "a", tc.server, tc.serverAccept...))
			dcfg := testConfig(t, "a", tc.client, tc.clientAccept...)
			dcfg.PeerName = tc.clientWants
			p, err := Dial(context.Background(), l.Addr().String(), dcfg)
			if err == nil {
				p.Close()
				t.Fatalf("%s connected to %s", tc.client, tc.server)
			}
			t.Logf("dialer sees: %v", err)
		})
	}
}

func TestInsecureModeTrustsTheHello(t *testing.T) {
	insecure := func(name string, role Role, accept ...Role) *Config {
		return &Config{Insecure: true, Name: name, Role: role, PeerRoles: accept, Log: testLogger(t), DialAttempts: 1, HandshakeTimeout: 2 * time.Second}
	}
	l := listen(t, insecure("w1", RoleWorker, RoleMain))
	client, server := connect(t, l, insecure("main", RoleMain))
	if server.Identity() != (Identity{"main", RoleMain}) || client.Identity() != (Identity{"w1", RoleWorker}) {
		t.Fatalf("identities %v / %v", server.Identity(), client.Identity())
	}
	send(t, client, &Prediction{Layer: 2})
	if m := recv(t, server); m.(*Prediction).Layer != 2 {
		t.Fatal("wrong message")
	}
	if _, err := Dial(context.Background(), l.Addr().String(), insecure("w9", RoleWorker)); !errors.Is(err, ErrIdentity) {
		t.Errorf("a worker claiming to be one was let in as a main node's peer: %v", err)
	}
	if _, err := Dial(context.Background(), l.Addr().String(), testConfig(t, "a", "main")); err == nil {
		t.Error("a node with certificates accepted an uncertified listener")
	}
	sl := listen(t, testConfig(t, "a", "w2"))
	if _, err := Dial(context.Background(), sl.Addr().String(), insecure("main", RoleMain)); err == nil {
		t.Error("a listener with certificates accepted an uncertified node")
	}
}

func TestVanishedPeerIsDetectedWithinIdleTimeout(t *testing.T) {
	const idle = 400 * time.Millisecond
	scfg := testConfig(t, "a", "w1")
	scfg.IdleTimeout, scfg.KeepAlivePeriod = idle, idle/4
	dcfg := testConfig(t, "a", "main")
	dcfg.IdleTimeout, dcfg.KeepAlivePeriod = idle, idle/4
	l := listen(t, scfg)
	client, server := connect(t, l, dcfg)
	send(t, client, &Heartbeat{Seq: 1})
	recv(t, server)

	// The client's machine vanishes: its socket closes without a word.
	start := time.Now()
	client.release()
	ctx, cancel := context.WithTimeout(context.Background(), 20*idle)
	defer cancel()
	_, err := server.Recv(ctx)
	elapsed := time.Since(start)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("server's Recv: %v after %v, want ErrTimeout", err, elapsed)
	}
	// quic-go allows max(idle timeout, 3 PTO); loopback PTOs are tiny,
	// so what this bounds is scheduling on a loaded test machine.
	if elapsed > 5*idle {
		t.Errorf("vanished peer detected after %v, idle timeout %v", elapsed, idle)
	}
	if got := l.Stats().PeersLost.Load(); got != 1 {
		t.Errorf("PeersLost = %d, want 1", got)
	}
	t.Logf("detected after %v (idle timeout %v)", elapsed, idle)
}

func TestReconnectToRestartedListener(t *testing.T) {
	scfg := testConfig(t, "a", "w1")
	l := listen(t, scfg)
	addr := l.Addr().String()
	client, server := connect(t, l, testConfig(t, "a", "main"))
	send(t, server, &Heartbeat{Seq: 1})
	recv(t, client)

	l.Close() // the worker restarts
	_, err := client.Recv(context.Background())
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("client after the listener closed: %v, want ErrClosed", err)
	}
	if err := client.Send(context.Background(), &Heartbeat{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send on a closed peer: %v, want ErrClosed", err)
	}

	l2, err := Listen(context.Background(), addr, scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l2.Close() })
	client2, server2 := connect(t, l2, testConfig(t, "a", "main"))
	send(t, client2, &Prediction{Layer: 9})
	if m := recv(t, server2); m.(*Prediction).Layer != 9 {
		t.Fatal("wrong message after reconnect")
	}
}

func TestDialRetriesUntilTheListenerIsUp(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	dcfg := testConfig(t, "a", "main")
	dcfg.Stats = new(Stats)
	dcfg.HandshakeTimeout, dcfg.DialAttempts, dcfg.DialBackoff = 150*time.Millisecond, 30, 20*time.Millisecond
	type result struct {
		p   *Peer
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := Dial(context.Background(), addr, dcfg)
		done <- result{p, err}
	}()
	for dcfg.Stats.DialRetries.Load() == 0 { // bounded: Dial gives up after 30 attempts
		select {
		case r := <-done:
			t.Fatalf("Dial ended before the listener was up: %v", r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	l, err := Listen(context.Background(), addr, testConfig(t, "a", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.p.Close()
	if r.p.Identity().Name != "w1" {
		t.Fatalf("connected to %v", r.p.Identity())
	}
}

func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	scfg := testConfig(t, "a", "w1")
	scfg.MaxFrameBytes = 1 << 20
	l := listen(t, scfg)
	healthy, healthyServer := connect(t, l, testConfig(t, "a", "main"))
	for _, tc := range badFrames(t) {
		if tc.name == "truncated header" || tc.name == "truncated body" {
			continue // on a live stream these just wait for more bytes
		}
		t.Run(tc.name, func(t *testing.T) {
			bad, _ := connect(t, l, testConfig(t, "a", "shadow"))
			before := l.Stats().Errors(tc.code)
			bad.ctrlMu.Lock()
			_, err := bad.ctrl.Write(tc.input)
			bad.ctrlMu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			_, err = bad.Recv(context.Background())
			var ce *ConnError
			if !errors.As(err, &ce) || ce.Code != tc.code || !ce.Remote {
				t.Fatalf("sender of bad input sees %v, want a remote %v", err, tc.code)
			}
			if got := l.Stats().Errors(tc.code) - before; got != 1 {
				t.Errorf("listener counted %d %v errors, want 1", got, tc.code)
			}
			// The other connection carries on.
			send(t, healthy, &Prediction{Layer: 4})
			if m := recv(t, healthyServer); m.(*Prediction).Layer != 4 {
				t.Fatal("wrong message on the healthy connection")
			}
		})
	}
	t.Run("truncated bulk stream", func(t *testing.T) {
		bad, _ := connect(t, l, testConfig(t, "a", "shadow"))
		s, err := bad.conn.OpenUniStream()
		if err != nil {
			t.Fatal(err)
		}
		s.Write(append([]byte{classBulk}, rawFrame(typePrediction, []byte{0x93, 1, 1})...)) // body cut short
		s.Close()
		if _, err := bad.Recv(context.Background()); !errors.Is(err, ErrMalformed) {
			t.Fatalf("got %v, want ErrMalformed", err)
		}
	})
	t.Run("second control stream", func(t *testing.T) {
		bad, _ := connect(t, l, testConfig(t, "a", "shadow"))
		s, err := bad.conn.OpenUniStream()
		if err != nil {
			t.Fatal(err)
		}
		s.Write([]byte{classControl})
		if _, err := bad.Recv(context.Background()); !errors.Is(err, ErrProtocol) {
			t.Fatalf("got %v, want ErrProtocol", err)
		}
	})
	// The listener still accepts newcomers.
	c, s := connect(t, l, testConfig(t, "a", "shadow"))
	send(t, c, &Heartbeat{Seq: 5})
	if m := recv(t, s); m.(*Heartbeat).Seq != 5 {
		t.Fatal("wrong message")
	}
}

func TestSendRefusesInvalidMessages(t *testing.T) {
	l := listen(t, testConfig(t, "a", "w1"))
	client, _ := connect(t, l, testConfig(t, "a", "main"))
	err := client.Send(context.Background(), &Activation{Hidden: Tensor{DType: F32, Shape: []int{2}, Data: make([]byte, 7)}})
	if !errors.Is(err, ErrBadTensor) {
		t.Fatalf("got %v, want ErrBadTensor", err)
	}
	if err := client.Send(context.Background(), &Hello{Name: "x", Role: RoleMain}); err == nil {
		t.Fatal("Send let a Hello through")
	}
	for _, a := range []*Alignment{
		{Seq: 1, Pass: 2, Token: 5},                                                                           // outside a pass
		{Seq: 1, Pass: 2, Token: 5, Batch: 9, BatchPass: 0, BatchSize: 1},                                     // pass 0
		{Seq: 1, Pass: 2, Token: 5, Batch: 9, BatchPass: 3, BatchSize: 0},                                     // no members
		{Seq: 1, Pass: 1, Token: -1, Batch: 9, BatchPass: 3, BatchSize: 1, PromptLeft: 4},                     // prompt left, no chunk
		{Seq: 1, Pass: 1, Token: -1, Batch: 9, BatchPass: 3, BatchSize: 1, Chunk: []int32{1}, PromptLeft: -1}, // negative
		{Seq: 1, Pass: 1, Token: 5, Batch: 9, BatchPass: 3, BatchSize: 1, Sampling: &Sampling{Temperature: 1, BiasIDs: []int32{1}}},
		{Seq: 1, Pass: 1, Token: 5, Batch: 9, BatchPass: 3, BatchSize: 1, Sampling: &Sampling{Temperature: math.NaN()}},
		{Seq: 1, Pass: 1, Token: 5, Batch: 9, BatchPass: 3, BatchSize: 1, Sampling: &Sampling{Temperature: 1, PromptLen: -2}},
	} {
		if err := client.Send(context.Background(), a); !errors.Is(err, ErrMalformed) {
			t.Fatalf("alignment %+v: got %v, want ErrMalformed", a, err)
		}
	}
	// still usable
	if err := client.Send(context.Background(), &Heartbeat{}); err != nil {
		t.Fatal(err)
	}
}

func TestCleanCloseIsSeenByThePeer(t *testing.T) {
	l := listen(t, testConfig(t, "a", "w1"))
	client, server := connect(t, l, testConfig(t, "a", "main"))
	send(t, client, &Prediction{Layer: 1})
	if m := recv(t, server); m.(*Prediction).Layer != 1 {
		t.Fatal("wrong message")
	}
	client.Close()
	_, err := server.Recv(context.Background())
	var ce *ConnError
	if !errors.As(err, &ce) || ce.Code != CodeClosed || !ce.Remote {
		t.Fatalf("server sees %v, want a remote clean close", err)
	}
	<-server.Done()
	if !errors.Is(server.Err(), ErrClosed) {
		t.Fatalf("Err() = %v", server.Err())
	}
}

func TestConfigErrors(t *testing.T) {
	certs, err := LoadCerts(testCluster(t, "a"), "w1")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  *Config
	}{
		{"nothing", &Config{}},
		{"both certs and insecure", &Config{Certs: certs, Insecure: true}},
		{"insecure without a name", &Config{Insecure: true, Role: RoleMain}},
		{"name differs from certificate", &Config{Certs: certs, Name: "w2"}},
		{"unknown peer role", &Config{Certs: certs, PeerRoles: []Role{"boss"}}},
		{"tiny frames", &Config{Certs: certs, MaxFrameBytes: 10}},
		{"connection's buffer room below a frame", &Config{Certs: certs, MaxFrameBytes: 1 << 20, MaxConnBufferedBytes: 1<<20 - 1}},
		{"listener's buffer room below a largest frame", &Config{Certs: certs, ConnGuaranteedBytes: 16 << 20, MaxBufferedBytes: 60 << 20}},
		{"a connection's own room above its bound", &Config{Certs: certs, MaxFrameBytes: 1 << 20, ConnGuaranteedBytes: 4 << 20}},
		{"buffer room past 1 TiB", &Config{Certs: certs, MaxConnBufferedBytes: 1 << 50}},
	}
	for _, tc := range cases {
		if _, err := Listen(context.Background(), "127.0.0.1:0", tc.cfg); err == nil {
			t.Errorf("%s: Listen accepted the config", tc.name)
		}
	}
}

// TestCloseForTellsThePeerWhy: a connection closed with a reason ends
// the other side's Recv with ErrClosed whose message carries the reason.
func TestCloseForTellsThePeerWhy(t *testing.T) {
	l := listen(t, testConfig(t, "a", "w1"))
	client, server := connect(t, l, testConfig(t, "a", "main"))
	server.CloseFor("w1's store is unreadable")
	_, err := client.Recv(context.Background())
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "w1's store is unreadable") {
		t.Fatalf("the other side sees %v", err)
	}
}

func TestListenerClosesWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	l, err := Listen(ctx, "127.0.0.1:0", testConfig(t, "a", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	client, _ := connect(t, l, testConfig(t, "a", "main"))
	cancel()
	if _, err := client.Recv(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("client sees %v after the listener's context ended", err)
	}
	if _, err := l.Accept(context.Background()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept: %v", err)
	}
}

func ExampleDial() {
	certs, err := LoadCerts("/etc/odmoe/certs", "main")
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	w1, err := Dial(ctx, "10.0.0.11:7070", &Config{Certs: certs, PeerRoles: []Role{RoleWorker}, PeerName: "w1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w1.Close()
	_ = w1.Send(ctx, &Prediction{Pass: 0, Layer: 0, Experts: []int32{3, 6}})
}
