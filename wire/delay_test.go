package wire

import (
	"net"
	"reflect"
	"testing"
	"time"
)

// TestSendDelayDelaysEveryRoundTrip: with SendDelay on both ends, a
// request and its answer cross two delay lines, so no round trip can be
// shorter than twice the delay, and messages still arrive intact and in
// order. (A lower bound only: an upper bound would be a timing test.)
func TestSendDelayDelaysEveryRoundTrip(t *testing.T) {
	const delay = 4 * time.Millisecond
	if g := TimerGrain(); g > delay {
		t.Fatalf("timer grain %v: pick a longer delay for this test", g)
	}
	scfg := testConfig(t, "a", "w1", RoleMain)
	scfg.SendDelay = delay
	ccfg := testConfig(t, "a", "main", RoleWorker)
	ccfg.SendDelay = delay
	l := listen(t, scfg)
	client, server := connect(t, l, ccfg)
	msgs := sampleMessages(64)
	for i := 0; i < 5; i++ {
		for _, m := range msgs[:3] {
			t0 := time.Now()
			send(t, client, m)
			got := recv(t, server)
			send(t, server, got)
			back := recv(t, client)
			if rtt := time.Since(t0); rtt < 2*delay {
				t.Fatalf("round trip %v through two %v delay lines", rtt, delay)
			}
			if !reflect.DeepEqual(back, m) {
				t.Fatalf("%v came back as %+v", m.Type(), back)
			}
		}
	}
}

func TestSendDelayBelowTheTimerGrainIsLeftOut(t *testing.T) {
	cfg := testConfig(t, "a", "w1")
	cfg.SendDelay = time.Nanosecond
	l := listen(t, cfg)
	if _, ok := l.pc.(*delayConn); ok {
		t.Fatal("a 1 ns delay was applied with sleeps")
	}
	cfg.SendDelay = 2 * TimerGrain()
	l2 := listen(t, cfg)
	if _, ok := l2.pc.(*delayConn); !ok {
		t.Fatalf("a delay of twice the timer grain (%v) was not applied", TimerGrain())
	}
}

// TestADelayLineDeliversWhatWasOnItWhenClosed: datagrams sent just
// before a node closes its socket still arrive, a delay later, as a
// link delivers what is on it: the node's goodbye (QUIC's
// CONNECTION_CLOSE) reaches its peers instead of leaving them to wait
// for their idle timeout.
func TestADelayLineDeliversWhatWasOnItWhenClosed(t *testing.T) {
	recvConn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer recvConn.Close()
	sendConn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := newDelayConn(sendConn, 3*time.Millisecond)
	for i := range 3 {
		if _, err := d.WriteTo([]byte{byte(i)}, recvConn.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WriteTo([]byte{9}, recvConn.LocalAddr()); err == nil {
		t.Fatal("a closed delay line took a datagram")
	}
	recvConn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	for i := range 3 {
		n, _, err := recvConn.ReadFrom(buf)
		if err != nil {
			t.Fatalf("datagram %d of 3 sent before the close: %v", i, err)
		}
		if n != 1 || buf[0] != byte(i) {
			t.Fatalf("datagram %d arrived as %v", i, buf[:n])
		}
	}
}
