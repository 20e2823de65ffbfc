package mainnode

import (
	"testing"
	"time"
)

// TestRecentPassesKeepTheLast16InOrderWithoutAllocating: 20 passes of 3
// layers leave passes 5..20, oldest first, each layer's figures its own;
// once the ring is full a pass allocates nothing.
func TestRecentPassesKeepTheLast16InOrderWithoutAllocating(t *testing.T) {
	var s Stats
	pass := func(it int64) {
		for l := range 3 {
			s.main(false, it, l, time.Duration(it)*time.Millisecond)
			s.experts(false, it, l, layerSample{wall: time.Duration(l+1) * time.Millisecond})
		}
	}
	for it := int64(1); it <= 20; it++ {
		pass(it)
	}
	got := s.recentPasses()
	if len(got) != recentPasses {
		t.Fatalf("%d passes kept", len(got))
	}
	for i, p := range got {
		want := int64(5 + i)
		if p.Pass != want || len(p.Layers) != 3 || p.Layers[0].MainMs != float64(want) || p.Layers[2].ExpertsMs != 3 {
			t.Fatalf("pass %d: %+v, want pass %d", i, p, want)
		}
	}
	it := int64(21)
	if allocs := testing.AllocsPerRun(50, func() { pass(it); it++ }); allocs != 0 {
		t.Fatalf("%v allocations a pass", allocs)
	}
}
