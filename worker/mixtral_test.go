//go:build !race

// The race detector makes this test take minutes (it generates and
// converts an 800 MB checkpoint); `make test` runs it in a separate step
// without -race.

package worker

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/store"
	"github.com/rs/zerolog"
)

// TestMixtralExpertRunsWithin1GiB: one expert of Mixtral-8x7B's real shape
// (4096x14336, 352 MB in BF16) loads from the store and runs on a worker
// with a 1 GiB budget, bit-identical to local mode.
func TestMixtralExpertRunsWithin1GiB(t *testing.T) {
	dir := t.TempDir()
	md, sd := filepath.Join(dir, "mx"), filepath.Join(dir, "store")
	if err := synth.Generate(md, synth.Options{Preset: "mixtral-layers", Seed: 1, Layers: 1, Experts: 2}); err != nil {
		t.Fatal(err)
	}
	if err := store.Convert(context.Background(), md, sd, store.ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(sd, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eb, _ := st.ExpertBytes(0, 1)
	if eb != 3*4096*14336*2 {
		t.Fatalf("expert of %d bytes", eb)
	}
	const budget = 1 << 30
	arena, _ := NewArena(budget)
	e := NewEngine(st, 4096, NewCPU(arena, NewLink(0)), zerolog.Nop())
	defer e.Close()
	x := randomInput(1, 4096, 4)
	out := make([]float32, 4096)
	if _, err := e.Run(context.Background(), model.Step{Seq: 1}, 0, 1, x, 1, out, Evict); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(md, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !sameBits(out, localExpert(m, 0, 1, x, 1)) {
		t.Fatal("Mixtral-shaped expert: worker output differs from local mode")
	}
	t.Logf("expert %d MB, peak device memory %d MB of %d MB", eb>>20, arena.Peak()>>20, budget>>20)
	if arena.Peak() > budget || arena.Peak() < int64(eb) {
		t.Fatalf("peak %d", arena.Peak())
	}
}
