package model

// Mixtral (MixtralForCausalLM): pre-norm decoder, grouped-query attention
// with rotate-half RoPE, and a sparse MoE block of SwiGLU experts whose
// top-k softmax weights are renormalised. Defaults are those of
// transformers' MixtralConfig.
func init() {
	register("MixtralForCausalLM", &architecture{
		defaults: Config{
			HiddenSize: 4096, IntermediateSize: 14336, NumLayers: 32,
			NumHeads: 32, NumKVHeads: 8, NumExperts: 8, TopK: 2,
			VocabSize: 32000, MaxPositions: 4096 * 32,
			RMSNormEps: 1e-5, RopeTheta: 1e6,
		},
		names: tensorNames{
			Embed:      "model.embed_tokens.weight",
			FinalNorm:  "model.norm.weight",
			LMHead:     "lm_head.weight",
			AttnNorm:   "model.layers.%d.input_layernorm.weight",
			FFNNorm:    "model.layers.%d.post_attention_layernorm.weight",
			Q:          "model.layers.%d.self_attn.q_proj.weight",
			K:          "model.layers.%d.self_attn.k_proj.weight",
			V:          "model.layers.%d.self_attn.v_proj.weight",
			O:          "model.layers.%d.self_attn.o_proj.weight",
			Router:     "model.layers.%d.block_sparse_moe.gate.weight",
			ExpertGate: "model.layers.%d.block_sparse_moe.experts.%d.w1.weight",
			ExpertUp:   "model.layers.%d.block_sparse_moe.experts.%d.w3.weight",
			ExpertDown: "model.layers.%d.block_sparse_moe.experts.%d.w2.weight",
		},
		normTopK: true,
	})
}
