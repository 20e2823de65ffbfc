package model

// Qwen3-MoE (Qwen3MoeForCausalLM): Mixtral's decoder with a head_dim of its
// own (not hidden/heads), an RMSNorm over head_dim on every query and key
// head before RoPE, and a sparse block whose softmax top-k weights are
// renormalised only when norm_topk_prob. Its experts are
// moe_intermediate_size wide, counted by num_experts, named
// mlp.experts.E.{gate,up,down}_proj. Defaults are transformers'
// Qwen3MoeConfig's. Layers in mlp_only_layers, or not on the
// decoder_sparse_step, are dense: a SwiGLU mlp.{gate,up,down}_proj of
// intermediate_size, run with the non-expert weights.
func init() {
	register("Qwen3MoeForCausalLM", &architecture{
		modelType:   "qwen3_moe",
		denseLayers: true,
		windowFlag:  true,
		defaults: Config{
			HiddenSize: 2048, IntermediateSize: 768, NumLayers: 24,
			NumHeads: 32, NumKVHeads: 4, NumExperts: 128, TopK: 8,
			VocabSize: 151936, MaxPositions: 32768,
			RMSNormEps: 1e-6, RopeTheta: 1e4, NormTopK: false,
			DenseIntermediateSize: 6144,
		},
		embed:     "model.embed_tokens.weight",
		finalNorm: "model.norm.weight",
		lmHead:    "lm_head.weight",
		layer: func(b *binder, c Config, l int) Layer {
			p := per("model.layers.%d.", l)
			a := b.attention(c, p)
			a.QNorm = b.vector(p+"self_attn.q_norm.weight", c.HeadDim) // per head
			a.KNorm = b.vector(p+"self_attn.k_norm.weight", c.HeadDim)
			L := b.ffn(c, l, p, "mlp.gate.weight")
			L.Attention = a
			return L
		},
		expertNames: mlpExpertNames,
	})
}
