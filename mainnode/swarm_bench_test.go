package mainnode_test

import (
	"context"
	"fmt"
	"github.com/odmoe/odmoe/passloop"
	"os"
	"path/filepath"
	"testing"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// benchSwarmFixture generates (once, cached like model/bench_test.go) the
// model named by ODMOE_BENCH_PRESET (default tiny; `make bench`: small),
// its store and certificates for 8 workers.
func benchSwarmFixture(b *testing.B) inproc.Files {
	b.Helper()
	preset := os.Getenv("ODMOE_BENCH_PRESET")
	if preset == "" {
		preset = "tiny"
	}
	f, err := inproc.Cached(context.Background(), preset, 1, filepath.Join(b.TempDir(), "certs"), 8, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	return f
}

// benchPositions bounds a benchmark session's positions.
const benchPositions = 512

// benchDecode runs prompt through runner as text mode does (a batch of
// one in the pass loop: on a Swarm with its hooks, the shadow's
// departures and alignments included), then warm untimed decode steps
// and b.N timed ones (greedy), and reports tokens/s. (A cancellable ctx
// costs the wire a few allocations per message that context.Background
// saves.)
func benchDecode(ctx context.Context, b *testing.B, m *model.Model, runner model.ExpertRunner, prompt []int, warm int) {
	// a sequence decodes at most benchPositions positions (a fast run
	// would pass the model's max_position_embeddings, and every policy is
	// measured over the same short contexts): then a new one starts,
	// untimed, with the prompt again
	room := min(benchPositions, m.Config.MaxPositions) - len(prompt) - warm
	var bt *passloop.Batcher
	if sw, ok := runner.(*mainnode.Swarm); ok {
		bt = sw.Batcher(m)
	} else {
		bt = passloop.New(m, runner, passloop.Hooks{})
	}
	defer bt.Close()
	bt.ChunkPrompts(0)
	b.ResetTimer()
	b.StopTimer()
	for left := b.N; left > 0; {
		n := min(left, room)
		_, _, err := bt.Generate(ctx, prompt, model.GenerateOptions{MaxTokens: warm + n + 1,
			OnToken: func(step, _ int, _ []float32) error {
				if step == warm {
					b.StartTimer()
				}
				return nil
			}})
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		left -= n
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// benchLoadBW is the edge-like host-to-device link the benchmark paces
// worker loads to: PCIe 3.0 x4, as on a Jetson (~4 GB/s).
const benchLoadBW = 4e9

// BenchmarkSwarmDecode measures, in one run, decode tokens/s of local mode
// and of an 8-worker swarm (groups of 2, in-process workers on loopback
// QUIC with mutual TLS) for each prefetch policy but the shadow's
// (BenchmarkShadowDecode), with worker loads paced to benchLoadBW, and the
// stall fraction of each; the resident swarm's workers pin their experts
// first.
func BenchmarkSwarmDecode(b *testing.B) {
	f := benchSwarmFixture(b)
	m, err := model.Load(f.Model, model.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	prompt := testPrompt(16, 7919, 1, m.Config.VocabSize)
	b.Run("local", func(b *testing.B) { benchDecode(context.Background(), b, m, model.NewResidentExperts(m), prompt, 0) })

	mainModel, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		b.Fatal(err)
	}
	defer mainModel.Close()
	certs, err := wire.LoadCerts(f.Certs, "main")
	if err != nil {
		b.Fatal(err)
	}
	c := mainModel.Config
	for _, policy := range mainnode.Prefetches {
		if policy == mainnode.Shadow {
			continue
		}
		b.Run(fmt.Sprintf("swarm8/%s", policy), func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			addrs, stop, err := inproc.StartWorkers(ctx, f, inproc.WorkerOptions{Count: 8, BudgetBytes: 1 << 30, LoadBytesSec: benchLoadBW,
				Resident: policy == mainnode.Resident, Log: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			defer stop()
			layout, _ := sched.NewLayout(8, 2)
			sw, err := mainnode.Dial(ctx, addrs, &wire.Config{Certs: certs, Log: zerolog.Nop()}, mainnode.Options{
				Layout: layout, Prefetch: policy, Hidden: c.HiddenSize, Log: zerolog.Nop(),
				Layers: c.ExpertLayers(), Experts: c.NumExperts, TopK: c.TopK, Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer sw.Close()
			benchDecode(context.Background(), b, mainModel, sw, prompt, 0)
			dec := mainnode.Total(sw.Stats().Decode)
			b.ReportMetric(dec.Stall.Seconds()/b.Elapsed().Seconds(), "stall-fraction")
			b.ReportMetric(float64(dec.Misses)/float64(max(dec.Results, 1)), "miss-fraction")
			b.ReportMetric(float64(dec.Load)/float64(max(dec.Loads, 1))/1e6, "ms/load")
		})
	}
}

// startBenchWorkers is startWorkers for benchmarks, with paced loads.
func startBenchWorkers(b *testing.B, ctx context.Context, f inproc.Files, n int, loadBW float64) []string {
	b.Helper()
	addrs, stop, err := inproc.StartWorkers(ctx, f, inproc.WorkerOptions{Count: n, BudgetBytes: 1 << 30, LoadBytesSec: loadBW, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	return addrs
}
