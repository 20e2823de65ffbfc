package simrig

import (
	"strings"
	"testing"

	"github.com/odmoe/odmoe/testbed"
)

// TestNodeIntFlagReadsARigNodesFlag: "-name V" and "-name=V", the last
// setting counting as for the node itself, the default when unset, and
// an error naming the node for a value that is not a number.
func TestNodeIntFlagReadsARigNodesFlag(t *testing.T) {
	n := testbed.Node{Name: "main", Flags: []string{"-group", "4", "-x", "1", "-group=2"}}
	if v, err := NodeIntFlag(n, "-group", 8); err != nil || v != 2 {
		t.Fatalf("-group: %v, %v; want 2 (the last)", v, err)
	}
	if v, err := NodeIntFlag(n, "-ahead", 1); err != nil || v != 1 {
		t.Fatalf("-ahead unset: %v, %v; want the default 1", v, err)
	}
	n.Flags = []string{"-group", "two"}
	if _, err := NodeIntFlag(n, "-group", 8); err == nil || !strings.Contains(err.Error(), "main") {
		t.Fatalf("-group two: %v; want an error naming the node", err)
	}
}
