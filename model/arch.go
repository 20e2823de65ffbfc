package model

import "fmt"

// architecture binds one Hugging Face model family to odmoe's blocks
// (block.go): its config defaults, its tensor names, and how its layers
// are made of blocks. A new MoE family is a new file that registers one
// of these.
type architecture struct {
	// modelType is config.json's model_type for the family (transformers'
	// config class's); another one is refused.
	modelType string
	// alsoModelTypes are other model_types a checkpoint of the family
	// publishes itself under (Kimi K2's "kimi_k2": DeepSeek-V3's code and
	// tensors, the name its makers gave it so engines can tell it apart).
	alsoModelTypes []string
	defaults       Config
	// denseLayers: the family honours decoder_sparse_step and
	// mlp_only_layers (Config.DenseLayers); others ignore them, as
	// transformers does.
	denseLayers bool
	// windowFlag: the family's sliding_window applies only where
	// use_sliding_window says so (the Qwen families: transformers gives
	// layers a window only then, from max_window_layers on).
	windowFlag bool
	// Embed, FinalNorm and LMHead name the model's outer tensors.
	embed, finalNorm, lmHead string
	// config, if set, reads the family's own config.json fields into c
	// (after the common ones, before the checks).
	config func(r *rawConfig, c *Config) error
	// layer binds layer l's blocks, all but the experts.
	layer func(b *binder, c Config, l int) Layer
	// expertNames names the gate, up and down matrices of expert e of
	// layer l (w1, w3, w2 in Mixtral's naming).
	expertNames func(l, e int) (gate, up, down string)
	// A family whose checkpoint stacks each layer's experts in a few
	// tensors (gpt-oss) names them with stackedExperts (their first
	// dimension is the expert) and binds them with experts instead.
	stackedExperts func(c Config, l int) []string
	experts        func(b *binder, c Config, l int) []Expert
	// quantMethods are the quantization_config.quant_method values the
	// family reads as such; any other is refused.
	quantMethods []string
}

var architectures = map[string]*architecture{}

func register(name string, a *architecture) {
	if _, dup := architectures[name]; dup {
		panic("model: architecture registered twice: " + name)
	}
	architectures[name] = a
}

// per fills a per-layer or per-expert name pattern.
func per(pattern string, a ...any) string { return fmt.Sprintf(pattern, a...) }

// attention binds the attention block every family names alike:
// input_layernorm and self_attn.{q,k,v,o}_proj of layer prefix p. A family
// adds what its attention has beyond that (norms, biases).
func (b *binder) attention(c Config, p string) Attention {
	h, q, kv := c.HiddenSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	return Attention{
		Norm: b.vector(p+"input_layernorm.weight", h),
		Q:    b.product(p+"self_attn.q_proj.weight", q, h),
		K:    b.product(p+"self_attn.k_proj.weight", kv, h),
		V:    b.product(p+"self_attn.v_proj.weight", kv, h),
		O:    b.product(p+"self_attn.o_proj.weight", h, q),
	}
}

// moe binds a sparse block: post_attention_layernorm and the router
// (named router, under layer prefix p); the experts are bound apart.
func (b *binder) moe(c Config, p, router string) *MoE {
	return &MoE{
		Norm:     b.vector(p+"post_attention_layernorm.weight", c.HiddenSize),
		Router:   b.matrix(p+router, c.NumExperts, c.HiddenSize),
		NormTopK: c.NormTopK,
	}
}

// ffn binds layer l's feed-forward block: a sparse block (moe, with the
// router named router) or, for a dense layer, post_attention_layernorm
// and the SwiGLU mlp.{gate,up,down}_proj of intermediate_size.
func (b *binder) ffn(c Config, l int, p, router string) Layer {
	if c.Sparse(l) {
		return Layer{MoE: b.moe(c, p, router)}
	}
	h, in := c.HiddenSize, c.DenseIntermediateSize
	return Layer{Dense: &Dense{
		Norm: b.vector(p+"post_attention_layernorm.weight", h),
		MLP: Expert{
			Gate: b.product(p+"mlp.gate_proj.weight", in, h),
			Up:   b.product(p+"mlp.up_proj.weight", in, h),
			Down: b.product(p+"mlp.down_proj.weight", h, in),
		},
	}}
}

// mlpExpertNames names expert e of layer l as the Qwen and OLMoE families
// do: mlp.experts.E.{gate,up,down}_proj.
func mlpExpertNames(l, e int) (gate, up, down string) {
	p := per("model.layers.%d.mlp.experts.%d.", l, e)
	return p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"
}
