package procswarm

import (
	"net"
	"os"
	"strconv"
	"testing"
)

// TestFreeAddrsPickBelowTheEphemeralRange: the addresses handed to nodes
// that have not bound them yet are all different, bindable, and, where
// the kernel says its ephemeral range, below it (where no dial's port 0
// lands), UDP and TCP.
func TestFreeAddrsPickBelowTheEphemeralRange(t *testing.T) {
	lo, hi := belowEphemeral()
	if _, err := os.Stat("/proc/sys/net/ipv4/ip_local_port_range"); err == nil && hi <= lo {
		t.Errorf("the kernel says its ephemeral range, yet no range below it: [%d, %d)", lo, hi)
	}
	below := func(addr string) {
		t.Helper()
		_, p, _ := net.SplitHostPort(addr)
		if port, _ := strconv.Atoi(p); hi > lo && (port < lo || port >= hi) {
			t.Errorf("%s: want a port in [%d, %d), below the ephemeral range", addr, lo, hi)
		}
	}
	seen := map[string]bool{}
	for range 200 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		below(addr)
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatalf("%s handed out, not bindable: %v", addr, err)
		}
		c.Close()
	}
	tcp, err := FreeTCPAddr()
	if err != nil {
		t.Fatal(err)
	}
	below(tcp)
}
