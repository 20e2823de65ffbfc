package model

import (
	"encoding/json"
	"fmt"

	"github.com/odmoe/odmoe/kernels"
)

// DeepSeek-V3 (DeepseekV3ForCausalLM, also DeepSeek-R1 and Kimi K2):
// Multi-head Latent Attention (MLA: queries through q_a_proj,
// q_a_layernorm and q_b_proj, or q_proj without q_lora_rank; keys and
// values through kv_a_proj_with_mqa, kv_a_layernorm and kv_b_proj, each
// head's query and key a no-RoPE part and an interleaved-RoPE part, the
// rotary key shared by all heads; YaRN with its mscale in the softmax
// scale), the first first_k_dense_replace layers a dense MLP, the others a
// sparse block routed by sigmoid scores with a choice bias and
// group-limited top-k (GroupRouting) beside n_shared_experts shared
// experts that every token runs unscaled (held on the main node, as
// Qwen2-MoE's shared expert). The KV cache holds each position's latent
// and rotary key, not every head's keys and values (kvcache.NewLatent).
// Defaults are transformers' DeepseekV3Config's.
func init() {
	register("DeepseekV3ForCausalLM", &architecture{
		modelType:      "deepseek_v3",
		alsoModelTypes: []string{"kimi_k2"},
		defaults: Config{
			HiddenSize: 7168, IntermediateSize: 2048, NumLayers: 61,
			NumHeads: 128, NumKVHeads: 128, NumExperts: 256, TopK: 8,
			VocabSize: 129280, MaxPositions: 4096,
			RMSNormEps: 1e-6, RopeTheta: 1e4, NormTopK: true,
			DenseIntermediateSize: 18432,
		},
		config:    deepseekV3Config,
		embed:     "model.embed_tokens.weight",
		finalNorm: "model.norm.weight",
		lmHead:    "lm_head.weight",
		layer: func(b *binder, c Config, l int) Layer {
			p := per("model.layers.%d.", l)
			L := b.ffn(c, l, p, "mlp.gate.weight")
			L.Attention = b.mla(c, p)
			if moe := L.MoE; moe != nil {
				moe.Grouped = &GroupRouting{Bias: b.vector(p+"mlp.gate.e_score_correction_bias", c.NumExperts),
					Groups: c.RouterGroups, GroupsKept: c.RouterGroupsKept, Scale: float32(c.RoutedScale)}
				if si, h := c.SharedIntermediateSize, c.HiddenSize; si > 0 {
					moe.Shared = &Expert{ // no gate: added as it is
						Gate: b.product(p+"mlp.shared_experts.gate_proj.weight", si, h),
						Up:   b.product(p+"mlp.shared_experts.up_proj.weight", si, h),
						Down: b.product(p+"mlp.shared_experts.down_proj.weight", h, si),
					}
				}
			}
			return L
		},
		expertNames:  mlpExpertNames,
		quantMethods: []string{"fp8"},
	})
}

// deepseekV3Config reads DeepseekV3Config's own fields: the MLA shape,
// the routed and shared experts, the dense first layers and the router,
// with transformers' defaults. transformers' router always scores with
// a sigmoid and chooses by the bias-corrected scores (noaux_tc): another
// scoring_func or topk_method is refused by name, as are the
// non-interleaved RoPE and attention biases, which no published
// checkpoint of the family uses. YaRN's factor is the config's
// rope_scaling.factor, as transformers 5 reads it (4.5x derives it from
// max_position_embeddings / original_max_position_embeddings; the
// published configs agree).
func deepseekV3Config(r *rawConfig, c *Config) error {
	qlora := 1536 // absent: transformers' default; null: q_proj
	if len(r.QLoRARank) > 0 {
		var v *int
		if err := json.Unmarshal(r.QLoRARank, &v); err != nil {
			return fmt.Errorf(`field "q_lora_rank" is %s; want an integer or null`, r.QLoRARank)
		}
		qlora = or(v, 0)
	}
	m := &MLAConfig{QLoRARank: qlora, KVLoRARank: or(r.KVLoRARank, 512),
		NopeDim: or(r.QKNopeHeadDim, 128), RopeDim: or(r.QKRopeHeadDim, 64), VDim: or(r.VHeadDim, 128)}
	c.MLA = m
	c.HeadDim = m.RopeDim // transformers' head_dim: what RoPE rotates
	c.NumExperts = or(r.NRoutedExperts, 256)
	c.IntermediateSize = or(r.MoEIntermediate, 2048)
	c.DenseIntermediateSize = or(r.IntermediateSize, 18432)
	c.SharedIntermediateSize = or(r.NSharedExperts, 1) * c.IntermediateSize
	c.RouterGroups, c.RouterGroupsKept = or(r.NGroup, 8), or(r.TopKGroup, 4)
	c.RoutedScale = or(r.RoutedScaling, 2.5)
	dense := or(r.FirstKDense, 3)
	for l := range min(dense, c.NumLayers) {
		c.DenseLayers = append(c.DenseLayers, l)
	}
	if q := r.Quantization; q != nil && q.Method == "fp8" {
		// DeepSeek's FP8 checkpoints: E4M3 weights, one weight_scale_inv
		// per 128x128 block; activations stay float32 here (the dynamic
		// activation scheme is a kernel's lossy choice, not the model's
		// weights)
		if q.Fmt != "e4m3" || len(q.BlockSize) != 2 || q.BlockSize[0] != 128 || q.BlockSize[1] != 128 {
			return fmt.Errorf(`field "quantization_config" is fp8 with fmt %q and weight_block_size %v; odmoe reads "e4m3" in blocks of [128, 128]`, q.Fmt, q.BlockSize)
		}
	}
	if s := or(r.ScoringFunc, "sigmoid"); s != "sigmoid" {
		return fmt.Errorf(`field "scoring_func" is %q; DeepseekV3ForCausalLM's router scores with "sigmoid"`, s)
	}
	if s := or(r.TopKMethod, "noaux_tc"); s != "noaux_tc" {
		return fmt.Errorf(`field "topk_method" is %q; DeepseekV3ForCausalLM's router chooses with "noaux_tc"`, s)
	}
	if !or(r.RopeInterleave, true) {
		return fmt.Errorf(`field "rope_interleave" is false; odmoe computes DeepSeek-V3's interleaved rotary embedding only`)
	}
	if or(r.AttentionBias, false) {
		return fmt.Errorf(`field "attention_bias" is true; DeepSeek-V3's attention projections have no biases here`)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"kv_lora_rank", m.KVLoRARank}, {"qk_nope_head_dim", m.NopeDim}, {"qk_rope_head_dim", m.RopeDim}, {"v_head_dim", m.VDim},
		{"n_group", c.RouterGroups}, {"topk_group", c.RouterGroupsKept}} {
		if f.v <= 0 {
			return fmt.Errorf("field %q is %d; must be positive", f.name, f.v)
		}
	}
	switch {
	case m.QLoRARank < 0:
		return fmt.Errorf(`field "q_lora_rank" is %d; must be positive or null`, m.QLoRARank)
	case c.NumExperts%c.RouterGroups != 0:
		return fmt.Errorf(`field "n_group" (%d) does not divide "n_routed_experts" (%d)`, c.RouterGroups, c.NumExperts)
	case c.RouterGroupsKept > c.RouterGroups:
		return fmt.Errorf(`field "topk_group" (%d) exceeds "n_group" (%d)`, c.RouterGroupsKept, c.RouterGroups)
	case c.NumExperts/c.RouterGroups < 2:
		return fmt.Errorf(`fields "n_group" (%d) and "n_routed_experts" (%d) leave groups of one expert; a group scores its best two`, c.RouterGroups, c.NumExperts)
	case c.TopK > c.RouterGroupsKept*(c.NumExperts/c.RouterGroups):
		return fmt.Errorf(`field "num_experts_per_tok" (%d) exceeds the experts of the %d groups kept`, c.TopK, c.RouterGroupsKept)
	}
	if len(c.DenseLayers) > 0 && c.DenseIntermediateSize <= 0 {
		return fmt.Errorf(`field "intermediate_size" is %d; must be positive`, c.DenseIntermediateSize)
	}
	return nil
}

// mla binds layer prefix p's Multi-head Latent Attention.
func (b *binder) mla(c Config, p string) Attention {
	m, h, H := c.MLA, c.HiddenSize, c.NumHeads
	qk, rank := m.NopeDim+m.RopeDim, m.KVLoRARank
	a := Attention{Norm: b.vector(p+"input_layernorm.weight", h), O: b.product(p+"self_attn.o_proj.weight", h, H*m.VDim)}
	w := &MLAWeights{
		KVA:     b.product(p+"self_attn.kv_a_proj_with_mqa.weight", rank+m.RopeDim, h),
		KVANorm: b.vector(p+"self_attn.kv_a_layernorm.weight", rank),
		KVB:     b.matrix(p+"self_attn.kv_b_proj.weight", H*(m.NopeDim+m.VDim), rank),
	}
	if m.QLoRARank > 0 {
		w.QA = b.product(p+"self_attn.q_a_proj.weight", m.QLoRARank, h)
		w.QANorm = b.vector(p+"self_attn.q_a_layernorm.weight", m.QLoRARank)
		w.QB = b.product(p+"self_attn.q_b_proj.weight", H*qk, m.QLoRARank)
	} else {
		a.Q = b.product(p+"self_attn.q_proj.weight", H*qk, h)
	}
	switch {
	case b.err == nil && b.shapes:
		w.ukT = absorbedKeysShape(w.KVB, H, m.NopeDim)
	case b.err == nil:
		w.ukT, b.err = absorbedKeys(w.KVB, H, m.NopeDim, m.VDim)
	}
	if b.err == nil { // held beside the checkpoint's
		*b.bytes += int64(w.ukT.Rows) * int64(w.ukT.DType.RowBytes(w.ukT.Cols))
	}
	if b.err == nil && w.KVB.DType == kernels.F8E4M3 {
		w.uv = headValueRows(w.KVB, m, H, b.shapes)
		for _, u := range w.uv {
			if u.DType == kernels.F32 { // dequantized: held beside the checkpoint's
				*b.bytes += int64(u.Rows) * int64(u.DType.RowBytes(u.Cols))
			}
		}
	}
	a.MLA = w
	return a
}
