package model

// Mixtral (MixtralForCausalLM): pre-norm decoder, grouped-query attention
// with rotate-half RoPE, and a sparse MoE block of SwiGLU experts whose
// top-k softmax weights are renormalised. Defaults are those of
// transformers' MixtralConfig.
func init() {
	register("MixtralForCausalLM", &architecture{
		modelType: "mixtral",
		defaults: Config{
			HiddenSize: 4096, IntermediateSize: 14336, NumLayers: 32,
			NumHeads: 32, NumKVHeads: 8, NumExperts: 8, TopK: 2,
			VocabSize: 32000, MaxPositions: 4096 * 32,
			RMSNormEps: 1e-5, RopeTheta: 1e6, NormTopK: true,
		},
		embed:     "model.embed_tokens.weight",
		finalNorm: "model.norm.weight",
		lmHead:    "lm_head.weight",
		layer: func(b *binder, c Config, l int) Layer {
			p := per("model.layers.%d.", l)
			return Layer{Attention: b.attention(c, p), MoE: b.moe(c, p, "block_sparse_moe.gate.weight")}
		},
		expertNames: func(l, e int) (gate, up, down string) {
			p := per("model.layers.%d.block_sparse_moe.experts.%d.", l, e)
			return p + "w1.weight", p + "w3.weight", p + "w2.weight"
		},
	})
}
