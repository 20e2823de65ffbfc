package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/odmoe/odmoe/harness/simrig"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/sim"
	"github.com/odmoe/odmoe/testbed"
)

// runSim predicts one bench rig case on a rig whose parts cost what a
// profile says, each node on its own CPU and link (package sim).
func runSim(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		if sub, ok := map[string]func(context.Context, []string, io.Reader, io.Writer, io.Writer) error{
			"calibrate": runSimCalibrate, "validate": runSimValidate, "sweep": runSimSweep}[args[0]]; ok {
			return sub(ctx, args[1:], stdin, stdout, stderr)
		}
	}
	fs := newFlagSet("sim", stderr)
	profilePath := fs.String("profile", "", "`FILE`: the rig's costs as JSON (sim.Profile; testbed/profiles/) (required)")
	rigPath := fs.String("rig", "testbed/rigs/paper.rig", "rig description `FILE`: its workers, and the main node's -group")
	dir := fs.String("model", "", "Hugging Face model directory: its config.json gives the shape (required)")
	mode := fs.String("mode", "shadow", "resident, reactive or shadow")
	caseFlag := fs.String("case", "16x64", "PROMPTxOUTPUT tokens")
	recall := fs.Float64("recall", 1, "shadow: the share of activations it predicts (eq. 3; measured: fp16 ~1, int8 ~0.98)")
	ahead := fs.Int("ahead", 1, "shadow: passes it may run past its latest alignment (0: late departure)")
	alignKV := fs.Int("align-kv", 1, alignKVUsage)
	accept, draft := draftFlags(fs, "")
	seed := fs.Uint64("seed", 1, "routing and prediction seed")
	asJSON := fs.Bool("json", false, "print one JSON object")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *profilePath == "" || *dir == "" {
		return usagef("-profile and -model are required")
	}
	c, err := oneCase(*caseFlag)
	if err != nil {
		return err
	}
	return simrig.Predict(simrig.PredictOptions{Profile: *profilePath, Rig: *rigPath, Model: *dir, Mode: *mode, Case: c, Recall: *recall, Ahead: *ahead, AlignKV: *alignKV,
		Accept: *accept, Draft: *draft, Seed: *seed, JSON: *asJSON}, stdout)
}

// draftFlags registers odmoe sim's and its sweep's -accept and -draft,
// their help ending in also.
func draftFlags(fs *flag.FlagSet, also string) (accept *float64, draft *int) {
	accept = fs.Float64("accept", 0, "shadow: the chance its guess of a token is the main node's sample (bench rig's agreed share; greedy ~0.85, sampled at 0.7 lower); 0: not modelled"+also)
	draft = fs.Int("draft", 0, fmt.Sprintf("shadow, with -accept: the guesses each decode pass checks after its token (0..%d; 0: none)", sim.MaxDraft)+also)
	return accept, draft
}

// alignKVUsage is the -align-kv flag's help in odmoe sim and its sweep.
const alignKVUsage = "shadow: the main node's -align-kv `K`: every K passes it sends the shadow the new positions' keys and values over its link (0: never); the token period's effect, and K's on the shadow's routing, are the recall's (odmoe tune-align measures it)"

// runSimCalibrate fits a profile to a bench rig directory's resident and
// shadow runs of one case.
func runSimCalibrate(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim calibrate", stderr)
	benchDir := fs.String("bench", "", "`DIR`: an odmoe bench rig output directory (its report.json) with resident and shadow runs (required)")
	caseFlag := fs.String("case", "16x256", "the PROMPTxOUTPUT case to calibrate from")
	out := fs.String("out", "", "write the profile to `FILE` (default: standard output)")
	cores := fs.Int("cores", -1, "CPU cores all the nodes shared; -1: the bench machine's when it ran them all (local, netns), else 0")
	rigPath := fs.String("rig", "", "the bench's rig `FILE` (its workers' layout, the shadow's lead); default: the path its report.json names")
	otherFlag := fs.String("other", "auto", "the PROMPTxOUTPUT case whose resident runs, at another prompt length than -case's, tell a prompt layer's and its messages' fixed costs from what each token adds; auto: the report's longest prompt but -case's, else its shortest; none: no such fit")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *benchDir == "" {
		return usagef("-bench is required")
	}
	c, err := oneCase(*caseFlag)
	if err != nil {
		return err
	}
	other, err := simrig.ParseOther(*otherFlag, c)
	if err != nil {
		return usagef("-other: %v", err)
	}
	p, err := simrig.Calibrate(simrig.CalibrateOptions{Bench: *benchDir, Case: c, Cores: *cores, Rig: *rigPath, Other: other})
	if err != nil {
		return err
	}
	return simrig.WriteProfile(p, *out, stdout)
}

// runSimValidate predicts every resident, reactive and shadow run of a
// bench rig directory with a profile and prints the table of measured
// against predicted decode tokens/s and TTFT, with the errors.
func runSimValidate(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim validate", stderr)
	benchDir := fs.String("bench", "", "`DIR`: an odmoe bench rig output directory (required)")
	profilePath := fs.String("profile", "", "`FILE`: the profile to predict with (required)")
	rigPath := fs.String("rig", "testbed/rigs/paper.rig", "the bench's rig `FILE`")
	seed := fs.Uint64("seed", 1, "routing and prediction seed")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *benchDir == "" || *profilePath == "" {
		return usagef("-bench and -profile are required")
	}
	return simrig.Validate(simrig.ValidateOptions{Bench: *benchDir, Profile: *profilePath, Rig: *rigPath, Seed: *seed}, stdout)
}

// oneCase reads a single PROMPTxOUTPUT case.
func oneCase(s string) (testbed.Case, error) {
	cases, err := testbed.ParseCases(s)
	if err != nil || len(cases) != 1 {
		return testbed.Case{}, usagef("-case %q: want one PROMPTxOUTPUT, e.g. 16x64", s)
	}
	return cases[0], nil
}

// runSimSweep predicts decode tokens/s over a range of one parameter
// (workers, link rate, recall, the shadow's lead), for each mode, as a
// table and an SVG chart.
func runSimSweep(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim sweep", stderr)
	profilePath := fs.String("profile", "", "`FILE`: the rig's costs (required)")
	dir := fs.String("model", "", "Hugging Face model directory (config.json) (required)")
	vary := fs.String("vary", "workers", "the parameter swept: workers, link (bits/s), recall, ahead, align (the KV alignment period, with -recalls as measured at each), draft (the guesses a shadow-driven pass checks, with -accept)")
	valuesFlag := fs.String("values", "4,8,16,32,64,128", "its values, comma-separated")
	modesFlag := fs.String("modes", "resident,reactive,shadow", "modes to predict")
	caseFlag := fs.String("case", "16x64", "PROMPTxOUTPUT tokens")
	workers := fs.Int("workers", 8, "workers (when not swept)")
	group := fs.Int("group", 0, "workers per group; 0 = the router's top-k")
	recall := fs.Float64("recall", 1, "the shadow's recall (when not swept)")
	ahead := fs.Int("ahead", 1, "the shadow's lead in passes (when not swept)")
	alignKV := fs.Int("align-kv", 1, alignKVUsage+" (when not swept)")
	accept, draft := draftFlags(fs, " (when not swept)")
	recallsFlag := fs.String("recalls", "", "the shadow's recall at each of -values, comma-separated (e.g. tune-align's at each alignment period); empty: -recall at all")
	seed := fs.Uint64("seed", 1, "routing and prediction seed")
	svgOut := fs.String("svg", "", "also draw the chart to `FILE`")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *profilePath == "" || *dir == "" {
		return usagef("-profile and -model are required")
	}
	c, err := oneCase(*caseFlag)
	if err != nil {
		return err
	}
	values, err := runflags.ParseFloats(*valuesFlag, math.Inf(-1), math.Inf(1))
	if err != nil {
		return usagef("-values: %v", err)
	}
	var recalls []float64
	if *recallsFlag != "" {
		if recalls, err = runflags.ParseFloats(*recallsFlag, 0, 1); err != nil {
			return usagef("-recalls: %v", err)
		}
		if len(recalls) != len(values) {
			return usagef("-recalls has %d values for -values' %d", len(recalls), len(values))
		}
	}
	if !slices.Contains(simrig.Varies, *vary) {
		return usagef("-vary %q: want %s", *vary, strings.Join(simrig.Varies, ", "))
	}
	modes := strings.Split(*modesFlag, ",")
	return simrig.Sweep(simrig.SweepOptions{Profile: *profilePath, Model: *dir, Vary: *vary, Values: values, Recalls: recalls, Modes: modes, Case: c,
		Workers: *workers, Group: *group, Recall: *recall, Ahead: *ahead, AlignKV: *alignKV,
		Accept: *accept, Draft: *draft, Seed: *seed, SVG: *svgOut}, stdout)
}
