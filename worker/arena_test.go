package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/rs/zerolog"
)

func TestArenaRefusesPastBudgetAndReusesFreedSpace(t *testing.T) {
	a, err := NewArena(4096)
	if err != nil {
		t.Fatal(err)
	}
	b1, err := a.Alloc(1000) // rounds to 1024
	if err != nil {
		t.Fatal(err)
	}
	b2, err := a.Alloc(3000) // rounds to 3072: arena now full
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(1); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("alloc past budget: %v", err)
	}
	if a.InUse() != 4096 || a.Peak() != 4096 {
		t.Fatalf("in use %d peak %d", a.InUse(), a.Peak())
	}
	a.Free(b1)
	if _, err := a.Alloc(2000); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("2000 bytes fit in a 1024-byte hole: %v", err)
	}
	a.Free(b2)
	b3, err := a.Alloc(4096)
	if err != nil {
		t.Fatalf("free blocks did not merge: %v", err)
	}
	if len(b3.Bytes) != 4096 {
		t.Fatalf("block of %d bytes", len(b3.Bytes))
	}
	a.Free(b3)
	if a.InUse() != 0 || a.Peak() != 4096 {
		t.Fatalf("in use %d peak %d", a.InUse(), a.Peak())
	}
}

// TestArenaNeverExceedsBudgetUnderRandomLoad: random alloc/free sequences
// keep InUse <= Budget, blocks disjoint, and every refusal typed.
func TestArenaNeverExceedsBudgetUnderRandomLoad(t *testing.T) {
	const budget = 1 << 20
	a, _ := NewArena(budget)
	rng := rand.New(rand.NewPCG(1, 2))
	var live []Block
	owner := make([]int, budget) // which live block (+1) owns each byte
	for step := range 5000 {
		if len(live) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(live))
			b := live[i]
			for j := range b.Bytes {
				owner[b.off+int64(j)] = 0
			}
			a.Free(b)
			live = append(live[:i], live[i+1:]...)
			continue
		}
		n := int64(1 + rng.IntN(budget/8))
		b, err := a.Alloc(n)
		if err != nil {
			if !errors.Is(err, ErrOverBudget) {
				t.Fatalf("step %d: %v", step, err)
			}
			continue
		}
		for j := range b.Bytes {
			if owner[b.off+int64(j)] != 0 {
				t.Fatalf("step %d: block at %d overlaps a live block", step, b.off)
			}
			owner[b.off+int64(j)] = step + 1
		}
		live = append(live, b)
		if a.InUse() > budget {
			t.Fatalf("step %d: in use %d > budget", step, a.InUse())
		}
	}
	if a.Peak() > budget {
		t.Fatalf("peak %d > budget", a.Peak())
	}
}

// liveHeap is the Go heap that survives a collection; at the default
// GOGC, garbage may pile up to as much again before the next one.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestArenaIsOffTheGoHeap: a worker's device budget is not Go heap, so it
// neither counts as live heap nor lets garbage pile up to its size before
// a collection (a budget-sized slice did both: the GC's goal was twice
// the budget, and a worker's RSS grew towards it run after run); many
// loads through the engine leave the heap near where it started.
func TestArenaIsOffTheGoHeap(t *testing.T) {
	const budget = 512 << 20
	f := tinyFixture(t)
	before := liveHeap()
	arena, err := NewArena(budget)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()
	if grew := int64(liveHeap()) - int64(before); grew > 16<<20 {
		t.Fatalf("a %d MiB arena added %d MiB of live Go heap", budget>>20, grew>>20)
	}
	e := NewEngine(f.store, f.model.Config.HiddenSize, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	h := f.model.Config.HiddenSize
	x, out := randomInput(1, h, 1), make([]float32, h)
	var peakHeap uint64
	var ms runtime.MemStats
	for i := range 2000 {
		if _, err := e.Run(context.Background(), model.Step{Seq: 1}, i%4, i%8, x, 1, out, Evict); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
		}
	}
	t.Logf("2000 loads through a %d MiB arena: Go heap in use peaked at %d MiB (live before: %d MiB)", budget>>20, peakHeap>>20, before>>20)
	if peakHeap > before+64<<20 {
		t.Errorf("Go heap in use reached %d MiB over loads of 0.2 MiB experts: garbage grows with the budget", peakHeap>>20)
	}
}
