// Package simrig runs package sim against the testbed's rigs: it
// predicts a case on a rig, calibrates a profile from a bench rig run,
// validates a profile against one, and sweeps one parameter (`odmoe sim`).
package simrig

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
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

// PredictOptions say what Predict predicts.
type PredictOptions struct {
	Profile, Rig, Model string // the profile's file, the rig's file, the model's directory
	Mode                string // resident, reactive or shadow
	Case                testbed.Case
	Recall              float64
	Ahead, AlignKV      int
	// Accept and Draft: the chance a shadow's guess is kept, and the
	// guesses a pass checks (sim.Options)
	Accept float64
	Draft  int
	Seed   uint64
	JSON   bool // one JSON object instead of a line
}

// Predict predicts one case on a rig whose parts cost what a profile
// says, each node on its own CPU and link, and prints it.
func Predict(o PredictOptions, stdout io.Writer) error {
	p, rig, layout, shape, err := setup(o.Profile, o.Rig, o.Model)
	if err != nil {
		return err
	}
	rates, err := rigLoadRates(rig)
	if err != nil {
		return err
	}
	c := o.Case
	stages, shadowStages := rig.StageStarts()
	res, err := sim.Expect(p, layout, shape, sim.Options{Mode: sim.Mode(o.Mode), Prompt: c.Prompt, Output: c.Output, Recall: o.Recall, Ahead: o.Ahead, AlignKV: o.AlignKV, Seed: o.Seed, LoadRates: linkRates(p, rates),
		Stages: stages, ShadowStages: shadowStages, Accept: o.Accept, Draft: o.Draft}, sim.ExpectRuns)
	if err != nil {
		return err
	}
	if o.JSON {
		out, err := json.Marshal(struct {
			Profile string `json:"profile"`
			Mode    string `json:"mode"`
			Case    string `json:"case"`
			sim.Result
		}{p.Name, o.Mode, o.Case.String(), res})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(out))
		return nil
	}
	drafting := ""
	if res.Drafted > 0 {
		drafting = fmt.Sprintf(", %.2f tokens a pass (%d of %d guesses kept)", float64(c.Output-1)/float64(res.Passes), res.Accepted, res.Drafted)
	}
	fmt.Fprintf(stdout, "%s, %s, %d workers in groups of %d, %s mode, %s: TTFT %.1f ms, decode %.2f tok/s, stall %.1f%%, %d loads, misses %d late / %d wrong%s\n",
		p.Name, o.Model, layout.Workers, layout.Group, o.Mode, o.Case.String(), res.TTFTms, res.DecodeTokensPerS, 100*res.StallFraction, res.Loads, res.MissesLate, res.MissesWrong, drafting)
	return nil
}

// CalibrateOptions say what Calibrate fits a profile to.
type CalibrateOptions struct {
	Bench string       // a bench rig output directory (its report.json) with resident and shadow runs
	Case  testbed.Case // the case to calibrate from
	Cores int          // CPU cores all the nodes shared; -1: the bench machine's when it ran them all (local, netns), else 0
	// Rig is the bench's rig file (its workers' layout, the shadow's
	// lead), for fitting the routing's locality; "": the report's own
	// path, else its worker nodes in groups of the model's top-k
	Rig string
	// Other is the case whose resident runs, at another prompt length
	// than Case's, give a prompt layer's costs and its messages' with
	// Case's: what a first token costs apart from each further one, and a
	// message's fixed cost apart from its bytes', which one length cannot
	// tell apart; zero: the report's longest prompt but Case's (the same
	// output length first), else its shortest; a prompt of -1: none.
	Other testbed.Case
}

// Calibrate fits a profile to a bench rig directory's resident and shadow
// runs of one case: one calibration a repeat, averaged.
func Calibrate(o CalibrateOptions) (sim.Profile, error) {
	rep, err := ReadBenchReport(o.Bench)
	if err != nil {
		return sim.Profile{}, err
	}
	c := o.Case
	want := c.String()
	// each mode's runs of the case: every repeat when the bench repeated it
	runs := map[testbed.Mode][]sim.Measured{}
	for _, r := range rep.Runs {
		if r.Case != want || (r.Mode != testbed.ModeResident && r.Mode != testbed.ModeShadow && r.Mode != testbed.ModeReactive) {
			continue
		}
		repeats := r.Repeats
		if len(repeats) == 0 {
			repeats = []testbed.Run{r}
		}
		for _, rr := range repeats {
			m, err := measured(rr)
			if err != nil {
				return sim.Profile{}, err
			}
			runs[r.Mode] = append(runs[r.Mode], m)
		}
	}
	n := min(len(runs[testbed.ModeResident]), len(runs[testbed.ModeShadow]))
	if n == 0 {
		return sim.Profile{}, fmt.Errorf("sim calibrate: %s has no resident and shadow runs of case %s", o.Bench, o.Case.String())
	}
	shape, cfg, err := Shape(rep.Model)
	if err != nil {
		return sim.Profile{}, fmt.Errorf("sim calibrate: the bench's model: %w", err)
	}
	shared := o.Cores
	if shared < 0 {
		shared = 0
		if rep.Via == "netns" || rep.Via == "local" {
			shared = rep.Machine.CPUs
		}
	}
	rate := 125e6 // 1 Gbit/s, the rigs' links
	if r, ok := rep.Link["rate"]; ok {
		if v, ok := ParseBitRate(r); ok {
			rate = v / 8
		}
	}
	name := fmt.Sprintf("calibrated from %s (%s, case %s, %s)", o.Bench, rep.Machine.CPU, o.Case.String(), rep.Date)
	// a profile for each repeat (its resident and shadow runs), their median
	var ps []sim.Profile
	for i := range n {
		p, err := sim.Calibrate(name, shape, shared, rate, runs[testbed.ModeResident][i], runs[testbed.ModeShadow][i])
		if err != nil {
			return sim.Profile{}, fmt.Errorf("sim calibrate: run %d of %d: %w", i+1, n, err)
		}
		// a load's CPU from the reactive run of the round, where the
		// bench made one, and the shadow's predictions' beside it
		if i < len(runs[testbed.ModeReactive]) {
			p = p.SplitLoadCPU(shape, runs[testbed.ModeReactive][i], runs[testbed.ModeShadow][i])
		}
		ps = append(ps, p)
	}
	p := sim.MedianProfile(ps)
	// the routing's skew, from how many experts a prompt layer loaded
	// (the reactive runs', else the shadow runs')
	loaded := runs[testbed.ModeReactive]
	if len(loaded) == 0 {
		loaded = runs[testbed.ModeShadow]
	}
	if used := medianOf(loaded, func(m sim.Measured) float64 { return promptLoadsPerLayer(m) }); used > 0 {
		var err error
		if p, err = sim.FitPromptSkew(p, shape, c.Prompt, used); err != nil {
			return p, fmt.Errorf("sim calibrate: fitting the routing's skew: %w", err)
		}
	}
	// a prompt layer's fixed cost apart from its tokens', by how local
	// mode's pass grows with the prompt
	local := localTTFTs(rep)
	p = p.SplitPrefill(shape, c.Prompt, sim.PrefillSlope(local))
	p.Sources = []string{fmt.Sprintf("odmoe sim calibrate -bench %s -case %s: the median of %d calibrations, one a run of the case", o.Bench, o.Case.String(), n)}
	// the routing's locality, from the shadow runs' decode loads a step
	br, err := benchLayout(rep, o.Rig, cfg)
	if err != nil {
		return p, fmt.Errorf("sim calibrate: %w", err)
	}
	layout, ahead := br.layout, br.ahead
	p = p.OnLayout(shape, layout)
	// a load's time from the reactive runs where the bench made them: a
	// load on demand waits for no other, where the shadow's, many at
	// once, queue on their links and share the cores; the wait a layer
	// has for its slowest (its stall), since a layer's loads run at once
	// and the slower of two is what the layer waits for, shared by the
	// loads each worker makes of a layer, which the timeline runs in turn
	// (top-8 over four workers, two a worker: a layer waited 21.8 ms on
	// olmoe-small for loads of 13.8 ms each that ran at once; the
	// timeline runs two of 10.9)
	if stall := medianStall(runs[testbed.ModeReactive]); stall > 0 {
		group := max(layout.Group, 1)
		each := float64((shape.TopK + group - 1) / group)
		p.LoadMs, p.LoadBytesPerS = 0, float64(shape.ExpertBytes)/(stall/each/1000)
	}
	if slices.ContainsFunc(br.rates, func(r float64) bool { return r > 0 }) {
		p = p.WithLinks(shape, br.rates) // a load: its link, and the rest
	}
	rates := linkRates(p, br.rates)
	// the prompt's messages' cost, from the resident runs' TTFT
	ttftOf := func(m sim.Measured) float64 { return m.TTFTms }
	ttft := medianOf(runs[testbed.ModeResident][:n], ttftOf) // the median, as validate compares
	at := sim.Options{Prompt: c.Prompt, Output: c.Output, LoadRates: rates}
	// the other prompt length's runs of every mode, where the bench made
	// one: the figures that vary with the prompt are fitted at both
	other, hasOther := otherResident(rep, c, o.Other)
	oc := testbed.Case{Prompt: other.Prompt, Output: other.Output}
	otherRuns := map[testbed.Mode][]sim.Measured{}
	for _, mode := range []testbed.Mode{testbed.ModeResident, testbed.ModeReactive, testbed.ModeShadow} {
		if !hasOther {
			break
		}
		if otherRuns[mode], err = modeRuns(rep, mode, oc.Prompt, oc.Output); err != nil {
			return p, err
		}
	}
	if hasOther {
		om := otherRuns[testbed.ModeResident]
		otherMs := medianOf(om, ttftOf)
		if otherMs <= 0 {
			return p, fmt.Errorf("sim calibrate: %s %s: no time to first token in its stats", other.Mode, other.Case)
		}
		// a prompt layer's parts, each a line through the two lengths'
		// figures (the runs of the median time to first token)
		calRun, otherRun := medianRun(runs[testbed.ModeResident][:n], ttftOf), medianRun(om, ttftOf)
		if q, ok := p.PrefillLines(shape, calRun, otherRun); ok {
			p = q
			p.Sources = append(p.Sources, fmt.Sprintf("a prompt layer's main part and slowest expert, a first token's and each further one's, from the resident runs of %s and %s", c.String(), other.Case))
		}
		// an expert's first token from the shorter prompt's layers'
		// wall, where the timeline, not the cores, sets its time
		shorter := calRun
		if other.Prompt < c.Prompt {
			shorter = otherRun
		}
		if q, ok := p.ExpertPrefillFromWall(shape, layout, shorter); ok {
			p = q
		}
		short, long := at, sim.Options{Prompt: other.Prompt, Output: other.Output, LoadRates: rates}
		shortMs, longMs := ttft, otherMs
		if other.Prompt < c.Prompt {
			short, long, shortMs, longMs = long, short, longMs, shortMs
		}
		if p.Cores > 0 {
			// on shared cores: the prompt's CPU, its compute's as local
			// mode's pass grows with the prompt (on the same cores), its
			// messages' fitted to the longer prompt's time
			p.PrefillCPUTokenMs = sim.PrefillSlope(local) * float64(p.Cores)
			p, err = sim.FitPrefillCPU(p, layout, shape, short, shortMs, long, longMs)
			p.Sources = append(p.Sources, fmt.Sprintf("the prompt's CPU (its compute's from the local runs), its messages' fixed cost and, where they cost nothing, its experts' first token, from the resident runs of %s and %s", c.String(), other.Case))
		} else {
			p, err = sim.FitPrefillMessages(p, layout, shape, short, shortMs, long, longMs)
			p.Sources = append(p.Sources, fmt.Sprintf("the prompt's messages' rate from the resident runs of %s and %s", c.String(), other.Case))
		}
	} else if o.Other.Prompt > 0 {
		return p, fmt.Errorf("sim calibrate: %s has no resident runs of case %s", o.Bench, o.Other.String())
	} else {
		p, err = sim.FitPrefillMessage(p, layout, shape, at, ttft)
	}
	if err != nil {
		return p, fmt.Errorf("sim calibrate: fitting the prompt's messages: %w", err)
	}
	// the prompt's loads' CPU, from the reactive runs' TTFT, where the
	// bench made them (at both prompt lengths: missed alike)
	var loadsAt []sim.Point
	for _, r := range []struct {
		at testbed.Case
		rs []sim.Measured
	}{{c, runs[testbed.ModeReactive]}, {oc, otherRuns[testbed.ModeReactive]}} {
		if at, ms := r.at, medianOf(r.rs, ttftOf); ms > 0 {
			loadsAt = append(loadsAt, sim.Point{O: sim.Options{Prompt: at.Prompt, Output: at.Output, LoadRates: rates}, Want: ms})
		}
	}
	if p, err = sim.FitPrefillLoads(p, layout, shape, loadsAt...); err != nil {
		return p, fmt.Errorf("sim calibrate: fitting the prompt's loads: %w", err)
	}
	// the routing's locality, from the shadow runs' decode loads a step
	// (at the other prompt length too)
	shadowAt := func(at testbed.Case, rs []sim.Measured) (sim.Point, bool) {
		var loads, recall float64
		for _, m := range rs {
			for _, l := range m.Decode {
				loads += float64(l.Loads) / float64(max(m.Output-1, 1))
			}
			recall += m.Recall
		}
		if len(rs) == 0 || loads == 0 {
			return sim.Point{}, false
		}
		k := float64(len(rs))
		return sim.Point{O: sim.Options{Prompt: at.Prompt, Output: at.Output, Recall: recall / k, Ahead: ahead, AlignKV: 1, LoadRates: rates}, Want: loads / k}, true
	}
	cal, _ := shadowAt(c, runs[testbed.ModeShadow][:n])
	repeatAt := []sim.Point{cal}
	// the shadow's pass over the prompt, from the shadow runs' TTFT (at
	// the other prompt length too)
	promptAt := []sim.Point{{O: cal.O, Want: medianOf(runs[testbed.ModeShadow][:n], ttftOf)}}
	if rs := otherRuns[testbed.ModeShadow]; hasOther {
		if pt, ok := shadowAt(oc, rs); ok {
			repeatAt = append(repeatAt, pt)
		}
		if ms := medianOf(rs, ttftOf); ms > 0 {
			o := cal.O
			o.Prompt, o.Output = oc.Prompt, oc.Output
			promptAt = append(promptAt, sim.Point{O: o, Want: ms})
		}
	}
	if p, err = sim.FitRouteRepeat(p, layout, shape, repeatAt...); err != nil {
		return p, fmt.Errorf("sim calibrate: fitting the routing's locality: %w", err)
	}
	if p, err = sim.FitShadowPrefill(p, layout, shape, local, promptAt...); err != nil {
		return p, fmt.Errorf("sim calibrate: fitting the shadow's prompt: %w", err)
	}
	return p, p.Validate()
}

// ParseOther reads CalibrateOptions.Other from s: auto (the report's
// longest prompt but the calibration case c's, else its shortest), none,
// or one PROMPTxOUTPUT case whose prompt length is not c's.
func ParseOther(s string, c testbed.Case) (testbed.Case, error) {
	switch s {
	case "auto":
		return testbed.Case{}, nil
	case "none":
		return testbed.Case{Prompt: -1}, nil
	}
	cases, err := testbed.ParseCases(s)
	if err != nil || len(cases) != 1 {
		return testbed.Case{}, fmt.Errorf("%q: want auto, none or one PROMPTxOUTPUT case, e.g. 128x64", s)
	}
	if cases[0].Prompt == c.Prompt {
		return testbed.Case{}, fmt.Errorf("%s: its prompt must be another length than the calibration case %s's", cases[0].String(), c.String())
	}
	return cases[0], nil
}

// WriteProfile writes p as indented JSON to the file path, or to stdout
// where path is "".
func WriteProfile(p sim.Profile, path string, stdout io.Writer) error {
	j, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	j = append(j, '\n')
	if path == "" {
		_, err = stdout.Write(j)
		return err
	}
	return os.WriteFile(path, j, 0o644)
}

// otherResident is the resident run of rep whose prompt length
// Calibrate fits a prompt's costs at beside c's (CalibrateOptions.Other):
// want's, or the longest prompt above c's, else the shortest below it,
// the same output length first.
func otherResident(rep *testbed.Report, c, want testbed.Case) (testbed.Run, bool) {
	var best testbed.Run
	found := false
	if want.Prompt < 0 {
		return best, false
	}
	// how much better r is than the best so far: a longer prompt above
	// c's, else a shorter one below it; at a length, c's output length
	better := func(r testbed.Run) bool {
		if !found {
			return true
		}
		if r.Prompt == best.Prompt {
			return r.Output == c.Output && best.Output != c.Output
		}
		if (r.Prompt > c.Prompt) != (best.Prompt > c.Prompt) {
			return r.Prompt > c.Prompt
		}
		if r.Prompt > c.Prompt {
			return r.Prompt > best.Prompt
		}
		return r.Prompt < best.Prompt
	}
	for _, r := range rep.Runs {
		if r.Mode != testbed.ModeResident || r.Prompt == c.Prompt {
			continue
		}
		if want.Prompt > 0 {
			if r.Prompt == want.Prompt && r.Output == want.Output {
				return r, true
			}
			continue
		}
		if better(r) {
			best, found = r, true
		}
	}
	return best, found
}

// promptLoadsPerLayer is how many experts m's prompt loaded a layer
// with experts (0: its figures say none).
func promptLoadsPerLayer(m sim.Measured) float64 {
	var loads, layers int
	for _, l := range m.Prefill {
		if l.Calls > 0 {
			loads, layers = loads+l.Loads, layers+1
		}
	}
	if layers == 0 {
		return 0
	}
	return float64(loads) / float64(layers)
}

// modeRuns are the measured runs (every repeat) of rep's run of mode at
// a case, none where the bench made none.
func modeRuns(rep *testbed.Report, mode testbed.Mode, prompt, output int) ([]sim.Measured, error) {
	var out []sim.Measured
	for _, r := range rep.Runs {
		if r.Mode != mode || r.Prompt != prompt || r.Output != output {
			continue
		}
		for _, rr := range repeatsOf(r) {
			m, err := measured(rr)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// repeatsOf are r's repeats, or r alone where the bench ran it once.
func repeatsOf(r testbed.Run) []testbed.Run {
	if len(r.Repeats) == 0 {
		return []testbed.Run{r}
	}
	return r.Repeats
}

// medianRun is the run of ms whose f is the median (lowerMedian's), the
// zero Measured for none.
func medianRun(ms []sim.Measured, f func(sim.Measured) float64) sim.Measured {
	if len(ms) == 0 {
		return sim.Measured{}
	}
	sorted := slices.Clone(ms)
	slices.SortStableFunc(sorted, func(a, b sim.Measured) int { return cmp.Compare(f(a), f(b)) })
	return sorted[(len(sorted)-1)/2]
}

// medianStall is the median over runs of a decode layer call's stall
// (ms): the median run's, as validate compares against the median run
// (one round of loopback tiny's three reactive runs stalled half as long
// as the others: pooled, it set every load 15% short of the median
// run's, and the reactive swarm's decode +22% fast).
func medianStall(runs []sim.Measured) float64 {
	return medianOf(runs, func(m sim.Measured) float64 {
		var stallMs float64
		var calls int
		for _, l := range m.Decode {
			stallMs, calls = stallMs+l.StallMs, calls+l.Calls
		}
		return stallMs / float64(max(calls, 1))
	})
}

// medianOf is the median of f over ms (lowerMedian), 0 for none.
func medianOf(ms []sim.Measured, f func(sim.Measured) float64) float64 {
	vs := make([]float64, len(ms))
	for i, m := range ms {
		vs[i] = f(m)
	}
	return lowerMedian(vs)
}

// lowerMedian is the median of vs, the lower of the middle two for an
// even count (a value measured, not a mean of two); 0 for none. It
// sorts vs.
func lowerMedian(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	slices.Sort(vs)
	return vs[(len(vs)-1)/2]
}

// localTTFTs are the local runs' prompt lengths and median times to
// first token: the whole model's pass over each prompt in one process.
func localTTFTs(rep *testbed.Report) [][2]float64 {
	var out [][2]float64
	for _, r := range rep.Runs {
		if ttft := medianTTFT(r); r.Mode == testbed.ModeLocal && ttft > 0 {
			out = append(out, [2]float64{float64(r.Prompt), ttft})
		}
	}
	return out
}

// medianTTFT is the median time to first token of r's repeats (the
// lower of the middle two), or r's own when it has none: the run a
// report keeps is its median decode's, and its own TTFT is one draw; 0
// where the stats hold none.
func medianTTFT(r testbed.Run) float64 {
	var ts []float64
	for _, rr := range r.Repeats {
		if t := runTTFT(rr); t > 0 {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		return runTTFT(r)
	}
	return lowerMedian(ts)
}

// runTTFT is a run's time to first token as its stats say (0: none).
func runTTFT(r testbed.Run) float64 {
	var st struct {
		TTFTms float64 `json:"ttft_ms"`
	}
	if json.Unmarshal(r.Stats, &st) != nil {
		return 0
	}
	return st.TTFTms
}

// benchLayout is what calibration needs of a bench's rig (benchRig):
// from rigFile, or the report's rig path, or else its worker nodes in
// groups of the model's (cfg) top-k, the shadow's default lead, and the links
// unknown.
func benchLayout(rep *testbed.Report, rigFile string, cfg model.Config) (benchRig, error) {
	for _, path := range []string{rigFile, rep.Rig} {
		if path == "" {
			continue
		}
		rig, err := testbed.ReadRig(path)
		if err != nil {
			if path == rigFile {
				return benchRig{}, err
			}
			continue // the report's path, read elsewhere than it ran
		}
		var b benchRig
		if b.layout, err = rigLayout(rig, cfg); err != nil {
			return b, err
		}
		if b.ahead, err = shadowAhead(rig); err != nil {
			return b, err
		}
		b.rates, err = rigLoadRates(rig)
		return b, err
	}
	workers := 0
	for _, n := range rep.Nodes {
		if f := strings.Fields(n); len(f) > 1 && f[1] == "worker" {
			workers++
		}
	}
	layout, err := sched.NewLayout(workers, sched.DefaultGroup(workers, cfg.TopK))
	return benchRig{layout: layout, ahead: shadow.DefaultAhead}, err
}

// benchRig is what calibration needs of a bench's rig: its workers'
// layout, the shadow's lead, and the workers' links (nil: not known).
type benchRig struct {
	layout sched.Layout
	ahead  int
	rates  []float64
}

// ValidateOptions say what Validate checks, against what.
type ValidateOptions struct {
	Bench, Profile, Rig string // a bench rig output directory, the profile's file, the bench's rig file
	Seed                uint64
}

// Validate predicts every resident, reactive and shadow run of a bench
// rig directory with a profile and prints the table of measured against
// predicted decode tokens/s and TTFT, with the errors.
func Validate(o ValidateOptions, stdout io.Writer) error {
	rep, err := ReadBenchReport(o.Bench)
	if err != nil {
		return err
	}
	p, rig, layout, shape, err := setup(o.Profile, o.Rig, rep.Model)
	if err != nil {
		return err
	}
	ahead, err := shadowAhead(rig)
	if err != nil {
		return err
	}
	rates, err := rigLoadRates(rig)
	if err != nil {
		return err
	}
	stages, shadowStages := rig.StageStarts()
	fmt.Fprintf(stdout, "%s against %s\n\n", p.Name, o.Bench)
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
		st.TTFTms = medianTTFT(r)
		// bench rig aligns the shadow every pass (testbed.MainFlags)
		res, err := sim.Expect(p, layout, shape, sim.Options{Mode: mode, Prompt: r.Prompt, Output: r.Output, Recall: recall, Ahead: ahead, AlignKV: 1, Seed: o.Seed, LoadRates: linkRates(p, rates),
			Stages: stages, ShadowStages: shadowStages}, sim.ExpectRuns)
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

// Varies are the parameters Sweep sweeps.
var Varies = []string{"workers", "link", "recall", "ahead", "align", "draft"}

// SweepOptions say what Sweep sweeps.
type SweepOptions struct {
	Profile, Model string // the profile's file, the model's directory
	Vary           string // one of Varies
	Values         []float64
	Recalls        []float64 // the shadow's recall at each of Values; nil: Recall at all
	Modes          []string
	Case           testbed.Case
	Workers, Group int // when not swept; Group 0: the router's top-k
	Recall         float64
	Ahead, AlignKV int
	// Accept and Draft: the chance a shadow's guess is kept, and the
	// guesses a shadow-driven pass checks (sim.Options; the other modes
	// have no guesses)
	Accept float64
	Draft  int
	Seed   uint64
	SVG    string // also draw the chart to this file
}

// Sweep predicts decode tokens/s over a range of one parameter (workers,
// link rate, recall, the shadow's lead, the KV alignment period), for
// each mode, as a table and an SVG chart.
func Sweep(o SweepOptions, stdout io.Writer) error {
	p, err := ReadProfile(o.Profile)
	if err != nil {
		return err
	}
	shape, cfg, err := Shape(o.Model)
	if err != nil {
		return err
	}
	c := o.Case
	values, recalls := o.Values, o.Recalls
	if recalls != nil && len(recalls) != len(values) {
		return fmt.Errorf("sim sweep: %d recalls for %d values", len(recalls), len(values))
	}
	xlabel, logX := map[string]string{"workers": "workers", "link": "link rate (bits/s)", "recall": "recall", "ahead": "passes ahead", "align": "KV alignment period (passes)", "draft": "guesses a pass"}[o.Vary], o.Vary == "workers" || o.Vary == "link" || o.Vary == "align"
	if xlabel == "" {
		return fmt.Errorf("sim sweep: -vary %q: want %s", o.Vary, strings.Join(Varies, ", "))
	}
	g := o.Group
	if g == 0 {
		g = cfg.TopK
	}
	modes := make([]string, len(o.Modes))
	for i, m := range o.Modes {
		modes[i] = strings.TrimSpace(m)
	}
	chart := svgplot.Chart{Title: fmt.Sprintf("decode tokens/s by %s, %s, %s", xlabel, o.Case.String(), strings.TrimSuffix(filepath.Base(o.Profile), ".json")), XLabel: xlabel, YLabel: "decode tokens/s", X: values, LogX: logX}
	fmt.Fprintf(stdout, "| %s | %s |\n|---|%s\n", xlabel, strings.Join(modes, " | "), strings.Repeat("---:|", len(modes)))
	rows := make([][]float64, len(values))
	for _, m := range modes {
		var ys []float64
		for i, v := range values {
			pp, w, so := p, o.Workers, sim.Options{Mode: sim.Mode(m), Prompt: c.Prompt, Output: c.Output, Recall: o.Recall, Ahead: o.Ahead, AlignKV: o.AlignKV, Seed: o.Seed,
				Accept: o.Accept, Draft: o.Draft}
			if recalls != nil {
				so.Recall = recalls[i]
			}
			switch o.Vary {
			case "workers":
				w = int(v)
			case "link":
				pp.LinkBytesPerS = v / 8
			case "recall":
				so.Recall = v
			case "ahead":
				so.Ahead = int(v)
			case "align":
				so.AlignKV = int(v)
			case "draft":
				so.Draft = int(v)
			}
			if so.Mode != sim.Shadow {
				so.Draft = 0 // the shadow guesses
			}
			layout, err := sched.NewLayout(w, g)
			if err != nil {
				return err
			}
			res, err := sim.Run(pp, layout, shape, so)
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
	if o.SVG != "" {
		f, err := os.Create(o.SVG)
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

// Shape is what of the model in dir the simulation needs.
func Shape(dir string) (sim.Shape, model.Config, error) {
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return sim.Shape{}, cfg, err
	}
	// the shadow's KV rows travel as fp16 (align.PackKV): keys and
	// values, or MLA's one latent row that is both
	kvRows := int64(2)
	if cfg.MLA != nil {
		kvRows = 1
	}
	h, q := int64(cfg.HiddenSize), int64(cfg.NumHeads*cfg.HeadDim)
	return sim.Shape{Layers: cfg.NumLayers, Experts: cfg.NumExperts, TopK: cfg.TopK, ExpertLayers: cfg.ExpertLayers(),
		ExpertBytes: ExpertBytes(cfg), HiddenBytes: 4 * h, // the hidden state travels as float32
		KVBytes: int64(cfg.NumLayers) * kvRows * int64(cfg.KVWidth()) * 2,
		// q and o, k and v, the router (MLA's low-rank projections taken as
		// these: a split's estimate); gate, up and down
		MainWeights: 2*h*q + 2*h*int64(cfg.KVWidth()) + h*int64(cfg.NumExperts), ExpertWeights: 3 * h * int64(cfg.IntermediateSize)}, cfg, nil
}

// ExpertBytes is one expert's weights as a worker holds them: gate, up
// and down (3 x hidden x intermediate weights) in BF16, or as a
// checkpoint published so holds them: MXFP4 (17 bytes per 32 weights:
// gpt-oss) or FP8 (a byte each and a float32 per 128x128 block:
// DeepSeek-V3), with gpt-oss's two bias rows in BF16.
func ExpertBytes(cfg model.Config) int64 {
	h, in := int64(cfg.HiddenSize), int64(cfg.IntermediateSize)
	w := 3 * h * in
	b := 2 * w
	switch cfg.Quantization {
	case "mxfp4":
		b = w * 17 / 32
	case "fp8":
		b = w + 3*4*((h+127)/128)*((in+127)/128)
	}
	if cfg.SwiGLULimit > 0 { // gpt-oss: biases on gate/up and down
		b += 2 * (2*int64(cfg.IntermediateSize) + int64(cfg.HiddenSize))
	}
	return b
}

// measured is what calibration reads of one bench run.
func measured(r testbed.Run) (sim.Measured, error) {
	var st struct {
		DecodeTokensPerS float64            `json:"decode_tokens_per_s"`
		Decode           []sim.LayerStats   `json:"decode_layers"`
		Prefill          []sim.LayerStats   `json:"prefill_layers"`
		Passes           []sim.LayerStats   `json:"iterations"`
		DecodeCPU        map[string]float64 `json:"decode_cpu_s"`
		Recall           *float64           `json:"recall"`
		TTFTms           float64            `json:"ttft_ms"`
	}
	if err := json.Unmarshal(r.Stats, &st); err != nil {
		return sim.Measured{}, fmt.Errorf("sim calibrate: %s %s: stats: %w", r.Mode, r.Case, err)
	}
	m := sim.Measured{Prompt: r.Prompt, Output: r.Output, DecodeTokensPerS: st.DecodeTokensPerS, Decode: st.Decode, Prefill: st.Prefill,
		CPUSeconds: r.CPUSeconds, Passes: st.Passes, Recall: 1, TTFTms: st.TTFTms}
	if st.Recall != nil {
		m.Recall = *st.Recall
	}
	// the decode's own CPU, where the nodes said it, for every role the
	// run's CPU split has
	if len(r.CPUSeconds) > 0 && len(st.DecodeCPU) == len(r.CPUSeconds) {
		m.CPUSeconds, m.DecodeCPU = st.DecodeCPU, true
	}
	return m, nil
}

// ParseBitRate reads a tc rate: "1gbit", "100mbit", "500kbit", "64bit"
// (bits per second).
func ParseBitRate(s string) (float64, bool) {
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

// ReadBenchReport reads a bench rig directory's report.json.
func ReadBenchReport(dir string) (*testbed.Report, error) {
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

// shadowAhead is the rig's shadow's -ahead (the default when not set).
func shadowAhead(rig *testbed.Rig) (int, error) {
	if rig.Shadow == nil {
		return shadow.DefaultAhead, nil
	}
	f, err := rig.Shadow.FlagsAs(runflags.RoleShadow)
	return f.Ahead, err
}

// setup reads what a simulation of a rig runs on: the profile, the rig
// and its worker layout, and the model's shape.
func setup(profilePath, rigPath, modelDir string) (sim.Profile, *testbed.Rig, sched.Layout, sim.Shape, error) {
	p, err := ReadProfile(profilePath)
	if err != nil {
		return p, nil, sched.Layout{}, sim.Shape{}, err
	}
	rig, err := testbed.ReadRig(rigPath)
	if err != nil {
		return p, nil, sched.Layout{}, sim.Shape{}, err
	}
	shape, cfg, err := Shape(modelDir)
	if err != nil {
		return p, rig, sched.Layout{}, shape, err
	}
	layout, err := rigLayout(rig, cfg)
	return p, rig, layout, shape, err
}

// rigLayout is the rig's workers in groups of its main node's -group (by
// default the model's top-k).
func rigLayout(rig *testbed.Rig, cfg model.Config) (sched.Layout, error) {
	f, err := rig.Main.FlagsAs(runflags.RoleMain)
	if err != nil {
		return sched.Layout{}, err
	}
	return sched.NewLayout(len(rig.Workers), cmp.Or(f.Group, sched.DefaultGroup(len(rig.Workers), cfg.TopK))) // the main node's default
}

// linkRates are the rig's links (rates) where p takes them
// (Profile.WorkerLinks), else nil: p's own LoadBytesPerS.
func linkRates(p sim.Profile, rates []float64) []float64 {
	if p.WorkerLinks {
		return rates
	}
	return nil
}

// rigLoadRates are the rig's workers' -load-bw (bytes a second; 0:
// unpaced), one a worker in the rig's order.
func rigLoadRates(rig *testbed.Rig) ([]float64, error) {
	var rates []float64
	for _, w := range rig.Workers {
		f, err := w.FlagsAs(runflags.RoleWorker)
		if err != nil {
			return nil, err
		}
		bw, err := runflags.ParseBytes(f.LoadBW)
		if err != nil {
			return nil, fmt.Errorf("rig %s, worker %s: -load-bw %q: %w", rig.Path, w.Name, f.LoadBW, err)
		}
		rates = append(rates, float64(bw))
	}
	return rates, nil
}

// ReadProfile reads a sim.Profile from a JSON file.
func ReadProfile(path string) (sim.Profile, error) {
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
