package worker

import (
	"context"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/rs/zerolog"
)

// BenchmarkLoad runs one token through a different expert each time, so
// every pass is a load (evicted after), from the store (read and
// decompress), through a host cache that holds every expert (a hit: no
// read), or through one that holds two (every load a fill and an
// eviction). MB/s is expert bytes loaded.
func BenchmarkLoad(b *testing.B) {
	f := tinyFixture(b)
	h := f.model.Config.HiddenSize
	size, _ := f.store.ExpertBytes(0, 0)
	all := len(f.store.Layers()) * f.store.Experts()
	for _, bc := range []struct {
		name      string
		hostBytes int64
	}{
		{"store", 0},
		{"host-cache-hit", int64(all * size)},
		{"host-cache-fill", int64(2 * size)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			arena, err := NewArena(64 << 20)
			if err != nil {
				b.Fatal(err)
			}
			defer arena.Close()
			e := NewEngine(f.store, h, NewCPU(arena, NewLink(0)), zerolog.Nop())
			defer e.Close()
			if bc.hostBytes > 0 {
				c, err := NewHostCache(bc.hostBytes)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				e.Host = c
			}
			x, out := randomInput(1, h, 1), make([]float32, h)
			run := func(i int) {
				l, ex := f.store.Layers()[i/f.store.Experts()%len(f.store.Layers())], i%f.store.Experts()
				if _, err := e.Run(context.Background(), model.Step{Seq: 1}, l, ex, x, 1, out, Evict); err != nil {
					b.Fatal(err)
				}
			}
			for i := range all { // a warm cache, and touched memory
				run(i)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				run(i)
				i++
			}
		})
	}
}
