package demo

import (
	"net"
	"strings"
	"testing"
)

// TestHTTPAddrGivesWayOnlyByDefault: a taken default port gives way
// to a free one; a taken port the user chose is an error naming it.
func TestHTTPAddrGivesWayOnlyByDefault(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().String()
	if _, err := HTTPAddr(taken, true); err == nil || !strings.Contains(err.Error(), "-http "+taken) {
		t.Errorf("a taken -http %s: %v, want an error naming it", taken, err)
	}
	got, err := HTTPAddr(taken, false)
	if err != nil || got == taken || !strings.HasPrefix(got, "127.0.0.1:") {
		t.Errorf("a taken default %s gave %q, %v; want another free port", taken, got, err)
	}
	if got, err := HTTPAddr("127.0.0.1:0", true); err != nil || strings.HasSuffix(got, ":0") {
		t.Errorf("-http 127.0.0.1:0 gave %q, %v; want the port resolved", got, err)
	}
}
