package mainnode

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
)

// render writes a plan as one line a person can check:
//
//	e2@w2 e5@w3 | hint w2 it5 L1 [2] | send w2 [2] rows [0] end
func render(p *Plan) string {
	var parts []string
	var run []string
	for i, e := range p.Experts {
		run = append(run, fmt.Sprintf("e%d@w%d", e, p.Assign[i]))
	}
	parts = append(parts, strings.Join(run, " "))
	for _, h := range p.Hints {
		parts = append(parts, fmt.Sprintf("hint w%d it%d L%d %v", h.Worker, h.Step.Pass, h.Layer, h.Experts))
	}
	for _, r := range p.Requests {
		s := fmt.Sprintf("send w%d %v rows %v", r.Worker, r.Experts, r.Tokens)
		if r.Keep {
			s += " keep"
		}
		if r.Cache {
			s += " cache"
		}
		if r.EndLayer {
			s += " end"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " | ")
}

// routes makes one token's routes (k = len(experts), equal weights).
func routes(tokens ...[]int) []model.Route {
	var rs []model.Route
	for _, t := range tokens {
		for _, e := range t {
			rs = append(rs, model.Route{Expert: e, Weight: 1 / float32(len(t))})
		}
	}
	return rs
}

func testPlanner(t *testing.T, p Prefetch, down ...int) *Planner {
	t.Helper()
	return testPlannerOf(t, p, []int{0, 1, 2, 3}, down...)
}

// testPlannerOf is testPlanner for a model whose layers have experts.
func testPlannerOf(t *testing.T, p Prefetch, layers []int, down ...int) *Planner {
	t.Helper()
	layout, _ := sched.NewLayout(4, 2) // groups {w0, w1}, {w2, w3}; layer l on group l mod 2
	pol, err := NewPolicy(p, PolicyModel{Layers: layers, Experts: 8, TopK: 2, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := NewPlanner(layout, pol, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range down {
		if _, err := pl.SetLive(w, false); err != nil {
			t.Fatal(err)
		}
	}
	return pl
}

// TestPlannerScenarios: what the main node does with one layer, for each
// policy, right, wrong and late predictions, prefill mini-batches, and
// workers out of the layout. Each case is one layer of a 4-layer model on
// 4 workers in groups of 2, read as: where each expert runs | the hints
// sent | the activations sent.
func TestPlannerScenarios(t *testing.T) {
	step := model.Step{Seq: 9, Pass: 5}
	cases := []struct {
		name      string
		policy    Prefetch
		down      []int
		layer     int
		tokens    [][]int // each token's experts
		predicted []int
		on        []int   // where the shadow hinted each predicted expert (nil: by index)
		spoiled   []spoil // experts a worker's store failed
		want      string
	}{
		{name: "reactive decode: the layer's group, no hints", policy: Reactive, layer: 1, tokens: [][]int{{2, 5}},
			want: "e2@w2 e5@w3 | send w2 [2] rows [0] end | send w3 [5] rows [0] end"},
		{name: "oracle-next hints what it is about to send", policy: OracleNext, layer: 1, tokens: [][]int{{2, 5}},
			want: "e2@w2 e5@w3 | hint w2 it5 L1 [2] | hint w3 it5 L1 [5] | send w2 [2] rows [0] end | send w3 [5] rows [0] end"},
		{name: "shadow, right prediction: each expert where it was loaded", policy: Shadow, layer: 0, tokens: [][]int{{3, 6}}, predicted: []int{3, 6},
			want: "e3@w0 e6@w1 | send w0 [3] rows [0] end | send w1 [6] rows [0] end"},
		{name: "shadow, one wrong: the right one stays, the other takes the free worker", policy: Shadow, layer: 1, tokens: [][]int{{2, 5}}, predicted: []int{1, 2},
			want: "e2@w3 e5@w2 | send w3 [2] rows [0] end | send w2 [5] rows [0] end"},
		{name: "shadow, all wrong: in order over the group", policy: Shadow, layer: 1, tokens: [][]int{{2, 5}}, predicted: []int{0, 7},
			want: "e2@w2 e5@w3 | send w2 [2] rows [0] end | send w3 [5] rows [0] end"},
		{name: "shadow, revised prediction: each expert on the worker it was hinted to, not by its index", policy: Shadow, layer: 1, tokens: [][]int{{2, 5}}, predicted: []int{2, 5}, on: []int{3, 2},
			want: "e2@w3 e5@w2 | send w3 [2] rows [0] end | send w2 [5] rows [0] end"},
		{name: "shadow, hinted nowhere or outside the group: as unpredicted", policy: Shadow, layer: 1, tokens: [][]int{{2, 5}}, predicted: []int{2, 5}, on: []int{-1, 0},
			want: "e2@w2 e5@w3 | send w2 [2] rows [0] end | send w3 [5] rows [0] end"},
		{name: "shadow, late (no prediction yet): in order over the group", policy: Shadow, layer: 1, tokens: [][]int{{2, 5}},
			want: "e2@w2 e5@w3 | send w2 [2] rows [0] end | send w3 [5] rows [0] end"},
		{name: "shadow, both on one expert: one worker, one request", policy: Shadow, layer: 1, tokens: [][]int{{4}}, predicted: []int{4},
			want: "e4@w2 | send w2 [4] rows [0] end"},
		{name: "resident: every expert on its owner, nothing hinted", policy: Resident, layer: 1, tokens: [][]int{{2, 5}},
			want: "e2@w3 e5@w2 | send w3 [2] rows [0] end | send w2 [5] rows [0] end"},
		{name: "prefill: expert e on worker e mod 4, hinted, in mini-batches of 2", policy: Shadow, layer: 1,
			tokens: [][]int{{1, 2}, {1, 6}, {1, 2}},
			want:   "e1@w1 e2@w2 e6@w2 | hint w1 it5 L1 [1] | hint w2 it5 L1 [2 6] | send w1 [1] rows [0 1] keep | send w1 [1] rows [2] end | send w2 [2] rows [0 2] | send w2 [6] rows [1] end"},
		{name: "resident prefill: owners, no hints", policy: Resident, layer: 1, tokens: [][]int{{1, 2}, {1, 6}},
			want: "e1@w2 e2@w3 e6@w3 | send w2 [1] rows [0 1] end | send w3 [2] rows [0] | send w3 [6] rows [1] end"},
		{name: "a worker out: its experts go to the other of its group", policy: OracleNext, down: []int{3}, layer: 1, tokens: [][]int{{2, 5}},
			want: "e2@w2 e5@w2 | hint w2 it5 L1 [2 5] | send w2 [2 5] rows [0] end"},
		{name: "a group out: its experts go to the next live worker", policy: Shadow, down: []int{2, 3}, layer: 1, tokens: [][]int{{2, 5}}, predicted: []int{2, 5},
			want: "e2@w0 e5@w0 | send w0 [2 5] rows [0] end"},
		{name: "a worker out in prefill: its expert goes to the other of its group", policy: Reactive, down: []int{1}, layer: 0, tokens: [][]int{{1, 2}, {1, 2}},
			want: "e1@w0 e2@w2 | hint w0 it5 L0 [1] | hint w2 it5 L0 [2] | send w0 [1] rows [0 1] end | send w2 [2] rows [0 1] end"},
		{name: "an expert a worker's store failed: that expert goes to the other of its group, the rest stays", policy: Reactive, layer: 1, tokens: [][]int{{2, 5}},
			spoiled: []spoil{{3, 1, 5}, {3, 0, 2}},
			want:    "e2@w2 e5@w2 | send w2 [2 5] rows [0] end"},
		{name: "failed on both of its group: the next worker that can", policy: Reactive, layer: 1, tokens: [][]int{{2, 5}},
			spoiled: []spoil{{3, 1, 5}, {2, 1, 5}},
			want:    "e2@w2 e5@w0 | send w2 [2] rows [0] end | send w0 [5] rows [0] end"},
		{name: "failed where the other of its group is out: the next live worker", policy: Reactive, down: []int{2}, layer: 1, tokens: [][]int{{2, 5}},
			spoiled: []spoil{{3, 1, 5}},
			want:    "e2@w3 e5@w0 | send w3 [2] rows [0] end | send w0 [5] rows [0] end"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pl := testPlanner(t, c.policy, c.down...)
			for _, sp := range c.spoiled {
				pl.Spoil(sp.worker, sp.layer, sp.expert)
			}
			var p Plan
			in := &Input{Step: step, Layer: c.layer, Tokens: len(c.tokens), Routes: routes(c.tokens...), Predicted: c.predicted, PredictedOn: c.on}
			pl.Plan(&p, in)
			if got := render(&p); got != c.want {
				t.Errorf("\n got: %s\nwant: %s", got, c.want)
			}
			for _, r := range p.Requests {
				if slices.Contains(c.down, r.Worker) {
					t.Errorf("request sent to worker %d, which is out", r.Worker)
				}
			}
		})
	}
}

// TestRandomPolicyHintsTheNextLayerAndPlacesOnItsDraws: the random policy
// hints TopK distinct experts for the next layer to that layer's group
// (the last layer's hint goes to the first layer of the next pass;
// dense layers, which have no experts, are skipped), draws the same
// experts again when it places that layer, and so keeps the drawn experts
// that are really routed where they were hinted. The prompt's layers and
// the first decode layer were never hinted.
func TestRandomPolicyHintsTheNextLayerAndPlacesOnItsDraws(t *testing.T) {
	for _, layers := range [][]int{{0, 1, 2, 3}, {1, 3}} {
		t.Run(fmt.Sprint(layers), func(t *testing.T) { testRandomPolicyHints(t, layers) })
	}
}

func testRandomPolicyHints(t *testing.T, layers []int) {
	pl := testPlannerOf(t, Random, layers)
	layout := pl.layout
	step := model.Step{Seq: 3, Pass: 4}
	for i, layer := range layers {
		var p Plan
		pl.Plan(&p, &Input{Step: step, Layer: layer, Tokens: 1, Routes: routes([]int{0, 1})})
		wantIt, next := step.Pass+1, layers[0]
		if i+1 < len(layers) {
			wantIt, next = step.Pass, layers[i+1]
		}
		var hinted []int
		for _, h := range p.Hints {
			if h.Step.Pass != wantIt || h.Layer != next || h.Step.Seq != step.Seq || layout.GroupOf(next) != h.Worker/layout.Group {
				t.Fatalf("layer %d: hint %+v, want pass %d layer %d in its group", layer, h, wantIt, next)
			}
			for _, e := range h.Experts {
				hinted = append(hinted, int(e))
			}
		}
		slices.Sort(hinted)
		if len(hinted) != 2 || hinted[0] == hinted[1] {
			t.Fatalf("layer %d hinted %v, want 2 distinct experts", layer, hinted)
		}
		// placing the hinted layer on exactly the hinted experts puts each
		// where its hint went: no miss
		var q Plan
		pl.Plan(&q, &Input{Step: model.Step{Seq: step.Seq, Pass: wantIt}, Layer: next, Tokens: 1, Routes: routes(hinted)})
		for i, e := range q.Experts {
			for _, h := range p.Hints {
				if slices.Contains(h.Experts, int32(e)) && h.Worker != q.Assign[i] {
					t.Fatalf("layer %d: expert %d hinted to w%d, placed on w%d", next, e, h.Worker, q.Assign[i])
				}
			}
		}
	}
	var again Plan // a different sequence draws differently somewhere
	differs := false
	for seq := uint64(4); seq < 12 && !differs; seq++ {
		var a, b Plan
		pl.Plan(&a, &Input{Step: step, Layer: 1, Tokens: 1, Routes: routes([]int{0, 1})})
		pl.Plan(&b, &Input{Step: model.Step{Seq: seq, Pass: step.Pass}, Layer: 1, Tokens: 1, Routes: routes([]int{0, 1})})
		differs = render(&a) != render(&b)
		again = a
	}
	if !differs {
		t.Errorf("8 sequences all drew %s", render(&again))
	}
}

// TestPlannerCountsLiveWorkers: SetLive says when it changed something,
// Live counts down to zero, and Substitute finds a live worker while one
// is left.
func TestPlannerCountsLiveWorkers(t *testing.T) {
	pl := testPlanner(t, Reactive, 0, 1)
	if pl.Live() != 2 || pl.Substitute(0) != 2 || pl.Substitute(1) != 2 || pl.Substitute(3) != 3 {
		t.Fatalf("live %d, substitutes %d %d %d", pl.Live(), pl.Substitute(0), pl.Substitute(1), pl.Substitute(3))
	}
	if changed, err := pl.SetLive(1, false); changed || err != nil {
		t.Fatalf("taking out a worker already out: changed %v, %v", changed, err)
	}
	for _, w := range []int{2, 3} {
		if changed, err := pl.SetLive(w, false); !changed || err != nil {
			t.Fatalf("taking out worker %d: changed %v, %v", w, changed, err)
		}
	}
	if pl.Live() != 0 {
		t.Fatalf("%d live after all went out", pl.Live())
	}
	if _, err := pl.SetLive(4, false); err == nil {
		t.Fatal("took out a worker the layout does not have")
	}
	if changed, err := pl.SetLive(1, true); !changed || err != nil || pl.Substitute(3) != 1 || !pl.IsLive(1) {
		t.Fatalf("putting worker 1 back: changed %v, %v, substitute of 3: %d", changed, err, pl.Substitute(3))
	}
}

// TestPlanningADecodeLayerAllocatesNothing: once a sequence's Plan has
// grown, planning a decode layer allocates nothing, for every policy.
// With residency (a placement set) it allocates nothing either.
func TestPlanningADecodeLayerAllocatesNothing(t *testing.T) {
	owners, err := sched.NewPlacement(4, []int{0, 1, 2, 3}, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range Prefetches {
		for _, residency := range []bool{false, true} {
			if residency && name == Resident {
				continue // the resident swarm keeps every expert already
			}
			pl := testPlanner(t, name)
			if residency {
				if err := pl.SetPlacement(owners); err != nil {
					t.Fatal(err)
				}
			}
			var p Plan
			rs := routes([]int{2, 5})
			pred := []int{2, 6}
			in := &Input{Step: model.Step{Seq: 1, Pass: 7}, Tokens: 1, Routes: rs, Predicted: pred}
			plan := func() {
				pl.Plan(&p, in)
				in.Layer = (in.Layer + 1) % 4
			}
			for range 8 {
				plan()
			}
			if n := testing.AllocsPerRun(100, plan); n != 0 {
				t.Errorf("%s, residency %v: %v allocations per decode layer", name, residency, n)
			}
		}
	}
}

// TestBatchedPassSendsEachWorkerOneRequest: a batched decode pass of three
// sequences sends each worker of the layer's group one activation with
// the rows of every sequence routed to its experts, each expert with its
// own rows, placed by the decode rule (the group), not prefill's spread.
func TestBatchedPassSendsEachWorkerOneRequest(t *testing.T) {
	pl := testPlanner(t, Reactive)
	// layer 1 runs on group {w2, w3}; rows: seq A -> e1 e4, B -> e4 e6, C -> e1 e3
	in := Input{Step: model.Step{Seq: 9, Pass: 3}, Layer: 1, Tokens: 3, Routes: routes([]int{1, 4}, []int{4, 6}, []int{1, 3}), Batched: true}
	if in.Prefill() {
		t.Fatal("a batched pass counts as prefill")
	}
	var p Plan
	pl.Plan(&p, &in)
	perWorker := map[int]int{}
	got := map[int][]int{} // expert -> the batch rows it runs on
	for _, r := range p.Requests {
		perWorker[r.Worker]++
		if r.Worker != 2 && r.Worker != 3 {
			t.Fatalf("request to w%d, outside layer 1's group: %s", r.Worker, render(&p))
		}
		if !r.EndLayer || r.Keep {
			t.Fatalf("request %+v: want the worker's last of the layer, no keep", r)
		}
		for j, e := range r.Experts {
			got[int(e)] = r.ExpertTokens(nil, j)
		}
	}
	for w, n := range perWorker {
		if n != 1 {
			t.Fatalf("w%d got %d requests: %s", w, n, render(&p))
		}
	}
	want := map[int][]int{1: {0, 2}, 3: {2}, 4: {0, 1}, 6: {1}}
	if len(got) != len(want) {
		t.Fatalf("experts %v, want %v", got, want)
	}
	for e, rows := range want {
		if !slices.Equal(got[e], rows) {
			t.Fatalf("expert %d runs on rows %v, want %v (plan %s)", e, got[e], rows, render(&p))
		}
	}
}

// TestResidencyRunsEveryExpertOnItsOwner: with a placement set, every
// policy runs each expert on its owner (whatever it would have placed),
// hints go to the owners, and every request asks the worker to keep its
// experts.
func TestResidencyRunsEveryExpertOnItsOwner(t *testing.T) {
	owners, err := sched.NewPlacement(4, []int{0, 1, 2, 3}, 8)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		policy Prefetch
		in     Input
		want   string
	}{
		// layer 1: e2 -> (2+1)%4 = w3, e5 -> w2; reactive would use group {w2,w3} by index
		{Reactive, Input{Step: model.Step{Seq: 1, Pass: 5}, Layer: 1, Tokens: 1, Routes: routes([]int{2, 5})},
			"e2@w3 e5@w2 | send w3 [2] rows [0] cache end | send w2 [5] rows [0] cache end"},
		// the shadow predicted e2 and e6 (placed on w2, w3 without residency): owners win
		{Shadow, Input{Step: model.Step{Seq: 1, Pass: 5}, Layer: 0, Tokens: 1, Routes: routes([]int{2, 6}), Predicted: []int{2, 6}},
			"e2@w2 e6@w2 | send w2 [2 6] rows [0] cache end"},
		// oracle-next hints what runs where
		{OracleNext, Input{Step: model.Step{Seq: 1, Pass: 5}, Layer: 2, Tokens: 1, Routes: routes([]int{1, 7})},
			"e1@w3 e7@w1 | hint w3 it5 L2 [1] | hint w1 it5 L2 [7] | send w3 [1] rows [0] cache end | send w1 [7] rows [0] cache end"},
		// a prompt of two tokens: each expert on its owner, mini-batches keep, all cache
		{Reactive, Input{Step: model.Step{Seq: 1, Pass: 1}, Layer: 3, Tokens: 2, Routes: routes([]int{0, 5}, []int{5, 6})},
			"e0@w3 e5@w0 e6@w1 | hint w3 it1 L3 [0] | hint w0 it1 L3 [5] | hint w1 it1 L3 [6] | send w3 [0] rows [0] cache end | send w0 [5] rows [0 1] cache end | send w1 [6] rows [1] cache end"},
	}
	for _, tc := range cases {
		pl := testPlanner(t, tc.policy)
		if err := pl.SetPlacement(owners); err != nil {
			t.Fatal(err)
		}
		var p Plan
		pl.Plan(&p, &tc.in)
		if got := render(&p); got != tc.want {
			t.Errorf("%s layer %d:\n got %s\nwant %s", tc.policy, tc.in.Layer, got, tc.want)
		}
	}
	// the random policy's hints for the next layer go to that layer's owners
	pl := testPlanner(t, Random)
	if err := pl.SetPlacement(owners); err != nil {
		t.Fatal(err)
	}
	var p Plan
	pl.Plan(&p, &Input{Step: model.Step{Seq: 1, Pass: 5}, Layer: 0, Tokens: 1, Routes: routes([]int{2, 5})})
	if len(p.Hints) == 0 {
		t.Fatal("random policy sent no hints")
	}
	for _, h := range p.Hints {
		for _, e := range h.Experts {
			if w := owners.Owner(h.Layer, int(e)); w != h.Worker {
				t.Errorf("random hint of layer %d expert %d to w%d, its owner is w%d", h.Layer, e, h.Worker, w)
			}
		}
	}
	// planning allocates nothing: TestPlanningADecodeLayerAllocatesNothing
	// a placement for another layout is refused
	other, _ := sched.NewPlacement(3, []int{0, 1, 2, 3}, 8)
	if err := pl.SetPlacement(other); err == nil {
		t.Error("a placement over 3 workers was taken by a planner of 4")
	}
}

// TestPredictedOnKeepsEachExpertWithItsWorker: a prediction's experts
// come back sorted, each still with the worker it was hinted to, whether
// they arrived sorted (as the shadow sends them) or not; without workers
// the index rule applies (nil).
func TestPredictedOnKeepsEachExpertWithItsWorker(t *testing.T) {
	for _, c := range []struct{ experts, workers []int32 }{
		{[]int32{1, 4, 6}, []int32{2, -1, 3}},
		{[]int32{6, 1, 4}, []int32{3, 2, -1}},
	} {
		es, on := predictedOn(c.experts, c.workers)
		if !slices.Equal(es, []int{1, 4, 6}) || !slices.Equal(on, []int{2, -1, 3}) {
			t.Errorf("%v on %v: %v on %v, want [1 4 6] on [2 -1 3]", c.experts, c.workers, es, on)
		}
	}
	if es, on := predictedOn([]int32{5, 2}, nil); !slices.Equal(es, []int{2, 5}) || on != nil {
		t.Errorf("without workers: %v on %v, want [2 5] on nil", es, on)
	}
}

// TestASpoiledExpertsHintsMoveWithIt: a hint naming an expert the hinted
// worker's store failed (for this layer or a later one, as the random
// policy hints) goes where the plan moves that expert off the worker (the
// group's other live worker that can load it), the rest of the hint
// staying; the policy's own slice is not edited.
func TestASpoiledExpertsHintsMoveWithIt(t *testing.T) {
	pl := testPlanner(t, Reactive)
	pl.Spoil(3, 2, 5) // layer 2 expert 5 on w3: its group's other is w2
	pl.Spoil(1, 2, 6) // layer 2 expert 6 on w1: w0
	policy := []int32{4, 5}
	p := Plan{Hints: []Hint{
		{Worker: 3, Layer: 2, Experts: policy},
		{Worker: 2, Layer: 2, Experts: []int32{1}},
		{Worker: 1, Layer: 2, Experts: []int32{6}},
		{Worker: 3, Layer: 1, Experts: []int32{5}}, // another layer: w3 can load it
	}}
	pl.avoidSpoiled(&p, 1)
	var got []string
	for _, h := range p.Hints {
		got = append(got, fmt.Sprintf("w%d L%d %v", h.Worker, h.Layer, h.Experts))
	}
	want := []string{"w3 L2 [4]", "w2 L2 [1]", "w3 L1 [5]", "w2 L2 [5]", "w0 L2 [6]"}
	if !slices.Equal(got, want) {
		t.Fatalf("hints %q, want %q", got, want)
	}
	if !slices.Equal(policy, []int32{4, 5}) {
		t.Fatalf("the policy's hint was edited: %v", policy)
	}
}
