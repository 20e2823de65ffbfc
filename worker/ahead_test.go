package worker

import (
	"context"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/rs/zerolog"
)

// TestPredictionsForALaterPassOutliveTheCurrentOne: a shadow running
// ahead predicts layer 1 of pass 3 while pass 2 still runs it.
// Ending pass 2's layer 1 lets go of pass 2's hold only: the
// expert pass 3 was predicted stays loaded and is a hit then; a
// prediction nobody used that pass 3 held is freed when pass 3
// ends the layer.
func TestPredictionsForALaterPassOutliveTheCurrentOne(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	arena, _ := NewArena(64 << 20)
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	x := randomInput(1, h, 4)
	out := make([]float32, h)
	it2, it3 := model.Step{Seq: 7, Pass: 2}, model.Step{Seq: 7, Pass: 3}
	e.Prefetch(ctx, it2, 1, []int{0})
	e.Prefetch(ctx, it3, 1, []int{0, 5}) // ahead: 0 again, and 5
	e.wg.Wait()
	if _, err := e.Run(ctx, it2, 1, 0, x, 1, out, Evict); err != nil {
		t.Fatal(err)
	}
	e.Evict(it2, 1)
	if got := e.Resident(); got != 2 {
		t.Fatalf("after pass 2's layer 1: %d experts resident, want 2 (pass 3's predictions)", got)
	}
	res, err := e.Run(ctx, it3, 1, 0, x, 1, out, Evict)
	if err != nil || res.Miss || res.Loaded {
		t.Fatalf("pass 3's expert 0: miss=%v loaded=%v err=%v, want a hit on the expert pass 2 loaded", res.Miss, res.Loaded, err)
	}
	if !sameBits(out, localExpert(f.model, 1, 0, x, 1)) {
		t.Fatal("wrong bits")
	}
	e.Evict(it3, 1)
	if got, wasted := e.Resident(), e.Stats.Wasted.Load(); got != 0 || wasted != 1 {
		t.Fatalf("after pass 3's layer 1: %d resident and %d wasted, want 0 and 1 (expert 5)", got, wasted)
	}
}

// TestWithdrawDropsOnlyTheWithdrawnPasses: the shadow takes back its
// predictions from pass 3 on (it ran ahead on a token the main node
// did not sample). What only passes 3 and 4 held goes, counted with its
// bytes; what pass 2 or another sequence also holds, or a request
// has used, stays.
func TestWithdrawDropsOnlyTheWithdrawnPasses(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	arena, _ := NewArena(64 << 20)
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	seq := uint64(3)
	e.Prefetch(ctx, model.Step{Seq: seq, Pass: 2}, 0, []int{1})
	e.Prefetch(ctx, model.Step{Seq: seq, Pass: 3}, 0, []int{1, 2})
	e.Prefetch(ctx, model.Step{Seq: seq, Pass: 4}, 1, []int{3})
	e.Prefetch(ctx, model.Step{Seq: 9, Pass: 3}, 1, []int{4}) // another sequence's
	e.Prefetch(ctx, model.Step{Seq: seq, Pass: 3}, 1, []int{4})
	e.wg.Wait()
	e.Withdraw(model.Step{Seq: seq, Pass: 3})
	if got := e.Resident(); got != 2 {
		t.Fatalf("%d experts resident after the withdrawal, want 2 (layer 0 expert 1 for pass 2, layer 1 expert 4 for sequence 9)", got)
	}
	b2, _ := f.store.ExpertBytes(0, 2)
	b3, _ := f.store.ExpertBytes(1, 3)
	if n, bytes := e.Stats.Withdrawn.Load(), e.Stats.WithdrawnBytes.Load(); n != 2 || bytes != int64(b2+b3) {
		t.Fatalf("withdrawn %d loads of %d bytes, want 2 of %d", n, bytes, b2+b3)
	}
	x := randomInput(1, h, 5)
	out := make([]float32, h)
	if res, err := e.Run(ctx, model.Step{Seq: seq, Pass: 2}, 0, 1, x, 1, out, Evict); err != nil || res.Miss {
		t.Fatalf("pass 2's prediction after the withdrawal: miss=%v err=%v", res.Miss, err)
	}
}

// TestWithdrawExpertsDropsOnlyThoseOfThePass: the shadow takes back
// experts 2 and 3 of layer 0 of pass 3 (the member that wanted them
// left the pass run ahead). Expert 2 goes, counted with its bytes; expert
// 3, which pass 4 also holds, and expert 1, not named, stay; so does
// the same expert of layer 1.
func TestWithdrawExpertsDropsOnlyThoseOfThePass(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	arena, _ := NewArena(64 << 20)
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	it3, it4 := model.Step{Seq: 3, Pass: 3}, model.Step{Seq: 3, Pass: 4}
	e.Prefetch(ctx, it3, 0, []int{1, 2, 3})
	e.Prefetch(ctx, it4, 0, []int{3})
	e.Prefetch(ctx, it3, 1, []int{2})
	e.wg.Wait()
	e.WithdrawExperts(it3, 0, []int{2, 3})
	if got := e.Resident(); got != 3 {
		t.Fatalf("%d experts resident after the withdrawal, want 3 (layer 0 experts 1 and 3, layer 1 expert 2)", got)
	}
	b2, _ := f.store.ExpertBytes(0, 2)
	if n, bytes := e.Stats.Withdrawn.Load(), e.Stats.WithdrawnBytes.Load(); n != 1 || bytes != int64(b2) {
		t.Fatalf("withdrawn %d loads of %d bytes, want 1 of %d", n, bytes, b2)
	}
	x := randomInput(1, h, 5)
	out := make([]float32, h)
	for _, c := range []struct {
		step          model.Step
		layer, expert int
	}{{it3, 0, 1}, {it4, 0, 3}, {it3, 1, 2}} {
		if res, err := e.Run(ctx, c.step, c.layer, c.expert, x, 1, out, Evict); err != nil || res.Miss {
			t.Fatalf("pass %d layer %d expert %d after the withdrawal: miss=%v err=%v, want a hit", c.step.Pass, c.layer, c.expert, res.Miss, err)
		}
	}
}

// TestLoadsForTheCurrentPassComeFirst: the budget is full of
// predictions for pass 3 (a shadow running ahead) when pass 2's
// prediction arrives: one of pass 3's makes room for it, the latest
// pass's first. A prediction for pass 4 then finds no room:
// it may not take pass 3's, nor pass 2's.
func TestLoadsForTheCurrentPassComeFirst(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	eb, _ := f.store.ExpertBytes(0, 0)
	arena, _ := NewArena(int64(2*eb) + 64<<10) // two experts and compute buffers
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	x := randomInput(1, h, 6)
	out := make([]float32, h)
	seq := uint64(1)
	if _, err := e.Run(ctx, model.Step{Seq: seq, Pass: 2}, 0, 0, x, 1, out, Evict); err != nil { // pass 2 runs
		t.Fatal(err)
	}
	e.Prefetch(ctx, model.Step{Seq: seq, Pass: 3}, 1, []int{1})
	e.wg.Wait()
	e.Prefetch(ctx, model.Step{Seq: seq, Pass: 4}, 1, []int{2})
	e.wg.Wait()
	e.Prefetch(ctx, model.Step{Seq: seq, Pass: 2}, 1, []int{3}) // now: pass 4's gives way
	e.wg.Wait()
	if r := e.Stats.Refused.Load(); r != 0 {
		t.Fatalf("pass 2's prediction was refused (%d)", r)
	}
	e.Prefetch(ctx, model.Step{Seq: seq, Pass: 4}, 1, []int{4}) // later than both: refused
	e.wg.Wait()
	if r := e.Stats.Refused.Load(); r != 1 {
		t.Fatalf("refused %d, want 1: pass 4's prediction took the room of an earlier pass's", r)
	}
	for _, c := range []struct {
		it     int64
		expert int
	}{{2, 3}, {3, 1}} {
		res, err := e.Run(ctx, model.Step{Seq: seq, Pass: c.it}, 1, c.expert, x, 1, out, Evict)
		if err != nil || res.Miss {
			t.Fatalf("pass %d expert %d: miss=%v err=%v, want its prediction kept", c.it, c.expert, res.Miss, err)
		}
		e.Evict(model.Step{Seq: seq, Pass: c.it}, 1)
	}
	if arena.Peak() > arena.Budget() {
		t.Fatalf("peak %d over the budget %d", arena.Peak(), arena.Budget())
	}
}
