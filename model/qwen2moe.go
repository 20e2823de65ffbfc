package model

// Qwen2-MoE (Qwen2MoeForCausalLM, also Qwen1.5-MoE): Mixtral's decoder with
// biases on the query, key and value projections, a sparse block whose
// softmax top-k weights are renormalised only when norm_topk_prob, and a
// shared expert (mlp.shared_expert, shared_expert_intermediate_size wide)
// that every token runs, scaled by sigmoid(mlp.shared_expert_gate(x)) and
// added to the routed mix. The shared expert is held and run with the
// non-expert weights, on the main node (MoE.Shared). Routed experts are
// moe_intermediate_size wide, counted by num_experts, named
// mlp.experts.E.{gate,up,down}_proj. Dense layers (mlp_only_layers,
// decoder_sparse_step) as in Qwen3-MoE. Defaults are transformers'
// Qwen2MoeConfig's.
func init() {
	register("Qwen2MoeForCausalLM", &architecture{
		modelType:   "qwen2_moe",
		denseLayers: true,
		windowFlag:  true,
		defaults: Config{
			HiddenSize: 2048, IntermediateSize: 1408, NumLayers: 24,
			NumHeads: 16, NumKVHeads: 16, NumExperts: 60, TopK: 4,
			VocabSize: 151936, MaxPositions: 32768,
			RMSNormEps: 1e-6, RopeTheta: 1e4, NormTopK: false,
			DenseIntermediateSize:  5632,
			SharedIntermediateSize: 5632,
		},
		embed:     "model.embed_tokens.weight",
		finalNorm: "model.norm.weight",
		lmHead:    "lm_head.weight",
		layer: func(b *binder, c Config, l int) Layer {
			h, q, kv, si := c.HiddenSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim, c.SharedIntermediateSize
			p := per("model.layers.%d.", l)
			L := b.ffn(c, l, p, "mlp.gate.weight")
			L.Attention = b.attention(c, p)
			L.Attention.QBias = b.vector(p+"self_attn.q_proj.bias", q)
			L.Attention.KBias = b.vector(p+"self_attn.k_proj.bias", kv)
			L.Attention.VBias = b.vector(p+"self_attn.v_proj.bias", kv)
			if si > 0 && L.MoE != nil {
				L.MoE.Shared = &Expert{
					Gate: b.product(p+"mlp.shared_expert.gate_proj.weight", si, h),
					Up:   b.product(p+"mlp.shared_expert.up_proj.weight", si, h),
					Down: b.product(p+"mlp.shared_expert.down_proj.weight", h, si),
				}
				L.MoE.SharedGate = b.matrix(p+"mlp.shared_expert_gate.weight", 1, h)
			}
			return L
		},
		expertNames: mlpExpertNames,
	})
}
