package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/sim"
)

// TestSimPredictsACaseAsJSON: `odmoe sim -json` on the tiny model and the
// paper rig prints one object with the figures scripts read, resident
// faster than reactive; a profile with a bad figure is refused naming it.
func TestSimPredictsACaseAsJSON(t *testing.T) {
	dir := t.TempDir()
	modelDir := filepath.Join(dir, "tiny")
	if _, se, code := run(t, "", "gen-tiny", "-out", modelDir, "-log-level", "warn"); code != 0 {
		t.Fatalf("gen-tiny: %s", se)
	}
	profile := filepath.Join(dir, "p.json")
	write := func(loadRate string) {
		p := `{"name": "t", "main_layer_ms": 0.5, "main_token_ms": 1, "shadow_layer_ms": 0.3, "shadow_token_ms": 0.5, "expert_ms": 0.2,
			"load_ms": 0.1, "load_bytes_per_s": ` + loadRate + `, "hop_ms": 0.1, "link_bytes_per_s": 125e6, "main_prefill_token_ms": 0.05, "expert_prefill_token_ms": 0.02}`
		if err := os.WriteFile(profile, []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("1e8")
	tps := map[string]float64{}
	for _, mode := range []string{"resident", "reactive", "shadow"} {
		so, se, code := run(t, "", "sim", "-profile", profile, "-rig", "testbed/rigs/paper.rig", "-model", modelDir, "-mode", mode, "-case", "16x32", "-json")
		if code != 0 {
			t.Fatalf("sim -mode %s: exit %d: %s", mode, code, se)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(so), &out); err != nil {
			t.Fatalf("sim -json printed %q: %v", so, err)
		}
		for _, k := range []string{"decode_tokens_per_s", "ttft_ms", "stall_fraction"} {
			if v, ok := out[k].(float64); !ok || v < 0 {
				t.Fatalf("sim -json: %s = %v in %s", k, out[k], so)
			}
		}
		tps[mode] = out["decode_tokens_per_s"].(float64)
	}
	if !(tps["resident"] > tps["reactive"]) || tps["resident"] <= 0 {
		t.Fatalf("decode tokens/s %v: want resident above reactive", tps)
	}
	write("0")
	_, se, code := run(t, "", "sim", "-profile", profile, "-model", modelDir)
	if code == 0 || !strings.Contains(se, "load_bytes_per_s") {
		t.Fatalf("a profile with no load rate: exit %d, %q", code, se)
	}
}

// TestSimCalibratesFromRecordedRigRuns: calibrated from one case of a
// recorded bench rig run (report.json trimmed by
// testdata/sim/trim-report.py to what calibration and validation read),
// and the resident runs of its longer prompt for what a prompt's messages
// cost by their bytes, the simulation predicts that case's decode
// tokens/s and TTFT within 5%, every other case and mode's decode tokens/s
// within 15% and TTFT within its rig's bar, and every case's
// shadow/resident ratio within 15% (issue 38's bars; medians of the
// repeats). The rigs: testdata/sim/paper-rig-r9 (paper.rig in network
// namespaces, the small preset, five runs of everything),
// testdata/sim/loopback-tiny and loopback-tiny-2 (loopback.rig, the tiny
// preset, three runs each, each role's decode CPU measured, a day and a
// machine's speed apart: resident 752 and 507 tok/s) and
// testdata/sim/hetero-small (hetero-loopback.rig: four workers on 4 GB/s
// links, four on 1 GB/s, the small preset, three runs), and the one-layer
// presets of real shape, qwen3-moe-small and olmoe-small, on
// shadow-whole.rig on the AVX2 VM and on the Zen 4 VM (*-zen4). Two bars are
// wider, each for one row: hetero-small's shadow/resident ratio at 20%
// (+16% at 128 tokens, where the resident runs spread from 33 to 42
// tok/s) and loopback-tiny-2's TTFT at 20% (the reactive swarm's
// 128-token prompt, -15%: its loads' CPU hides in a short prompt's idle
// cores more than in a long one's busy ones, which the simulation's
// fixed CPU a load does not tell apart).
func TestSimCalibratesFromRecordedRigRuns(t *testing.T) {
	for _, c := range []struct {
		bench, rig, cal string
		rows, ratios    int
		ttftBar         float64 // TTFT's bar off the calibration case
		ratioBar        float64 // shadow/resident's
		attention       bool    // the context's growth measurable (Mixtral-sized attention), so fitted; the tiny preset's is noise, fitted or not
		links           bool    // the rig's workers' links paced (-load-bw): a load's cost split from them
	}{
		{"testdata/sim/paper-rig-r9", "testbed/rigs/paper.rig", "16x256", 12, 4, 0.15, 0.15, true, true},
		{"testdata/sim/loopback-tiny", "testbed/rigs/loopback.rig", "16x64", 6, 2, 0.15, 0.15, false, true},
		{"testdata/sim/loopback-tiny-2", "testbed/rigs/loopback.rig", "16x64", 6, 2, 0.20, 0.15, false, true},
		{"testdata/sim/hetero-small", "testbed/rigs/hetero-loopback.rig", "16x64", 6, 2, 0.15, 0.20, true, true},
		// one layer of real shape, top-8 over four workers (2026-11-29)
		{"testdata/sim/qwen3-moe-small-rig", "testbed/rigs/shadow-whole.rig", "128x64", 6, 2, 0.15, 0.15, false, false},
		{"testdata/sim/olmoe-small-rig", "testbed/rigs/shadow-whole.rig", "128x64", 6, 2, 0.15, 0.15, false, false},
		// the same on the Zen 4 VM, its workers collecting per 16 MiB
		// (2026-11-29 23:31 UTC): a reactive layer's two loads a worker
		// took 21.8 ms together, 13.8 each
		{"testdata/sim/qwen3-moe-small-rig-zen4", "testbed/rigs/shadow-whole.rig", "128x64", 6, 2, 0.15, 0.15, false, false},
		{"testdata/sim/olmoe-small-rig-zen4", "testbed/rigs/shadow-whole.rig", "128x64", 6, 2, 0.15, 0.15, false, false},
	} {
		t.Run(filepath.Base(c.bench), func(t *testing.T) {
			profile := filepath.Join(t.TempDir(), "p.json")
			if _, se, code := run(t, "", "sim", "calibrate", "-bench", c.bench, "-case", c.cal, "-rig", c.rig, "-out", profile); code != 0 {
				t.Fatalf("sim calibrate: exit %d: %s", code, se)
			}
			var p sim.Profile
			if b, err := os.ReadFile(profile); err != nil || json.Unmarshal(b, &p) != nil {
				t.Fatalf("the profile: %v", err)
			}
			longer := slices.ContainsFunc(p.Sources, func(s string) bool {
				return strings.Contains(s, "the prompt's CPU") && strings.Contains(s, "p16-") && strings.Contains(s, "p128-")
			})
			// on shared cores: the longer prompt's CPU a byte of its
			// messages, and the prompt's routing no more even than the
			// skewed presets' is
			if c.attention && p.MainPositionMs <= 0 || !strings.Contains(p.Sources[0], "median of") || c.links != p.WorkerLinks || !longer || p.PrefillCPUByteNs <= 0 || p.PromptSkew <= 0 {
				t.Errorf("profile: main_position_ms %v, sources %q, worker_links %v, prefill_cpu_byte_ns %v, prompt_skew %v: want the context's growth fitted, the runs averaged, the rig's links, the longer prompt's CPU, a skew",
					p.MainPositionMs, p.Sources, p.WorkerLinks, p.PrefillCPUByteNs, p.PromptSkew)
			}
			so, se, code := run(t, "", "sim", "validate", "-bench", c.bench, "-profile", profile, "-rig", c.rig)
			if code != 0 {
				t.Fatalf("sim validate: exit %d: %s", code, se)
			}
			rows, ratios := 0, 0
			for line := range strings.SplitSeq(so, "\n") {
				var cs, mode string
				var meas, pred, ttft, ttftPred float64
				if n, _ := fmt.Sscanf(line, "| %s | %s | %f | %f | %s | %f | %f |", &cs, &mode, &meas, &pred, new(string), &ttft, &ttftPred); n == 7 {
					rows++
					bar, ttftBar := 0.15, c.ttftBar
					if cs == c.cal {
						bar, ttftBar = 0.05, 0.05
						if mode == "reactive" { // not calibrated from
							bar, ttftBar = 0.15, c.ttftBar
						}
					}
					if math.Abs(pred/meas-1) > bar {
						t.Errorf("%s %s: measured %v tok/s, predicted %v (bar %.0f%%)", cs, mode, meas, pred, 100*bar)
					}
					if math.Abs(ttftPred/ttft-1) > ttftBar {
						t.Errorf("%s %s: measured TTFT %v ms, predicted %v (bar %.0f%%)", cs, mode, ttft, ttftPred, 100*ttftBar)
					}
				}
				if n, _ := fmt.Sscanf(line, "%s shadow / resident measured %f%%, predicted %f%%", &cs, &meas, &pred); n == 3 {
					ratios++
					if math.Abs(pred/meas-1) > c.ratioBar {
						t.Errorf("%s: shadow/resident measured %v%%, predicted %v%%", cs, meas, pred)
					}
				}
			}
			if rows != c.rows || ratios != c.ratios {
				t.Fatalf("sim validate printed %d rows and %d ratios, want %d and %d:\n%s", rows, ratios, c.rows, c.ratios, so)
			}
		})
	}
}

// TestSimPredictsAStagedRigFromTheUnstagedOne: calibrated on an
// unstaged small rig (128x64), the simulator predicts the staged rig run
// beside it (the main node's layers on two stages, the shadow in two)
// within 15%, decode and TTFT, every mode: on the Zen 4 VM from six
// rounds of each rig taken in turn (2026-11-29 23:14-23:25 UTC), and on
// the AVX2 VM from three of each, one rig after the other (2026-11-29
// 06:44 UTC). There the staged rig's 16-token resident prompt took 27%
// longer than the unstaged rig's (275 ms against 217; 4.5% longer on
// the Zen 4 VM), which the stages' hops (64 KB each) do not explain:
// that one row's TTFT is held to 25%. Until the calibration met the shorter
// prompt's own time (fitShortPrompt) it over-predicted the unstaged
// rig's 16-token prompt (+7% there, +23% on the Zen 4 VM), which hid
// the gap on the AVX2 VM and failed the Zen 4 pair.
func TestSimPredictsAStagedRigFromTheUnstagedOne(t *testing.T) {
	for _, pair := range []struct {
		whole, staged string
		wider         string // the case and mode of a row held to 25%
	}{
		{"testdata/sim/small-whole-zen4", "testdata/sim/small-staged-zen4", ""},
		{"testdata/sim/small-whole", "testdata/sim/small-staged", "16x64 resident"},
	} {
		t.Run(filepath.Base(pair.staged), func(t *testing.T) {
			profile := filepath.Join(t.TempDir(), "p.json")
			if _, se, code := run(t, "", "sim", "calibrate", "-bench", pair.whole, "-case", "128x64", "-rig", "testbed/rigs/shadow-whole.rig", "-out", profile); code != 0 {
				t.Fatalf("sim calibrate: exit %d: %s", code, se)
			}
			so, se, code := run(t, "", "sim", "validate", "-bench", pair.staged, "-profile", profile, "-rig", "testbed/rigs/stages-shadow-stages.rig")
			if code != 0 {
				t.Fatalf("sim validate: exit %d: %s", code, se)
			}
			rows := 0
			for line := range strings.SplitSeq(so, "\n") {
				var cs, mode string
				var meas, pred, ttft, ttftPred float64
				if n, _ := fmt.Sscanf(line, "| %s | %s | %f | %f | %s | %f | %f |", &cs, &mode, &meas, &pred, new(string), &ttft, &ttftPred); n != 7 {
					continue
				}
				rows++
				ttftBar := 0.15
				if cs+" "+mode == pair.wider {
					ttftBar = 0.25
				}
				if math.Abs(pred/meas-1) > 0.15 || math.Abs(ttftPred/ttft-1) > ttftBar {
					t.Errorf("%s %s: decode measured %v tok/s, predicted %v (bar 15%%); TTFT measured %v ms, predicted %v (bar %.0f%%)", cs, mode, meas, pred, ttft, ttftPred, 100*ttftBar)
				}
			}
			if rows != 6 {
				t.Fatalf("sim validate printed %d rows, want 6:\n%s", rows, so)
			}
		})
	}
}

// TestShippedProfilesPredict: every profile in testbed/profiles is valid
// and predicts Mixtral-8x7B on the paper rig, shadow-driven decode below
// the resident swarm's.
func TestShippedProfilesPredict(t *testing.T) {
	profiles, err := filepath.Glob("testbed/profiles/*.json")
	if err != nil || len(profiles) == 0 {
		t.Fatalf("no profiles in testbed/profiles (%v)", err)
	}
	for _, p := range profiles {
		tps := map[string]float64{}
		for _, mode := range []string{"resident", "shadow"} {
			so, se, code := run(t, "", "sim", "-profile", p, "-model", "testdata/sim/mixtral-8x7b", "-mode", mode, "-case", "16x64", "-json")
			if code != 0 {
				t.Fatalf("%s, %s: exit %d: %s", p, mode, code, se)
			}
			var out struct {
				DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
			}
			if err := json.Unmarshal([]byte(so), &out); err != nil {
				t.Fatal(err)
			}
			tps[mode] = out.DecodeTokensPerS
		}
		if !(tps["shadow"] > 0 && tps["shadow"] < tps["resident"]) {
			t.Errorf("%s: decode tokens/s %v: want 0 < shadow < resident", p, tps)
		}
	}
}

// TestSimSweepTablesAndDraws: a sweep over workers prints a row per
// value with a column per mode, and its SVG holds a line per mode; the
// shadow-driven swarm gains from more workers on a load-bound rig.
func TestSimSweepTablesAndDraws(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "w.svg")
	so, se, code := run(t, "", "sim", "sweep", "-profile", "testbed/profiles/odmoe-rig-rtx3090-1gbit.json", "-model", "testdata/sim/mixtral-8x7b",
		"-vary", "workers", "-values", "4,16", "-modes", "resident,shadow", "-svg", svg)
	if code != 0 {
		t.Fatalf("sim sweep: exit %d: %s", code, se)
	}
	var shadow []float64
	for line := range strings.SplitSeq(so, "\n") {
		var x, res, sh float64
		if n, _ := fmt.Sscanf(line, "| %g | %f | %f |", &x, &res, &sh); n == 3 {
			shadow = append(shadow, sh)
		}
	}
	if len(shadow) != 2 || !(shadow[1] > shadow[0]) {
		t.Fatalf("sweep printed shadow tokens/s %v over 4 and 16 workers, want 2 rising values:\n%s", shadow, so)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "<polyline"); n != 2 {
		t.Fatalf("the chart has %d lines, want 2", n)
	}
}

// TestTheNativeFormatModelsPredict: the shipped configs of gpt-oss-120b
// (MXFP4) and DeepSeek-V3 (FP8) load as the sim's models, and their
// profiles predict: gpt-oss's shadow-driven swarm of 16 Jetsons between
// the reactive and the resident ones, DeepSeek's reactive swarm below its
// resident one.
func TestTheNativeFormatModelsPredict(t *testing.T) {
	for _, c := range []struct {
		profile, model string
		modes          []string
	}{
		{"testbed/profiles/jetson-orin-nano-8gb-1gbit-gpt-oss-120b.json", "testdata/sim/gpt-oss-120b", []string{"reactive", "shadow", "resident"}},
		{"testbed/profiles/rtx4060ti-16gb-10gbit-deepseek-v3.json", "testdata/sim/deepseek-v3", []string{"reactive", "resident"}},
	} {
		var last float64
		for _, mode := range c.modes {
			so, se, code := run(t, "", "sim", "-profile", c.profile, "-model", c.model, "-mode", mode, "-case", "16x64", "-recall", "0.99", "-json")
			if code != 0 {
				t.Fatalf("%s, %s: exit %d: %s", c.model, mode, code, se)
			}
			var out struct {
				DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
			}
			if err := json.Unmarshal([]byte(so), &out); err != nil {
				t.Fatal(err)
			}
			if !(out.DecodeTokensPerS > last) {
				t.Errorf("%s %s: %.2f tok/s, want above the mode before (%.2f)", c.model, mode, out.DecodeTokensPerS, last)
			}
			last = out.DecodeTokensPerS
		}
	}
}
