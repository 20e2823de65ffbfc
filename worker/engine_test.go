package worker

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/store"
	"github.com/rs/zerolog"
)

// fixture is a tiny model and its store, made once per test binary.
type fixture struct {
	model *model.Model
	store *store.Store
	dir   string
}

var (
	fixOnce sync.Once
	fix     fixture
	fixErr  error
)

func tinyFixture(t testing.TB) fixture {
	t.Helper()
	fixOnce.Do(func() {
		dir, err := os.MkdirTemp("", "odmoe-worker-")
		if err != nil {
			fixErr = err
			return
		}
		fix.dir = dir
		md, sd := filepath.Join(dir, "tiny"), filepath.Join(dir, "store")
		if fixErr = synth.Generate(md, synth.Options{Preset: "tiny", Seed: 3}); fixErr != nil {
			return
		}
		if fixErr = store.Convert(context.Background(), md, sd, store.ConvertOptions{}); fixErr != nil {
			return
		}
		if fix.model, fixErr = model.Load(md, model.LoadOptions{}); fixErr != nil {
			return
		}
		fix.store, fixErr = store.Open(sd, store.Options{})
	})
	if fixErr != nil {
		t.Fatal(fixErr)
	}
	return fix
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fix.dir != "" {
		if fix.store != nil {
			fix.store.Close()
		}
		if fix.model != nil {
			fix.model.Close()
		}
		os.RemoveAll(fix.dir)
	}
	os.Exit(code)
}

func randomInput(n, h int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n*h)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// localExpert computes what local mode computes for this expert.
func localExpert(m *model.Model, layer, expert int, x []float32, n int) []float32 {
	out := make([]float32, n*m.Config.HiddenSize)
	m.Layers[layer].MoE.Experts[expert].Forward(out, x, n, &model.ExpertScratch{})
	return out
}

// TestRunEqualsLocalExpertBitForBit: an expert loaded from the compressed
// store and run by the worker gives local mode's bits, on a miss and on a
// hinted load, for one token and for a batch.
func TestRunEqualsLocalExpertBitForBit(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	arena, _ := NewArena(64 << 20)
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	for _, n := range []int{1, 5} {
		x := randomInput(n, h, uint64(n))
		out := make([]float32, n*h)
		res, err := e.Run(ctx, model.Step{Seq: 1}, 2, 5, x, n, out, Evict)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Miss || !sameBits(out, localExpert(f.model, 2, 5, x, n)) {
			t.Fatalf("n=%d: miss=%v, bits equal=%v", n, res.Miss, sameBits(out, localExpert(f.model, 2, 5, x, n)))
		}
		e.Prefetch(ctx, model.Step{Seq: 1}, 3, []int{0, 7})
		res, err = e.Run(ctx, model.Step{Seq: 1}, 3, 7, x, n, out, Evict)
		if err != nil {
			t.Fatal(err)
		}
		if res.Miss || !sameBits(out, localExpert(f.model, 3, 7, x, n)) {
			t.Fatalf("hinted n=%d: miss=%v", n, res.Miss)
		}
		e.Evict(model.Step{Seq: 1}, 3) // expert 0 was hinted but never used
	}
	e.wg.Wait() // a hinted load evicted while in flight is freed when it ends
	if e.Resident() != 0 || arena.InUse() != 0 {
		t.Fatalf("after evicting: %d resident, %d bytes in use", e.Resident(), arena.InUse())
	}
	if got := e.Stats.Misses.Load(); got != 2 {
		t.Errorf("misses %d, want 2", got)
	}
	if got := e.Stats.Hits.Load(); got != 2 {
		t.Errorf("hits %d, want 2", got)
	}
	if got := e.Stats.Wasted.Load(); got != 2 {
		t.Errorf("wasted %d, want 2", got)
	}
}

// TestAResidentWorkerLoadsOnNoPrediction: with PinnedOnly (a resident
// worker beside a shadow), a prediction of an expert it pinned holds it
// and one of an expert it does not hold loads nothing; a request is
// still served from the pinned expert without a load.
func TestAResidentWorkerLoadsOnNoPrediction(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	arena, _ := NewArena(64 << 20)
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	if err := e.Pin(ctx, 1, []int{2}); err != nil {
		t.Fatal(err)
	}
	e.PinnedOnly = true
	loads := e.Stats.Loads.Load()
	e.Prefetch(ctx, model.Step{Seq: 1, Pass: 2}, 1, []int{2, 3, 4})
	e.wg.Wait()
	if got := e.Stats.Loads.Load(); got != loads || e.Resident() != 1 {
		t.Fatalf("predictions of experts 2 (pinned), 3 and 4: %d loads, %d resident; want none and 1", got-loads, e.Resident())
	}
	x := randomInput(1, h, 3)
	out := make([]float32, h)
	res, err := e.Run(ctx, model.Step{Seq: 1, Pass: 2}, 1, 2, x, 1, out, Evict)
	if err != nil || res.Miss || res.Loaded || !sameBits(out, localExpert(f.model, 1, 2, x, 1)) {
		t.Fatalf("the pinned expert: %v, miss %v, loaded %v", err, res.Miss, res.Loaded)
	}
}

// TestBudgetIsNeverExceeded: with room for one expert, a second hinted
// expert is refused (counted), the request for it still succeeds as a
// miss once the first is done, and the peak stays within the budget.
func TestBudgetIsNeverExceeded(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	eb, _ := f.store.ExpertBytes(0, 0)
	budget := int64(eb) + 64<<10 // one expert and its compute buffers
	arena, _ := NewArena(budget)
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	x := randomInput(1, h, 9)
	out := make([]float32, h)
	e.Prefetch(ctx, model.Step{Seq: 1}, 1, []int{2})
	if _, err := e.Run(ctx, model.Step{Seq: 1}, 1, 2, x, 1, out, Hold); err != nil { // keep it resident
		t.Fatal(err)
	}
	e.Prefetch(ctx, model.Step{Seq: 1}, 1, []int{4}) // same layer: nothing may be evicted for it
	e.wg.Wait()
	if got := e.Stats.Refused.Load(); got != 1 {
		t.Fatalf("refused %d, want 1", got)
	}
	if _, err := e.Run(ctx, model.Step{Seq: 1}, 1, 4, x, 1, out, Evict); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("second expert of the same layer while the first is resident: %v", err)
	}
	e.Evict(model.Step{Seq: 1}, 1)
	res, err := e.Run(ctx, model.Step{Seq: 1}, 1, 4, x, 1, out, Evict)
	if err != nil || !res.Miss {
		t.Fatalf("after evicting: miss=%v err=%v", res.Miss, err)
	}
	if !sameBits(out, localExpert(f.model, 1, 4, x, 1)) {
		t.Fatal("wrong bits")
	}
	// a stale expert of another layer is evicted to make room
	e.Prefetch(ctx, model.Step{Seq: 1}, 0, []int{1})
	e.wg.Wait()
	if _, err := e.Run(ctx, model.Step{Seq: 1}, 2, 3, x, 1, out, Evict); err != nil {
		t.Fatalf("stale expert was not evicted for a new layer: %v", err)
	}
	if arena.Peak() > budget {
		t.Fatalf("peak %d > budget %d", arena.Peak(), budget)
	}
}

// TestSequencesDoNotEvictEachOthersExperts: two sequences on one worker.
// One sequence running an expert, or ending a layer, never frees what the
// other still holds; an expert hinted by one is a hit for the other (one
// load serves both); and ending a sequence frees the hints it left behind.
func TestSequencesDoNotEvictEachOthersExperts(t *testing.T) {
	f := tinyFixture(t)
	h := f.model.Config.HiddenSize
	arena, _ := NewArena(64 << 20)
	e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	x := randomInput(1, h, 5)
	out := make([]float32, h)
	const a, b = 1, 2
	e.Prefetch(ctx, model.Step{Seq: a}, 3, []int{1, 6}) // a's prediction for layer 3
	e.Prefetch(ctx, model.Step{Seq: b}, 3, []int{6})    // b's: expert 6 is shared
	e.wg.Wait()
	// b runs expert 6 and ends its layer 3: a still holds 1 and 6
	if res, err := e.Run(ctx, model.Step{Seq: b}, 3, 6, x, 1, out, Evict); err != nil || res.Miss {
		t.Fatalf("b's hinted expert: miss=%v err=%v", res.Miss, err)
	}
	e.Evict(model.Step{Seq: b}, 3)
	if got := e.Resident(); got != 2 {
		t.Fatalf("after b ended layer 3, %d experts resident, want a's 2", got)
	}
	for _, ex := range []int{1, 6} {
		res, err := e.Run(ctx, model.Step{Seq: a}, 3, ex, x, 1, out, Evict)
		if err != nil || res.Miss {
			t.Fatalf("a's expert %d after b's eviction: miss=%v err=%v", ex, res.Miss, err)
		}
		if !sameBits(out, localExpert(f.model, 3, ex, x, 1)) {
			t.Fatalf("expert %d: wrong bits", ex)
		}
	}
	if e.Resident() != 0 || arena.InUse() != 0 {
		t.Fatalf("after both ran: %d resident, %d bytes in use", e.Resident(), arena.InUse())
	}
	// an expert b hinted is a hit for a, and stays for b
	e.Prefetch(ctx, model.Step{Seq: b}, 2, []int{2})
	if res, err := e.Run(ctx, model.Step{Seq: a}, 2, 2, x, 1, out, Evict); err != nil || res.Miss {
		t.Fatalf("a on b's hinted expert: miss=%v err=%v", res.Miss, err)
	}
	if e.Resident() != 1 {
		t.Fatalf("a's run freed the expert b still holds (%d resident)", e.Resident())
	}
	// hints for passes that never came go with their sequence
	e.Prefetch(ctx, model.Step{Seq: a}, 0, []int{0})
	e.EndSequence(b)
	e.EndSequence(a)
	e.wg.Wait()
	if e.Resident() != 0 || arena.InUse() != 0 {
		t.Fatalf("after both sequences ended: %d resident, %d bytes in use", e.Resident(), arena.InUse())
	}
	if got := e.Stats.Loads.Load(); got != 4 {
		t.Errorf("%d loads, want 4 (each expert once, shared ones too)", got)
	}
}

// TestAnExpertThatFailsItsChecksumIsQuarantined: an expert whose bytes in
// the store are damaged fails its first load (the store's checksum), is
// quarantined, and is refused at once afterwards (no second read, no load
// from a prediction), while the other experts run as before.
func TestAnExpertThatFailsItsChecksumIsQuarantined(t *testing.T) {
	f := tinyFixture(t)
	dir := t.TempDir()
	for _, name := range []string{"index.bin", "chunks.bin"} {
		b, err := os.ReadFile(filepath.Join(f.dir, "store", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "chunks.bin" {
			b[1000] ^= 0x10 // in layer 0 expert 0's first chunk
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h := f.model.Config.HiddenSize
	arena, _ := NewArena(64 << 20)
	e := NewEngine(st, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	ctx := context.Background()
	x, out := randomInput(1, h, 1), make([]float32, h)
	for i := range 2 {
		if _, err := e.Run(ctx, model.Step{Seq: 1, Pass: int64(i)}, 0, 0, x, 1, out, Evict); !errors.Is(err, store.ErrChecksum) {
			t.Fatalf("run %d of the damaged expert: %v, want a checksum error", i+1, err)
		}
	}
	e.Prefetch(ctx, model.Step{Seq: 1, Pass: 2}, 0, []int{0})
	e.wg.Wait()
	if q, l := e.Stats.Quarantined.Load(), e.Stats.Loads.Load(); q != 1 || l != 0 {
		t.Fatalf("quarantined %d, loads %d: want 1 quarantined and nothing loaded", q, l)
	}
	if _, err := e.Run(ctx, model.Step{Seq: 1, Pass: 3}, 0, 1, x, 1, out, Evict); err != nil || !sameBits(out, localExpert(f.model, 0, 1, x, 1)) {
		t.Fatalf("another expert of the damaged store: %v", err)
	}
}
