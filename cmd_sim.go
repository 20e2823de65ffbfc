package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/sim"
	"github.com/odmoe/odmoe/testbed"
)

// runSim predicts one bench rig case on a rig whose parts cost what a
// profile says, each node on its own CPU and link (package sim).
func runSim(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", stderr)
	profilePath := fs.String("profile", "", "`FILE`: the rig's costs as JSON (sim.Profile; testbed/profiles/) (required)")
	rigPath := fs.String("rig", "testbed/rigs/paper.rig", "rig description `FILE`: its workers, and the main node's -group")
	dir := fs.String("model", "", "Hugging Face model directory: its config.json gives the shape (required)")
	mode := fs.String("mode", "shadow", "resident, reactive or shadow")
	caseFlag := fs.String("case", "16x64", "PROMPTxOUTPUT tokens")
	recall := fs.Float64("recall", 1, "shadow: the share of activations it predicts (eq. 3; measured: fp16 ~1, int8 ~0.98)")
	ahead := fs.Int("ahead", 1, "shadow: iterations it may run past its latest alignment (0: late departure)")
	seed := fs.Uint64("seed", 1, "routing and prediction seed")
	asJSON := fs.Bool("json", false, "print one JSON object")
	var lf logFlags
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *profilePath == "" || *dir == "" {
		return usagef("-profile and -model are required")
	}
	b, err := os.ReadFile(*profilePath)
	if err != nil {
		return err
	}
	var p sim.Profile
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("sim: profile %s: %w", *profilePath, err)
	}
	cfg, err := model.LoadConfig(*dir)
	if err != nil {
		return err
	}
	rig, err := testbed.ReadRig(*rigPath)
	if err != nil {
		return err
	}
	cases, err := testbed.ParseCases(*caseFlag)
	if err != nil || len(cases) != 1 {
		return usagef("-case %q: want one PROMPTxOUTPUT, e.g. 16x64", *caseFlag)
	}
	group := cfg.TopK
	if i := slices.Index(rig.Main.Flags, "-group"); i >= 0 && i+1 < len(rig.Main.Flags) {
		if group, err = strconv.Atoi(rig.Main.Flags[i+1]); err != nil {
			return fmt.Errorf("sim: %s: the main node's -group %q", *rigPath, rig.Main.Flags[i+1])
		}
	}
	layout, err := sched.NewLayout(len(rig.Workers), group)
	if err != nil {
		return err
	}
	shape := sim.Shape{Layers: cfg.NumLayers, Experts: cfg.NumExperts, TopK: cfg.TopK, ExpertLayers: cfg.ExpertLayers(),
		// bf16 gate, up and down; the hidden state travels as float32
		ExpertBytes: 3 * 2 * int64(cfg.HiddenSize) * int64(cfg.IntermediateSize), HiddenBytes: 4 * int64(cfg.HiddenSize)}
	c := cases[0]
	res, err := sim.Run(p, layout, shape, sim.Options{Mode: sim.Mode(*mode), Prompt: c.Prompt, Output: c.Output, Recall: *recall, Ahead: *ahead, Seed: *seed})
	if err != nil {
		return err
	}
	if *asJSON {
		out, err := json.Marshal(struct {
			Profile string `json:"profile"`
			Mode    string `json:"mode"`
			Case    string `json:"case"`
			sim.Result
		}{p.Name, *mode, *caseFlag, res})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(out))
		return nil
	}
	fmt.Fprintf(stdout, "%s, %s, %d workers in groups of %d, %s mode, %s: TTFT %.1f ms, decode %.2f tok/s, stall %.1f%%, %d loads, misses %d late / %d wrong\n",
		p.Name, *dir, layout.Workers, layout.Group, *mode, *caseFlag, res.TTFTms, res.DecodeTokensPerS, 100*res.StallFraction, res.Loads, res.MissesLate, res.MissesWrong)
	return nil
}
