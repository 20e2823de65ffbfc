package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/odmoe/odmoe/harness/simrig"
	"github.com/odmoe/odmoe/plan"
	"github.com/odmoe/odmoe/runflags"
)

// runPlan answers what a swarm of one kind of node needs to serve a
// model: its stages, shadow stages and workers, what each holds, and the
// predicted speeds (package plan).
func runPlan(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", stderr)
	dir := fs.String("model", "", "Hugging Face model `DIR`: its config.json is all the planner reads (required)")
	devicePath := fs.String("device", "", "`FILE`: the node's size and speeds as JSON (plan.Device; testbed/devices/) (required)")
	nodeMem := fs.String("node-mem", "", "the node's memory `SIZE` instead of the device's (e.g. 16GiB); its reserve stays")
	link := fs.String("link", "", "the nodes' link `RATE` instead of the device's (e.g. 1gbit, 10gbit)")
	quantFlag := fs.String("quant", "nf4", "the shadow's copy: fp16, int8 or nf4")
	caseFlag := fs.String("case", "128x64", "PROMPTxOUTPUT tokens the speeds are predicted on")
	recall := fs.Float64("recall", 0.97, "the shadow's share of activations predicted (measured: odmoe tune-align; nf4 0.968 on the small preset)")
	ahead := fs.Int("ahead", 1, "the shadow's lead in passes")
	contextLen := fs.Int("context", 0, "the longest sequence the nodes serve, in `TOKENS`, as each node's -context: its KV cache is sized to it (default: the model's max_position_embeddings)")
	maxWorkers := fs.Int("max-workers", 128, "the most workers tried (multiples of -group)")
	group := fs.Int("group", 0, "workers a layer's experts go to; 0 = the router's top-k")
	within := fs.Float64("within", 0.05, "a swarm of fewer nodes is answered where its decode is within this share of the fastest's")
	seed := fs.Uint64("seed", 1, "routing and prediction seed")
	asJSON := fs.Bool("json", false, "print the answer, every option weighed, as one JSON object")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dir == "" || *devicePath == "" {
		return usagef("-model and -device are required")
	}
	d, err := plan.ReadDevice(*devicePath)
	if err != nil {
		return err
	}
	if *nodeMem != "" {
		if d.MemBytes, err = runflags.ParseBytes(*nodeMem); err != nil {
			return usagef("-node-mem: %v", err)
		}
		d.Name = fmt.Sprintf("%s with %s", d.Name, *nodeMem)
	}
	if *link != "" {
		rate, ok := simrig.ParseBitRate(*link)
		if !ok {
			return usagef("-link %q: want a rate such as 1gbit or 100mbit", *link)
		}
		d.LinkBitsPerS, d.Name = rate, fmt.Sprintf("%s on %s links", d.Name, *link)
	}
	quant, err := runflags.ParseQuant(*quantFlag)
	if err != nil {
		return usagef("-quant %v", err)
	}
	c, err := oneCase(*caseFlag)
	if err != nil {
		return err
	}
	if *recall < 0 || *recall > 1 || *within < 0 || *within >= 1 || *maxWorkers < 1 || *ahead < 0 || *group < 0 || *contextLen < 0 {
		return usagef("-recall %v (0..1), -within %v (0..1), -max-workers %d (>= 1), -ahead %d, -group %d and -context %d (>= 0)", *recall, *within, *maxWorkers, *ahead, *group, *contextLen)
	}
	o := plan.Options{Model: *dir, Device: d, Quant: quant, Prompt: c.Prompt, Output: c.Output, Recall: *recall, Ahead: *ahead,
		MaxWorkers: *maxWorkers, Group: *group, Within: *within, Seed: *seed, Context: *contextLen}
	a, err := plan.Plan(o)
	if err != nil {
		return err
	}
	if *asJSON {
		out, err := json.MarshalIndent(a, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(out))
		return nil
	}
	plan.WriteText(stdout, a, o)
	return nil
}
