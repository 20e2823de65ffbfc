//go:build cuda

package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
)

// benchShapes are real models' expert shapes (hidden, intermediate), BF16.
var benchShapes = []struct {
	name          string
	hidden, inter int
}{
	{"qwen3-30b-a3b", 2048, 768},
	{"olmoe", 2048, 1024},
	{"mixtral-8x7b", 4096, 14336},
}

// benchExpert is a random expert of the shape on the host and on the GPU.
type benchExpert struct {
	host      model.Expert
	dev       Expert
	bytes     int64
	x, act, o Ptr
}

func newBenchExpert(b *testing.B, d *Device, s *Stream, hidden, inter, n int) *benchExpert {
	rng := rand.New(rand.NewPCG(1, uint64(hidden+inter)))
	e := &benchExpert{host: model.Expert{Gate: randomMatrix(rng, kernels.BF16, inter, hidden, false),
		Up: randomMatrix(rng, kernels.BF16, inter, hidden, false), Down: randomMatrix(rng, kernels.BF16, hidden, inter, false)}}
	up := func(data []byte) Ptr {
		p, err := d.Alloc(int64(len(data)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Free(p) })
		if err := s.CopyToDevice(p, data); err != nil {
			b.Fatal(err)
		}
		e.bytes += int64(len(data))
		return p
	}
	e.dev = Expert{Gate: Matrix{up(e.host.Gate.Data), kernels.BF16, inter, hidden, 0}, Up: Matrix{up(e.host.Up.Data), kernels.BF16, inter, hidden, 0},
		Down: Matrix{up(e.host.Down.Data), kernels.BF16, hidden, inter, 0}}
	e.x = up(bytesOf(randomVectors(rng, n*hidden, false)))
	e.act, e.o = up(make([]byte, 4*n*inter)), up(make([]byte, 4*n*hidden))
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkExpertFFN: one expert on n tokens, on the GPU (kernels only,
// the input already on the device) and on this machine's CPU (the
// kernels package, every core), from weights already in place.
func BenchmarkExpertFFN(b *testing.B) {
	d := testDevice(b)
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for _, sh := range benchShapes {
		for _, n := range []int{1, 8} {
			e := newBenchExpert(b, d, s, sh.hidden, sh.inter, n)
			b.Run(fmt.Sprintf("%s/n%d/gpu", sh.name, n), func(b *testing.B) {
				b.SetBytes(e.bytes)
				for b.Loop() {
					if err := s.Forward(e.dev, e.x, e.act, e.o, n); err != nil {
						b.Fatal(err)
					}
					if err := s.Sync(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%s/n%d/cpu", sh.name, n), func(b *testing.B) {
				x := randomVectors(rand.New(rand.NewPCG(2, 3)), n*sh.hidden, false)
				out := make([]float32, n*sh.hidden)
				var scratch model.ExpertScratch
				b.SetBytes(e.bytes)
				for b.Loop() {
					e.host.Forward(out, x, n, &scratch)
				}
			})
		}
	}
}

// BenchmarkHostToDevice: copying 64 MiB to the GPU from page-locked
// (HostAlloc) and from ordinary (pageable) Go memory.
func BenchmarkHostToDevice(b *testing.B) {
	d := testDevice(b)
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const size = 64 << 20
	dst, err := d.Alloc(size)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free(dst)
	pinned, err := d.HostAlloc(size)
	if err != nil {
		b.Fatal(err)
	}
	defer d.FreeHost(pinned)
	pageable := make([]byte, size)
	for i := range pageable {
		pageable[i], pinned[i] = byte(i), byte(i)
	}
	for _, c := range []struct {
		name string
		src  []byte
	}{{"pinned", pinned}, {"pageable", pageable}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if err := s.CopyToDevice(dst, c.src); err != nil {
					b.Fatal(err)
				}
				if err := s.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoadThenCompute is one expert's turn on a worker's GPU, as
// OD-MoE's cacheless workers run it: its decompressed bytes copied up from
// page-locked memory, then computed on one token (decode) or eight
// (a prompt's mini-batch). It reports each part's device time and the
// load's share of the whole.
func BenchmarkLoadThenCompute(b *testing.B) {
	d := testDevice(b)
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ev := make([]*Event, 3)
	for i := range ev {
		if ev[i], err = d.NewEvent(); err != nil {
			b.Fatal(err)
		}
		defer ev[i].Close()
	}
	for _, sh := range benchShapes {
		for _, n := range []int{1, 8} {
			e := newBenchExpert(b, d, s, sh.hidden, sh.inter, n)
			staging, err := d.HostAlloc(e.bytes)
			if err != nil {
				b.Fatal(err)
			}
			off := copy(staging, e.host.Gate.Data)
			off += copy(staging[off:], e.host.Up.Data)
			copy(staging[off:], e.host.Down.Data)
			b.Run(fmt.Sprintf("%s/n%d", sh.name, n), func(b *testing.B) {
				var load, compute time.Duration
				for b.Loop() {
					s.Record(ev[0])
					if err := s.CopyToDevice(e.dev.Gate.Ptr, staging[:len(e.host.Gate.Data)]); err != nil {
						b.Fatal(err)
					}
					// the three matrices were allocated apart: copy each
					o := len(e.host.Gate.Data)
					s.CopyToDevice(e.dev.Up.Ptr, staging[o:o+len(e.host.Up.Data)])
					o += len(e.host.Up.Data)
					s.CopyToDevice(e.dev.Down.Ptr, staging[o:o+len(e.host.Down.Data)])
					s.Record(ev[1])
					if err := s.Forward(e.dev, e.x, e.act, e.o, n); err != nil {
						b.Fatal(err)
					}
					s.Record(ev[2])
					l, err := ev[1].Since(ev[0])
					if err != nil {
						b.Fatal(err)
					}
					c, err := ev[2].Since(ev[1])
					if err != nil {
						b.Fatal(err)
					}
					load, compute = load+l, compute+c
				}
				b.ReportMetric(float64(load.Nanoseconds())/float64(b.N), "load-ns/op")
				b.ReportMetric(float64(compute.Nanoseconds())/float64(b.N), "compute-ns/op")
				b.ReportMetric(float64(load)/float64(load+compute), "load-share")
			})
			d.FreeHost(staging)
		}
	}
}
