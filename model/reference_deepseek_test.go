package model

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/model/synth"
)

// deepseekRef is config.json as the DeepSeek-V3 reference reads it, with
// transformers' field names, apart from odmoe's Config.
type deepseekRef struct {
	Hidden        int     `json:"hidden_size"`
	Layers        int     `json:"num_hidden_layers"`
	Heads         int     `json:"num_attention_heads"`
	QLoRA         *int    `json:"q_lora_rank"`
	KVLoRA        int     `json:"kv_lora_rank"`
	Nope          int     `json:"qk_nope_head_dim"`
	Rope          int     `json:"qk_rope_head_dim"`
	V             int     `json:"v_head_dim"`
	Experts       int     `json:"n_routed_experts"`
	TopK          int     `json:"num_experts_per_tok"`
	Groups        int     `json:"n_group"`
	GroupsKept    int     `json:"topk_group"`
	Scale         float64 `json:"routed_scaling_factor"`
	NormTopK      bool    `json:"norm_topk_prob"`
	FirstDense    int     `json:"first_k_dense_replace"`
	Eps           float64 `json:"rms_norm_eps"`
	Theta         float64 `json:"rope_theta"`
	MaxPositions  int     `json:"max_position_embeddings"`
	RopeScaling   map[string]any
	RawRope       json.RawMessage `json:"rope_scaling"`
	TieEmbeddings bool            `json:"tie_word_embeddings"`
}

// forwardDeepseekV3 is an independent float64 implementation of
// transformers' DeepseekV3ForCausalLM forward pass (modeling_deepseek_v3.py),
// from its formulas, with no KV cache and no weight absorption: each
// head's query q_b_proj(q_a_layernorm(q_a_proj(x))) split into a no-RoPE
// and a RoPE part; kv_a_proj_with_mqa(x) split into the latent, normed by
// kv_a_layernorm (eps 1e-6) and expanded by kv_b_proj into every head's
// no-RoPE key and value, and the rotary key shared by the heads; the RoPE
// parts rotated as apply_rotary_pos_emb_interleave does, with YaRN's
// frequencies and attention factor (refRopeScaling); scores scaled by
// 1/sqrt(nope+rope) times yarn_get_mscale(factor, mscale_all_dim)^2;
// dense first layers; the sigmoid router with its correction bias, group
// limit and scaling (deepseekRouter64); SwiGLU experts and the shared
// experts added unscaled.
func (r refModel) forwardDeepseekV3(tokens []int, c deepseekRef, cfgJSON []byte) [][]float64 {
	rot := refRopeScaling(r.t, cfgJSON, c.Theta, c.MaxPositions)
	qk := c.Nope + c.Rope
	scale := 1 / math.Sqrt(float64(qk))
	if m, ok := c.RopeScaling["mscale_all_dim"].(float64); ok && m != 0 {
		f := c.RopeScaling["factor"].(float64)
		ms := 0.1*m*math.Log(f) + 1
		scale *= ms * ms
	}
	interleaved := func(x []float64, pos int) []float64 {
		d := len(x)
		de := make([]float64, d)
		for i := range d / 2 {
			de[i], de[d/2+i] = x[2*i], x[2*i+1]
		}
		return rot(de, pos)
	}
	emb := r.tensor("model.embed_tokens.weight")
	xs := make([][]float64, len(tokens))
	for t, id := range tokens {
		xs[t] = append([]float64(nil), emb[id]...)
	}
	for l := range c.Layers {
		p := "model.layers." + strconv.Itoa(l) + "."
		at := p + "self_attn."
		kvb := r.tensor(at + "kv_b_proj.weight")
		wo := r.tensor(at + "o_proj.weight")
		qs, ks, vs := make([][][]float64, len(xs)), make([][][]float64, len(xs)), make([][][]float64, len(xs))
		for t := range xs {
			h := rmsnorm(xs[t], r.vec(p+"input_layernorm.weight"), c.Eps)
			var q []float64
			if c.QLoRA != nil {
				q = linear(r.tensor(at+"q_b_proj.weight"), rmsnorm(linear(r.tensor(at+"q_a_proj.weight"), h), r.vec(at+"q_a_layernorm.weight"), 1e-6))
			} else {
				q = linear(r.tensor(at+"q_proj.weight"), h)
			}
			kva := linear(r.tensor(at+"kv_a_proj_with_mqa.weight"), h)
			kv := linear(kvb, rmsnorm(kva[:c.KVLoRA], r.vec(at+"kv_a_layernorm.weight"), 1e-6))
			kRot := interleaved(kva[c.KVLoRA:], t)
			qs[t], ks[t], vs[t] = make([][]float64, c.Heads), make([][]float64, c.Heads), make([][]float64, c.Heads)
			for hh := range c.Heads {
				qh := q[hh*qk : (hh+1)*qk]
				qs[t][hh] = append(append([]float64(nil), qh[:c.Nope]...), interleaved(qh[c.Nope:], t)...)
				kh := kv[hh*(c.Nope+c.V) : (hh+1)*(c.Nope+c.V)]
				ks[t][hh] = append(append([]float64(nil), kh[:c.Nope]...), kRot...)
				vs[t][hh] = kh[c.Nope:]
			}
		}
		next := make([][]float64, len(xs))
		for t := range xs {
			att := make([]float64, c.Heads*c.V)
			for hh := range c.Heads {
				sc := make([]float64, t+1)
				for j := range sc {
					for i := range qk {
						sc[j] += qs[t][hh][i] * ks[j][hh][i]
					}
					sc[j] *= scale
				}
				pr := softmax64(sc)
				for j := range sc {
					for i := range c.V {
						att[hh*c.V+i] += pr[j] * vs[j][hh][i]
					}
				}
			}
			o := linear(wo, att)
			x := make([]float64, len(xs[t]))
			for i := range x {
				x[i] = xs[t][i] + o[i]
			}
			h := rmsnorm(x, r.vec(p+"post_attention_layernorm.weight"), c.Eps)
			if l < c.FirstDense {
				y := r.swiglu64(p+"mlp.", h)
				for i := range x {
					x[i] += y[i]
				}
				next[t] = x
				continue
			}
			logits := linear(r.tensor(p+"mlp.gate.weight"), h)
			l32, b32 := make([]float32, len(logits)), make([]float32, len(logits))
			bias := r.vec(p + "mlp.gate.e_score_correction_bias")
			for e := range logits {
				l32[e], b32[e] = float32(logits[e]), float32(bias[e])
			}
			experts, weights := deepseekRouter64(l32, b32, c.Groups, c.GroupsKept, c.TopK, c.NormTopK, c.Scale)
			for j, e := range experts {
				y := r.swiglu64(p+"mlp.experts."+strconv.Itoa(e)+".", h)
				for i := range x {
					x[i] += weights[j] * y[i]
				}
			}
			y := r.swiglu64(p+"mlp.shared_experts.", h)
			for i := range x {
				x[i] += y[i]
			}
			next[t] = x
		}
		xs = next
	}
	norm := r.vec("model.norm.weight")
	head := r.tensor("lm_head.weight")
	out := make([][]float64, len(xs))
	for t := range xs {
		out[t] = linear(head, rmsnorm(xs[t], norm, c.Eps))
	}
	return out
}

// TestDeepseekV3MatchesFloat64Reference: the deepseek-v3-tiny preset (laid
// out as deepseek-ai/DeepSeek-V3's BF16 checkpoint: MLA with q_lora_rank,
// YaRN with mscale, a dense first layer, grouped sigmoid routing with the
// correction bias in F32, a shared expert) gives logits within 1e-4
// relative L2 of the float64 reference at every position, and its greedy
// tokens; and so does the same checkpoint with q_proj instead of
// q_lora_rank.
func TestDeepseekV3MatchesFloat64Reference(t *testing.T) {
	m, dir := loadPreset(t, "deepseek-v3-tiny")
	c := m.Config
	if c.MLA == nil || c.MLA.QLoRARank == 0 || c.RopeScaling == nil || len(c.DenseLayers) == 0 || c.RouterGroups == 0 ||
		m.Layers[len(m.Layers)-1].MoE.Shared == nil || !NewSession(m, NewResidentExperts(m), 0).Cache().Latent() {
		t.Fatalf("the preset does not exercise DeepSeek-V3's differences: %+v", c)
	}
	cfgJSON, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkDeepseek(t, m, dir, cfgJSON)
	// the same shapes without q_lora_rank: q_proj (DeepSeek-V2-Lite's way)
	p := synth.Presets["deepseek-v3-tiny"]
	p.Name, p.QLoRA = "deepseek-v3-tiny-q-proj", 0
	synth.Presets[p.Name] = p
	defer delete(synth.Presets, p.Name)
	m, dir = loadPreset(t, p.Name)
	if m.Config.MLA.QLoRARank != 0 || m.Layers[0].Attention.Q.Rows == 0 {
		t.Fatalf("the q_proj variant binds %+v", m.Config.MLA)
	}
	if cfgJSON, err = os.ReadFile(filepath.Join(dir, "config.json")); err != nil {
		t.Fatal(err)
	}
	checkDeepseek(t, m, dir, cfgJSON)
}

// TestADeepseekV3FP8CheckpointMatchesFloat64Reference: deepseek-v3-tiny-fp8
// (every projection F8_E4M3 with its 128x128 weight_scale_inv, as
// DeepSeek publishes V3 and R1) is bound as F8 matrices and gives logits
// within 1e-4 of the float64 reference on the dequantized weights; and
// so does the same with heads of 32 + 32, whose value rows of kv_b_proj
// do not start a scale block (dequantized to F32 at bind).
func TestADeepseekV3FP8CheckpointMatchesFloat64Reference(t *testing.T) {
	for _, nope := range []int{128, 32} {
		p := synth.Presets["deepseek-v3-tiny-fp8"]
		if nope != p.NopeDim {
			p.Name, p.NopeDim, p.VDim = "deepseek-v3-tiny-fp8-narrow", nope, nope
			synth.Presets[p.Name] = p
			defer delete(synth.Presets, p.Name)
		}
		m, dir := loadPreset(t, p.Name)
		w := m.Layers[1].Attention.MLA
		if w.KVB.DType != kernels.F8E4M3 || w.QA.DType != kernels.F8E4M3 || m.Layers[0].Dense.MLP.Gate.DType != kernels.F8E4M3 ||
			m.Layers[1].MoE.Experts[0].Gate.DType != kernels.F8E4M3 || m.Layers[1].MoE.Shared.Down.DType != kernels.F8E4M3 ||
			m.Layers[1].MoE.Router.DType != kernels.BF16 || m.LMHead.DType != kernels.BF16 {
			t.Fatalf("%s binds KVB %v, q_a %v, dense %v, expert %v, shared %v, router %v, head %v", p.Name, w.KVB.DType, w.QA.DType,
				m.Layers[0].Dense.MLP.Gate.DType, m.Layers[1].MoE.Experts[0].Gate.DType, m.Layers[1].MoE.Shared.Down.DType, m.Layers[1].MoE.Router.DType, m.LMHead.DType)
		}
		if want := kernels.F8E4M3; nope == 32 {
			want = kernels.F32
			if w.uv[1].DType != want {
				t.Fatalf("%s: head 1's value rows are %v, want %v", p.Name, w.uv[1].DType, want)
			}
		} else if w.uv[1].DType != want {
			t.Fatalf("%s: head 1's value rows are %v, want %v", p.Name, w.uv[1].DType, want)
		}
		cfgJSON, err := os.ReadFile(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		checkDeepseek(t, m, dir, cfgJSON)
	}
	// and the scales matter: the experts' read as 1 are far from it
	m, dir := loadPreset(t, "deepseek-v3-tiny-fp8")
	set, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	cfgJSON, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c deepseekRef
	if err := json.Unmarshal(cfgJSON, &c); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(c.RawRope, &c.RopeScaling); err != nil {
		t.Fatal(err)
	}
	tokens := make([]int, 24)
	for i := range tokens {
		tokens[i] = (i*53 + 7) % m.Config.VocabSize
	}
	want := refModel{cfg: m.Config, set: set, t: t}.forwardDeepseekV3(tokens, c, cfgJSON)
	one := binary.LittleEndian.AppendUint32(nil, math.Float32bits(1))
	for _, l := range m.Config.ExpertLayers() {
		for e := range m.Layers[l].MoE.Experts {
			x := &m.Layers[l].MoE.Experts[e]
			for _, w := range []*kernels.Matrix{&x.Gate, &x.Up, &x.Down} {
				w.Scales = bytes.Repeat(one, len(w.Scales)/4)
			}
		}
	}
	if worst := worstAgainst(t, m, tokens, want); worst <= 1e-4 {
		t.Errorf("with the experts' scales read as 1 the model is still within %.3g of the reference", worst)
	}
}

// checkDeepseek runs a 24-token sequence through m token by token against
// the reference.
func checkDeepseek(t *testing.T, m *Model, dir string, cfgJSON []byte) {
	t.Helper()
	var c deepseekRef
	if err := json.Unmarshal(cfgJSON, &c); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(c.RawRope, &c.RopeScaling); err != nil {
		t.Fatal(err)
	}
	set, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	tokens := make([]int, 24)
	for i := range tokens {
		tokens[i] = (i*53 + 7) % m.Config.VocabSize
	}
	decodeAgainst(t, m.Config.Architecture, m, tokens, refModel{cfg: m.Config, set: set, t: t}.forwardDeepseekV3(tokens, c, cfgJSON))
}

// TestAQuantizedDeepseekV3OwnsItsMLAWeights: the shadow's quantized copy
// of a DeepSeek-V3 checkpoint quantizes the MLA projections too and
// owns them: with the checkpoint closed under it, it still predicts the
// full model's greedy tokens (all but a few of 24).
func TestAQuantizedDeepseekV3OwnsItsMLAWeights(t *testing.T) {
	full, dir := loadPreset(t, "deepseek-v3-tiny")
	src, err := Load(dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q, err := src.Quantized(kernels.Q8, nil)
	if err != nil {
		t.Fatal(err)
	}
	src.Close() // its mapping is gone: q must not read it
	if w := q.Layers[1].Attention.MLA; w == nil || w.KVB.DType != kernels.Q8 || w.ukT.DType != kernels.Q8 || w.QB.DType != kernels.Q8 {
		t.Fatalf("the quantized copy's MLA weights: %+v", w)
	}
	a, b := NewSession(full, NewResidentExperts(full), 0), NewSession(q, NewResidentExperts(q), 0)
	agree := 0
	for i := range 24 {
		id := (i*53 + 7) % full.Config.VocabSize
		x, err := a.Forward(context.Background(), []int{id})
		if err != nil {
			t.Fatal(err)
		}
		want := Argmax(x)
		y, err := b.Forward(context.Background(), []int{id})
		if err != nil {
			t.Fatal(err)
		}
		if Argmax(y) == want {
			agree++
		}
	}
	t.Logf("the Q8 copy agrees on %d of 24 greedy tokens", agree)
	if agree < 20 {
		t.Fatalf("the Q8 copy agrees on %d of 24 greedy tokens", agree)
	}
	// quantizing leaves the source model as it was (its transposed keys,
	// made at load, are not the checkpoint's to drop)
	before, err := NewSession(full, NewResidentExperts(full), 0).Forward(context.Background(), []int{5, 9, 11})
	if err != nil {
		t.Fatal(err)
	}
	before = append([]float32(nil), before...)
	if _, err := full.Quantized(kernels.Q8, nil); err != nil {
		t.Fatal(err)
	}
	after, err := NewSession(full, NewResidentExperts(full), 0).Forward(context.Background(), []int{5, 9, 11})
	if err != nil {
		t.Fatal(err)
	}
	if d := firstDiff(after, before); d >= 0 {
		t.Fatalf("quantizing changed the source model: logit %d %v, before %v", d, after[d], before[d])
	}
}

// TestDeepseekV3ConfigRefusesWhatItDoesNotCompute: a scoring_func or
// topk_method transformers' DeepseekV3ForCausalLM does not use, a group
// layout that cannot hold the top-k, an FP8 quantization_config of
// another format or block size than DeepSeek publishes, and any other
// quantization method are refused, each
// naming the field.
func TestDeepseekV3ConfigRefusesWhatItDoesNotCompute(t *testing.T) {
	_, dir := loadPreset(t, "deepseek-v3-tiny")
	orig, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseConfig(orig); err != nil {
		t.Fatalf("the preset's own config: %v", err)
	}
	for _, c := range []struct{ from, to, says string }{
		{`"scoring_func": "sigmoid"`, `"scoring_func": "softmax"`, `"scoring_func" is "softmax"`},
		{`"topk_method": "noaux_tc"`, `"topk_method": "greedy"`, `"topk_method" is "greedy"`},
		{`"topk_group": 3`, `"topk_group": 1`, `"num_experts_per_tok" (4) exceeds the experts of the 1 groups kept`},
		{`"n_group": 8`, `"n_group": 5`, `"n_group" (5) does not divide`},
		{`"attention_bias": false`, `"attention_bias": true`, `"attention_bias" is true`},
		{`"v_head_dim": 32`, `"v_head_dim": 32, "rope_interleave": false`, `"rope_interleave" is false`},
		{`"v_head_dim": 32`, `"v_head_dim": 32, "quantization_config": {"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}`, `fmt "e5m2"`},
		{`"v_head_dim": 32`, `"v_head_dim": 32, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 64]}`, `weight_block_size [64 64]`},
		{`"v_head_dim": 32`, `"v_head_dim": 32, "quantization_config": {"quant_method": "awq"}`, `"quantization_config" says "awq"`},
	} {
		b := strings.Replace(string(orig), c.from, c.to, 1)
		if b == string(orig) {
			t.Fatalf("the preset's config.json has no %s", c.from)
		}
		if _, err := ParseConfig([]byte(b)); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %s", c.to, err, c.says)
		}
	}
}
