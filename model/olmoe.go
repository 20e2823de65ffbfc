package model

// OLMoE (OlmoeForCausalLM): Mixtral's decoder with an RMSNorm over the
// whole query projection (hidden size) and the whole key projection (kv
// heads x head_dim) before the heads are split and rotated, queries, keys
// and values clamped to clip_qkv when the config sets it, and a sparse
// block whose softmax top-k weights are renormalised only when
// norm_topk_prob. Experts are intermediate_size wide, counted by
// num_experts, named mlp.experts.E.{gate,up,down}_proj. Defaults are
// transformers' OlmoeConfig's.
func init() {
	register("OlmoeForCausalLM", &architecture{
		modelType: "olmoe",
		defaults: Config{
			HiddenSize: 2048, IntermediateSize: 1024, NumLayers: 16,
			NumHeads: 16, NumKVHeads: 16, NumExperts: 64, TopK: 8,
			VocabSize: 50304, MaxPositions: 4096,
			RMSNormEps: 1e-5, RopeTheta: 1e4, NormTopK: false,
		},
		embed:     "model.embed_tokens.weight",
		finalNorm: "model.norm.weight",
		lmHead:    "lm_head.weight",
		layer: func(b *binder, c Config, l int) Layer {
			p := per("model.layers.%d.", l)
			a := b.attention(c, p)
			a.QNorm = b.vector(p+"self_attn.q_norm.weight", c.NumHeads*c.HeadDim) // the whole projection
			a.KNorm = b.vector(p+"self_attn.k_norm.weight", c.NumKVHeads*c.HeadDim)
			return Layer{Attention: a, MoE: b.moe(c, p, "mlp.gate.weight")}
		},
		expertNames: mlpExpertNames,
	})
}
