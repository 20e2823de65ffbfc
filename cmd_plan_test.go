package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestPlanAnswersWithEveryNodeWithinItsSize: odmoe plan -json on
// gpt-oss-120b's config.json and the Orin NX 16 GB device answers nodes
// that each hold at most the node's budget and speeds above zero; a node
// of 64 GiB needs no stage; -context 4096 sizes the KV caches to it (the
// main node holds less); an unknown -quant and a missing -device are
// refused by name.
func TestPlanAnswersWithEveryNodeWithinItsSize(t *testing.T) {
	plan := func(args ...string) map[string]any {
		t.Helper()
		so, se, code := run(t, "", append([]string{"plan", "-model", "testdata/sim/gpt-oss-120b", "-device", "testbed/devices/jetson-orin-nx-16gb.json", "-max-workers", "8", "-json"}, args...)...)
		if code != 0 {
			t.Fatalf("plan %v: exit %d: %s", args, code, se)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(so), &out); err != nil {
			t.Fatalf("plan -json printed %q: %v", so, err)
		}
		return out
	}
	roles := func(a map[string]any) (budget float64, nodes map[string]float64) {
		nodes = map[string]float64{}
		for _, n := range a["nodes"].([]any) {
			n := n.(map[string]any)
			if h := n["holds_bytes"].(float64); h > a["node_budget_bytes"].(float64) {
				t.Errorf("%v holds %v bytes, over the node's %v", n, h, a["node_budget_bytes"])
			}
			nodes[n["role"].(string)] += n["count"].(float64)
		}
		return a["node_budget_bytes"].(float64), nodes
	}
	a := plan()
	if c := a["chosen"].(map[string]any); c["decode_tokens_per_s"].(float64) <= 0 || c["prompt_tokens_per_s"].(float64) <= 0 {
		t.Fatalf("chosen %v: want speeds above zero", c)
	}
	_, nodes := roles(a)
	if nodes["main"] != 1 || nodes["worker"] < 4 {
		t.Fatalf("nodes %v: want a main node and 4 workers or more", nodes)
	}
	big := plan("-node-mem", "64GiB", "-link", "10gbit")
	if budget, nodes := roles(big); nodes["stage"] != 0 || budget < 60<<30 || !strings.Contains(big["device"].(string), "10gbit") {
		t.Fatalf("on 64 GiB nodes of 10gbit links: %v nodes, budget %v, device %q: want no stage", nodes, budget, big["device"])
	}
	holds := func(a map[string]any) float64 { return a["nodes"].([]any)[0].(map[string]any)["holds_bytes"].(float64) }
	short := plan("-context", "4096")
	if short["context"].(float64) != 4096 || a["context"].(float64) != 131072 || holds(short) >= holds(a) {
		t.Fatalf("-context 4096: context %v (whole %v), main node holds %v (whole context %v): want 4096 and less held", short["context"], a["context"], holds(short), holds(a))
	}
	if _, se, code := run(t, "", "plan", "-model", "testdata/sim/gpt-oss-120b", "-device", "testbed/devices/jetson-orin-nx-16gb.json", "-quant", "int3"); code == 0 || !strings.Contains(se, "int3") {
		t.Fatalf("-quant int3: exit %d, %q", code, se)
	}
	if _, se, code := run(t, "", "plan", "-model", "testdata/sim/gpt-oss-120b"); code == 0 || !strings.Contains(se, "-device") {
		t.Fatalf("no -device: exit %d, %q", code, se)
	}
}
