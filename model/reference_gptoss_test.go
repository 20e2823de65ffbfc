package model

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/safetensors"
)

// gptOssRef is config.json as the gpt-oss reference reads it, with
// transformers' field names, apart from odmoe's Config.
type gptOssRef struct {
	Layers       int      `json:"num_hidden_layers"`
	Heads        int      `json:"num_attention_heads"`
	KVHeads      int      `json:"num_key_value_heads"`
	HeadDim      int      `json:"head_dim"`
	Intermediate int      `json:"intermediate_size"`
	TopK         int      `json:"num_experts_per_tok"`
	Eps          float64  `json:"rms_norm_eps"`
	Theta        float64  `json:"rope_theta"`
	MaxPositions int      `json:"max_position_embeddings"`
	Window       int      `json:"sliding_window"`
	LayerTypes   []string `json:"layer_types"`
	Limit        float64  `json:"swiglu_limit"`
	MXFP4        *struct {
		Method string `json:"quant_method"`
	} `json:"quantization_config"`
}

// gptOssExpert returns expert e's gate_up_proj and down_proj weights as
// transformers indexes them, w(in, out): from the BF16 tensors [experts,
// in, out], or, as published, dequantized from the MXFP4 blocks and
// scales [experts, out, in/32, 16] and [experts, out, in/32] by the OCP
// MX specification (refE2M1 of each nibble, low nibble first, times
// 2^(scale-127)), as transformers' convert_moe_packed_tensors does.
func (r refModel) gptOssExpert(ex string, e int, mxfp4 bool) (gateUp, down func(in, out int) float64) {
	if !mxfp4 {
		gu, dn := r.slab(ex+"gate_up_proj", e), r.slab(ex+"down_proj", e)
		return func(i, j int) float64 { return gu[i][j] }, func(i, j int) float64 { return dn[i][j] }
	}
	dequant := func(name string) [][]float64 {
		b, ok := r.set.Info(name + "_blocks")
		if !ok || len(b.Shape) != 4 {
			r.t.Fatalf("%s_blocks: %v", name, b.Shape)
		}
		rows, nb := b.Shape[1], b.Shape[2]
		codes, err := r.set.Raw(name+"_blocks", "U8", b.Shape...)
		if err != nil {
			r.t.Fatal(err)
		}
		scales, err := r.set.Raw(name+"_scales", "U8", b.Shape[:3]...)
		if err != nil {
			r.t.Fatal(err)
		}
		out := make([][]float64, rows)
		for o := range out {
			out[o] = make([]float64, nb*32)
			for blk := range nb {
				s := int(scales[(e*rows+o)*nb+blk])
				for j := range 16 {
					c := codes[((e*rows+o)*nb+blk)*16+j]
					out[o][blk*32+2*j] = math.Ldexp(refE2M1(c&15), s-127)
					out[o][blk*32+2*j+1] = math.Ldexp(refE2M1(c>>4), s-127)
				}
			}
		}
		return out
	}
	gu, dn := dequant(ex+"gate_up_proj"), dequant(ex+"down_proj")
	return func(i, j int) float64 { return gu[j][i] }, func(i, j int) float64 { return dn[j][i] }
}

// refE2M1 decodes an E2M1 code from its bits as the OCP MX specification
// defines it: sign, two exponent bits of bias 1, one mantissa bit, an
// exponent of 0 subnormal.
func refE2M1(q byte) float64 {
	sign := 1.0
	if q&8 != 0 {
		sign = -1
	}
	e, m := int(q>>1&3), float64(q&1)
	if e == 0 {
		return sign * m * 0.5
	}
	return sign * (1 + m/2) * math.Ldexp(1, e-1)
}

// slab reads slice e of a 3-D tensor [n, rows, cols] as rows x cols.
func (r refModel) slab(name string, e int) [][]float64 {
	t, err := r.set.Tensor(name)
	if err != nil || len(t.Shape) != 3 || t.DType != kernels.BF16 {
		r.t.Fatalf("%s: %v, shape %v %v; want a 3-D BF16 tensor", name, err, t.Shape, t.DType)
	}
	rows, cols := t.Shape[1], t.Shape[2]
	out := make([][]float64, rows)
	for i := range out {
		out[i] = make([]float64, cols)
		for j := range out[i] {
			k := 2 * ((e*rows+i)*cols + j)
			out[i][j] = float64(math.Float32frombits(uint32(t.Data[k])<<16 | uint32(t.Data[k+1])<<24))
		}
	}
	return out
}

// forwardGptOss is an independent float64 implementation of
// transformers' GptOssForCausalLM forward pass (modeling_gpt_oss.py),
// from its formulas, with no KV cache: q, k and v projections with
// their biases, rotate-half RoPE with YaRN (refRopeScaling), scores
// scaled by 1/sqrt(head_dim) over the causal positions (on a
// "sliding_attention" layer only the last sliding_window of them), each
// head's sink appended as one more logit to the softmax and dropped; o
// with its bias; the router linear(x, W, b), its top-k and their
// softmax; each chosen expert x @ gate_up_proj[e] + bias, gate and up
// the even and odd columns, gate clamped above and up on both sides at
// swiglu_limit, glu = gate * sigmoid(1.702 gate), (up + 1) * glu @
// down_proj[e] + bias, weighted.
func (r refModel) forwardGptOss(tokens []int, c gptOssRef, cfgJSON []byte) [][]float64 {
	rot := refRopeScaling(r.t, cfgJSON, c.Theta, c.MaxPositions)
	hd, group := c.HeadDim, c.Heads/c.KVHeads
	emb := r.tensor("model.embed_tokens.weight")
	xs := make([][]float64, len(tokens))
	for t, id := range tokens {
		xs[t] = append([]float64(nil), emb[id]...)
	}
	add := func(a, b []float64) []float64 {
		for i := range a {
			a[i] += b[i]
		}
		return a
	}
	for l := range c.Layers {
		p := "model.layers." + strconv.Itoa(l) + "."
		at, ex := p+"self_attn.", p+"mlp.experts."
		sinks := r.vec(at + "sinks")
		qs, ks, vs := make([][]float64, len(xs)), make([][]float64, len(xs)), make([][]float64, len(xs))
		for t := range xs {
			h := rmsnorm(xs[t], r.vec(p+"input_layernorm.weight"), c.Eps)
			qs[t] = add(linear(r.tensor(at+"q_proj.weight"), h), r.vec(at+"q_proj.bias"))
			ks[t] = add(linear(r.tensor(at+"k_proj.weight"), h), r.vec(at+"k_proj.bias"))
			vs[t] = add(linear(r.tensor(at+"v_proj.weight"), h), r.vec(at+"v_proj.bias"))
			for hh := range c.Heads {
				copy(qs[t][hh*hd:], rot(qs[t][hh*hd:(hh+1)*hd], t))
			}
			for hh := range c.KVHeads {
				copy(ks[t][hh*hd:], rot(ks[t][hh*hd:(hh+1)*hd], t))
			}
		}
		next := make([][]float64, len(xs))
		for t := range xs {
			lo := 0
			if c.LayerTypes[l] == "sliding_attention" {
				lo = max(0, t-c.Window+1) // kv_idx > q_idx - sliding_window
			}
			att := make([]float64, c.Heads*hd)
			for hh := range c.Heads {
				kv := hh / group
				logits := make([]float64, 0, t-lo+2)
				for j := lo; j <= t; j++ {
					var s float64
					for i := range hd {
						s += qs[t][hh*hd+i] * ks[j][kv*hd+i]
					}
					logits = append(logits, s/math.Sqrt(float64(hd)))
				}
				pr := softmax64(append(logits, sinks[hh])) // the sink's share is dropped
				for j := lo; j <= t; j++ {
					for i := range hd {
						att[hh*hd+i] += pr[j-lo] * vs[j][kv*hd+i]
					}
				}
			}
			x := add(append([]float64(nil), xs[t]...), add(linear(r.tensor(at+"o_proj.weight"), att), r.vec(at+"o_proj.bias")))
			h := rmsnorm(x, r.vec(p+"post_attention_layernorm.weight"), c.Eps)
			experts, weights := gptOssRouter64(add(linear(r.tensor(p+"mlp.router.weight"), h), r.vec(p+"mlp.router.bias")), c.TopK)
			for j, e := range experts {
				gu, dn := r.gptOssExpert(ex, e, c.MXFP4 != nil)
				bias := r.tensor(ex + "gate_up_proj_bias")[e]
				act := make([]float64, c.Intermediate)
				for k := range act {
					g, u := bias[2*k], bias[2*k+1]
					for i := range h {
						g += h[i] * gu(i, 2*k)
						u += h[i] * gu(i, 2*k+1)
					}
					g, u = math.Min(g, c.Limit), math.Max(math.Min(u, c.Limit), -c.Limit)
					act[k] = (u + 1) * g / (1 + math.Exp(-1.702*g))
				}
				out := append([]float64(nil), r.tensor(ex + "down_proj_bias")[e]...)
				for k, a := range act {
					for i := range out {
						out[i] += a * dn(k, i)
					}
				}
				for i := range x {
					x[i] += weights[j] * out[i]
				}
			}
			next[t] = x
		}
		xs = next
	}
	norm, head := r.vec("model.norm.weight"), r.tensor("lm_head.weight")
	out := make([][]float64, len(xs))
	for t := range xs {
		out[t] = linear(head, rmsnorm(xs[t], norm, c.Eps))
	}
	return out
}

// TestGptOssMatchesFloat64Reference: the gpt-oss-tiny preset (laid out
// as gpt-oss-20b's BF16 checkpoint: sinks, q/k/v/o biases, alternating
// sliding and full layers, YaRN without truncation, the router's bias
// and top-k softmax, stacked fused experts with biases, the clamped
// SwiGLU), and gpt-oss-tiny-mxfp4 (its experts in MXFP4 as published),
// give logits within 1e-4 relative L2 of the float64 reference
// at every position of a 24-token sequence (three times the window), and
// its greedy tokens. And each of those details matters: the model with
// it removed (sinks, window, attention or expert biases, the clamp, the
// router's bias or its top-k softmax) is more than 1e-4 away somewhere.
func TestGptOssMatchesFloat64Reference(t *testing.T) {
	for _, preset := range []string{"gpt-oss-tiny", "gpt-oss-tiny-mxfp4"} {
		t.Run(preset, func(t *testing.T) { checkGptOss(t, preset) })
	}
}

func checkGptOss(t *testing.T, preset string) {
	m, dir := loadPreset(t, preset)
	cfgJSON, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c gptOssRef
	if err := json.Unmarshal(cfgJSON, &c); err != nil {
		t.Fatal(err)
	}
	if c.Window == 0 || len(c.LayerTypes) != c.Layers || c.Limit == 0 || m.Config.RopeScaling == nil || m.Config.RopeScaling.Truncate {
		t.Fatalf("the preset does not exercise gpt-oss's differences: %s", cfgJSON)
	}
	set, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	// ten windows: the sliding layers' caches drop rows (kvcache
	// WindowSlack) several times on the way
	tokens := make([]int, 10*c.Window)
	for i := range tokens {
		tokens[i] = (i*53 + 7) % m.Config.VocabSize
	}
	want := refModel{cfg: m.Config, set: set, t: t}.forwardGptOss(tokens, c, cfgJSON)
	_, last := decodeAgainst(t, preset, m, tokens, want)
	// the same tokens prefilled in one pass, but the last: its rows are
	// all there for the pass, and the sliding layers drop them after
	s := NewSession(m, NewResidentExperts(m), 0)
	if _, err := s.Forward(context.Background(), tokens[:len(tokens)-1]); err != nil {
		t.Fatal(err)
	}
	got, err := s.Forward(context.Background(), tokens[len(tokens)-1:])
	if err != nil {
		t.Fatal(err)
	}
	if d := firstDiff(got, last); d >= 0 {
		t.Fatalf("prefilled in one pass, logit %d is %v; token by token %v", d, got[d], last[d])
	}
	if cache := s.Cache(); cache.Base(0) == 0 || cache.Base(1) != 0 {
		t.Fatalf("after %d positions the sliding layer 0 starts at %d, the full layer 1 at %d", len(tokens), cache.Base(0), cache.Base(1))
	}
	if mx := c.MXFP4 != nil; mx != (m.Layers[0].MoE.Experts[0].GateUp.DType == kernels.MXFP4) || mx != (preset == "gpt-oss-tiny-mxfp4") {
		t.Fatalf("%s binds its experts as %v", preset, m.Layers[0].MoE.Experts[0].GateUp.DType)
	}

	for _, l := range m.Config.ExpertLayers() {
		for _, e := range m.Layers[l].MoE.Experts {
			if e.Limit != float32(c.Limit) || e.Alpha != gptOssAlpha || !e.Fused() {
				t.Fatalf("layer %d's experts: limit %v alpha %v fused %v", l, e.Limit, e.Alpha, e.Fused())
			}
		}
	}
	for _, mut := range []struct {
		name   string
		change func(l int, L *Layer)
	}{
		{"no sinks", func(_ int, L *Layer) { L.Attention.Sinks = nil }},
		{"no window", func(_ int, L *Layer) { L.Attention.Window = 0 }},
		{"no q/k/v biases", func(_ int, L *Layer) { L.Attention.QBias, L.Attention.KBias, L.Attention.VBias = nil, nil, nil }},
		{"no o bias", func(_ int, L *Layer) { L.Attention.OBias = nil }},
		{"no router bias", func(_ int, L *Layer) { L.MoE.RouterBias = nil }},
		{"softmax over every expert", func(_ int, L *Layer) { L.MoE.SoftmaxOfTopK, L.MoE.NormTopK = false, false }},
		{"no clamp", func(_ int, L *Layer) {
			for e := range L.MoE.Experts {
				L.MoE.Experts[e].Limit = float32(math.Inf(1))
			}
		}},
		{"no expert biases", func(_ int, L *Layer) {
			for e := range L.MoE.Experts {
				x := &L.MoE.Experts[e]
				x.GateUpBias = kernels.Matrix{DType: kernels.F32, Rows: 1, Cols: x.GateUp.Rows, Data: make([]byte, 4*x.GateUp.Rows)}
				x.DownBias = kernels.Matrix{DType: kernels.F32, Rows: 1, Cols: x.Down.Rows, Data: make([]byte, 4*x.Down.Rows)}
			}
		}},
	} {
		mm := *m
		mm.Layers = make([]Layer, len(m.Layers))
		for l := range m.Layers {
			mm.Layers[l] = m.Layers[l]
			moe := *m.Layers[l].MoE
			moe.Experts = append([]Expert(nil), moe.Experts...)
			mm.Layers[l].MoE = &moe
			mut.change(l, &mm.Layers[l])
		}
		worst := worstAgainst(t, &mm, tokens, want)
		if worst <= 1e-4 {
			t.Errorf("%s: still within %.3g of the reference; the test would not catch it", mut.name, worst)
		}
		t.Logf("%s: %.3g from the reference", mut.name, worst)
	}
}

// worstAgainst is decodeAgainst's worst relative L2 error, without
// failing on it.
func worstAgainst(t *testing.T, m *Model, tokens []int, want [][]float64) float64 {
	t.Helper()
	s := NewSession(m, NewResidentExperts(m), len(tokens))
	var worst float64
	for i, id := range tokens {
		got, err := s.Forward(context.Background(), []int{id})
		if err != nil {
			t.Fatal(err)
		}
		worst = max(worst, relL2(got, want[i]))
	}
	return worst
}

// TestGptOssConfigReadsWhatTransformersReads: layer_types, sliding_window,
// head_dim and rope_scaling default as GptOssConfig's do, and a
// layer_types of the wrong length or with an unknown type is refused by
// name.
func TestGptOssConfigReadsWhatTransformersReads(t *testing.T) {
	c, err := ParseConfig([]byte(`{"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 4}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{128, 0, 128, 0}; c.HeadDim != 64 || c.SwiGLULimit != 7 || !c.AttentionBias || len(c.LayerWindows) != 4 ||
		c.LayerWindows[0] != want[0] || c.LayerWindows[1] != want[1] || c.LayerWindows[2] != want[2] || c.LayerWindows[3] != want[3] || c.SlidingWindow != 0 {
		t.Errorf("defaults: head_dim %d limit %g bias %v windows %v sliding %d", c.HeadDim, c.SwiGLULimit, c.AttentionBias, c.LayerWindows, c.SlidingWindow)
	}
	if rs := c.RopeScaling; rs == nil || rs.Type != "yarn" || rs.Factor != 32 || rs.OriginalMaxPosition != 4096 || rs.Truncate {
		t.Errorf("default rope_scaling: %+v", rs)
	}
	for _, bad := range []struct{ cfg, says string }{
		{`"layer_types": ["full_attention"]`, `"layer_types" has 1 entries for 4 layers`},
		{`"layer_types": ["full_attention", "full_attention", "chunked_attention", "full_attention"]`, `layer 2 "chunked_attention"`},
		{`"swiglu_limit": 0`, `"swiglu_limit" is 0`},
		{`"sliding_window": 0`, `"sliding_window" is 0`},
		{`"quantization_config": {"quant_method": "awq"}`, `"quantization_config" says "awq"`},
	} {
		_, err := ParseConfig([]byte(`{"architectures": ["GptOssForCausalLM"], "num_hidden_layers": 4, ` + bad.cfg + `}`))
		if err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s: %v, want an error saying %s", bad.cfg, err, bad.says)
		}
	}
}

// TestASequenceSteppedBackPastItsWindowsRowsIsRefused: a session whose
// sliding layers dropped rows, truncated further back than
// kvcache.WindowSlack, refuses its next pass with an error naming the
// layer and positions, rather than reading rows it no longer holds.
func TestASequenceSteppedBackPastItsWindowsRowsIsRefused(t *testing.T) {
	m, _ := loadPreset(t, "gpt-oss-tiny")
	s := NewSession(m, NewResidentExperts(m), 0)
	tokens := make([]int, 100)
	for i := range tokens {
		tokens[i] = (i*53 + 7) % m.Config.VocabSize
	}
	if _, err := s.Forward(context.Background(), tokens); err != nil {
		t.Fatal(err)
	}
	back := s.Cache().Base(0) - 1 // before the first row layer 0 holds
	s.Cache().Truncate(back)
	_, err := s.Forward(context.Background(), tokens[:1])
	if err == nil || !strings.Contains(err.Error(), "no longer holds position") {
		t.Fatalf("stepping back to %d: %v, want an error saying the cache no longer holds a position", back, err)
	}
}
