package plan

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sim"
)

// Device is one kind of node, as a planned swarm is made of: what it
// holds, how fast it streams weights and multiplies a prompt, loads an
// expert from its own store, and talks. testbed/devices holds some, each
// figure's source in Sources.
type Device struct {
	Name    string   `json:"name"`
	Sources []string `json:"sources,omitempty"`
	// MemBytes is the node's memory; ReserveBytes what its OS and the
	// odmoe process beyond what it holds (runtime, buffers, a pass's
	// scratch) keep of it. A node plans to hold MemBytes - ReserveBytes.
	MemBytes     int64 `json:"mem_bytes"`
	ReserveBytes int64 `json:"reserve_bytes"`
	// MemBytesPerS is the rate decode's memory-bound kernels stream
	// weights at; LayerMs what a layer's kernel launches and bookkeeping
	// add to it (and sampling to the head).
	MemBytesPerS float64 `json:"mem_bytes_per_s"`
	LayerMs      float64 `json:"layer_ms"`
	// FLOPS is the sustained rate of a prompt's batched products, where
	// compute, not memory, bounds them.
	FLOPS float64 `json:"flops"`
	// LoadBytesPerS is an expert's load from the worker's own store (read
	// and decompressed), the net rate.
	LoadBytesPerS float64 `json:"load_bytes_per_s"`
	// LinkBitsPerS and HopMs are its network link and a message's
	// latency over it.
	LinkBitsPerS float64 `json:"link_bits_per_s"`
	HopMs        float64 `json:"hop_ms"`
}

// Budget is what a node plans to hold.
func (d Device) Budget() int64 { return d.MemBytes - d.ReserveBytes }

// Validate refuses a device whose sizes and rates cannot plan.
func (d Device) Validate() error {
	if d.MemBytes <= 0 || d.ReserveBytes < 0 || d.Budget() <= 0 {
		return fmt.Errorf("plan: device %q: mem_bytes %d less reserve_bytes %d leaves nothing to hold", d.Name, d.MemBytes, d.ReserveBytes)
	}
	for name, v := range map[string]float64{"mem_bytes_per_s": d.MemBytesPerS, "flops": d.FLOPS, "load_bytes_per_s": d.LoadBytesPerS, "link_bits_per_s": d.LinkBitsPerS} {
		if v <= 0 {
			return fmt.Errorf("plan: device %q: %s is %v, must be > 0", d.Name, name, v)
		}
	}
	if d.LayerMs < 0 || d.HopMs < 0 {
		return fmt.Errorf("plan: device %q: layer_ms %v and hop_ms %v must be >= 0", d.Name, d.LayerMs, d.HopMs)
	}
	return nil
}

// ReadDevice reads a Device from a JSON file.
func ReadDevice(path string) (Device, error) {
	var d Device
	b, err := os.ReadFile(path)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("plan: device %s: %w", path, err)
	}
	return d, d.Validate()
}

// profile is what the parts of a swarm of d cost for m (its shape,
// quantized to quant for the shadow), at the memory roofline: a layer
// costs the bytes it reads over d's rate, as testbed/profiles' hand
// figures do (the main node's part of a layer: its non-expert weights;
// an expert: its weights; the shadow's layer: its quantized copy's
// non-expert weights and the top-k experts it runs; the heads: their
// matrices; a cached position: its KV row), a prompt token twice its
// weights in FLOPs over d's rate.
func profile(d Device, m *model.Model, s sim.Shape, quant kernels.DType) (sim.Profile, error) {
	c := m.Config
	all, err := m.FootprintOf(m.HeldLayers(), model.FootprintOptions{Head: true})
	if err != nil {
		return sim.Profile{}, err
	}
	q, err := m.FootprintOf(m.HeldLayers(), model.FootprintOptions{Quantized: true, Quant: quant, Experts: true, Head: true})
	if err != nil {
		return sim.Profile{}, err
	}
	// the shadow's layer, on average: its non-expert weights and the
	// top-k experts it runs of each MoE layer
	shadowLayer := (q.Layers + q.Experts*int64(c.TopK)/int64(c.NumExperts)) / int64(c.NumLayers)
	ms := func(bytes float64) float64 { return 1000 * bytes / d.MemBytesPerS }
	kvRow := int64(2)
	if c.MLA != nil {
		kvRow = 1
	}
	p := sim.Profile{
		Name:                 d.Name,
		MainLayerMs:          ms(float64(all.Layers)/float64(c.NumLayers)) + d.LayerMs,
		MainTokenMs:          ms(float64(all.Head)) + d.LayerMs,
		MainPositionMs:       ms(float64(kvRow * 4 * int64(c.KVWidth()))),
		ShadowLayerMs:        ms(float64(shadowLayer)) + d.LayerMs,
		ShadowTokenMs:        ms(float64(q.Head)) + d.LayerMs,
		ExpertMs:             ms(float64(s.ExpertBytes)),
		LoadBytesPerS:        d.LoadBytesPerS,
		HopMs:                d.HopMs,
		LinkBytesPerS:        d.LinkBitsPerS / 8,
		MainPrefillTokenMs:   1000 * 2 * float64(s.MainWeights) / d.FLOPS,
		ExpertPrefillTokenMs: 1000 * 2 * float64(s.ExpertWeights) / d.FLOPS,
	}
	p.ShadowPositionMs = p.MainPositionMs
	p.Sources = []string{fmt.Sprintf("odmoe plan: %s at the memory roofline of %s", c.Architecture, d.Name)}
	return p, p.Validate()
}
