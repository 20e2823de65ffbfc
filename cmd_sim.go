package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/odmoe/odmoe/internal/svgplot"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
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
	ahead := fs.Int("ahead", 1, "shadow: iterations it may run past its latest alignment (0: late departure)")
	alignKV := fs.Int("align-kv", 1, alignKVUsage)
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
	p, _, layout, shape, err := simRig(*profilePath, *rigPath, *dir)
	if err != nil {
		return err
	}
	c, err := oneCase(*caseFlag)
	if err != nil {
		return err
	}
	res, err := sim.Run(p, layout, shape, sim.Options{Mode: sim.Mode(*mode), Prompt: c.Prompt, Output: c.Output, Recall: *recall, Ahead: *ahead, AlignKV: *alignKV, Seed: *seed})
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

// alignKVUsage is the -align-kv flag's help in odmoe sim and its sweep.
const alignKVUsage = "shadow: the main node's -align-kv `K`: every K iterations it sends the shadow the new positions' keys and values over its link (0: never); the token period's effect, and K's on the shadow's routing, are the recall's (odmoe tune-align measures it)"

// simShape is what of the model in dir the simulation needs.
func simShape(dir string) (sim.Shape, model.Config, error) {
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return sim.Shape{}, cfg, err
	}
	return sim.Shape{Layers: cfg.NumLayers, Experts: cfg.NumExperts, TopK: cfg.TopK, ExpertLayers: cfg.ExpertLayers(),
		// bf16 gate, up and down; the hidden state travels as float32,
		// the shadow's KV rows as fp16 (align.PackKV)
		ExpertBytes: 3 * 2 * int64(cfg.HiddenSize) * int64(cfg.IntermediateSize), HiddenBytes: 4 * int64(cfg.HiddenSize),
		KVBytes: int64(cfg.NumLayers) * 2 * int64(cfg.NumKVHeads*cfg.HeadDim) * 2}, cfg, nil
}

// runSimCalibrate fits a profile to a bench rig directory's resident and
// shadow runs of one case.
func runSimCalibrate(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim calibrate", stderr)
	benchDir := fs.String("bench", "", "`DIR`: an odmoe bench rig output directory (its report.json) with resident and shadow runs (required)")
	caseFlag := fs.String("case", "16x256", "the PROMPTxOUTPUT case to calibrate from")
	out := fs.String("out", "", "write the profile to `FILE` (default: standard output)")
	cores := fs.Int("cores", -1, "CPU cores all the nodes shared; -1: the bench machine's when it ran them all (local, netns), else 0")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *benchDir == "" {
		return usagef("-bench is required")
	}
	rep, err := readBenchReport(*benchDir)
	if err != nil {
		return err
	}
	c, err := oneCase(*caseFlag)
	if err != nil {
		return err
	}
	want := c.String()
	// each mode's runs of the case: every repeat when the bench repeated it
	runs := map[testbed.Mode][]sim.Measured{}
	for _, r := range rep.Runs {
		if r.Case != want || (r.Mode != testbed.ModeResident && r.Mode != testbed.ModeShadow) {
			continue
		}
		repeats := r.Repeats
		if len(repeats) == 0 {
			repeats = []testbed.Run{r}
		}
		for _, rr := range repeats {
			m, err := measured(rr)
			if err != nil {
				return err
			}
			runs[r.Mode] = append(runs[r.Mode], m)
		}
	}
	n := min(len(runs[testbed.ModeResident]), len(runs[testbed.ModeShadow]))
	if n == 0 {
		return fmt.Errorf("sim calibrate: %s has no resident and shadow runs of case %s", *benchDir, *caseFlag)
	}
	shape, _, err := simShape(rep.Model)
	if err != nil {
		return fmt.Errorf("sim calibrate: the bench's model: %w", err)
	}
	shared := *cores
	if shared < 0 {
		shared = 0
		if rep.Via == "netns" || rep.Via == "local" {
			shared = rep.Machine.CPUs
		}
	}
	rate := 125e6 // 1 Gbit/s, the rigs' links
	if r, ok := rep.Link["rate"]; ok {
		if v, ok := parseBitRate(r); ok {
			rate = v / 8
		}
	}
	name := fmt.Sprintf("calibrated from %s (%s, case %s, %s)", *benchDir, rep.Machine.CPU, *caseFlag, rep.Date)
	// a profile for each repeat (its resident and shadow runs), averaged
	var ps []sim.Profile
	for i := range n {
		p, err := sim.Calibrate(name, shape, shared, rate, runs[testbed.ModeResident][i], runs[testbed.ModeShadow][i])
		if err != nil {
			return fmt.Errorf("sim calibrate: run %d of %d: %w", i+1, n, err)
		}
		ps = append(ps, p)
	}
	p := sim.MeanProfile(ps)
	p.Sources = []string{fmt.Sprintf("odmoe sim calibrate -bench %s -case %s: the mean of %d calibrations, one a run of the case", *benchDir, *caseFlag, n)}
	j, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	j = append(j, '\n')
	if *out == "" {
		_, err = stdout.Write(j)
		return err
	}
	return os.WriteFile(*out, j, 0o644)
}

// measured is what calibration reads of one bench run.
func measured(r testbed.Run) (sim.Measured, error) {
	var st struct {
		DecodeTokensPerS float64          `json:"decode_tokens_per_s"`
		Decode           []sim.LayerStats `json:"decode_layers"`
		Prefill          []sim.LayerStats `json:"prefill_layers"`
		Iterations       []sim.LayerStats `json:"iterations"`
	}
	if err := json.Unmarshal(r.Stats, &st); err != nil {
		return sim.Measured{}, fmt.Errorf("sim calibrate: %s %s: stats: %w", r.Mode, r.Case, err)
	}
	return sim.Measured{Prompt: r.Prompt, Output: r.Output, DecodeTokensPerS: st.DecodeTokensPerS, Decode: st.Decode, Prefill: st.Prefill,
		CPUSeconds: r.CPUSeconds, Iterations: st.Iterations}, nil
}

// parseFloats reads comma-separated numbers, each in [lo, hi].
func parseFloats(s string, lo, hi float64) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < lo || v > hi {
			return nil, fmt.Errorf("%q is not a number in %v..%v", f, lo, hi)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseBitRate reads a tc rate: "1gbit", "100mbit", "500kbit", "64bit"
// (bits per second).
func parseBitRate(s string) (float64, bool) {
	for _, u := range []struct {
		suffix string
		scale  float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if num, ok := strings.CutSuffix(strings.ToLower(strings.TrimSpace(s)), u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			return v * u.scale, err == nil && v > 0
		}
	}
	return 0, false
}

// readBenchReport reads a bench rig directory's report.json.
func readBenchReport(dir string) (*testbed.Report, error) {
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		return nil, err
	}
	var rep testbed.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("sim: %s/report.json: %w", dir, err)
	}
	return &rep, nil
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
	rep, err := readBenchReport(*benchDir)
	if err != nil {
		return err
	}
	p, rig, layout, shape, err := simRig(*profilePath, *rigPath, rep.Model)
	if err != nil {
		return err
	}
	ahead, err := shadowAhead(rig)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s against %s\n\n", p.Name, *benchDir)
	fmt.Fprintln(stdout, "| case | mode | measured tok/s | predicted | error | measured TTFT ms | predicted | error |")
	fmt.Fprintln(stdout, "|---|---|---:|---:|---:|---:|---:|---:|")
	ratios := map[string]map[testbed.Mode][2]float64{} // case -> mode -> measured, predicted
	for _, r := range rep.Runs {
		var mode sim.Mode
		switch r.Mode {
		case testbed.ModeResident, testbed.ModeReactive, testbed.ModeShadow:
			mode = sim.Mode(r.Mode)
		default:
			continue
		}
		var st struct {
			DecodeTokensPerS float64  `json:"decode_tokens_per_s"`
			TTFTms           float64  `json:"ttft_ms"`
			Recall           *float64 `json:"recall"`
		}
		if err := json.Unmarshal(r.Stats, &st); err != nil {
			return fmt.Errorf("sim validate: %s %s: %w", r.Mode, r.Case, err)
		}
		recall := 1.0
		if st.Recall != nil {
			recall = *st.Recall
		}
		// bench rig aligns the shadow every iteration (testbed.MainFlags)
		res, err := sim.Run(p, layout, shape, sim.Options{Mode: mode, Prompt: r.Prompt, Output: r.Output, Recall: recall, Ahead: ahead, AlignKV: 1, Seed: *seed})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "| %dx%d | %s | %.2f | %.2f | %+.0f%% | %.1f | %.1f | %+.0f%% |\n", r.Prompt, r.Output, r.Mode,
			st.DecodeTokensPerS, res.DecodeTokensPerS, 100*(res.DecodeTokensPerS/st.DecodeTokensPerS-1), st.TTFTms, res.TTFTms, 100*(res.TTFTms/st.TTFTms-1))
		if ratios[r.Case] == nil {
			ratios[r.Case] = map[testbed.Mode][2]float64{}
		}
		ratios[r.Case][r.Mode] = [2]float64{st.DecodeTokensPerS, res.DecodeTokensPerS}
	}
	for _, c := range slices.Sorted(maps.Keys(ratios)) {
		res, sh := ratios[c][testbed.ModeResident], ratios[c][testbed.ModeShadow]
		if res[0] > 0 && sh[0] > 0 {
			fmt.Fprintf(stdout, "\n%s: shadow / resident measured %.1f%%, predicted %.1f%%", c, 100*sh[0]/res[0], 100*sh[1]/res[1])
		}
	}
	fmt.Fprintln(stdout)
	return nil
}

// shadowAhead is the rig's shadow's -ahead (the default when not set).
func shadowAhead(rig *testbed.Rig) (int, error) {
	if rig.Shadow == nil {
		return shadow.DefaultAhead, nil
	}
	return nodeIntFlag(*rig.Shadow, "-ahead", shadow.DefaultAhead)
}

// simRig reads what a simulation of a rig runs on: the profile, the rig
// and its worker layout, and the model's shape.
func simRig(profilePath, rigPath, modelDir string) (sim.Profile, *testbed.Rig, sched.Layout, sim.Shape, error) {
	p, err := readProfile(profilePath)
	if err != nil {
		return p, nil, sched.Layout{}, sim.Shape{}, err
	}
	rig, err := testbed.ReadRig(rigPath)
	if err != nil {
		return p, nil, sched.Layout{}, sim.Shape{}, err
	}
	shape, cfg, err := simShape(modelDir)
	if err != nil {
		return p, rig, sched.Layout{}, shape, err
	}
	layout, err := rigLayout(rig, cfg)
	return p, rig, layout, shape, err
}

// rigLayout is the rig's workers in groups of its main node's -group (by
// default the model's top-k, as the main node does).
func rigLayout(rig *testbed.Rig, cfg model.Config) (sched.Layout, error) {
	group, err := nodeIntFlag(rig.Main, "-group", cfg.TopK)
	if err != nil {
		return sched.Layout{}, err
	}
	return sched.NewLayout(len(rig.Workers), group)
}

// nodeIntFlag is the value of a rig node's integer flag, or def when the
// node does not set it (the last setting counts, as for the node itself).
func nodeIntFlag(n testbed.Node, name string, def int) (int, error) {
	v, set := "", false
	for i, f := range n.Flags {
		switch {
		case f == name && i+1 < len(n.Flags):
			v, set = n.Flags[i+1], true
		case strings.HasPrefix(f, name+"="):
			v, set = strings.TrimPrefix(f, name+"="), true
		}
	}
	if !set {
		return def, nil
	}
	x, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("sim: rig node %s: %s %q is not an integer", n.Name, name, v)
	}
	return x, nil
}

// readProfile reads a sim.Profile from a JSON file.
func readProfile(path string) (sim.Profile, error) {
	var p sim.Profile
	b, err := os.ReadFile(path)
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("sim: profile %s: %w", path, err)
	}
	return p, nil
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
	vary := fs.String("vary", "workers", "the parameter swept: workers, link (bits/s), recall, ahead, align (the KV alignment period, with -recalls as measured at each)")
	valuesFlag := fs.String("values", "4,8,16,32,64,128", "its values, comma-separated")
	modesFlag := fs.String("modes", "resident,reactive,shadow", "modes to predict")
	caseFlag := fs.String("case", "16x64", "PROMPTxOUTPUT tokens")
	workers := fs.Int("workers", 8, "workers (when not swept)")
	group := fs.Int("group", 0, "workers per group; 0 = the router's top-k")
	recall := fs.Float64("recall", 1, "the shadow's recall (when not swept)")
	ahead := fs.Int("ahead", 1, "the shadow's lead in iterations (when not swept)")
	alignKV := fs.Int("align-kv", 1, alignKVUsage+" (when not swept)")
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
	p, err := readProfile(*profilePath)
	if err != nil {
		return err
	}
	shape, cfg, err := simShape(*dir)
	if err != nil {
		return err
	}
	c, err := oneCase(*caseFlag)
	if err != nil {
		return err
	}
	values, err := parseFloats(*valuesFlag, math.Inf(-1), math.Inf(1))
	if err != nil {
		return usagef("-values: %v", err)
	}
	var recalls []float64
	if *recallsFlag != "" {
		if recalls, err = parseFloats(*recallsFlag, 0, 1); err != nil {
			return usagef("-recalls: %v", err)
		}
		if len(recalls) != len(values) {
			return usagef("-recalls has %d values for -values' %d", len(recalls), len(values))
		}
	}
	xlabel, logX := map[string]string{"workers": "workers", "link": "link rate (bits/s)", "recall": "recall", "ahead": "iterations ahead", "align": "KV alignment period (iterations)"}[*vary], *vary == "workers" || *vary == "link" || *vary == "align"
	if xlabel == "" {
		return usagef("-vary %q: want workers, link, recall, ahead or align", *vary)
	}
	g := *group
	if g == 0 {
		g = cfg.TopK
	}
	modes := strings.Split(*modesFlag, ",")
	for i := range modes {
		modes[i] = strings.TrimSpace(modes[i])
	}
	chart := svgplot.Chart{Title: fmt.Sprintf("decode tokens/s by %s, %s, %s", xlabel, *caseFlag, strings.TrimSuffix(filepath.Base(*profilePath), ".json")), XLabel: xlabel, YLabel: "decode tokens/s", X: values, LogX: logX}
	fmt.Fprintf(stdout, "| %s | %s |\n|---|%s\n", xlabel, strings.Join(modes, " | "), strings.Repeat("---:|", len(modes)))
	rows := make([][]float64, len(values))
	for _, m := range modes {
		var ys []float64
		for i, v := range values {
			pp, w, o := p, *workers, sim.Options{Mode: sim.Mode(m), Prompt: c.Prompt, Output: c.Output, Recall: *recall, Ahead: *ahead, AlignKV: *alignKV, Seed: *seed}
			if recalls != nil {
				o.Recall = recalls[i]
			}
			switch *vary {
			case "workers":
				w = int(v)
			case "link":
				pp.LinkBytesPerS = v / 8
			case "recall":
				o.Recall = v
			case "ahead":
				o.Ahead = int(v)
			case "align":
				o.AlignKV = int(v)
			}
			layout, err := sched.NewLayout(w, g)
			if err != nil {
				return err
			}
			res, err := sim.Run(pp, layout, shape, o)
			if err != nil {
				return err
			}
			ys = append(ys, res.DecodeTokensPerS)
			rows[i] = append(rows[i], res.DecodeTokensPerS)
		}
		chart.Series = append(chart.Series, svgplot.Series{Name: m, Y: ys})
	}
	for i, v := range values {
		cells := make([]string, len(rows[i]))
		for j, y := range rows[i] {
			cells[j] = fmt.Sprintf("%.2f", y)
		}
		fmt.Fprintf(stdout, "| %g | %s |\n", v, strings.Join(cells, " | "))
	}
	if *svgOut != "" {
		f, err := os.Create(*svgOut)
		if err != nil {
			return err
		}
		if err := chart.Write(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	return nil
}
