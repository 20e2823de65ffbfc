package worker

import "math"

// After says what becomes of an expert once a request has computed it.
type After uint8

const (
	// Evict lets go of the expert at once (OD-MoE's cacheless worker): it
	// is freed unless another sequence still holds it.
	Evict After = iota
	// Hold keeps holding it for the sequence's next mini-batch of the
	// layer (prefill), until the layer ends (Engine.Evict).
	Hold
	// Cache lets go of it but keeps it resident (-residency on): it stays
	// loaded, free for any later request, until its memory is wanted for
	// another expert and the residency policy picks it as the coldest.
	Cache
)

// String names the mode as logs and tests say it.
func (a After) String() string {
	switch a {
	case Evict:
		return "evict"
	case Hold:
		return "hold"
	case Cache:
		return "cache"
	}
	return "after(?)"
}

// heatHalfLife is how many expert uses on a worker halve an expert's
// heat: its reuse is predicted from its uses, recent ones weighing more.
// With a token's experts spread over the swarm a worker runs a few
// experts per pass, so this remembers some tens of passes.
const heatHalfLife = 64

// heat is an expert's decayed use count, as of the worker's use clock at:
// the residency policy evicts the coldest resident expert first (FluxMoE's
// reuse-driven residency, with per-expert counts decayed as popularity
// drifts). Experts a prediction holds go only after every resident
// expert nobody holds (Engine.makeRoom).
type heat struct {
	count float64
	at    uint64
}

// value is the heat decayed to clock now.
func (h heat) value(now uint64) float64 {
	if h.count == 0 || now <= h.at {
		return h.count
	}
	return h.count * math.Exp2(-float64(now-h.at)/heatHalfLife)
}

// use adds one use at clock now.
func (h *heat) use(now uint64) {
	h.count = h.value(now) + 1
	h.at = max(h.at, now)
}

// colder reports whether a resident expert with heat a (created in order
// ao) should be evicted before one with heat b (order bo): the colder
// first, the older on a tie.
func colder(a heat, ao uint64, b heat, bo uint64, now uint64) bool {
	va, vb := a.value(now), b.value(now)
	if va != vb {
		return va < vb
	}
	return ao < bo
}
