package model

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
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
// sum. It returns every position's logits.
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
				ep := p + "mlp.experts." + strconv.Itoa(e) + "."
				g, u := linear(r.tensor(ep+"gate_proj.weight"), h), linear(r.tensor(ep+"up_proj.weight"), h)
				for i := range g {
					g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
				}
				y := linear(r.tensor(ep+"down_proj.weight"), g)
				for i := range x {
					x[i] += probs[e] / wsum * y[i]
				}
			}
			if f.shared {
				sp := p + "mlp.shared_expert."
				g, u := linear(r.tensor(sp+"gate_proj.weight"), h), linear(r.tensor(sp+"up_proj.weight"), h)
				for i := range g {
					g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
				}
				y := linear(r.tensor(sp+"down_proj.weight"), g)
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
	if m.Config.HeadDim == m.Config.HiddenSize/m.Config.NumHeads || !m.Config.NormTopK || len(m.Layers[0].Attention.QNorm) != m.Config.HeadDim {
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
	if m.Layers[0].MoE.Shared == nil || m.Layers[0].Attention.QBias == nil || m.Config.SharedIntermediateSize == 0 {
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
	for _, normTopK := range []bool{true, false} {
		m.Config.NormTopK = normTopK
		for l := range m.Layers {
			m.Layers[l].MoE.NormTopK = normTopK
		}
		f.normTopK = normTopK
		want := refModel{cfg: m.Config, set: set, t: t}.forwardQKNorm(testTokens, f)
		s := NewSession(m, NewResidentExperts(m), len(testTokens))
		for i, id := range testTokens {
			got, err := s.Forward(context.Background(), []int{id})
			if err != nil {
				t.Fatal(err)
			}
			if e := relL2(got, want[i]); e > 1e-4 {
				t.Errorf("norm_topk_prob %v, position %d: relative L2 error %.3g > 1e-4", normTopK, i, e)
			}
			if Argmax(got) != argmax64(want[i]) {
				t.Errorf("norm_topk_prob %v, position %d: greedy token %d, reference %d", normTopK, i, Argmax(got), argmax64(want[i]))
			}
		}
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
// defaults to false as in transformers, and a config with dense layers is
// refused, saying why, rather than run as another model.
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
	for _, dense := range []string{`,"mlp_only_layers":[1]`, `,"decoder_sparse_step":2`} {
		if _, err := ParseConfig([]byte(fmt.Sprintf(base, dense))); err == nil || !strings.Contains(err.Error(), "dense") {
			t.Errorf("%s: err = %v, want a refusal of dense layers", dense, err)
		}
	}
	_, err = ParseConfig([]byte(`{"architectures":["LlamaForCausalLM"]}`))
	if err == nil || !strings.Contains(err.Error(), "MixtralForCausalLM") || !strings.Contains(err.Error(), "Qwen3MoeForCausalLM") {
		t.Errorf("an unknown architecture: %v, want the supported ones listed", err)
	}
}
