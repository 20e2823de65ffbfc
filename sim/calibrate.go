package sim

import (
	"fmt"
	"slices"
)

// LayerStats is one layer's figures of a run's -stats (decode_layers,
// prefill_layers): summed over calls.
type LayerStats struct {
	Layer     int     `json:"layer"`
	Calls     int     `json:"calls"`
	MainMs    float64 `json:"main_ms"`
	WorkerMs  float64 `json:"worker_ms"`  // the slowest request's compute
	NetworkMs float64 `json:"network_ms"` // round trips, the slowest request's
	LoadMs    float64 `json:"load_ms"`
	Loads     int     `json:"loads"`
}

// Measured is one measured bench rig run, as calibration reads it.
type Measured struct {
	Prompt, Output   int
	DecodeTokensPerS float64
	Decode           []LayerStats
	Prefill          []LayerStats
	// CPUSeconds by role ("main", "shadow", "workers"), when every node
	// ran on the measuring machine
	CPUSeconds map[string]float64
}

// Calibrate fits a profile to a resident and a shadow-driven run of the
// same case on one rig: the main node's layer and token times, a
// worker's expert time and the hop from the resident run; the load time
// and the shadow from the shadow run; the prefill costs from the resident
// run's prefill; and, when cores > 0 (the nodes shared that many) and
// both runs have their CPU by role, what each role's CPU costs a token.
// The shadow's layer time is its CPU time a token over the layers: its
// forward pass, on one core.
func Calibrate(name string, s Shape, cores int, linkBytesPerS float64, resident, shadow Measured) (Profile, error) {
	p := Profile{Name: name, LinkBytesPerS: linkBytesPerS, Cores: cores}
	rd := withCalls(resident.Decode)
	sd := withCalls(shadow.Decode)
	if len(rd) < 2 || len(sd) < 2 {
		return p, fmt.Errorf("sim: calibration needs decode figures of at least 2 layers in both runs (resident %d, shadow %d)", len(rd), len(sd))
	}
	// layer 0's main time also holds the token's own work (embedding,
	// the previous token's head and sampling)
	var main, worker, network float64
	for _, l := range rd[1:] {
		main += l.MainMs / float64(l.Calls)
	}
	main /= float64(len(rd) - 1)
	for _, l := range rd {
		worker += l.WorkerMs / float64(l.Calls)
		network += l.NetworkMs / float64(l.Calls)
	}
	worker /= float64(len(rd))
	network /= float64(len(rd))
	p.MainLayerMs = main
	p.MainTokenMs = max(0, rd[0].MainMs/float64(rd[0].Calls)-main)
	p.ExpertMs = worker
	wire := 1000 * float64(s.HiddenBytes) / linkBytesPerS
	p.HopMs = max(0, network/2-wire)
	var loadMs float64
	var loads int
	for _, l := range sd {
		loadMs += l.LoadMs
		loads += l.Loads
	}
	if loads == 0 {
		return p, fmt.Errorf("sim: the shadow run made no loads to calibrate them from")
	}
	p.LoadBytesPerS = float64(s.ExpertBytes) / (loadMs / float64(loads) / 1000)
	if rp := withCalls(resident.Prefill); len(rp) > 0 && resident.Prompt > 0 {
		var m, w float64
		for _, l := range rp {
			m += l.MainMs
			w += l.WorkerMs
		}
		p.MainPrefillTokenMs = m / float64(len(rp)) / float64(resident.Prompt)
		// the slowest worker of a layer ran about its share of the tokens
		p.ExpertPrefillTokenMs = w / float64(len(rp)) / (float64(resident.Prompt*s.TopK) / float64(s.Experts))
	}
	sh := shadow.CPUSeconds["shadow"]
	if sh <= 0 || shadow.Output < 2 {
		return p, fmt.Errorf("sim: the shadow run has no CPU time of its shadow node: its time a layer cannot be calibrated")
	}
	p.ShadowCPUTokenMs = 1000 * sh / float64(shadow.Output)
	p.ShadowLayerMs = p.ShadowCPUTokenMs / float64(s.Layers)
	if cores > 0 {
		rc, sc := resident.CPUSeconds, shadow.CPUSeconds
		if rc == nil || sc == nil {
			return p, fmt.Errorf("sim: shared cores but the runs have no CPU time by role")
		}
		tokens := float64(resident.Output)
		p.MainCPUTokenMs = 1000 * rc["main"] / tokens
		experts := float64(resident.Output * moe(s) * s.TopK)
		p.WorkerCPUExpertMs = 1000 * rc["workers"] / experts
		// what the shadow run's workers spent beyond computing: loads
		extra := 1000*sc["workers"] - p.WorkerCPUExpertMs*float64(shadow.Output*moe(s)*s.TopK)
		p.WorkerCPULoadMs = max(0, extra/float64(loads))
		// the shadow run was CPU-bound (it is on two shared cores): the
		// share of the cores it kept busy at its measured rate
		if shadow.DecodeTokensPerS > 0 {
			cpu := p.tokenCPUMs(s, float64(loads)/float64(shadow.Output-1), true)
			p.CPUEfficiency = min(1, shadow.DecodeTokensPerS*cpu/(1000*float64(cores)))
		}
	}
	return p, p.Validate()
}

func withCalls(ls []LayerStats) []LayerStats {
	return slices.DeleteFunc(slices.Clone(ls), func(l LayerStats) bool { return l.Calls == 0 })
}

func moe(s Shape) int {
	if s.ExpertLayers == nil {
		return s.Layers
	}
	return len(s.ExpertLayers)
}
