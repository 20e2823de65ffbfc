package worker

import (
	"context"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/model"
	"github.com/rs/zerolog"
)

// rssOverheadBytes bounds what a worker's resident memory may grow by
// beyond the device memory it touched: its Go heap and runtime over
// many loads (docs/BENCHMARKS.md measures ~40 MiB on the small preset;
// the bound is generous, for -race and a busy machine).
const rssOverheadBytes = 96 << 20

// TestWorkerRSSStaysWithinTouchedBudgetAndOverhead is issue 13's
// criterion in a test process: over 2000 loads through a 1 GiB budget,
// each with the garbage a worker's decoded messages leave (a 256 KiB
// prefill batch, written), resident memory grows by at most the device
// memory the loads touched plus rssOverheadBytes. With the arena a Go
// slice the GC's goal was twice the budget, and the garbage stayed
// resident until it was reached (+500 MiB here).
func TestWorkerRSSStaysWithinTouchedBudgetAndOverhead(t *testing.T) {
	const budget, garbageBytes, loads = 1 << 30, 256 << 10, 2000
	f := tinyFixture(t)
	runtime.GC()
	debug.FreeOSMemory()
	rss0 := procmem.RSS()
	if rss0 == 0 {
		t.Skip("resident memory is unknown on this platform")
	}
	arena, err := NewArena(budget)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()
	e := NewEngine(f.store, f.model.Config.HiddenSize, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	h := f.model.Config.HiddenSize
	x, out := randomInput(1, h, 1), make([]float32, h)
	var grew int64
	for i := range loads {
		if _, err := e.Run(context.Background(), model.Step{Seq: 1}, f.store.Layers()[i%len(f.store.Layers())], i%f.store.Experts(), x, 1, out, Evict); err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, garbageBytes)
		for j := 0; j < len(msg); j += 4096 {
			msg[j] = byte(i)
		}
		if i%50 == 0 {
			grew = max(grew, procmem.RSS()-rss0)
		}
	}
	touched := arena.Peak() // first fit: the loads touched the arena's first Peak bytes at most
	t.Logf("%d loads, %d MiB of garbage: RSS grew by %d MiB (device memory touched %d KiB; bound %d MiB)",
		loads, loads*garbageBytes>>20, grew>>20, touched>>10, (touched+rssOverheadBytes)>>20)
	if grew > touched+rssOverheadBytes {
		t.Errorf("RSS grew by %d MiB over %d loads: more than the %d KiB of device memory they touched + %d MiB",
			grew>>20, loads, touched>>10, rssOverheadBytes>>20)
	}
}
