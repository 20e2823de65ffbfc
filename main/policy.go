package mainnode

import (
	"fmt"
	"strings"
)

// Prefetch is a loading policy: who tells the workers what to load, when.
type Prefetch string

// The policies (OD-MoE section 4.2's ablation cases name them).
const (
	// Reactive sends no hints in decode: workers load an expert when its
	// activation arrives (ablation case 6).
	Reactive Prefetch = "reactive"
	// OracleNext hints a layer's group the moment the main node's router
	// has chosen, just before the activation: it exercises the hint path
	// with always-correct predictions and no lookahead.
	OracleNext Prefetch = "oracle-next"
	// Shadow loads on the shadow node's predictions (SEP); a wrong one is
	// reloaded on demand and counted as a miss (ablation cases 1-4, with
	// the alignment periods).
	Shadow Prefetch = "shadow"
	// Random hints each layer's group with random experts one layer ahead
	// (ablation case 5).
	Random Prefetch = "random"
	// Resident is the fully cached reference, not a loading policy: every
	// expert lives on its owner worker (sched.Layout.Owner), which pinned
	// it at start (worker -resident), so nothing is loaded at all.
	Resident Prefetch = "resident"
)

// Prefetches lists the policies this build knows.
var Prefetches = []Prefetch{Reactive, OracleNext, Shadow, Random, Resident}

// ParsePrefetch checks a -prefetch value.
func ParsePrefetch(s string) (Prefetch, error) {
	for _, p := range Prefetches {
		if string(p) == s {
			return p, nil
		}
	}
	names := make([]string, len(Prefetches))
	for i, p := range Prefetches {
		names[i] = string(p)
	}
	return "", fmt.Errorf("prefetch policy %q unknown (have %s)", s, strings.Join(names, ", "))
}
