package wire

import (
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
