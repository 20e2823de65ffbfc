package procswarm

import "testing"

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
