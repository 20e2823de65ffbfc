package model

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model/safetensors"
)

// refRopeScaling is transformers' rope_scaling computation
// (modeling_rope_utils.py: _compute_linear_scaling_rope_parameters,
// _compute_yarn_parameters) in float64, from config.json's fields as the
// test reads them itself: it returns a rotation of one head (HF's
// rotate_half, cos and sin times YaRN's attention factor).
func refRopeScaling(t *testing.T, configJSON []byte, theta float64, maxPositions int) func(x []float64, pos int) []float64 {
	var c struct {
		RopeScaling map[string]any `json:"rope_scaling"`
	}
	if err := json.Unmarshal(configJSON, &c); err != nil {
		t.Fatal(err)
	}
	rs := c.RopeScaling
	num := func(k string, def float64) float64 {
		if v, ok := rs[k].(float64); ok {
			return v
		}
		return def
	}
	typ, _ := rs["rope_type"].(string)
	if typ == "" { // the older key, which transformers reads too
		typ, _ = rs["type"].(string)
	}
	factor := num("factor", 1)
	return func(x []float64, pos int) []float64 {
		d := len(x)
		inv := make([]float64, d/2)
		attn := 1.0
		for i := range inv {
			inv[i] = 1 / math.Pow(theta, float64(2*i)/float64(d))
		}
		switch typ {
		case "linear":
			for i := range inv {
				inv[i] /= factor
			}
		case "yarn":
			getMscale := func(scale, m float64) float64 {
				if scale <= 1 {
					return 1
				}
				return 0.1*m*math.Log(scale) + 1
			}
			if a, ok := rs["attention_factor"].(float64); ok {
				attn = a
			} else if m, ma := num("mscale", 0), num("mscale_all_dim", 0); m != 0 && ma != 0 {
				attn = getMscale(factor, m) / getMscale(factor, ma)
			} else {
				attn = getMscale(factor, 1)
			}
			orig := num("original_max_position_embeddings", float64(maxPositions))
			corr := func(rot float64) float64 {
				return float64(d) * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(theta))
			}
			low, high := corr(num("beta_fast", 32)), corr(num("beta_slow", 1))
			if tr, ok := rs["truncate"].(bool); !ok || tr {
				low, high = math.Floor(low), math.Ceil(high)
			}
			low, high = math.Max(low, 0), math.Min(high, float64(d-1))
			if low == high {
				high += 0.001
			}
			for i := range inv {
				ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
				extra := 1 - ramp
				inv[i] = inv[i]/factor*(1-extra) + inv[i]*extra
			}
		}
		y := make([]float64, d)
		for i := range d / 2 {
			c, s := math.Cos(float64(pos)*inv[i])*attn, math.Sin(float64(pos)*inv[i])*attn
			y[i] = x[i]*c - x[i+d/2]*s
			y[i+d/2] = x[i+d/2]*c + x[i]*s
		}
		return y
	}
}

// TestRopeScalingMatchesFloat64Reference: a checkpoint whose config.json
// asks for YaRN (transformers' defaults; explicit betas, mscales and no
// truncation as DeepSeek-V3 and gpt-oss write them) or linear scaling
// gives logits within 1e-4 relative L2 of the float64 reference at every
// position of a 48-token sequence, and other logits than without the
// scaling (the scaling is not ignored), and an unknown type is refused
// by name.
func TestRopeScalingMatchesFloat64Reference(t *testing.T) {
	base := tinyModel(t)
	orig, err := os.ReadFile(filepath.Join(base, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	plain := loadTiny(t)
	tokens := make([]int, 48)
	for i := range tokens {
		tokens[i] = (i*37 + 11) % plain.Config.VocabSize
	}
	unscaled, err := NewSession(plain, NewResidentExperts(plain), 0).Forward(context.Background(), tokens)
	if err != nil {
		t.Fatal(err)
	}
	unscaled = append([]float32(nil), unscaled...)
	for _, c := range []struct{ name, scaling string }{
		{"yarn", `{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}`},
		{"yarn as DeepSeek-V3 writes it", `{"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707, "original_max_position_embeddings": 64}`},
		{"yarn without truncation", `{"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 96}`},
		{"linear", `{"rope_type": "linear", "factor": 8.0}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := withConfig(t, base, orig, c.scaling)
			m, err := Load(dir, LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			set, err := safetensors.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer set.Close()
			cfgJSON, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			ref := refModel{cfg: m.Config, set: set, t: t, rot: refRopeScaling(t, cfgJSON, m.Config.RopeTheta, m.Config.MaxPositions)}
			_, last := decodeAgainst(t, c.name, m, tokens, ref.forward(tokens))
			d := make([]float64, len(unscaled))
			for j := range d {
				d[j] = float64(unscaled[j])
			}
			if relL2(last, d) < 1e-3 {
				t.Fatalf("the last position's logits are within 1e-3 of the unscaled model's: the scaling is ignored")
			}
		})
	}
	dir := withConfig(t, base, orig, `{"rope_type": "dynamic", "factor": 2.0}`)
	if _, err := Load(dir, LoadOptions{}); err == nil || !strings.Contains(err.Error(), `"dynamic"`) {
		t.Fatalf("rope_scaling of type dynamic: %v, want it refused by name", err)
	}
}

// withConfig is a copy of the model in base (its weights linked) whose
// config.json is orig with rope_scaling set to scaling.
func withConfig(t *testing.T, base string, orig []byte, scaling string) string {
	return withConfigField(t, base, orig, "rope_scaling", scaling)
}

// withConfigField is a copy of the model in base (its weights linked)
// whose config.json is orig with field set to the JSON value.
func withConfigField(t *testing.T, base string, orig []byte, field, value string) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "config.json" {
			if err := os.Symlink(filepath.Join(base, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(orig, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg[field] = json.RawMessage(value)
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
