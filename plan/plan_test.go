package plan

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/sim"
)

// TestAShapedCheckpointHoldsWhatAGeneratedOneDoes: for every family (and
// its FP8 and MXFP4 forms), a model bound from its config.json alone
// (Shaped: a sparse checkpoint of shapes) holds, by FootprintOf, exactly
// what the generated checkpoint with its weights does, for every kind of
// node: a whole main node, a staged main node and its stages, a whole
// shadow and shadow stages in each quantization, a node of experts.
func TestAShapedCheckpointHoldsWhatAGeneratedOneDoes(t *testing.T) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny", "deepseek-v3-tiny-fp8", "gpt-oss-tiny", "gpt-oss-tiny-mxfp4"} {
		t.Run(preset, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), preset)
			if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: 5}); err != nil {
				t.Fatal(err)
			}
			real, err := model.Load(dir, model.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer real.Close()
			shaped, err := Shaped(dir, t.TempDir(), 0)
			if err != nil {
				t.Fatal(err)
			}
			defer shaped.Close()
			if a, b := shaped.NonExpertBytes(), real.NonExpertBytes(); a != b {
				t.Errorf("non-expert bytes: shaped %d, generated %d", a, b)
			}
			if a, b := shaped.ExpertBytes(), real.ExpertBytes(); a != b {
				t.Errorf("expert bytes: shaped %d, generated %d", a, b)
			}
			L := real.Config.NumLayers
			ranges := []model.LayerRange{model.AllLayers(L), model.NoLayers, {First: 0, End: 1}, {First: 1, End: L}}
			opts := []model.FootprintOptions{{Head: true}, {SkipHead: true}, {Experts: true, Head: true}}
			for _, q := range []kernels.DType{kernels.NF4, kernels.Q8, kernels.F16} {
				opts = append(opts, model.FootprintOptions{Quantized: true, Quant: q, Experts: true, Head: true}, model.FootprintOptions{Quantized: true, Quant: q, Experts: true, SkipHead: true})
			}
			for _, r := range ranges {
				for _, o := range opts {
					if r == model.NoLayers && !o.Head {
						continue // a node of nothing
					}
					want, err := real.FootprintOf(r, o)
					if err != nil {
						t.Fatal(err)
					}
					got, err := shaped.FootprintOf(r, o)
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Errorf("layers %s, %+v: shaped holds %+v, generated %+v", r, o, got, want)
					}
				}
			}
		})
	}
}

// TestShapedModelsHaveTheirPublishedParameterCounts: the checkpoints the
// planner shapes from the published config.json files hold as many
// weights as their makers publish (an FP8 or MXFP4 weight counted once,
// its scales not): Mixtral-8x7B 46.7B, Qwen3-30B-A3B 30.5B,
// Qwen3-235B-A22B 235B, gpt-oss-120b 116.83B, DeepSeek-V3 671B (its MTP
// module's 14B apart: odmoe runs no MTP layer), Kimi K2 1.04T (its
// technical report; the model card rounds to 1T).
func TestShapedModelsHaveTheirPublishedParameterCounts(t *testing.T) {
	for _, c := range []struct {
		dir       string
		published float64
	}{{"mixtral-8x7b", 46.7e9}, {"qwen3-30b-a3b", 30.5e9}, {"qwen3-235b-a22b", 235e9}, {"gpt-oss-120b", 116.83e9}, {"deepseek-v3", 671e9}, {"kimi-k2", 1.04e12}} {
		cfg, err := model.LoadConfig(filepath.Join("../testdata/sim", c.dir))
		if err != nil {
			t.Fatal(err)
		}
		p, err := presetOf(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var n float64
		for _, s := range synth.Specs(p) {
			e := 1.0
			for _, d := range s.Shape {
				e *= float64(d)
			}
			switch {
			case strings.HasSuffix(s.Name, "_scale_inv") || strings.HasSuffix(s.Name, "_scales"):
				continue // FP8's and MXFP4's scales
			case strings.HasSuffix(s.Name, "_blocks"):
				e *= 2 // two MXFP4 weights a byte
			}
			n += e
		}
		if math.Abs(n/c.published-1) > 0.015 {
			t.Errorf("%s: %.4g weights, published %.4g", c.dir, n, c.published)
		}
	}
}

// testDevice is a 16 GiB node in the proportions of an Orin NX.
func testDevice() Device {
	return Device{Name: "test node", MemBytes: 16 << 30, ReserveBytes: 3 << 29, MemBytesPerS: 100e9, LayerMs: 0.1, FLOPS: 10e12,
		LoadBytesPerS: 1.5e9, LinkBitsPerS: 1e9, HopMs: 0.2}
}

// TestAPlanKeepsEveryNodeWithinItsSizeAndCoversEveryLayer: Qwen3-30B-A3B
// on 4 GiB nodes needs main stages and shadow stages; every node holds
// at most its budget (as FootprintOf counts its share), the main node
// and its stages hold every layer once in order, as do the shadow's
// stages from layer 0, and a resident plan's workers hold every expert.
// On nodes of 1 TiB the same model needs no stage at all.
func TestAPlanKeepsEveryNodeWithinItsSizeAndCoversEveryLayer(t *testing.T) {
	d := testDevice()
	d.MemBytes = d.ReserveBytes + 4<<30
	o := Options{Model: "../testdata/sim/qwen3-30b-a3b", Device: d, Quant: kernels.NF4, Prompt: 32, Output: 16, Recall: 0.97, Ahead: 1, MaxWorkers: 32, Within: 0.05, Seed: 1}
	a, err := Plan(o)
	if err != nil {
		t.Fatal(err)
	}
	var stages, shadows int
	next := map[string]int{"main": 0, "stage": 0, "shadow": 0}
	for _, n := range a.Nodes {
		if n.Holds > d.Budget() || n.Holds <= 0 {
			t.Errorf("%s %s holds %d bytes, the node's budget is %d", n.Role, n.LayersText, n.Holds, d.Budget())
		}
		switch n.Role {
		case "main", "stage":
			if n.Layers != model.NoLayers && n.Layers.First != next["stage"] {
				t.Errorf("%s begins at layer %d, want %d", n.Role, n.Layers.First, next["stage"])
			}
			if n.Layers != model.NoLayers {
				next["stage"] = n.Layers.End
			}
			if n.Role == "stage" {
				stages++
			}
		case "shadow":
			if n.Layers.First != next["shadow"] {
				t.Errorf("shadow stage begins at layer %d, want %d", n.Layers.First, next["shadow"])
			}
			next["shadow"] = n.Layers.End
			shadows++
		}
	}
	if next["stage"] != 48 || stages == 0 {
		t.Errorf("main node and %d stages end at layer %d, want 48 layers over 1 or more stages", stages, next["stage"])
	}
	if a.Chosen.Mode == sim.Shadow && (next["shadow"] != 48 || shadows < 2) {
		t.Errorf("the shadow's %d stages end at layer %d, want 48 over several", shadows, next["shadow"])
	}
	if a.Chosen.Mode == sim.Resident {
		w := a.Nodes[len(a.Nodes)-1]
		if all := int64(48*128) * 3 * 2048 * 768 * 2; int64(w.Count)*w.Holds < all { // 48 layers of 128 BF16 experts
			t.Errorf("%d resident workers of %d bytes hold less than the experts' %d", w.Count, w.Holds, all)
		}
	}
	// the fewest nodes within 5% of the fastest
	best := 0.0
	for _, op := range a.Options {
		best = max(best, op.DecodeTokensPerS)
	}
	for _, op := range a.Options {
		if op.DecodeTokensPerS >= 0.95*best && op.Nodes < a.Chosen.Nodes {
			t.Errorf("chose %+v, but %+v has fewer nodes within 5%% of the fastest %.2f", a.Chosen, op, best)
		}
	}
	big := o
	big.Device.MemBytes = 1 << 40
	b, err := Plan(big)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range b.Nodes {
		if n.Role == "stage" || n.Role == "shadow" && n.LayersText != "all" {
			t.Errorf("on 1 TiB nodes: %s %s, want no stage", n.Role, n.LayersText)
		}
	}
}

// TestANodeTooSmallForOneLayerIsNamed: where a node cannot hold one
// quantized layer of the shadow's, the plan answers without a shadow and
// says why (which layer, how much); where it cannot hold the embedding
// and head, there is no plan, and the error says so.
func TestANodeTooSmallForOneLayerIsNamed(t *testing.T) {
	d := testDevice()
	// 2.5 GiB: gpt-oss-120b's embedding and head (2.2 GiB) fit, the
	// shadow's first layer beside them in NF4 (its 128 experts alone
	// ~1.7 GiB) does not
	d.MemBytes = d.ReserveBytes + 5<<29
	o := Options{Model: "../testdata/sim/gpt-oss-120b", Device: d, Quant: kernels.NF4, Prompt: 32, Output: 16, Recall: 0.97, MaxWorkers: 4, Seed: 1}
	a, err := Plan(o)
	if err != nil || !strings.Contains(a.NoShadow, "shadow") || !strings.Contains(a.NoShadow, "layer 0 alone holds") || a.Chosen.Mode == sim.Shadow || len(a.Shadow) > 0 {
		t.Fatalf("gpt-oss-120b on 2.5 GiB nodes: %v, no shadow %q, chose %+v: want a plan without a shadow, the shadow's layer 0 named", err, a.NoShadow, a.Chosen)
	}
	for _, op := range a.Options {
		if op.Mode == sim.Shadow {
			t.Fatalf("a shadow-driven option %+v weighed with no shadow to drive it", op)
		}
	}
	o.Device.MemBytes = d.ReserveBytes + 1<<30
	if _, err := Plan(o); err == nil || !strings.Contains(err.Error(), "embedding and the output head") {
		t.Fatalf("gpt-oss-120b on 1 GiB nodes: %v; want the embedding and head named", err)
	}
}
