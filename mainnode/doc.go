// Package mainnode is the main node role (and a main stage's): it holds
// the non-expert weights of its layers and their KV cache, runs the pass
// loop (package passloop) over them, and runs each layer's experts on the
// worker group that layer belongs to (sched), summing their outputs in
// the fixed order local mode uses, so the swarm's logits are local mode's
// bit for bit. Swarm is the model.ExpertRunner that does this over wire;
// it also sends the loading hints of the -prefetch policy and measures
// what every layer costs (main compute, worker compute, network, loads,
// stalls, misses).
//
// It does not own the transformer (model), the pass loop (passloop), the
// placement rule (sched), the transport (wire) or the workers' memory
// (worker).
package mainnode
