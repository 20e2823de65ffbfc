package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Config is the part of a Hugging Face config.json that odmoe uses, with
// Hugging Face's defaults filled in for absent fields.
type Config struct {
	Architecture     string  // architectures[0], e.g. "MixtralForCausalLM"
	ModelType        string  // model_type, e.g. "mixtral"
	HiddenSize       int     // hidden_size
	IntermediateSize int     // an expert's: moe_intermediate_size in the families with dense layers, else intermediate_size
	NumLayers        int     // num_hidden_layers
	NumHeads         int     // num_attention_heads
	NumKVHeads       int     // num_key_value_heads
	HeadDim          int     // head_dim, default hidden_size / num_attention_heads
	NumExperts       int     // num_local_experts (Mixtral) or num_experts (Qwen)
	TopK             int     // num_experts_per_tok
	VocabSize        int     // vocab_size
	MaxPositions     int     // max_position_embeddings
	RMSNormEps       float64 // rms_norm_eps
	RopeTheta        float64 // rope_theta
	// RopeScaling is rope_scaling ("linear" or "yarn"); nil for none.
	RopeScaling   *RopeScaling
	TieEmbeddings bool // tie_word_embeddings
	SlidingWindow int  // sliding_window, 0 = none
	// LayerWindows, when set (gpt-oss's layer_types), is each layer's
	// window instead (0: full attention).
	LayerWindows []int
	// Quantization is quantization_config.quant_method, one the family
	// reads ("mxfp4": gpt-oss's experts as published; "fp8": DeepSeek-V3's
	// weights); "" for none.
	Quantization string
	// SwiGLULimit is gpt-oss's swiglu_limit, its experts' clamp;
	// AttentionBias its attention_bias (biases on q, k, v and o).
	SwiGLULimit   float64
	AttentionBias bool
	BOS           int    // bos_token_id, -1 = none
	EOS           []int  // eos_token_id (int or list)
	TorchDType    string // torch_dtype, informational
	// NormTopK renormalises each token's top-k routing weights to sum to
	// one: norm_topk_prob where the family has it, else the family's rule
	// (Mixtral always).
	NormTopK bool
	// ClipQKV clamps queries, keys and values to [-ClipQKV, ClipQKV]
	// after their projections and norms (OLMoE's clip_qkv); 0: none.
	ClipQKV float64
	// SharedIntermediateSize is the width of a shared expert every token
	// runs beside its routed ones (Qwen2-MoE's
	// shared_expert_intermediate_size); 0: none.
	SharedIntermediateSize int
	// DenseLayers lists, ascending, the layers whose feed-forward block is
	// a dense SwiGLU MLP run with the non-expert weights instead of a
	// sparse block (Qwen's mlp_only_layers and decoder_sparse_step);
	// DenseIntermediateSize is that MLP's width (intermediate_size).
	DenseLayers           []int
	DenseIntermediateSize int
	// MLA is Multi-head Latent Attention's shape (DeepSeek-V3); nil for
	// grouped-query attention.
	MLA *MLAConfig
	// RouterGroups, RouterGroupsKept and RoutedScale are DeepSeek-V3's
	// router (n_group, topk_group, routed_scaling_factor: GroupRouting);
	// RouterGroups 0 for the softmax router.
	RouterGroups, RouterGroupsKept int
	RoutedScale                    float64
}

// MLAConfig is Multi-head Latent Attention's shape: queries through a
// low-rank projection (QLoRARank; 0: q_proj), keys and values through
// one of KVLoRARank shared by all heads plus a rotary key of RopeDim, each
// head's query and key NopeDim+RopeDim wide and its value VDim.
type MLAConfig struct {
	QLoRARank, KVLoRARank  int // q_lora_rank, kv_lora_rank
	NopeDim, RopeDim, VDim int // qk_nope_head_dim, qk_rope_head_dim, v_head_dim
}

// KVWidth is the floats a KV cache row holds per layer and position: the
// keys (and as many values) of every KV head, or MLA's latent and rotary
// key, which serve as both.
func (c Config) KVWidth() int {
	if c.MLA != nil {
		return c.MLA.KVLoRARank + c.MLA.RopeDim
	}
	return c.NumKVHeads * c.HeadDim
}

// WindowOf is layer l's attention window: how many positions, its own
// included, each query reads; 0 for all of them.
func (c Config) WindowOf(l int) int {
	if c.LayerWindows != nil {
		return c.LayerWindows[l]
	}
	return c.SlidingWindow
}

// Sparse reports whether layer l has a sparse (MoE) block.
func (c Config) Sparse(l int) bool {
	_, dense := slices.BinarySearch(c.DenseLayers, l)
	return !dense
}

// ExpertLayers lists, ascending, the layers that have experts: every
// layer but the dense ones.
func (c Config) ExpertLayers() []int {
	var ls []int
	for l := range c.NumLayers {
		if c.Sparse(l) {
			ls = append(ls, l)
		}
	}
	return ls
}

// rawConfig mirrors config.json; pointers tell absent fields from zeros.
type rawConfig struct {
	Architectures    []string        `json:"architectures"`
	ModelType        string          `json:"model_type"`
	HiddenSize       *int            `json:"hidden_size"`
	IntermediateSize *int            `json:"intermediate_size"`
	NumLayers        *int            `json:"num_hidden_layers"`
	NumHeads         *int            `json:"num_attention_heads"`
	NumKVHeads       *int            `json:"num_key_value_heads"`
	HeadDim          *int            `json:"head_dim"`
	NumExperts       *int            `json:"num_local_experts"`
	NumExpertsQwen   *int            `json:"num_experts"`
	MoEIntermediate  *int            `json:"moe_intermediate_size"`
	NormTopKProb     *bool           `json:"norm_topk_prob"`
	SparseStep       *int            `json:"decoder_sparse_step"`
	MLPOnlyLayers    []int           `json:"mlp_only_layers"`
	ClipQKV          *float64        `json:"clip_qkv"`
	SharedInter      *int            `json:"shared_expert_intermediate_size"`
	TopK             *int            `json:"num_experts_per_tok"`
	VocabSize        *int            `json:"vocab_size"`
	MaxPositions     *int            `json:"max_position_embeddings"`
	RMSNormEps       *float64        `json:"rms_norm_eps"`
	RopeTheta        *float64        `json:"rope_theta"`
	RopeScaling      json.RawMessage `json:"rope_scaling"`
	Quantization     *struct {
		Method    string `json:"quant_method"`
		Fmt       string `json:"fmt"`               // fp8: "e4m3"
		BlockSize []int  `json:"weight_block_size"` // fp8: [128, 128]
	} `json:"quantization_config"`
	TieEmbeddings    *bool           `json:"tie_word_embeddings"`
	SlidingWindow    *int            `json:"sliding_window"`
	UseSlidingWindow *bool           `json:"use_sliding_window"`
	MaxWindowLayers  *int            `json:"max_window_layers"`
	BOS              *int            `json:"bos_token_id"`
	EOS              json.RawMessage `json:"eos_token_id"`
	TorchDType       string          `json:"torch_dtype"`
	// DeepSeek-V3's
	QLoRARank      json.RawMessage `json:"q_lora_rank"` // null (no q_lora) differs from absent (the default)
	KVLoRARank     *int            `json:"kv_lora_rank"`
	QKNopeHeadDim  *int            `json:"qk_nope_head_dim"`
	QKRopeHeadDim  *int            `json:"qk_rope_head_dim"`
	VHeadDim       *int            `json:"v_head_dim"`
	NRoutedExperts *int            `json:"n_routed_experts"`
	NSharedExperts *int            `json:"n_shared_experts"`
	FirstKDense    *int            `json:"first_k_dense_replace"`
	NGroup         *int            `json:"n_group"`
	TopKGroup      *int            `json:"topk_group"`
	RoutedScaling  *float64        `json:"routed_scaling_factor"`
	ScoringFunc    *string         `json:"scoring_func"`
	TopKMethod     *string         `json:"topk_method"`
	RopeInterleave *bool           `json:"rope_interleave"`
	AttentionBias  *bool           `json:"attention_bias"`
	// gpt-oss's
	LayerTypes  []string `json:"layer_types"`
	SwiGLULimit *float64 `json:"swiglu_limit"`
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "index.bin")); errors.Is(err, fs.ErrNotExist) && serr == nil {
			return Config{}, fmt.Errorf("model: %s is an expert store (index.bin), not a model directory: give -model the Hugging Face directory (config.json, *.safetensors) the store was converted from; the store is the workers' -store", dir)
		}
		return Config{}, fmt.Errorf("model: %w (a model directory holds a Hugging Face config.json and *.safetensors)", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses config.json bytes and checks that odmoe supports the
// architecture and that the shapes are consistent.
func ParseConfig(b []byte) (Config, error) {
	var r rawConfig
	if err := json.Unmarshal(b, &r); err != nil {
		return Config{}, fmt.Errorf("bad config JSON: %w", err)
	}
	if len(r.Architectures) == 0 {
		return Config{}, fmt.Errorf(`field "architectures" is missing or empty`)
	}
	arch, ok := architectures[r.Architectures[0]]
	if !ok {
		return Config{}, fmt.Errorf(`field "architectures" is %q; supported: %s`, r.Architectures[0], strings.Join(SupportedArchitectures(), ", "))
	}
	if r.ModelType != "" && r.ModelType != arch.modelType && !slices.Contains(arch.alsoModelTypes, r.ModelType) {
		return Config{}, fmt.Errorf(`field "model_type" is %q, and "architectures" says %s, whose model_type is %q`, r.ModelType, r.Architectures[0], arch.modelType)
	}
	d := arch.defaults
	c := Config{
		Architecture:           r.Architectures[0],
		ModelType:              r.ModelType,
		HiddenSize:             or(r.HiddenSize, d.HiddenSize),
		IntermediateSize:       or(r.IntermediateSize, d.IntermediateSize),
		NumLayers:              or(r.NumLayers, d.NumLayers),
		NumHeads:               or(r.NumHeads, d.NumHeads),
		NumKVHeads:             or(r.NumKVHeads, d.NumKVHeads),
		NumExperts:             or(r.NumExperts, or(r.NumExpertsQwen, d.NumExperts)),
		NormTopK:               or(r.NormTopKProb, d.NormTopK),
		ClipQKV:                or(r.ClipQKV, 0),
		SharedIntermediateSize: or(r.SharedInter, d.SharedIntermediateSize),
		TopK:                   or(r.TopK, d.TopK),
		VocabSize:              or(r.VocabSize, d.VocabSize),
		MaxPositions:           or(r.MaxPositions, d.MaxPositions),
		RMSNormEps:             or(r.RMSNormEps, d.RMSNormEps),
		RopeTheta:              or(r.RopeTheta, d.RopeTheta),
		TieEmbeddings:          or(r.TieEmbeddings, d.TieEmbeddings),
		SlidingWindow:          or(r.SlidingWindow, 0),
		BOS:                    or(r.BOS, -1),
		TorchDType:             r.TorchDType,
	}
	if arch.denseLayers {
		// these families name an expert's width moe_intermediate_size and
		// keep intermediate_size for their dense layers
		c.IntermediateSize = or(r.MoEIntermediate, d.IntermediateSize)
		// transformers' rule: layer l is sparse unless it is in
		// mlp_only_layers or (l+1) is not a multiple of decoder_sparse_step
		step := or(r.SparseStep, 1)
		if step < 1 {
			return Config{}, fmt.Errorf(`field "decoder_sparse_step" is %d; must be positive`, step)
		}
		for l := range c.NumLayers {
			if slices.Contains(r.MLPOnlyLayers, l) || (l+1)%step != 0 {
				c.DenseLayers = append(c.DenseLayers, l)
			}
		}
		for _, l := range r.MLPOnlyLayers {
			if l < 0 || l >= c.NumLayers {
				return Config{}, fmt.Errorf(`field "mlp_only_layers" names layer %d; the model has layers 0..%d`, l, c.NumLayers-1)
			}
		}
		if len(c.DenseLayers) > 0 {
			c.DenseIntermediateSize = or(r.IntermediateSize, d.DenseIntermediateSize)
		}
	}
	if q := r.Quantization; q != nil {
		// a quantized checkpoint's weights are not what its dtypes say:
		// only the formats a family reads as such are taken
		if !slices.Contains(arch.quantMethods, q.Method) {
			return Config{}, fmt.Errorf(`field "quantization_config" says %q: odmoe reads unquantized checkpoints (BF16, F16, F32), gpt-oss's "mxfp4" experts and DeepSeek-V3's "fp8" weights`, q.Method)
		}
		c.Quantization = q.Method
	}
	rs, err := parseRopeScaling(r.RopeScaling)
	if err != nil {
		return Config{}, err
	}
	c.RopeScaling = rs
	c.HeadDim = or(r.HeadDim, 0)
	if arch.windowFlag {
		// transformers: layer l has the window when use_sliding_window and
		// l >= max_window_layers (28 if absent)
		from := or(r.MaxWindowLayers, 28)
		switch {
		case !or(r.UseSlidingWindow, false) || from >= c.NumLayers:
			c.SlidingWindow = 0 // sliding_window is only the size it would have
		case c.SlidingWindow > 0 && from > 0:
			return Config{}, fmt.Errorf(`fields "use_sliding_window" and "max_window_layers" (%d) give only layers %d and later a window; odmoe windows all layers or none`, from, from)
		}
	}
	if arch.config != nil {
		if err := arch.config(&r, &c); err != nil {
			return Config{}, err
		}
	}
	if c.HeadDim == 0 && c.NumHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	if len(r.EOS) > 0 && string(r.EOS) != "null" {
		var one int
		if err := json.Unmarshal(r.EOS, &one); err == nil {
			c.EOS = []int{one}
		} else if err := json.Unmarshal(r.EOS, &c.EOS); err != nil {
			return Config{}, fmt.Errorf(`field "eos_token_id" is %s; want an integer or a list of integers`, r.EOS)
		}
	}
	return c, c.validate()
}

func or[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func (c Config) validate() error {
	positive := []struct {
		field string
		v     int
	}{
		{"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumLayers}, {"num_attention_heads", c.NumHeads},
		{"num_key_value_heads", c.NumKVHeads}, {"head_dim", c.HeadDim},
		{"num_local_experts", c.NumExperts}, {"num_experts_per_tok", c.TopK},
		{"vocab_size", c.VocabSize}, {"max_position_embeddings", c.MaxPositions},
	}
	if len(c.DenseLayers) > 0 {
		positive = append(positive, struct {
			field string
			v     int
		}{"intermediate_size", c.DenseIntermediateSize})
	}
	for _, p := range positive {
		if p.v <= 0 {
			return fmt.Errorf("field %q is %d; must be positive", p.field, p.v)
		}
	}
	if len(c.DenseLayers) == c.NumLayers {
		return fmt.Errorf(`fields "mlp_only_layers" and "decoder_sparse_step" make every layer dense; odmoe runs models with experts`)
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf(`field "num_attention_heads" (%d) is not a multiple of "num_key_value_heads" (%d)`, c.NumHeads, c.NumKVHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf(`field "head_dim" is %d; rotary embeddings need it even`, c.HeadDim)
	}
	if c.TopK > c.NumExperts {
		return fmt.Errorf(`field "num_experts_per_tok" (%d) exceeds "num_local_experts" (%d)`, c.TopK, c.NumExperts)
	}
	if c.RMSNormEps <= 0 {
		return fmt.Errorf(`field "rms_norm_eps" is %g; must be positive`, c.RMSNormEps)
	}
	if c.RopeTheta <= 0 {
		return fmt.Errorf(`field "rope_theta" is %g; must be positive`, c.RopeTheta)
	}
	if c.ClipQKV < 0 {
		return fmt.Errorf(`field "clip_qkv" is %g; must be positive or null`, c.ClipQKV)
	}
	if c.SlidingWindow < 0 {
		return fmt.Errorf(`field "sliding_window" is %d; must be positive or null`, c.SlidingWindow)
	}
	return nil
}

// SupportedArchitectures lists the values of "architectures" odmoe loads.
func SupportedArchitectures() []string {
	var names []string
	for n := range architectures {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// IsEOS reports whether id ends generation.
func (c Config) IsEOS(id int) bool {
	for _, e := range c.EOS {
		if e == id {
			return true
		}
	}
	return false
}
