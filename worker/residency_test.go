package worker

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/rs/zerolog"
)

// residencyEngine is an engine with room for n experts of the tiny model
// (and one token's compute buffers).
func residencyEngine(t *testing.T, n int) (*Engine, *Arena, fixture) {
	t.Helper()
	f := tinyFixture(t)
	eb, _ := f.store.ExpertBytes(0, 0)
	budget := int64(n)*align(int64(eb)) + 64<<10
	arena, err := NewArena(budget)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(f.store, f.model.Config.HiddenSize, NewCPU(arena, NewLink(0)), zerolog.Nop())
	t.Cleanup(e.Close)
	return e, arena, f
}

// runExpert runs one token through (layer, expert) and checks local
// mode's bits.
func runExpert(t *testing.T, e *Engine, f fixture, seq uint64, layer, expert int, after After) Result {
	t.Helper()
	h := f.model.Config.HiddenSize
	x := randomInput(1, h, uint64(7*layer+expert))
	out := make([]float32, h)
	res, err := e.Run(context.Background(), model.Step{Seq: seq}, layer, expert, x, 1, out, after)
	if err != nil {
		t.Fatalf("layer %d expert %d (%s): %v", layer, expert, after, err)
	}
	if !sameBits(out, localExpert(f.model, layer, expert, x, 1)) {
		t.Fatalf("layer %d expert %d (%s): not local mode's bits", layer, expert, after)
	}
	return res
}

// TestCachedExpertServesLaterRequestsWithoutALoad: an expert a request
// left resident is a hit for the next request of any sequence, loads
// nothing and still gives local mode's bits; Evict (OD-MoE's cacheless
// worker) leaves nothing behind.
func TestCachedExpertServesLaterRequestsWithoutALoad(t *testing.T) {
	e, _, f := residencyEngine(t, 4)
	if res := runExpert(t, e, f, 1, 1, 3, Cache); !res.Miss || !res.Loaded || res.Resident {
		t.Fatalf("first request: %+v, want a miss that loads", res)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		res := runExpert(t, e, f, seq, 1, 3, Cache)
		if res.Miss || res.Loaded || !res.Resident {
			t.Fatalf("sequence %d: %+v, want a resident hit", seq, res)
		}
	}
	if got := e.Stats.Loads.Load(); got != 1 {
		t.Fatalf("%d loads for four requests of one cached expert, want 1", got)
	}
	if got := e.Stats.Resident.Load(); got != 3 {
		t.Fatalf("%d resident hits, want 3", got)
	}
	if n, b := e.Cached(); n != 1 || b <= 0 {
		t.Fatalf("cached %d experts, %d bytes; want 1 expert", n, b)
	}
	// ending the sequences and their layers keeps it: nobody asked to evict
	e.Evict(model.Step{Seq: 1}, 1)
	e.EndSequence(2)
	if res := runExpert(t, e, f, 4, 1, 3, Evict); !res.Resident {
		t.Fatal("an expert left resident was lost when its sequences let go of the layer")
	}

	runExpert(t, e, f, 5, 2, 1, Evict)
	if n := e.Resident(); n != 1 {
		t.Fatalf("%d experts resident after an Evict request beside the cached one, want 1", n)
	}
}

// TestResidencyEvictsTheColdestExpertForRoom: with room for two experts,
// loading a third evicts the one used least (recently), never the budget
// exceeded; the hot one is still a hit afterwards.
func TestResidencyEvictsTheColdestExpertForRoom(t *testing.T) {
	e, arena, f := residencyEngine(t, 2)
	for range 3 {
		runExpert(t, e, f, 1, 0, 5, Cache) // hot
	}
	runExpert(t, e, f, 1, 1, 2, Cache) // cold, and newer
	runExpert(t, e, f, 1, 2, 7, Cache) // needs room
	if got := e.Stats.Evicted.Load(); got != 1 {
		t.Fatalf("%d evictions for one expert over the budget, want 1", got)
	}
	if res := runExpert(t, e, f, 1, 0, 5, Cache); !res.Resident {
		t.Fatal("the hot expert was evicted, not the cold one")
	}
	if res := runExpert(t, e, f, 1, 1, 2, Cache); !res.Loaded {
		t.Fatal("the cold expert was still resident: what was evicted?")
	}
	if arena.Peak() > arena.Budget() {
		t.Fatalf("peak %d over the budget %d", arena.Peak(), arena.Budget())
	}
}

// TestPredictionsOutrankResidentExperts: an expert predicted for a layer
// that has not run yet is never evicted to make room; a resident expert
// nobody predicted is, however hot.
func TestPredictionsOutrankResidentExperts(t *testing.T) {
	e, _, f := residencyEngine(t, 2)
	for range 5 {
		runExpert(t, e, f, 1, 0, 4, Cache)
	}
	ctx := context.Background()
	e.Prefetch(ctx, model.Step{Seq: 2}, 1, []int{6}) // predicted for sequence 2's layer 1
	e.wg.Wait()
	runExpert(t, e, f, 3, 2, 1, Cache) // a miss that needs room
	loads := e.Stats.Loads.Load()
	if res := runExpert(t, e, f, 2, 1, 6, Evict); res.Miss || e.Stats.Loads.Load() != loads {
		t.Fatalf("the predicted expert was evicted for a miss: %+v", res)
	}
	if res := runExpert(t, e, f, 1, 0, 4, Cache); !res.Loaded {
		t.Fatal("the resident expert was kept and the prediction dropped?")
	}
}

// TestHeatDecaysWithHalfLife checks the residency policy's heat against
// the formula: count * 2^(-age/heatHalfLife), one added per use.
func TestHeatDecaysWithHalfLife(t *testing.T) {
	var h heat
	h.use(10)
	h.use(10 + heatHalfLife)
	want := 1*0.5 + 1
	if got := h.value(10 + heatHalfLife); math.Abs(got-want) > 1e-12 {
		t.Fatalf("heat %v, want %v", got, want)
	}
	if got, want := h.value(10+3*heatHalfLife), want/4; math.Abs(got-want) > 1e-12 {
		t.Fatalf("heat two half-lives later %v, want %v", got, want)
	}
	var cold heat
	cold.use(10 + 3*heatHalfLife)
	if !colder(h, 1, cold, 2, 10+3*heatHalfLife) {
		t.Fatal("0.375 uses is not colder than 1")
	}
	if colder(cold, 2, cold, 1, 0) || !colder(cold, 1, cold, 2, 0) {
		t.Fatal("on a tie the older goes first")
	}
}

// TestResidentExpertsGiveWayToComputeBuffers: a budget filled with
// resident experts still computes: the coldest is evicted to make room
// for the compute buffers.
func TestResidentExpertsGiveWayToComputeBuffers(t *testing.T) {
	f := tinyFixture(t)
	eb, _ := f.store.ExpertBytes(0, 0)
	budget := 2 * align(int64(eb)) // two experts, no room for buffers beside them
	arena, err := NewArena(budget)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(f.store, f.model.Config.HiddenSize, NewCPU(arena, NewLink(0)), zerolog.Nop())
	t.Cleanup(e.Close)
	runExpert(t, e, f, 1, 0, 1, Cache)
	runExpert(t, e, f, 1, 0, 2, Cache) // its buffers need the first one's room
	if got := e.Stats.Evicted.Load(); got != 1 {
		t.Fatalf("%d resident experts evicted, want 1 (for the second expert's buffers)", got)
	}
	if arena.Peak() > budget {
		t.Fatalf("peak %d over the budget %d", arena.Peak(), budget)
	}
}

// TestAWaitingRequestEvictsAnUnusedPrediction: when predictions of the
// request's own layer fill the budget, a request for an expert nobody
// predicted still runs: the newest prediction not used yet gives way
// (wasted, counted), and the older one stays for its request.
func TestAWaitingRequestEvictsAnUnusedPrediction(t *testing.T) {
	e, arena, f := residencyEngine(t, 2)
	ctx := context.Background()
	e.Prefetch(ctx, model.Step{Seq: 1}, 1, []int{2})
	e.Prefetch(ctx, model.Step{Seq: 1}, 1, []int{4})
	e.wg.Wait()
	if res := runExpert(t, e, f, 1, 1, 6, Evict); !res.Miss {
		t.Fatalf("expert 6 was not predicted, yet %+v", res)
	}
	if got := e.Stats.Wasted.Load(); got != 1 {
		t.Fatalf("%d predictions wasted, want 1", got)
	}
	loads := e.Stats.Loads.Load()
	if res := runExpert(t, e, f, 1, 1, 2, Evict); res.Miss || e.Stats.Loads.Load() != loads {
		t.Fatalf("the older prediction was evicted instead of the newer: %+v", res)
	}
	if arena.Peak() > arena.Budget() {
		t.Fatalf("peak %d over the budget %d", arena.Peak(), arena.Budget())
	}
}

// TestAWaitingRequestWaitsForPredictionsStillLoading: when predictions
// still loading hold the whole budget, a request for another expert waits
// for one to land and evicts it, rather than failing.
func TestAWaitingRequestWaitsForPredictionsStillLoading(t *testing.T) {
	f := tinyFixture(t)
	eb, _ := f.store.ExpertBytes(0, 0)
	arena, err := NewArena(2*align(int64(eb)) + 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(f.store, f.model.Config.HiddenSize, NewCPU(arena, NewLink(float64(eb)*20)), zerolog.Nop()) // 50 ms a load
	t.Cleanup(e.Close)
	e.Prefetch(context.Background(), model.Step{Seq: 1}, 1, []int{2, 4})
	for arena.InUse() < 2*align(int64(eb)) { // both predictions hold their memory: the request must wait
		time.Sleep(time.Millisecond)
	}
	if e.prefetchInFlight() == nil {
		t.Fatal("the predictions landed before the request: the wait is not exercised (slow the link)")
	}
	if res := runExpert(t, e, f, 1, 1, 6, Evict); !res.Miss {
		t.Fatalf("expert 6 was not predicted, yet %+v", res)
	}
	if arena.Peak() > arena.Budget() {
		t.Fatalf("peak %d over the budget %d", arena.Peak(), arena.Budget())
	}
}

// TestAWaitingRequestEvictsAPredictedResidentExpert: when the budget is
// full of resident experts that predictions hold again, a request for an
// expert nobody predicted evicts the coldest of them rather than failing;
// an expert kept for a prompt's next mini-batch is never taken.
func TestAWaitingRequestEvictsAPredictedResidentExpert(t *testing.T) {
	e, arena, f := residencyEngine(t, 2)
	runExpert(t, e, f, 1, 0, 1, Cache)
	runExpert(t, e, f, 1, 0, 1, Cache) // hotter
	runExpert(t, e, f, 1, 0, 2, Cache)
	e.Prefetch(context.Background(), model.Step{Seq: 2}, 0, []int{1, 2}) // both predicted again: held
	e.wg.Wait()
	if res := runExpert(t, e, f, 3, 0, 3, Evict); !res.Miss {
		t.Fatalf("expert 3 was not predicted, yet %+v", res)
	}
	if res := runExpert(t, e, f, 2, 0, 1, Evict); !res.Resident {
		t.Fatal("the hotter predicted expert was evicted, not the colder")
	}
	// a prompt's expert kept for its next mini-batch stays
	if arena.Peak() > arena.Budget() {
		t.Fatalf("peak %d over the budget %d", arena.Peak(), arena.Budget())
	}
	e2, arena2, _ := residencyEngine(t, 1)
	runExpert(t, e2, f, 1, 1, 4, Hold)
	h := f.model.Config.HiddenSize
	out := make([]float32, h)
	if _, err := e2.Run(context.Background(), model.Step{Seq: 2}, 1, 5, randomInput(1, h, 1), 1, out, Evict); err == nil {
		t.Fatal("an expert kept for a prompt's next mini-batch was evicted for another request")
	}
	if arena2.Peak() > arena2.Budget() {
		t.Fatalf("peak %d over the budget %d", arena2.Peak(), arena2.Budget())
	}
}

// TestAPromptsKeptExpertSurvivesOtherSequences: an expert a prompt keeps
// for its next mini-batch stays kept when other sequences let go of its
// layer or run it themselves: a third sequence's request is refused for
// room rather than take it, and the prompt's next mini-batch loads nothing.
func TestAPromptsKeptExpertSurvivesOtherSequences(t *testing.T) {
	e, _, f := residencyEngine(t, 1)
	runExpert(t, e, f, 1, 1, 4, Hold) // sequence 1's prompt keeps expert 4
	runExpert(t, e, f, 2, 1, 4, Evict)
	e.Evict(model.Step{Seq: 2}, 1)
	e.EndSequence(2)
	h := f.model.Config.HiddenSize
	out := make([]float32, h)
	if _, err := e.Run(context.Background(), model.Step{Seq: 3}, 1, 5, randomInput(1, h, 2), 1, out, Evict); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("sequence 3 took the room of an expert sequence 1 keeps: %v", err)
	}
	loads := e.Stats.Loads.Load()
	if runExpert(t, e, f, 1, 1, 4, Evict); e.Stats.Loads.Load() != loads {
		t.Fatal("the prompt's kept expert was reloaded")
	}
}

// TestResultSaysHowLongBeforeItsRequestThePredictionCame: a load made on
// a prediction reports the prediction's lead over the request; a miss, or
// an expert already resident, reports none.
func TestResultSaysHowLongBeforeItsRequestThePredictionCame(t *testing.T) {
	e, _, f := residencyEngine(t, 4)
	e.Prefetch(context.Background(), model.Step{Seq: 1}, 0, []int{3})
	time.Sleep(20 * time.Millisecond)
	if res := runExpert(t, e, f, 1, 0, 3, Cache); res.Miss || !res.Loaded || res.Lead < 20*time.Millisecond || res.Lead > 10*time.Second {
		t.Fatalf("hinted load: %+v, want a lead of at least 20 ms", res)
	}
	if res := runExpert(t, e, f, 1, 0, 5, Evict); !res.Miss || res.Lead != 0 {
		t.Fatalf("miss: lead %v, want 0", res.Lead)
	}
	if res := runExpert(t, e, f, 1, 0, 3, Evict); !res.Resident || res.Lead != 0 {
		t.Fatalf("resident hit: lead %v, want 0 (nothing loaded)", res.Lead)
	}
}
