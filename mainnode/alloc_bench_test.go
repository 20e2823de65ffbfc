package mainnode_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// BenchmarkDecodeLayerAllocs decodes on the tiny model through an
// in-process swarm of 4 workers (groups of 2) and reports allocations per
// decode layer of the whole process: main node, workers and the wire
// between them (run with -memprofile to see where each comes from; see
// docs/BENCHMARKS.md "Allocations on the decode path").
func BenchmarkDecodeLayerAllocs(b *testing.B) {
	for _, policy := range []mainnode.Prefetch{mainnode.Reactive, mainnode.OracleNext} {
		b.Run(string(policy), func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f, err := inproc.Generate(ctx, b.TempDir(), "tiny", 3, 4)
			if err != nil {
				b.Fatal(err)
			}
			m, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			addrs, stop, err := inproc.StartWorkers(ctx, f, inproc.WorkerOptions{Count: 4, BudgetBytes: 64 << 20, Log: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			defer stop()
			certs, err := wire.LoadCerts(filepath.Join(f.Certs), "main")
			if err != nil {
				b.Fatal(err)
			}
			layout, _ := sched.NewLayout(4, 2)
			sw, err := mainnode.Dial(ctx, addrs, &wire.Config{Certs: certs, Log: zerolog.Nop()}, mainnode.Options{
				Layout: layout, Prefetch: policy, Hidden: m.Config.HiddenSize, Log: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			defer sw.Close()
			b.ReportAllocs()
			// cancellable, as a real main node's; 16 untimed steps: buffers grow to their size
			benchDecode(ctx, b, m, sw, []int{1, 2, 3, 4}, 16)
		})
	}
}
