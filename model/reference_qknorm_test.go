package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/model/synth"
)

// qkFamily says how a Qwen/OLMoE-style family differs from Mixtral.
type qkFamily struct {
	qkNorm   string  // "head" (Qwen3: RMSNorm over each head), "whole" (OLMoE: over the projection), "" (none)
	clip     float64 // OLMoE's clip_qkv, after the norms; 0: none
	normTopK bool    // norm_topk_prob
	bias     bool    // Qwen2-MoE: q/k/v projection biases
	shared   bool    // Qwen2-MoE: the shared expert, sigmoid-gated
	// dense says which layers are a dense MLP (mlp.{gate,up,down}_proj)
	// instead of experts; read by the test from config.json itself
	// (denseLayersOf), not from odmoe's Config.
	dense map[int]bool
}

// denseLayersOf applies transformers' rule (Qwen3MoeDecoderLayer,
// Qwen2MoeDecoderLayer) to dir/config.json: layer l is a dense MLP when it
// is in mlp_only_layers or (l+1) % decoder_sparse_step != 0.
func denseLayersOf(t *testing.T, dir string) map[int]bool {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Layers     int   `json:"num_hidden_layers"`
		SparseStep *int  `json:"decoder_sparse_step"`
		MLPOnly    []int `json:"mlp_only_layers"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	step := 1
	if raw.SparseStep != nil {
		step = *raw.SparseStep
	}
	dense := map[int]bool{}
	for l := range raw.Layers {
		if slices.Contains(raw.MLPOnly, l) || (l+1)%step != 0 {
			dense[l] = true
		}
	}
	return dense
}

// swiglu64 is down(silu(gate(h)) * up(h)) of the MLP named prefix.
func (r refModel) swiglu64(prefix string, h []float64) []float64 {
	g, u := linear(r.tensor(prefix+"gate_proj.weight"), h), linear(r.tensor(prefix+"up_proj.weight"), h)
	for i := range g {
		g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
	}
	return linear(r.tensor(prefix+"down_proj.weight"), g)
}

// forwardQKNorm is an independent float64 implementation of Hugging
// Face's Qwen3MoeForCausalLM (modeling_qwen3_moe.py), OlmoeForCausalLM
// (modeling_olmoe.py) and Qwen2MoeForCausalLM (modeling_qwen2_moe.py)
// forward passes, from the formulas, with no KV cache: q/k/v biases
// (Qwen2), RMSNorm of queries and keys before RoPE (Qwen3: per head,
// q_norm and k_norm of head_dim; OLMoE: over the whole q and k
// projections, then q, k, v clamped to clip_qkv), head_dim from the
// config, softmax routing over num_experts whose top-k weights are
// renormalised only when norm_topk_prob, SwiGLU experts mlp.experts.E
// down(silu(gate(x)) * up(x)), and (Qwen2) the shared expert
// sigmoid(shared_expert_gate(x)) * shared_expert(x) added to the routed
// sum; a dense layer (f.dense) runs mlp.{gate,up,down}_proj as one
// SwiGLU MLP instead. It returns every position's logits.
func (r refModel) forwardQKNorm(tokens []int, f qkFamily) [][]float64 {
	normTopK := f.normTopK
	clamp := func(v []float64) {
		if f.clip > 0 {
			for i := range v {
				v[i] = math.Max(-f.clip, math.Min(f.clip, v[i]))
			}
		}
	}
	c := r.cfg
	hd, eps := c.HeadDim, c.RMSNormEps
	emb := r.tensor("model.embed_tokens.weight")
	xs := make([][]float64, len(tokens))
	for t, id := range tokens {
		xs[t] = append([]float64(nil), emb[id]...)
	}
	for l := range c.NumLayers {
		p := "model.layers." + strconv.Itoa(l) + "."
		wq, wk, wv, wo := r.tensor(p+"self_attn.q_proj.weight"), r.tensor(p+"self_attn.k_proj.weight"), r.tensor(p+"self_attn.v_proj.weight"), r.tensor(p+"self_attn.o_proj.weight")
		var qn, kn []float64
		if f.qkNorm != "" {
			qn, kn = r.vec(p+"self_attn.q_norm.weight"), r.vec(p+"self_attn.k_norm.weight")
		}
		ln1, ln2 := r.vec(p+"input_layernorm.weight"), r.vec(p+"post_attention_layernorm.weight")
		qs, ks, vs := make([][]float64, len(xs)), make([][]float64, len(xs)), make([][]float64, len(xs))
		for t := range xs {
			h := rmsnorm(xs[t], ln1, eps)
			qs[t], ks[t], vs[t] = linear(wq, h), linear(wk, h), linear(wv, h)
			if f.bias {
				for _, pb := range []struct {
					v    []float64
					name string
				}{{qs[t], "q"}, {ks[t], "k"}, {vs[t], "v"}} {
					for i, b := range r.vec(p + "self_attn." + pb.name + "_proj.bias") {
						pb.v[i] += b
					}
				}
			}
			if f.qkNorm == "whole" {
				qs[t], ks[t] = rmsnorm(qs[t], qn, eps), rmsnorm(ks[t], kn, eps)
				clamp(qs[t])
				clamp(ks[t])
				clamp(vs[t])
			}
			for hh := range c.NumHeads {
				head := qs[t][hh*hd : (hh+1)*hd]
				if f.qkNorm == "head" {
					head = rmsnorm(head, qn, eps)
				}
				copy(qs[t][hh*hd:], rope(head, t, c.RopeTheta))
			}
			for hh := range c.NumKVHeads {
				head := ks[t][hh*hd : (hh+1)*hd]
				if f.qkNorm == "head" {
					head = rmsnorm(head, kn, eps)
				}
				copy(ks[t][hh*hd:], rope(head, t, c.RopeTheta))
			}
		}
		next := make([][]float64, len(xs))
		for t := range xs {
			att := make([]float64, c.NumHeads*hd)
			for hh := range c.NumHeads {
				kvh := hh / (c.NumHeads / c.NumKVHeads)
				sc := make([]float64, t+1)
				for j := 0; j <= t; j++ {
					for i := range hd {
						sc[j] += qs[t][hh*hd+i] * ks[j][kvh*hd+i]
					}
					sc[j] /= math.Sqrt(float64(hd))
				}
				pr := softmax64(sc)
				for j := 0; j <= t; j++ {
					for i := range hd {
						att[hh*hd+i] += pr[j] * vs[j][kvh*hd+i]
					}
				}
			}
			o := linear(wo, att)
			x := make([]float64, len(xs[t]))
			for i := range x {
				x[i] = xs[t][i] + o[i]
			}
			h := rmsnorm(x, ln2, eps)
			if f.dense[l] {
				y := r.swiglu64(p+"mlp.", h)
				for i := range x {
					x[i] += y[i]
				}
				next[t] = x
				continue
			}
			probs := softmax64(linear(r.tensor(p+"mlp.gate.weight"), h))
			idx := make([]int, len(probs))
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(a, b int) bool { return probs[idx[a]] > probs[idx[b]] })
			wsum := 1.0
			if normTopK {
				wsum = 0
				for _, e := range idx[:c.TopK] {
					wsum += probs[e]
				}
			}
			for _, e := range idx[:c.TopK] {
				y := r.swiglu64(p+"mlp.experts."+strconv.Itoa(e)+".", h)
				for i := range x {
					x[i] += probs[e] / wsum * y[i]
				}
			}
			if f.shared {
				y := r.swiglu64(p+"mlp.shared_expert.", h)
				z := linear(r.tensor(p+"mlp.shared_expert_gate.weight"), h)[0]
				for i := range x {
					x[i] += 1 / (1 + math.Exp(-z)) * y[i]
				}
			}
			next[t] = x
		}
		xs = next
	}
	norm := r.vec("model.norm.weight")
	head := "lm_head.weight"
	if c.TieEmbeddings {
		head = "model.embed_tokens.weight"
	}
	lm := r.tensor(head)
	out := make([][]float64, len(xs))
	for t := range xs {
		out[t] = linear(lm, rmsnorm(xs[t], norm, eps))
	}
	return out
}

// TestQwen3MoEMatchesFloat64Reference: the qwen3-moe-tiny preset, with
// norm_topk_prob on and off, in local mode matches the float64 reference
// of the Hugging Face formulas at every position (relative L2 <= 1e-4),
// with the same greedy token.
func TestQwen3MoEMatchesFloat64Reference(t *testing.T) {
	m, dir := loadPreset(t, "qwen3-moe-tiny")
	if m.Config.HeadDim == m.Config.HiddenSize/m.Config.NumHeads || !m.Config.NormTopK || len(m.Layers[0].Attention.QNorm) != m.Config.HeadDim ||
		len(denseLayersOf(t, dir)) == 0 {
		t.Fatalf("the preset does not exercise Qwen3's differences: %+v", m.Config)
	}
	checkAgainstReference(t, m, dir, qkFamily{qkNorm: "head"})
}

// TestOLMoEMatchesFloat64Reference: the olmoe-tiny preset (clip_qkv set,
// whole-projection q/k norms) with norm_topk_prob off (OLMoE's default)
// and on matches the float64 reference the same way.
func TestOLMoEMatchesFloat64Reference(t *testing.T) {
	m, dir := loadPreset(t, "olmoe-tiny")
	if m.Config.ClipQKV == 0 || m.Config.NormTopK || len(m.Layers[0].Attention.QNorm) != m.Config.NumHeads*m.Config.HeadDim {
		t.Fatalf("the preset does not exercise OLMoE's differences: %+v", m.Config)
	}
	checkAgainstReference(t, m, dir, qkFamily{qkNorm: "whole", clip: m.Config.ClipQKV})
}

// TestQwen2MoEMatchesFloat64Reference: the qwen2-moe-tiny preset (q/k/v
// biases, a shared expert) matches the float64 reference the same way.
func TestQwen2MoEMatchesFloat64Reference(t *testing.T) {
	m, dir := loadPreset(t, "qwen2-moe-tiny")
	last := len(m.Layers) - 1
	if m.Layers[last].MoE.Shared == nil || m.Layers[0].Attention.QBias == nil || m.Config.SharedIntermediateSize == 0 || len(denseLayersOf(t, dir)) == 0 {
		t.Fatalf("the preset does not exercise Qwen2-MoE's differences: %+v", m.Config)
	}
	checkAgainstReference(t, m, dir, qkFamily{bias: true, shared: true})
}

// loadPreset generates preset and loads it; the test closes it.
func loadPreset(t *testing.T, preset string) (*Model, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), preset)
	if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: 4}); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, dir
}

// checkAgainstReference runs testTokens through m, with norm_topk_prob on
// and off, against forwardQKNorm.
func checkAgainstReference(t *testing.T, m *Model, dir string, f qkFamily) {
	t.Helper()
	set, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	f.dense = denseLayersOf(t, dir)
	for _, normTopK := range []bool{true, false} {
		m.Config.NormTopK = normTopK
		for _, l := range m.Config.ExpertLayers() {
			m.Layers[l].MoE.NormTopK = normTopK
		}
		f.normTopK = normTopK
		want := refModel{cfg: m.Config, set: set, t: t}.forwardQKNorm(testTokens, f)
		decodeAgainst(t, fmt.Sprintf("norm_topk_prob %v", normTopK), m, testTokens, want)
	}
}

func argmax64(v []float64) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// TestQwen3MoEConfig: Qwen's field names (num_experts,
// moe_intermediate_size, norm_topk_prob) are read, norm_topk_prob
// defaults to false as in transformers, and dense layers follow
// transformers' rule: layer l is sparse unless it is in mlp_only_layers
// or (l+1) is not a multiple of decoder_sparse_step. Mixtral, which has
// no such fields in transformers, ignores them.
func TestQwen3MoEConfig(t *testing.T) {
	base := `{"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
		"num_key_value_heads":2,"head_dim":32,"num_experts":16,"num_experts_per_tok":4,"moe_intermediate_size":24,
		"intermediate_size":256,"vocab_size":100,"max_position_embeddings":64%s}`
	c, err := ParseConfig([]byte(fmt.Sprintf(base, "")))
	if err != nil {
		t.Fatal(err)
	}
	if c.NumExperts != 16 || c.IntermediateSize != 24 || c.HeadDim != 32 || c.NormTopK || c.RMSNormEps != 1e-6 {
		t.Fatalf("parsed %+v", c)
	}
	if c, _ := ParseConfig([]byte(fmt.Sprintf(base, `,"norm_topk_prob":true`))); !c.NormTopK {
		t.Fatal("norm_topk_prob true not read")
	}
	if len(c.DenseLayers) != 0 || c.DenseIntermediateSize != 0 {
		t.Errorf("no dense fields: dense layers %v of width %d", c.DenseLayers, c.DenseIntermediateSize)
	}
	four := strings.Replace(base, `"num_hidden_layers":2`, `"num_hidden_layers":4`, 1)
	for _, tc := range []struct {
		fields         string
		dense, experts []int
	}{
		{`,"mlp_only_layers":[1]`, []int{1}, []int{0, 2, 3}},
		{`,"decoder_sparse_step":2`, []int{0, 2}, []int{1, 3}},
		{`,"decoder_sparse_step":2,"mlp_only_layers":[3]`, []int{0, 2, 3}, []int{1}},
	} {
		c, err := ParseConfig([]byte(fmt.Sprintf(four, tc.fields)))
		if err != nil {
			t.Fatalf("%s: %v", tc.fields, err)
		}
		if !slices.Equal(c.DenseLayers, tc.dense) || !slices.Equal(c.ExpertLayers(), tc.experts) || c.DenseIntermediateSize != 256 || c.IntermediateSize != 24 {
			t.Errorf("%s: dense %v (width %d), experts in %v (width %d); want dense %v of 256, experts in %v of 24",
				tc.fields, c.DenseLayers, c.DenseIntermediateSize, c.ExpertLayers(), c.IntermediateSize, tc.dense, tc.experts)
		}
	}
	for _, bad := range []struct{ fields, says string }{
		{`,"mlp_only_layers":[0,1,2,3]`, "every layer dense"},
		{`,"mlp_only_layers":[7]`, "names layer 7"},
		{`,"decoder_sparse_step":0`, "decoder_sparse_step"},
	} {
		if _, err := ParseConfig([]byte(fmt.Sprintf(four, bad.fields))); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s: err = %v, want it to say %q", bad.fields, err, bad.says)
		}
	}
	// sliding_window is only the size a window would have: transformers
	// gives layer l one when use_sliding_window and l >= max_window_layers
	for _, tc := range []struct {
		fields string
		window int
	}{
		{`,"sliding_window":32`, 0},
		{`,"sliding_window":32,"use_sliding_window":false,"max_window_layers":0`, 0},
		{`,"sliding_window":32,"use_sliding_window":true,"max_window_layers":0`, 32},
		{`,"sliding_window":32,"use_sliding_window":true`, 0}, // max_window_layers 28 >= 4 layers
	} {
		if c, err := ParseConfig([]byte(fmt.Sprintf(four, tc.fields))); err != nil || c.SlidingWindow != tc.window {
			t.Errorf("%s: window %d (%v), want %d", tc.fields, c.SlidingWindow, err, tc.window)
		}
	}
	if _, err := ParseConfig([]byte(fmt.Sprintf(four, `,"sliding_window":32,"use_sliding_window":true,"max_window_layers":2`))); err == nil || !strings.Contains(err.Error(), "max_window_layers") {
		t.Errorf("a window for layers 2 and 3 only: %v, want it refused naming max_window_layers", err)
	}
	mixtral := strings.Replace(strings.Replace(four, "Qwen3MoeForCausalLM", "MixtralForCausalLM", 1), `"num_experts"`, `"num_local_experts"`, 1)
	if c, err := ParseConfig([]byte(fmt.Sprintf(mixtral, `,"sliding_window":32`))); err != nil || c.SlidingWindow != 32 {
		t.Errorf("Mixtral's sliding_window: %d (%v), want 32: transformers applies it as it is", c.SlidingWindow, err)
	}
	if c, err := ParseConfig([]byte(fmt.Sprintf(mixtral, `,"mlp_only_layers":[1]`))); err != nil || len(c.DenseLayers) != 0 || c.IntermediateSize != 256 {
		t.Errorf("Mixtral with mlp_only_layers: %v, dense %v, expert width %d; want the field ignored and intermediate_size 256", err, c.DenseLayers, c.IntermediateSize)
	}
	_, err = ParseConfig([]byte(`{"architectures":["LlamaForCausalLM"]}`))
	if err == nil || !strings.Contains(err.Error(), "MixtralForCausalLM") || !strings.Contains(err.Error(), "Qwen3MoeForCausalLM") {
		t.Errorf("an unknown architecture: %v, want the supported ones listed", err)
	}
}
