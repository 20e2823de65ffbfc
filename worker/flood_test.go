package worker_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/harness/rogue"
	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"
)

// TestWorkerSurvivesAFrameFloodAndKeepsServing is issue 13's flood: an
// authenticated peer kept a worker's memory from being bounded by opening
// ~500 streams whose frame headers each claimed 64 MiB (the worker
// allocated every claimed body, ~24 GB, and was OOM-killed). Here two
// hostile connections (one with the main node's certificate, one with
// the shadow's) send 500 such claims with 1 KiB of body each, in waves
// (a peer may have 128 streams open), then leave 100 more each stalled
// open, holding whatever room their frames got. The worker's memory
// (Go's from the OS, and the peak RSS) must grow by less than the stated
// bound, and, with the stalled claims still held, the worker must answer
// a main node's activations (a decode step on the control stream, a
// prefill batch on a bulk stream) with local mode's bits.
func TestWorkerSurvivesAFrameFloodAndKeepsServing(t *testing.T) {
	const (
		perConn = 250        // claims per hostile connection, 500 in all
		wave    = 50         // streams per connection at a time
		stalled = 100        // claims per connection left open
		claim   = 64<<20 - 2 // a frame body of the default MaxFrameBytes
		bound   = 256 << 20  // the most the worker's memory may grow
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := inproc.Generate(ctx, t.TempDir(), "tiny", 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	stats := new(wire.Stats) // what the worker has done with the claims: the test waits on it
	addr, stop, err := inproc.StartWorker(ctx, f, 0, "127.0.0.1:0", inproc.WorkerOptions{Count: 1, BudgetBytes: 64 << 20, Stats: stats, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	local, err := model.Load(f.Model, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()

	m := startMemWatch()
	var hostile []*rogue.Conn
	for _, name := range []string{"main", "shadow"} {
		c, err := rogue.Dial(ctx, addr, f.Certs, name)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hostile = append(hostile, c)
	}
	for sent := 0; sent < perConn; sent += wave {
		for _, c := range hostile {
			for range wave {
				// reset once written, so that the stream's credit comes back
				openClaim(ctx, t, c, claim, 1<<10).CancelWrite(1)
			}
		}
		// every claim sent so far read and dropped by the worker
		waitFor(t, fmt.Sprintf("the worker to end the %d cancelled claims' streams", 2*(sent+wave)), func() bool {
			return stats.BulkStreamsEnded.Load() >= uint64(2*(sent+wave))
		})
		if g := m.growth(); g > bound { // fail before the old reader takes the machine
			t.Fatalf("after %d claims of 64 MiB: the worker's memory grew by %d MiB, bound %d MiB", 2*(sent+wave), g>>20, bound>>20)
		}
	}
	headers := stats.FrameHeaders.Load() // the cancelled claims' streams have all ended
	for _, c := range hostile {
		for range stalled {
			openClaim(ctx, t, c, claim, 1<<10)
		}
	}
	waitFor(t, fmt.Sprintf("the worker to read the %d stalled claims' headers", 2*stalled), func() bool {
		return stats.FrameHeaders.Load() >= headers+2*stalled
	})
	g := m.growth()
	t.Logf("%d claims of 64 MiB, %d left stalled: the worker's memory grew by %d MiB (%s), bound %d MiB",
		2*(perConn+stalled), 2*stalled, g>>20, m.what, bound>>20)
	if g > bound {
		t.Fatalf("the worker's memory grew by %d MiB under the flood, bound %d MiB", g>>20, bound>>20)
	}

	certs, err := wire.LoadCerts(f.Certs, "main")
	if err != nil {
		t.Fatal(err)
	}
	p, err := wire.Dial(ctx, addr, &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	h := local.Config.HiddenSize
	bulkTokens := 256<<10/(4*h) + 1 // over wire's 256 KiB: a bulk stream
	for i, tokens := range []int{1, bulkTokens} {
		x := randomHidden(tokens*h, uint64(i))
		layer, experts := i, []int32{int32(i), int32(i + 3)}
		act := &wire.Activation{Seq: 1, Pass: int64(i + 1), Layer: layer, Tokens: tokens, Experts: experts, Hidden: wire.Float32Tensor(x, tokens, h), ID: uint64(i)}
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		if err := p.Send(rctx, act); err != nil {
			t.Fatal(err)
		}
		for range experts {
			msg, err := p.Recv(rctx)
			if err != nil {
				t.Fatalf("%d tokens at layer %d, during the flood: %v", tokens, layer, err)
			}
			r, ok := msg.(*wire.ExpertResult)
			if !ok {
				t.Fatalf("got %#v, want an ExpertResult", msg)
			}
			got, err := r.Output.Float32s()
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float32, tokens*h)
			local.Layers[layer].MoE.Experts[r.Expert].Forward(want, x, tokens, &model.ExpertScratch{})
			if !sameBits(got, want) {
				t.Fatalf("layer %d expert %d, %d tokens: the worker's output differs from local mode's", layer, r.Expert, tokens)
			}
		}
		rcancel()
	}
}

// memWatch measures how much the process's memory grew since it started:
// the larger of what Go obtained from the OS (which never shrinks, so it
// keeps a passing peak of the Go heap) and the peak RSS (VmHWM, reset at
// the start where the kernel allows, else VmRSS sampled at each growth).
type memWatch struct {
	sys0      uint64
	rss0, rss int64
	peak      bool
	what      string
}

func startMemWatch() *memWatch {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := &memWatch{sys0: ms.Sys}
	// "5" resets the peak RSS (Linux 4.0 and later)
	m.peak = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	m.rss0 = procmem.RSS()
	return m
}

func (m *memWatch) growth() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss := procmem.RSS()
	if m.peak {
		rss = procmem.PeakRSS()
	}
	m.rss = max(m.rss, rss)
	sys, res := int64(ms.Sys-m.sys0), m.rss-m.rss0
	m.what = fmt.Sprintf("Go's memory from the OS +%d MiB, peak RSS +%d MiB", sys>>20, res>>20)
	if m.rss0 == 0 { // RSS unknown on this platform
		res = 0
	}
	return max(sys, res)
}

func randomHidden(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 13))
	x := make([]float32, n)
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

// waitFor polls cond until it holds, failing the test after a minute
// with what it waited for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

// openClaim opens a bulk stream on c whose frame header claims size
// bytes and sends send of them.
func openClaim(ctx context.Context, t *testing.T, c *rogue.Conn, size, send int) *quic.SendStream {
	t.Helper()
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := c.Claim(octx, size, send)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
