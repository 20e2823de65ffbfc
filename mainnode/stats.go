package mainnode

import (
	"slices"
	"time"

	"github.com/odmoe/odmoe/internal/quantile"
	"github.com/odmoe/odmoe/wire"
)

// LayerStats sums what one layer cost over the passes that ran it.
type LayerStats struct {
	Calls   int64
	Main    time.Duration // t_M: main-node compute before the layer's experts (attention, router)
	Experts time.Duration // wall time from sending activations to the last result
	Worker  time.Duration // worker compute (the slowest request's, summed over calls)
	Network time.Duration // Experts minus the slowest request's worker-side time
	Stall   time.Duration // time requests waited on workers for their expert to load
	Load    time.Duration // load time of the experts loaded for these requests
	Loads   int64         // experts loaded for these requests
	Misses  int64         // experts not loaded when their activation arrived: loaded on demand
	// With the shadow, in decode, a miss is late (the expert was
	// predicted, but the prediction, or the hint, came after the
	// activation) or wrong (the expert was not predicted).
	MissesLate, MissesWrong int64
	Results                 int64
}

// Stats are the main node's figures, split by decode and prefill, per
// layer, and summed over the layers of each pass (forward pass).
type Stats struct {
	Decode, Prefill []LayerStats
	Passes          []LayerStats // index i: pass i+1 (the prompt is pass 1), up to maxPassStats
	Faults          FaultStats
	// Residency is what -residency on decided; nil with it off.
	Residency *ResidencyStats
	// Leads are how long before its request each decode load made on a
	// prediction had its prediction (the first maxLeadSamples of them):
	// a load hides when its lead covers it.
	Leads  []time.Duration
	beyond LayerStats // where passes past maxPassStats go, unkept
	// recent is a ring of the last decode passes' layer timelines,
	// recent[last] the latest: a full ring reuses its oldest slot, layers
	// and all, so that the decode loop allocates nothing for it
	recent []PassTimeline
	last   int
}

// PassTimeline is one decode pass's layers in order: each one's main-node
// compute before its experts, then its experts' wall time, of which the
// network and the wait for loads (the layer timeline bench rig draws,
// from the main node's side), in milliseconds.
type PassTimeline struct {
	Pass   int64        `json:"iter"`
	Layers []LayerTimes `json:"layers"`
}

// LayerTimes is one layer of a PassTimeline.
type LayerTimes struct {
	MainMs    float64 `json:"main_ms"`
	ExpertsMs float64 `json:"experts_ms"`
	NetworkMs float64 `json:"network_ms"`
	StallMs   float64 `json:"stall_ms"`
}

// recentPasses is how many decode passes' timelines are kept.
const recentPasses = 16

// recentLayer is layer l of decode pass it in the recent timelines,
// starting a new pass when it is not the latest.
func (s *Stats) recentLayer(it int64, l int) *LayerTimes {
	if len(s.recent) == 0 || s.recent[s.last].Pass != it {
		if len(s.recent) < recentPasses {
			s.recent = append(s.recent, PassTimeline{})
			s.last = len(s.recent) - 1
		} else {
			s.last = (s.last + 1) % recentPasses
		}
		s.recent[s.last] = PassTimeline{Pass: it, Layers: s.recent[s.last].Layers[:0]}
	}
	p := &s.recent[s.last]
	for len(p.Layers) <= l {
		p.Layers = append(p.Layers, LayerTimes{})
	}
	return &p.Layers[l]
}

// recentPasses copies the ring out, oldest first.
func (s *Stats) recentPasses() []PassTimeline {
	out := make([]PassTimeline, 0, len(s.recent))
	for i := range s.recent {
		p := s.recent[(s.last+1+i)%len(s.recent)]
		out = append(out, PassTimeline{Pass: p.Pass, Layers: slices.Clone(p.Layers)})
	}
	return out
}

// layerSample is one RunExperts call's figures.
type layerSample struct {
	wall, network           time.Duration
	worker, stall, load     time.Duration
	loads, misses, results  int64
	missesLate, missesWrong int64
}

func (ls *layerSample) add(r *wire.ExpertResult) {
	ls.worker = max(ls.worker, r.ComputeTime)
	ls.stall = max(ls.stall, r.StallTime)
	if r.Loaded {
		ls.loads++
		ls.load += r.LoadTime
	}
	if r.Miss {
		ls.misses++
	}
	ls.results++
}

func (s *Stats) layer(prefill bool, l int) *LayerStats {
	p := &s.Decode
	if prefill {
		p = &s.Prefill
	}
	for len(*p) <= l {
		*p = append(*p, LayerStats{})
	}
	return &(*p)[l]
}

// maxPassStats bounds the per-pass figures: a server's batch
// runs passes for as long as it lives, and only a run's first passes
// are worth a row each (the figures per layer hold everything).
const maxPassStats = 4096

func (s *Stats) pass(it int64) *LayerStats {
	if it > maxPassStats {
		s.beyond = LayerStats{}
		return &s.beyond
	}
	for int64(len(s.Passes)) < it {
		s.Passes = append(s.Passes, LayerStats{})
	}
	return &s.Passes[it-1]
}

func (s *Stats) main(prefill bool, it int64, l int, d time.Duration) {
	s.layer(prefill, l).Main += d
	s.pass(it).Main += d
	if !prefill {
		s.recentLayer(it, l).MainMs += ms(d)
	}
}

func (s *Stats) experts(prefill bool, it int64, l int, ls layerSample) {
	one := LayerStats{Calls: 1, Experts: ls.wall, Network: ls.network, Worker: ls.worker, Stall: ls.stall,
		Load: ls.load, Loads: ls.loads, Misses: ls.misses, MissesLate: ls.missesLate, MissesWrong: ls.missesWrong, Results: ls.results}
	s.layer(prefill, l).add(one)
	s.pass(it).add(one)
	if !prefill {
		t := s.recentLayer(it, l)
		t.ExpertsMs += ms(ls.wall)
		t.NetworkMs += ms(ls.network)
		t.StallMs += ms(ls.stall)
	}
}

// add sums b into a.
func (a *LayerStats) add(b LayerStats) {
	a.Calls += b.Calls
	a.Main += b.Main
	a.Experts += b.Experts
	a.Worker += b.Worker
	a.Network += b.Network
	a.Stall += b.Stall
	a.Load += b.Load
	a.Loads += b.Loads
	a.Misses += b.Misses
	a.MissesLate += b.MissesLate
	a.MissesWrong += b.MissesWrong
	a.Results += b.Results
}

// figures is a on the wire (a main stage's, StageFigures).
func (a LayerStats) figures() wire.LayerFigures {
	return wire.LayerFigures{Calls: a.Calls, Main: int64(a.Main), Experts: int64(a.Experts), Worker: int64(a.Worker), Network: int64(a.Network),
		Stall: int64(a.Stall), Load: int64(a.Load), Loads: a.Loads, Misses: a.Misses, MissesLate: a.MissesLate, MissesWrong: a.MissesWrong, Results: a.Results}
}

// layerStats is f off the wire.
func layerStats(f wire.LayerFigures) LayerStats {
	return LayerStats{Calls: f.Calls, Main: time.Duration(f.Main), Experts: time.Duration(f.Experts), Worker: time.Duration(f.Worker),
		Network: time.Duration(f.Network), Stall: time.Duration(f.Stall), Load: time.Duration(f.Load), Loads: f.Loads, Misses: f.Misses,
		MissesLate: f.MissesLate, MissesWrong: f.MissesWrong, Results: f.Results}
}

// addStage puts a main stage's figures of its layers in s (the main
// node's hold nothing of them: the stage ran them).
func (s *Stats) addStage(f *wire.StageFigures) {
	for i := range f.Decode {
		*s.layer(false, f.First+i) = layerStats(f.Decode[i])
		*s.layer(true, f.First+i) = layerStats(f.Prefill[i])
	}
}

// Total sums layers.
func Total(layers []LayerStats) LayerStats {
	var t LayerStats
	for _, l := range layers {
		t.add(l)
	}
	return t
}

func (s *Stats) clone() *Stats {
	return &Stats{Decode: slices.Clone(s.Decode), Prefill: slices.Clone(s.Prefill), Passes: slices.Clone(s.Passes), Faults: s.Faults,
		Leads: slices.Clone(s.Leads)}
}

// maxLeadSamples bounds Stats.Leads (a server runs for as long as it lives).
const maxLeadSamples = 1 << 16

// addLeads records prediction leads, up to maxLeadSamples in all.
func (s *Stats) addLeads(leads []time.Duration) {
	s.Leads = append(s.Leads, leads[:min(len(leads), maxLeadSamples-len(s.Leads))]...)
}

// LeadPercentiles returns the 5th, 50th and 95th percentiles of the
// leads (nearest rank), zeros if there are none.
func (s *Stats) LeadPercentiles() (p5, p50, p95 time.Duration) {
	q := quantile.Of(s.Leads, 0.05, 0.50, 0.95)
	return q[0], q[1], q[2]
}
