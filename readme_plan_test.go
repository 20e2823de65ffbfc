//go:build !race

// The planning table takes ~35 s of simulation (2 vCPU) without the race
// detector; make test runs it in its own step (Makefile).

package main

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/plan"
)

var updatePlanTable = flag.Bool("update-plan-table", false, "rewrite README.md's planning table from the planner's answers")

// readmePlans are README's planning table's rows: each model on the
// node the issue asked about, planned with odmoe plan's defaults.
var readmePlans = []struct{ name, model, node, device string }{
	{"Qwen3-30B-A3B", "testdata/sim/qwen3-30b-a3b", "Jetson Orin Nano 8 GB", "testbed/devices/jetson-orin-nano-8gb.json"},
	{"Qwen3-30B-A3B", "testdata/sim/qwen3-30b-a3b", "Raspberry Pi 5 8 GB", "testbed/devices/raspberry-pi5-8gb.json"},
	{"gpt-oss-120b", "testdata/sim/gpt-oss-120b", "Jetson Orin NX 16 GB", "testbed/devices/jetson-orin-nx-16gb.json"},
	{"Qwen3-235B-A22B", "testdata/sim/qwen3-235b-a22b", "Jetson Orin NX 16 GB", "testbed/devices/jetson-orin-nx-16gb.json"},
	{"DeepSeek-V3", "testdata/sim/deepseek-v3", "Jetson Orin NX 16 GB", "testbed/devices/jetson-orin-nx-16gb.json"},
	{"Kimi K2", "testdata/sim/kimi-k2", "Jetson Orin NX 16 GB", "testbed/devices/jetson-orin-nx-16gb.json"},
}

const planTableStart, planTableEnd = "<!-- plan-table: start -->", "<!-- plan-table: end -->"

// TestReadmePlanningTableIsThePlannersAnswer: README's planning table is
// what odmoe plan answers today for each of its rows, every node within
// its size (go test -run PlanningTable -update-plan-table rewrites it).
func TestReadmePlanningTableIsThePlannersAnswer(t *testing.T) {
	rows := make([]string, len(readmePlans))
	for i, r := range readmePlans {
		t.Run(r.name+" on "+r.node, func(t *testing.T) {
			t.Parallel()
			d, err := plan.ReadDevice(r.device)
			if err != nil {
				t.Fatal(err)
			}
			// odmoe plan's defaults (cmd_plan.go)
			a, err := plan.Plan(plan.Options{Model: r.model, Device: d, Quant: kernels.NF4, Prompt: 128, Output: 64, Recall: 0.97, Ahead: 1,
				MaxWorkers: 128, Within: 0.05, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range a.Nodes {
				if n.Holds > d.Budget() {
					t.Errorf("%s %s holds %d bytes, over the node's %d", n.Role, n.LayersText, n.Holds, d.Budget())
				}
			}
			rows[i] = plan.TableRow(r.name, r.node, a)
		})
	}
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		table := plan.TableHeader + "\n" + strings.Join(rows, "\n")
		b, err := os.ReadFile("README.md")
		if err != nil {
			t.Fatal(err)
		}
		readme := string(b)
		start, end := strings.Index(readme, planTableStart), strings.Index(readme, planTableEnd)
		if start < 0 || end < start {
			t.Fatalf("README.md has no %s ... %s", planTableStart, planTableEnd)
		}
		have := strings.TrimSpace(readme[start+len(planTableStart) : end])
		if have == table {
			return
		}
		if *updatePlanTable {
			readme = readme[:start+len(planTableStart)] + "\n" + table + "\n" + readme[end:]
			if err := os.WriteFile("README.md", []byte(readme), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("README.md's planning table is not the planner's answer (go test -run PlanningTable -update-plan-table rewrites it); the planner answers:\n%s\nREADME has:\n%s", table, have)
	})
}
