package sched

import (
	"slices"
	"strings"
	"testing"
)

func TestLayoutNeedsWholeGroups(t *testing.T) {
	for _, c := range []struct{ w, g int }{{3, 2}, {0, 2}, {4, 0}} {
		if _, err := NewLayout(c.w, c.g); err == nil {
			t.Errorf("NewLayout(%d, %d) accepted", c.w, c.g)
		}
	}
}

// TestDecodeIsRoundRobinOverGroups mirrors OD-MoE's ten-node rig: 8 workers
// in groups of 2, so layers 0..3 run on workers {0,1},{2,3},{4,5},{6,7}
// and layer 4 on {0,1} again.
func TestDecodeIsRoundRobinOverGroups(t *testing.T) {
	l, err := NewLayout(8, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 1}, {2, 3}}
	for layer, w := range want {
		got := l.Assign(nil, layer, []int{3, 6}, false)
		if !slices.Equal(got, w) {
			t.Errorf("layer %d: workers %v, want %v", layer, got, w)
		}
	}
	// more experts than group members wrap inside the group
	if got := l.Assign(nil, 1, []int{0, 1, 2}, false); !slices.Equal(got, []int{2, 3, 2}) {
		t.Errorf("3 experts in a group of 2: %v", got)
	}
}

func TestPrefillSpreadsExpertsOverAllWorkers(t *testing.T) {
	l, _ := NewLayout(4, 2)
	got := l.Assign(nil, 5, []int{0, 1, 2, 3, 4, 5, 6, 7}, true)
	if !slices.Equal(got, []int{0, 1, 2, 3, 0, 1, 2, 3}) {
		t.Fatalf("prefill workers %v", got)
	}
}

func TestPlaceDecodeKeepsHintedExpertsWhereTheyWereLoaded(t *testing.T) {
	l, _ := NewLayout(4, 2) // layer 1 -> group 1 = workers {2, 3}
	cases := []struct {
		experts []int
		hinted  map[int]int
		want    []int
	}{
		{[]int{2, 5}, map[int]int{2: 2, 5: 3}, []int{2, 3}}, // right prediction
		{[]int{1, 2}, map[int]int{2: 2, 5: 3}, []int{3, 2}}, // 2 stays on w2, 1 takes the free w3
		{[]int{1, 6}, map[int]int{2: 2, 5: 3}, []int{2, 3}}, // all wrong: in order
		{[]int{2, 5}, map[int]int{2: 0, 5: 3}, []int{2, 3}}, // a hint outside the group is ignored
		{[]int{3, 4}, nil, []int{2, 3}},
	}
	for _, c := range cases {
		if got := l.PlaceDecode(nil, 1, c.experts, c.hinted); !slices.Equal(got, c.want) {
			t.Errorf("experts %v hinted %v: workers %v, want %v", c.experts, c.hinted, got, c.want)
		}
	}
}

func TestResidentOwnersSpreadEachLayerOverDistinctWorkers(t *testing.T) {
	l, _ := NewLayout(8, 2)
	const layers, experts = 32, 8
	held := make([]int, l.Workers)
	for layer := range layers {
		seen := map[int]bool{}
		for e := range experts {
			w := l.Owner(layer, e)
			if w < 0 || w >= l.Workers || seen[w] {
				t.Fatalf("layer %d expert %d on worker %d (seen %v)", layer, e, w, seen)
			}
			seen[w] = true
		}
		for w := range l.Workers {
			for _, e := range l.Owned(w, layer, experts) {
				if l.Owner(layer, e) != w {
					t.Fatalf("Owned(%d, %d) lists expert %d, owned by %d", w, layer, e, l.Owner(layer, e))
				}
				held[w]++
			}
		}
	}
	for w, n := range held {
		if n != layers*experts/l.Workers {
			t.Errorf("worker %d holds %d experts, want %d", w, n, layers*experts/l.Workers)
		}
	}
	if got := l.Owners(nil, 3, []int{1, 6}); got[0] != 4 || got[1] != 1 {
		t.Errorf("Owners(3, [1 6]) = %v, want [4 1]", got)
	}
}

// TestPlacePredictedIsPlaceDecodeOfThePrediction: placing on a prediction
// directly gives what PlaceDecode gives with the hints that prediction
// made (its i-th expert on DecodeWorker(layer, i)), for every pair of
// 2-of-8 routings and predictions and groups of 2 and 4.
func TestPlacePredictedIsPlaceDecodeOfThePrediction(t *testing.T) {
	var pairs [][]int
	for a := range 8 {
		for b := a + 1; b < 8; b++ {
			pairs = append(pairs, []int{a, b})
		}
	}
	for _, g := range []int{2, 4} {
		l, _ := NewLayout(8, g)
		for layer := range 3 {
			for _, experts := range pairs {
				for _, pred := range append(pairs, nil) {
					hinted := map[int]int{}
					for i, e := range pred {
						hinted[e] = l.DecodeWorker(layer, i)
					}
					want := l.PlaceDecode(nil, layer, experts, hinted)
					if got := l.PlacePredicted(nil, layer, experts, pred, nil); !slices.Equal(got, want) {
						t.Fatalf("group %d layer %d experts %v predicted %v: %v, want %v", g, layer, experts, pred, got, want)
					}
				}
			}
		}
	}
}

// TestPredictionHintsAreWherePlacePredictedLooks: when the routing is what
// was predicted, every expert is placed on the worker its hint went to,
// each predicted expert is hinted exactly once, and only the layer's
// group is hinted; for groups of 2 and 4 and 1 to 6 predicted experts.
func TestPredictionHintsAreWherePlacePredictedLooks(t *testing.T) {
	for _, g := range []int{2, 4} {
		l, _ := NewLayout(8, g)
		for layer := range 3 {
			for k := 1; k <= 6; k++ {
				predicted := make([]int, k)
				for i := range predicted {
					predicted[i] = 3*i + 1
				}
				hintedTo := map[int]int{}
				l.PredictionHints(layer, predicted, nil, func(w int, experts []int) {
					if l.GroupOf(layer) != w/l.Group {
						t.Fatalf("layer %d: hint to worker %d outside its group", layer, w)
					}
					for _, e := range experts {
						if _, dup := hintedTo[e]; dup {
							t.Fatalf("expert %d hinted twice", e)
						}
						hintedTo[e] = w
					}
				})
				placed := l.PlacePredicted(nil, layer, predicted, predicted, nil)
				for i, e := range predicted {
					if w, ok := hintedTo[e]; !ok || w != placed[i] {
						t.Fatalf("group %d layer %d: expert %d hinted to %d (ok=%v), placed on %d", g, layer, e, w, ok, placed[i])
					}
				}
			}
		}
	}
}

func TestDefaultGroupSplitsTheWorkersEvenly(t *testing.T) {
	for _, c := range []struct{ workers, topK, want int }{
		{8, 2, 2}, {1, 2, 1}, {3, 2, 1}, {6, 4, 3}, {8, 8, 8}, {4, 8, 4}, {7, 8, 7}, {9, 8, 3},
	} {
		g := DefaultGroup(c.workers, c.topK)
		if g != c.want {
			t.Errorf("DefaultGroup(%d workers, top-%d) = %d, want %d", c.workers, c.topK, g, c.want)
		}
		if _, err := NewLayout(c.workers, g); err != nil {
			t.Error(err)
		}
	}
	if _, err := NewLayout(1, 2); err == nil || !strings.Contains(err.Error(), "give -group 1") {
		t.Errorf("NewLayout(1, 2): %v", err)
	}
}

// TestPredictionWorkersKeepWhatStays: a fresh prediction goes where
// PredictionHints sends it; revised (an expert dropped, others added),
// every expert that stays keeps its worker, the new ones fill the least
// loaded workers of the group, and PlacePredicted told those workers
// places every expert there; for groups of 2 and 4.
func TestPredictionWorkersKeepWhatStays(t *testing.T) {
	for _, g := range []int{2, 4} {
		l, _ := NewLayout(8, g)
		for layer := range 3 {
			was := []int{1, 4, 6, 9}
			on := l.PredictionWorkers(nil, layer, was, nil, nil, nil)
			for i := range was {
				if on[i] != l.DecodeWorker(layer, i) {
					t.Fatalf("group %d layer %d: fresh prediction %v on %v, want expert %d on %d", g, layer, was, on, was[i], l.DecodeWorker(layer, i))
				}
			}
			now := []int{0, 1, 6, 9, 11} // 4 gone; 0 and 11 new
			got := l.PredictionWorkers(nil, layer, now, was, on, nil)
			load := map[int]int{}
			for i, e := range now {
				if j, ok := slices.BinarySearch(was, e); ok && got[i] != on[j] {
					t.Fatalf("group %d layer %d: expert %d moved from %d to %d", g, layer, e, on[j], got[i])
				}
				if got[i]/g != l.GroupOf(layer) {
					t.Fatalf("group %d layer %d: expert %d on worker %d outside the group", g, layer, e, got[i])
				}
				load[got[i]]++
			}
			most, least := 0, len(now)
			for j := range g {
				most, least = max(most, load[l.DecodeWorker(layer, j)]), min(least, load[l.DecodeWorker(layer, j)])
			}
			if most-least > 1 {
				t.Fatalf("group %d layer %d: loads %v after revision, uneven", g, layer, load)
			}
			placed := l.PlacePredicted(nil, layer, now, now, got)
			if !slices.Equal(placed, got) {
				t.Fatalf("group %d layer %d: placed %v, hinted %v", g, layer, placed, got)
			}
			// a worker outside the group, or none, counts as no hint
			bad := slices.Clone(got)
			bad[0], bad[1] = (l.GroupOf(layer)+1)%l.Groups()*g, -1
			placed = l.PlacePredicted(nil, layer, now, now, bad)
			for i := range 2 {
				if placed[i]/g != l.GroupOf(layer) {
					t.Fatalf("group %d layer %d: expert %d placed on %d outside the group", g, layer, now[i], placed[i])
				}
			}
		}
	}
}

// TestAWorkersShareHoldsEveryExpertItRuns: a worker's share (Holds) has
// every expert the layout hands it, in decode (whatever a pass's other
// experts are) and in prefill, and little else: on 8 workers in groups
// of 2 over 8 layers of 64 experts, a quarter of the store and 1/8 of
// the rest.
func TestAWorkersShareHoldsEveryExpertItRuns(t *testing.T) {
	l, err := NewLayout(8, 2)
	if err != nil {
		t.Fatal(err)
	}
	const layers, experts = 8, 64
	for layer := range layers {
		for e := range experts {
			if w := l.PrefillWorker(e); !l.Holds(w, layer, e) {
				t.Fatalf("prefill runs layer %d expert %d on worker %d, outside its share", layer, e, w)
			}
			for i := range experts { // e as the i-th distinct expert of a decode pass
				if w := l.DecodeWorker(layer, i); !l.Holds(w, layer, e) {
					t.Fatalf("decode may run layer %d expert %d on worker %d, outside its share", layer, e, w)
				}
			}
		}
	}
	held := 0
	for layer := range layers {
		for e := range experts {
			if l.Holds(3, layer, e) {
				held++
			}
		}
	}
	// its group's 2 layers whole, and 1/8 of the other 6 layers' experts
	if want := 2*experts + 6*experts/8; held != want {
		t.Fatalf("worker 3 holds %d experts of %d, want %d", held, layers*experts, want)
	}
}
