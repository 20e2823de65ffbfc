package wire_test

import (
	"bytes"
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/odmoe/odmoe/internal/inproc"
	mainnode "github.com/odmoe/odmoe/main"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// TestWorkerSurvivesAFrameFloodAndServesTheNextRun is the faults issue's
// flood against a real worker: an authenticated peer (a main node's
// certificate) opens 500 bulk streams, each claiming a 64 MiB frame and
// sending 1 KiB of it. The worker's memory stays under the stated bound
// (it used to allocate every claimed body, ~24 GB, and be OOM-killed) and
// it then serves a main node's run, bit-identical to local mode.
func TestWorkerSurvivesAFrameFloodAndServesTheNextRun(t *testing.T) {
	const streams, wave = 500, 100
	const bound = 256 << 20 // growth of heap in use and of RSS
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := inproc.Generate(ctx, t.TempDir(), "tiny", 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	addr, stop, err := inproc.StartWorker(ctx, f, 0, "127.0.0.1:0", inproc.WorkerOptions{Count: 1, BudgetBytes: 64 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	certs, err := wire.LoadCerts(f.Certs, "main")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop()}
	attacker, err := wire.Dial(ctx, addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0, rss0 := ms.HeapInuse, wire.VmRSS()
	var heapMax uint64
	var rssMax int64
	claim := append(wire.ClaimHeader(64<<20-2), bytes.Repeat([]byte{9}, 1<<10)...)
	for sent := 0; sent < streams; sent += wave {
		for i := range wave {
			octx, ocancel := context.WithTimeout(ctx, 5*time.Second)
			s, err := attacker.OpenRawStream(octx)
			ocancel()
			if err != nil {
				t.Fatalf("stream %d: %v", sent+i, err)
			}
			if _, err := s.Write(claim); err != nil {
				t.Fatal(err)
			}
			s.CancelWrite(1) // the next wave needs the stream credit back
		}
		time.Sleep(100 * time.Millisecond)
		runtime.ReadMemStats(&ms)
		heapMax, rssMax = max(heapMax, ms.HeapInuse), max(rssMax, wire.VmRSS())
	}
	t.Logf("%d streams claiming 64 MiB each: heap in use grew by at most %d MiB, RSS by %d MiB",
		streams, (int64(heapMax)-int64(heap0))>>20, (rssMax-rss0)>>20)
	if g := int64(heapMax) - int64(heap0); g > bound {
		t.Errorf("heap grew by %d MiB under the flood, bound %d MiB", g>>20, bound>>20)
	}
	if g := rssMax - rss0; rss0 > 0 && g > bound {
		t.Errorf("RSS grew by %d MiB under the flood, bound %d MiB", g>>20, bound>>20)
	}
	attacker.Close()

	// the next run: a main node on the same worker, against local mode
	local, err := model.Load(f.Model, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	mm, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mm.Close()
	layout, _ := sched.NewLayout(1, 1)
	c := local.Config
	sw, err := mainnode.Dial(ctx, []string{addr}, &wire.Config{Certs: certs, Log: zerolog.Nop()}, mainnode.Options{Layout: layout, Prefetch: mainnode.Reactive,
		Hidden: c.HiddenSize, Layers: c.NumLayers, Experts: c.NumExperts, TopK: c.TopK, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	prompt := []int{1, 2, 3, 4, 5}
	want, _, err := model.Generate(ctx, model.NewSession(local, model.NewResidentExperts(local), 16), prompt, model.GenerateOptions{MaxTokens: 6})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := sw.Generate(ctx, model.NewSession(mm, sw, 16), prompt, model.GenerateOptions{MaxTokens: 6})
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("the run after the flood: %v, tokens %v, local %v", err, got, want)
	}
}
