package procswarm

import (
	"net"
	"os"
	"strconv"
	"testing"
)

// TestFreeUDPAddrNeverRepeats: the addresses handed to nodes that have
// not bound them yet are all different.
func TestFreeUDPAddrNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		addr, err := FreeUDPAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
	}
}

// TestFreeUDPAddrPicksBelowTheEphemeralRange: where the kernel says its
// ephemeral range, the ports handed out lie below it (where no dial's
// port 0 lands), UDP and TCP, are bindable, and are never handed out
// twice.
func TestFreeUDPAddrPicksBelowTheEphemeralRange(t *testing.T) {
	lo, hi := belowEphemeral()
	seen := map[string]bool{}
	for range 32 {
		addr, err := FreeUDPAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if hi > lo && (port < lo || port >= hi) {
			t.Errorf("%s: want a port in [%d, %d), below the ephemeral range", addr, lo, hi)
		}
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
	_, p, _ := net.SplitHostPort(tcp)
	if port, _ := strconv.Atoi(p); hi > lo && (port < lo || port >= hi) {
		t.Errorf("TCP %s: want a port in [%d, %d)", tcp, lo, hi)
	}
	if _, err := os.Stat("/proc/sys/net/ipv4/ip_local_port_range"); err == nil && hi <= lo {
		t.Errorf("the kernel says its ephemeral range, yet no range below it: [%d, %d)", lo, hi)
	}
}
