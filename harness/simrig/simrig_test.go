package simrig

import (
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/sim"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/testbed"
)

// TestARigsOwnFlagsSetTheSimulatedLayoutAndLead: the main node's -group
// ("-group V" or "-group=V", the last setting counting, as for the node
// itself) and the shadow's -ahead (its default when unset) are read as
// the nodes read them; a value that is not a number is an error naming
// the node.
func TestARigsOwnFlagsSetTheSimulatedLayoutAndLead(t *testing.T) {
	rig := &testbed.Rig{Main: testbed.Node{Name: "main", Flags: []string{"-group", "4", "-group=2"}}, Workers: make([]testbed.Node, 4),
		Shadow: &testbed.Node{Name: "shadow"}}
	if l, err := rigLayout(rig, model.Config{TopK: 4}); err != nil || l.Group != 2 {
		t.Fatalf("-group: %+v, %v; want groups of 2 (the last)", l, err)
	}
	if a, err := shadowAhead(rig); err != nil || a != 1 {
		t.Fatalf("-ahead unset: %v, %v; want the default 1", a, err)
	}
	rig.Main.Flags = nil
	if l, err := rigLayout(rig, model.Config{TopK: 4}); err != nil || l.Group != 4 {
		t.Fatalf("-group unset: %+v, %v; want the model's top-k, 4", l, err)
	}
	rig.Main.Flags = []string{"-group", "two"}
	if _, err := rigLayout(rig, model.Config{TopK: 4}); err == nil || !strings.Contains(err.Error(), "main") {
		t.Fatalf("-group two: %v; want an error naming the node", err)
	}
}

// TestTheSimulatedShapeIsTheModels: one expert's bytes are what the
// store gives a worker (BF16 SwiGLU experts; gpt-oss's with their biases,
// in BF16 and in MXFP4 as published; DeepSeek-V3's in FP8), and a position's KV rows are MLA's
// one latent row for DeepSeek-V3.
func TestTheSimulatedShapeIsTheModels(t *testing.T) {
	for _, preset := range []string{"tiny", "gpt-oss-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny", "deepseek-v3-tiny-fp8"} {
		dir := filepath.Join(t.TempDir(), preset)
		if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: 1}); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "store")
		if err := store.Convert(context.Background(), dir, out, store.ConvertOptions{}); err != nil {
			t.Fatal(err)
		}
		st, err := store.Open(out, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		want, err := st.ExpertBytes(st.Layers()[0], 0)
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
		s, cfg, err := Shape(dir)
		if err != nil {
			t.Fatal(err)
		}
		if s.ExpertBytes != int64(want) {
			t.Errorf("%s: an expert of %d bytes, the store's %d", preset, s.ExpertBytes, want)
		}
		kv := int64(cfg.NumLayers) * 2 * int64(cfg.NumKVHeads*cfg.HeadDim) * 2
		if m := cfg.MLA; m != nil {
			kv = int64(cfg.NumLayers) * int64(m.KVLoRARank+m.RopeDim) * 2
		}
		if s.KVBytes != kv {
			t.Errorf("%s: a position's KV rows of %d bytes, want %d", preset, s.KVBytes, kv)
		}
	}
}

// TestMedianStallIsTheMedianRuns: a load's time comes from the median
// run's stall a layer call, not from every run's pooled: one round that
// stalled half as long does not move it.
func TestMedianStallIsTheMedianRuns(t *testing.T) {
	run := func(stall float64) sim.Measured {
		return sim.Measured{Decode: []sim.LayerStats{{Calls: 10, StallMs: 10 * stall}, {Calls: 30, StallMs: 30 * stall}}}
	}
	if got := medianStall([]sim.Measured{run(0.8), run(0.4), run(0.85)}); math.Abs(got-0.8) > 1e-12 {
		t.Errorf("median stall %v, want the median run's 0.8 (pooled: 0.68)", got)
	}
	if got := medianStall(nil); got != 0 {
		t.Errorf("no runs: %v", got)
	}
}

// TestParseOther: -other reads auto, none or a case whose prompt is
// another length than the calibration's, and refuses anything else.
func TestParseOther(t *testing.T) {
	cal := testbed.Case{Prompt: 16, Output: 64}
	for s, want := range map[string]testbed.Case{"auto": {}, "none": {Prompt: -1}, "128x64": {Prompt: 128, Output: 64}, "8x64": {Prompt: 8, Output: 64}} {
		if got, err := ParseOther(s, cal); err != nil || got != want {
			t.Errorf("ParseOther(%q) = %+v, %v; want %+v", s, got, err, want)
		}
	}
	for _, s := range []string{"16x64", "16x256", "128x64,256x64", "long"} {
		if _, err := ParseOther(s, cal); err == nil {
			t.Errorf("ParseOther(%q): no error", s)
		}
	}
}

// TestOtherResidentPrefersALongerPromptThenAShorter: calibration's other
// length is the longest prompt above the case's (its output length
// first), else the shortest below it, or the one asked for.
func TestOtherResidentPrefersALongerPromptThenAShorter(t *testing.T) {
	run := func(mode testbed.Mode, prompt, output int) testbed.Run {
		return testbed.Run{Mode: mode, Prompt: prompt, Output: output}
	}
	rep := &testbed.Report{Runs: []testbed.Run{run(testbed.ModeResident, 16, 64), run(testbed.ModeResident, 64, 64), run(testbed.ModeResident, 32, 64),
		run(testbed.ModeShadow, 512, 64), run(testbed.ModeResident, 128, 256), run(testbed.ModeResident, 128, 64), run(testbed.ModeResident, 8, 64)}}
	for _, c := range []struct {
		cal, want, got testbed.Case
		ok             bool
	}{
		{cal: testbed.Case{Prompt: 16, Output: 64}, want: testbed.Case{Prompt: 128, Output: 64}, ok: true},
		{cal: testbed.Case{Prompt: 16, Output: 256}, want: testbed.Case{Prompt: 128, Output: 256}, ok: true},
		{cal: testbed.Case{Prompt: 128, Output: 64}, want: testbed.Case{Prompt: 8, Output: 64}, ok: true},
		{cal: testbed.Case{Prompt: 128, Output: 64}, got: testbed.Case{Prompt: 32, Output: 64}, want: testbed.Case{Prompt: 32, Output: 64}, ok: true},
		{cal: testbed.Case{Prompt: 128, Output: 64}, got: testbed.Case{Prompt: 48, Output: 64}},
		{cal: testbed.Case{Prompt: 128, Output: 64}, got: testbed.Case{Prompt: -1}},
	} {
		r, ok := otherResident(rep, c.cal, c.got)
		if ok != c.ok || ok && (r.Prompt != c.want.Prompt || r.Output != c.want.Output) {
			t.Errorf("calibrating %s, asked %+v: %dx%d, %v; want %s, %v", c.cal.String(), c.got, r.Prompt, r.Output, ok, c.want.String(), c.ok)
		}
	}
}

// TestARigsStagesAreSimulated: a rig's stages and shadow stages reach
// the simulation as their first layers (testbed/rigs/stages-shadow-
// stages.rig: the main node's layers from 0 and 4, the shadow's alike),
// and a resident decode over them pays their hops: slower than the same
// workers with an unstaged main node (shadow-whole.rig).
func TestARigsStagesAreSimulated(t *testing.T) {
	staged, err := testbed.ReadRig("../../testbed/rigs/stages-shadow-stages.rig")
	if err != nil {
		t.Fatal(err)
	}
	if st, sh := staged.StageStarts(); !slices.Equal(st, []int{0, 4}) || !slices.Equal(sh, []int{0, 4}) {
		t.Fatalf("stage starts %v, shadow stage starts %v: want [0 4] both", st, sh)
	}
	predict := func(rig string) sim.Result {
		var out strings.Builder
		err := Predict(PredictOptions{Profile: "../../testbed/profiles/jetson-orin-nano-8gb-1gbit.json", Rig: "../../testbed/rigs/" + rig, Model: "../../testdata/sim/small",
			Mode: "resident", Case: testbed.Case{Prompt: 16, Output: 33}, Recall: 1, Ahead: 1, Seed: 1, JSON: true}, &out)
		if err != nil {
			t.Fatal(err)
		}
		var r sim.Result
		if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	whole, split := predict("shadow-whole.rig"), predict("stages-shadow-stages.rig")
	if !(split.DecodeTokensPerS < whole.DecodeTokensPerS && split.TTFTms > whole.TTFTms) {
		t.Fatalf("resident on stages %.2f tok/s, TTFT %.1f ms; unstaged %.2f, %.1f: want the stages' hops to cost", split.DecodeTokensPerS, split.TTFTms, whole.DecodeTokensPerS, whole.TTFTms)
	}
}
