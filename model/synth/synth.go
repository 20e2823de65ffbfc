// Package synth writes deterministic random MoE checkpoints (Mixtral,
// Qwen3-MoE) in exactly
// the Hugging Face layout (config.json, model.safetensors in BF16,
// tokenizer.json, tokenizer_config.json, generation_config.json), for
// tests, demos and benchmarks. Nothing is ever downloaded: the tokenizer is
// trained on a built-in corpus unless a real tokenizer.json is adopted,
// and tokenizer_config.json carries the family's real chat template.
//
// Weights are drawn like a trained model's so that the statistics later
// stages depend on are realistic: matrices N(0, 0.02) (the BF16 exponent
// entropy the store compresses), norm weights near 1, and the router scaled
// so that its top-1 probability is typically 0.3-0.6 (so that expert
// prediction is neither trivial nor a coin toss).
package synth

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/chat"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/model/tokenizer"
)

// Preset is a model shape.
type Preset struct {
	Name string
	// Family is the Hugging Face architecture: "" or "mixtral"
	// (MixtralForCausalLM), "qwen3-moe" (Qwen3MoeForCausalLM), "olmoe"
	// (OlmoeForCausalLM), "qwen2-moe" (Qwen2MoeForCausalLM), "deepseek-v3"
	// (DeepseekV3ForCausalLM), "gpt-oss" (GptOssForCausalLM).
	Family             string
	ClipQKV            float64 // OLMoE's clip_qkv; 0: none
	SharedIntermediate int     // Qwen2-MoE's shared expert
	// MLPOnlyLayers are dense layers (Qwen's mlp_only_layers): a SwiGLU
	// MLP of DenseIntermediate instead of experts.
	MLPOnlyLayers     []int
	DenseIntermediate int
	// DeepSeek-V3's Multi-head Latent Attention (QLoRA 0: q_proj) and
	// router (RouterGroups of which RouterGroupsKept kept, RoutedScale);
	// its dense first layers are MLPOnlyLayers, its shared experts
	// SharedIntermediate wide in all (a multiple of Intermediate).
	QLoRA, KVLoRA, NopeDim, RopeDim, VDim int
	RouterGroups, RouterGroupsKept        int
	RoutedScale                           float64
	// YaRN, if set, is config.json's rope_scaling.
	YaRN map[string]any
	// gpt-oss's sliding_window (its even layers have it, its odd ones
	// attend to everything) and swiglu_limit.
	SlidingWindow int
	SwiGLULimit   float64
	// MXFP4: the experts as gpt-oss publishes them, MXFP4 blocks and
	// scales (quantization_config "mxfp4"), drawn as the BF16 ones and
	// quantized as the OCP MX specification does.
	MXFP4 bool
	// FP8: DeepSeek-V3's projections as DeepSeek publishes them, F8_E4M3
	// with a float32 weight_scale_inv per 128x128 block
	// (quantization_config "fp8"), drawn as the BF16 ones and quantized
	// as DeepSeek's FP8 cast does (scale = amax/448 per block).
	FP8              bool
	Hidden           int
	Intermediate     int  // an expert's
	HeadDim          int  // 0: Hidden / Heads
	NormTopK         bool // Qwen's norm_topk_prob
	Layers           int
	Heads, KVHeads   int
	Experts, TopK    int
	Vocab            int // 0: the tokenizer's size
	TokenizerVocab   int // merges target for the built-in tokenizer
	MaxPositions     int
	RopeTheta        float64
	TieWordEmbedding bool
}

// Presets are the shapes gen-tiny knows.
var Presets = map[string]Preset{
	// tiny: a few MB, for unit tests.
	"tiny": {Name: "tiny", Hidden: 128, Intermediate: 256, Layers: 4, Heads: 4, KVHeads: 2,
		Experts: 8, TopK: 2, TokenizerVocab: 1024, MaxPositions: 4096, RopeTheta: 1e6},
	// small: ~1.5 GB, for benchmarks.
	"small": {Name: "small", Hidden: 1024, Intermediate: 3584, Layers: 8, Heads: 16, KVHeads: 4,
		Experts: 8, TopK: 2, Vocab: 32000, TokenizerVocab: 4096, MaxPositions: 32768, RopeTheta: 1e6},
	// mixtral-layers: Mixtral-8x7B's real shapes, two layers, for memory tests.
	"mixtral-layers": {Name: "mixtral-layers", Hidden: 4096, Intermediate: 14336, Layers: 2, Heads: 32, KVHeads: 8,
		Experts: 8, TopK: 2, Vocab: 32000, TokenizerVocab: 4096, MaxPositions: 32768, RopeTheta: 1e6},
	// qwen3-moe-tiny: Qwen3-MoE's layer structure (q/k norms, a head_dim
	// apart from hidden/heads, many small experts, top-4) at a few MB.
	// Its middle layer is dense (mlp_only_layers).
	"qwen3-moe-tiny": {Name: "qwen3-moe-tiny", Family: "qwen3-moe", Hidden: 128, Intermediate: 64, HeadDim: 64, NormTopK: true,
		MLPOnlyLayers: []int{1}, DenseIntermediate: 256, Layers: 3, Heads: 4, KVHeads: 2, Experts: 16, TopK: 4, TokenizerVocab: 1024, MaxPositions: 4096, RopeTheta: 1e6},
	// qwen3-moe-small: Qwen3-30B-A3B's real layer (hidden 2048, 32 query
	// and 4 KV heads of head_dim 128, 128 experts of 768, top-8,
	// norm_topk_prob), ~1.5 GB: one layer (128 experts of 9.4 MB are
	// 1.2 GB a layer) and a 32000-token vocabulary, untied as in the real
	// model. The real vocabulary (151936) alone would take 1.24 GB for
	// the embedding and the head; adopt Qwen3's tokenizer.json with
	// gen-tiny -tokenizer for that (~2.5 GB).
	"qwen3-moe-small": {Name: "qwen3-moe-small", Family: "qwen3-moe", Hidden: 2048, Intermediate: 768, HeadDim: 128, NormTopK: true,
		Layers: 1, Heads: 32, KVHeads: 4, Experts: 128, TopK: 8, Vocab: 32000, TokenizerVocab: 4096, MaxPositions: 40960, RopeTheta: 1e6},
	// olmoe-tiny: OLMoE's layer structure (q/k norms over the whole
	// projections, clip_qkv, many small experts, top-4, routing weights
	// not renormalised) at a few MB.
	"olmoe-tiny": {Name: "olmoe-tiny", Family: "olmoe", Hidden: 128, Intermediate: 64, ClipQKV: 2,
		Layers: 3, Heads: 4, KVHeads: 4, Experts: 16, TopK: 4, TokenizerVocab: 1024, MaxPositions: 4096, RopeTheta: 1e4},
	// olmoe-small: OLMoE-1B-7B's real layer (hidden 2048, 16 heads of
	// 128 without GQA, 64 experts of 1024, top-8, no clip_qkv, routing
	// weights not renormalised) and real vocabulary size (50304, untied),
	// one layer: ~1.25 GB.
	"olmoe-small": {Name: "olmoe-small", Family: "olmoe", Hidden: 2048, Intermediate: 1024,
		Layers: 1, Heads: 16, KVHeads: 16, Experts: 64, TopK: 8, Vocab: 50304, TokenizerVocab: 4096, MaxPositions: 4096, RopeTheta: 1e4},
	// qwen2-moe-small: Qwen1.5-MoE-A2.7B's real layer (hidden 2048, 16
	// heads of 128 without GQA, q/k/v biases, 60 experts of 1408, top-4,
	// a shared expert of 5632 with its gate), one layer and a 32000-token
	// vocabulary (the real 151936 would be 1.24 GB alone): ~1.4 GB.
	"qwen2-moe-small": {Name: "qwen2-moe-small", Family: "qwen2-moe", Hidden: 2048, Intermediate: 1408, SharedIntermediate: 5632,
		Layers: 1, Heads: 16, KVHeads: 16, Experts: 60, TopK: 4, Vocab: 32000, TokenizerVocab: 4096, MaxPositions: 8192, RopeTheta: 1e6},
	// qwen2-moe-tiny: Qwen2-MoE's layer structure (q/k/v biases, a shared
	// expert with its sigmoid gate beside 16 routed ones, top-4) at a few
	// MB. Its first layer is dense (mlp_only_layers).
	"qwen2-moe-tiny": {Name: "qwen2-moe-tiny", Family: "qwen2-moe", Hidden: 128, Intermediate: 64, SharedIntermediate: 128,
		MLPOnlyLayers: []int{0}, DenseIntermediate: 256, Layers: 3, Heads: 4, KVHeads: 2, Experts: 16, TopK: 4, TokenizerVocab: 1024, MaxPositions: 4096, RopeTheta: 1e6},
	// deepseek-v3-tiny: DeepSeek-V3's layer structure (Multi-head Latent
	// Attention with q_lora_rank, a dense first layer, 16 routed experts
	// in 8 groups of which 3 are kept, top-4, a shared expert, the
	// sigmoid router's correction bias in F32, YaRN with mscale as its
	// config.json has it) at a few MB, laid out as deepseek-ai/DeepSeek-V3's
	// BF16 checkpoint (its tensor names, dtypes and config fields).
	"deepseek-v3-tiny": {Name: "deepseek-v3-tiny", Family: "deepseek-v3", Hidden: 128, Intermediate: 64, SharedIntermediate: 64,
		MLPOnlyLayers: []int{0}, DenseIntermediate: 256, Layers: 3, Heads: 4, KVHeads: 4, Experts: 16, TopK: 4, NormTopK: true,
		QLoRA: 48, KVLoRA: 32, NopeDim: 32, RopeDim: 16, VDim: 32, RouterGroups: 8, RouterGroupsKept: 3, RoutedScale: 2.5,
		YaRN:           map[string]any{"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 128, "type": "yarn"},
		TokenizerVocab: 1024, MaxPositions: 4096, RopeTheta: 1e4},
	// deepseek-v3-small: DeepSeek-V3's real layer in FP8 as published
	// (hidden 7168, 128 heads with q_lora_rank 1536 and kv_lora_rank 512,
	// 128 + 64 query/key and 128 value dimensions, 256 experts of 2048 in
	// 8 groups of which 4 are kept, top-8, a shared expert), one sparse
	// layer and a 32000-token vocabulary: ~12.4 GB (the experts alone are
	// 11.3 GB), for benchmarks on a machine with the disk for it.
	"deepseek-v3-small": {Name: "deepseek-v3-small", Family: "deepseek-v3", FP8: true, Hidden: 7168, Intermediate: 2048, SharedIntermediate: 2048,
		Layers: 1, Heads: 128, KVHeads: 128, Experts: 256, TopK: 8, NormTopK: true, Vocab: 32000,
		QLoRA: 1536, KVLoRA: 512, NopeDim: 128, RopeDim: 64, VDim: 128, RouterGroups: 8, RouterGroupsKept: 4, RoutedScale: 2.5,
		YaRN:           map[string]any{"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
		TokenizerVocab: 4096, MaxPositions: 163840, RopeTheta: 1e4},
	// deepseek-v3-tiny-fp8: deepseek-v3-tiny with its projections in FP8,
	// laid out as deepseek-ai/DeepSeek-V3 is published (every attention
	// and MLP projection F8_E4M3 with its weight_scale_inv; the
	// embedding, head, norms, router and correction bias as they were).
	// Its heads are DeepSeek-V3's width (128 no-RoPE and 128 value
	// dimensions), so that each head's value rows of kv_b_proj start a
	// 128-row scale block, as in the real model.
	"deepseek-v3-tiny-fp8": {Name: "deepseek-v3-tiny-fp8", Family: "deepseek-v3", FP8: true, Hidden: 128, Intermediate: 64, SharedIntermediate: 64,
		MLPOnlyLayers: []int{0}, DenseIntermediate: 256, Layers: 3, Heads: 4, KVHeads: 4, Experts: 16, TopK: 4, NormTopK: true,
		QLoRA: 48, KVLoRA: 32, NopeDim: 128, RopeDim: 16, VDim: 128, RouterGroups: 8, RouterGroupsKept: 3, RoutedScale: 2.5,
		YaRN:           map[string]any{"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 128, "type": "yarn"},
		TokenizerVocab: 1024, MaxPositions: 4096, RopeTheta: 1e4},
	// gpt-oss-tiny: gpt-oss's layer structure (attention sinks, biases on
	// q, k, v and o, a sliding window of 8 on even layers and full
	// attention on odd ones, YaRN as its config.json has it, the router's
	// bias and top-k softmax, experts stacked per layer with fused,
	// interleaved gate/up and biases, the clamped SwiGLU at its published
	// limit of 7, which the gate/up products, drawn wide, cross) at a few
	// MB, laid out as gpt-oss-20b's BF16 checkpoint (transformers' tensor
	// names and shapes, config.json's fields).
	"gpt-oss-tiny": {Name: "gpt-oss-tiny", Family: "gpt-oss", Hidden: 128, Intermediate: 64, HeadDim: 32, SlidingWindow: 8, SwiGLULimit: 7,
		Layers: 3, Heads: 4, KVHeads: 2, Experts: 16, TopK: 4,
		YaRN:           map[string]any{"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 128, "rope_type": "yarn", "truncate": false},
		TokenizerVocab: 1024, MaxPositions: 4096, RopeTheta: 150000},
	// gpt-oss-small: gpt-oss-120b's real layer (hidden 2880, 64 query and
	// 8 KV heads of 64, a window of 128, 128 experts of 2880, top-4) with
	// its experts in MXFP4 as published, one layer and a 32000-token
	// vocabulary (the real 201088 would be 2.3 GB alone): ~2.1 GB.
	"gpt-oss-small": {Name: "gpt-oss-small", Family: "gpt-oss", MXFP4: true, Hidden: 2880, Intermediate: 2880, HeadDim: 64, SlidingWindow: 128, SwiGLULimit: 7,
		Layers: 1, Heads: 64, KVHeads: 8, Experts: 128, TopK: 4, Vocab: 32000,
		YaRN:           map[string]any{"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
		TokenizerVocab: 4096, MaxPositions: 131072, RopeTheta: 150000},
	// gpt-oss-tiny-mxfp4: gpt-oss-tiny with its experts in MXFP4, laid out
	// as openai/gpt-oss-20b is published (*_blocks and *_scales in U8,
	// biases in BF16, quantization_config "mxfp4").
	"gpt-oss-tiny-mxfp4": {Name: "gpt-oss-tiny-mxfp4", Family: "gpt-oss", MXFP4: true, Hidden: 128, Intermediate: 64, HeadDim: 32, SlidingWindow: 8, SwiGLULimit: 7,
		Layers: 3, Heads: 4, KVHeads: 2, Experts: 16, TopK: 4,
		YaRN:           map[string]any{"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 128, "rope_type": "yarn", "truncate": false},
		TokenizerVocab: 1024, MaxPositions: 4096, RopeTheta: 150000},
}

// denseIntermediate is the width of a dense layer's MLP (Qwen's
// intermediate_size).
func (p Preset) denseIntermediate() int {
	if p.DenseIntermediate > 0 {
		return p.DenseIntermediate
	}
	return 4 * p.Hidden
}

// byteLevel says whether the family's tokenizer is a byte-level BPE
// (Qwen's, with <|endoftext|>, <|im_start|>, <|im_end|>) rather than
// Mixtral's SentencePiece-style BPE with byte fallback.
func (p Preset) byteLevel() bool { return p.Family == "qwen3-moe" || p.Family == "qwen2-moe" }

// headDim is the preset's attention head width.
func (p Preset) headDim() int {
	if p.HeadDim > 0 {
		return p.HeadDim
	}
	return p.Hidden / p.Heads
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	var n []string
	for k := range Presets {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Options control Generate.
type Options struct {
	Preset string
	Seed   uint64
	// Tokenizer, if set, is a tokenizer.json to adopt; the vocabulary is
	// sized to it. The tokenizer_config.json beside it, if any, is copied
	// as it is, its chat_template (or none) included.
	Tokenizer string
	// Layers and Experts, when positive, override the preset's (tests use
	// Mixtral-shaped experts without generating all of Mixtral).
	Layers, Experts int
	// Progress, if set, is called with bytes of weights written so far and
	// the total.
	Progress func(done, total int64)
}

const (
	weightStd = 0.02
	// routerLogitStd is the spread of router logits on a normalised hidden
	// state; 1.0 over 8 experts gives a mean top-1 probability near 0.45.
	routerLogitStd = 1.0
)

// Generate writes a model into dir, which must not exist or be empty.
func Generate(dir string, opt Options) error {
	p, ok := Presets[opt.Preset]
	if !ok {
		return fmt.Errorf("synth: unknown preset %q (have %s)", opt.Preset, strings.Join(PresetNames(), ", "))
	}
	if opt.Layers > 0 {
		p.Layers = opt.Layers
	}
	if opt.Experts > 0 {
		p.Experts = opt.Experts
	}
	if p.TopK > p.Experts {
		return fmt.Errorf("synth: %d experts cannot serve top-%d routing", p.Experts, p.TopK)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	stamp := stampOf(p, opt)
	tok, err := writeTokenizer(dir, p, opt.Tokenizer)
	if err != nil {
		return err
	}
	if p.Vocab == 0 || opt.Tokenizer != "" {
		p.Vocab = tok.VocabSize()
	}
	if p.Vocab < tok.VocabSize() {
		return fmt.Errorf("synth: preset vocabulary %d is smaller than the tokenizer's %d", p.Vocab, tok.VocabSize())
	}
	if err := writeJSON(filepath.Join(dir, "config.json"), hfConfig(p, tok)); err != nil {
		return err
	}
	gen := map[string]any{"_from_model_config": true, "bos_token_id": bosID(tok), "eos_token_id": firstOr(tok.EOS(), 2), "transformers_version": "4.46.0"}
	if err := writeJSON(filepath.Join(dir, "generation_config.json"), gen); err != nil {
		return err
	}
	if err := writeWeights(filepath.Join(dir, "model.safetensors"), p, opt); err != nil {
		return err
	}
	return writeJSON(filepath.Join(dir, stampFile), stamp)
}

// stampFile records what a generated model was generated from, so that a
// cached model of a preset whose shape has since changed is made anew.
const stampFile = "odmoe-synth.json"

// generatorVersion changes when the same preset and seed would give
// other bytes (a change to the drawing or the files written). 5: the
// family's chat template in tokenizer_config.json.
const generatorVersion = 5

type stamp struct {
	Preset      string `json:"preset"`
	Seed        uint64 `json:"seed"`
	Tokenizer   string `json:"tokenizer,omitempty"`
	Fingerprint string `json:"fingerprint"`
}

func stampOf(p Preset, opt Options) stamp {
	sum := sha256.Sum256(fmt.Appendf(nil, "odmoe synth v%d %#v", generatorVersion, p))
	return stamp{Preset: p.Name, Seed: opt.Seed, Tokenizer: opt.Tokenizer, Fingerprint: hex.EncodeToString(sum[:8])}
}

// bosID is the config's bos_token_id: the tokenizer's, or, for a
// tokenizer that adds none (Qwen's), <|endoftext|> as Qwen's configs say.
func bosID(tok *tokenizer.Tokenizer) any {
	if tok.BOS() >= 0 {
		return tok.BOS()
	}
	if id, ok := tok.TokenID("<|endoftext|>"); ok {
		return id
	}
	return nil
}

func firstOr(v []int, def int) int {
	if len(v) > 0 {
		return v[0]
	}
	return def
}

func writeTokenizer(dir string, p Preset, adopt string) (*tokenizer.Tokenizer, error) {
	if adopt != "" {
		b, err := os.ReadFile(adopt)
		if err != nil {
			return nil, fmt.Errorf("synth: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
			return nil, fmt.Errorf("synth: %w", err)
		}
		side := filepath.Join(filepath.Dir(adopt), "tokenizer_config.json")
		if cb, err := os.ReadFile(side); err == nil {
			if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cb, 0o644); err != nil {
				return nil, fmt.Errorf("synth: %w", err)
			}
		}
		t, err := tokenizer.LoadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("synth: adopting %s: %w", adopt, err)
		}
		return t, nil
	}
	train := tokenizer.TrainSentencePieceBPE // Mixtral's kind
	if p.byteLevel() {
		train = tokenizer.TrainByteLevelBPE
	}
	t, err := train(tokenizer.BuiltinCorpus, p.TokenizerVocab)
	if err != nil {
		return nil, fmt.Errorf("synth: training the built-in tokenizer: %w", err)
	}
	if err := t.WriteFiles(dir); err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	if err := addChatTemplate(filepath.Join(dir, "tokenizer_config.json"), p); err != nil {
		return nil, err
	}
	return tokenizer.LoadDir(dir)
}

// chatTemplates name each family's chat template (package chat's
// built-in copies of the real ones): Mixtral-8x7B-Instruct's, Qwen3's,
// Qwen1.5's for Qwen2-MoE, OLMoE-Instruct's Tulu template.
var chatTemplates = map[string]string{"": "mixtral-instruct", "mixtral": "mixtral-instruct",
	"qwen3-moe": "qwen3", "qwen2-moe": "qwen1.5", "olmoe": "tulu",
	"deepseek-v3": "mixtral-instruct", "gpt-oss": "mixtral-instruct"} // DeepSeek-V3's and gpt-oss's own templates are not built in yet

// addChatTemplate adds the family's chat_template to the
// tokenizer_config.json the tokenizer wrote (which owns no templates).
func addChatTemplate(path string, p Preset) error {
	src, ok := chat.Builtin(chatTemplates[p.Family])
	if !ok {
		return fmt.Errorf("synth: no chat template for family %q", p.Family)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("synth: %s: %w", path, err)
	}
	cfg["chat_template"] = src
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(cfg); err != nil {
		return fmt.Errorf("synth: %s: %w", path, err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	return nil
}

func hfConfig(p Preset, tok *tokenizer.Tokenizer) map[string]any {
	// what every family's config.json has
	c := map[string]any{
		"attention_dropout":       0.0,
		"bos_token_id":            bosID(tok),
		"eos_token_id":            firstOr(tok.EOS(), 2),
		"hidden_act":              "silu",
		"hidden_size":             p.Hidden,
		"initializer_range":       weightStd,
		"max_position_embeddings": p.MaxPositions,
		"num_attention_heads":     p.Heads,
		"num_experts_per_tok":     p.TopK,
		"num_hidden_layers":       p.Layers,
		"num_key_value_heads":     p.KVHeads,
		"rope_theta":              p.RopeTheta,
		"tie_word_embeddings":     p.TieWordEmbedding,
		"torch_dtype":             "bfloat16",
		"transformers_version":    "4.51.0",
		"use_cache":               true,
		"vocab_size":              p.Vocab,
		"odmoe_synth_preset":      p.Name,
	}
	// and what each family names or adds in its own way
	var own map[string]any
	switch p.Family {
	case "qwen3-moe", "qwen2-moe":
		own = map[string]any{
			"architectures":         []string{"Qwen3MoeForCausalLM"},
			"model_type":            "qwen3_moe",
			"attention_bias":        false,
			"decoder_sparse_step":   1,
			"head_dim":              p.headDim(),
			"intermediate_size":     p.denseIntermediate(),
			"mlp_only_layers":       append([]int{}, p.MLPOnlyLayers...),
			"moe_intermediate_size": p.Intermediate,
			"norm_topk_prob":        p.NormTopK,
			"num_experts":           p.Experts,
			"rms_norm_eps":          1e-6,
			"sliding_window":        nil,
			"use_sliding_window":    false,
		}
		if p.Family == "qwen2-moe" { // no head_dim (hidden/heads), biases always, a shared expert
			own["architectures"], own["model_type"] = []string{"Qwen2MoeForCausalLM"}, "qwen2_moe"
			delete(own, "attention_bias")
			delete(own, "head_dim")
			own["shared_expert_intermediate_size"] = p.SharedIntermediate
		}
	case "olmoe":
		var clip any // null unless set
		if p.ClipQKV > 0 {
			clip = p.ClipQKV
		}
		own = map[string]any{
			"architectures":        []string{"OlmoeForCausalLM"},
			"model_type":           "olmoe",
			"attention_bias":       false,
			"clip_qkv":             clip,
			"intermediate_size":    p.Intermediate,
			"norm_topk_prob":       p.NormTopK,
			"num_experts":          p.Experts,
			"output_router_logits": false,
			"rms_norm_eps":         1e-5,
			"router_aux_loss_coef": 0.01,
		}
	case "deepseek-v3":
		var qlora any // null: q_proj
		if p.QLoRA > 0 {
			qlora = p.QLoRA
		}
		own = map[string]any{
			"architectures":            []string{"DeepseekV3ForCausalLM"},
			"model_type":               "deepseek_v3",
			"attention_bias":           false,
			"aux_loss_alpha":           0.001,
			"ep_size":                  1,
			"first_k_dense_replace":    len(p.MLPOnlyLayers),
			"intermediate_size":        p.denseIntermediate(),
			"kv_lora_rank":             p.KVLoRA,
			"moe_intermediate_size":    p.Intermediate,
			"moe_layer_freq":           1,
			"n_group":                  p.RouterGroups,
			"n_routed_experts":         p.Experts,
			"n_shared_experts":         p.SharedIntermediate / p.Intermediate,
			"norm_topk_prob":           p.NormTopK,
			"num_nextn_predict_layers": 0,
			"q_lora_rank":              qlora,
			"qk_nope_head_dim":         p.NopeDim,
			"qk_rope_head_dim":         p.RopeDim,
			"rms_norm_eps":             1e-6,
			"rope_scaling":             p.YaRN,
			"routed_scaling_factor":    p.RoutedScale,
			"scoring_func":             "sigmoid",
			"seq_aux":                  true,
			"topk_group":               p.RouterGroupsKept,
			"topk_method":              "noaux_tc",
			"v_head_dim":               p.VDim,
		}
		if p.FP8 {
			own["quantization_config"] = map[string]any{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": []int{128, 128}}
		}
	case "gpt-oss":
		types := make([]string, p.Layers)
		for l := range types {
			types[l] = map[bool]string{true: "sliding_attention", false: "full_attention"}[l%2 == 0]
		}
		own = map[string]any{
			"architectures":          []string{"GptOssForCausalLM"},
			"model_type":             "gpt_oss",
			"attention_bias":         true,
			"experts_per_token":      p.TopK,
			"head_dim":               p.headDim(),
			"initial_context_length": p.YaRN["original_max_position_embeddings"],
			"intermediate_size":      p.Intermediate,
			"layer_types":            types,
			"num_local_experts":      p.Experts,
			"output_router_logits":   false,
			"pad_token_id":           firstOr(tok.EOS(), 2),
			"rms_norm_eps":           1e-5,
			"rope_scaling":           p.YaRN,
			"router_aux_loss_coef":   0.9,
			"sliding_window":         p.SlidingWindow,
			"swiglu_limit":           p.SwiGLULimit,
			"transformers_version":   "4.55.0.dev0",
		}
		if p.MXFP4 {
			own["quantization_config"] = map[string]any{"quant_method": "mxfp4",
				"modules_to_not_convert": []string{"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}
		}
	default:
		own = map[string]any{
			"architectures":        []string{"MixtralForCausalLM"},
			"model_type":           "mixtral",
			"head_dim":             p.Hidden / p.Heads,
			"intermediate_size":    p.Intermediate,
			"num_local_experts":    p.Experts,
			"output_router_logits": false,
			"rms_norm_eps":         1e-5,
			"router_aux_loss_coef": 0.02,
			"sliding_window":       nil,
			"transformers_version": "4.46.0",
		}
	}
	maps.Copy(c, own)
	return c
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	return nil
}

// tensor is one weight to draw: values ~ mean + std*N(0,1), or, with
// mxfp4 set, the blocks or scales of that MXFP4 tensor (fillMXFP4).
type tensor struct {
	spec      safetensors.Spec
	mean, std float64
	mxfp4     string
	// fp8Of, when set, is the projection this FP8 tensor (its codes or its
	// scales) holds, of shape fp8 (fillFP8)
	fp8Of string
	fp8   [2]int
}

// mat is a BF16 matrix of rows x cols drawn with std.
func mat(name string, rows, cols int, std float64) tensor {
	return tensor{spec: safetensors.Spec{Name: name, DType: "BF16", Shape: []int{rows, cols}}, std: std}
}

// normOf is a BF16 norm weight of n, near 1.
func normOf(name string, n int) tensor {
	return tensor{spec: safetensors.Spec{Name: name, DType: "BF16", Shape: []int{n}}, mean: 1, std: weightStd}
}

// swiglu is a SwiGLU MLP's gate_proj, up_proj and down_proj (prefix
// ends in "."), inter wide on a hidden of h: a dense layer's, a shared
// expert's, a routed expert's in the Qwen and DeepSeek naming.
func swiglu(prefix string, inter, h int) []tensor {
	return []tensor{
		mat(prefix+"gate_proj.weight", inter, h, weightStd),
		mat(prefix+"up_proj.weight", inter, h, weightStd),
		mat(prefix+"down_proj.weight", h, inter, weightStd),
	}
}

// finalNormAndHead are model.norm and, unless tied, lm_head.
func finalNormAndHead(p Preset) []tensor {
	ts := []tensor{normOf("model.norm.weight", p.Hidden)}
	if !p.TieWordEmbedding {
		ts = append(ts, mat("lm_head.weight", p.Vocab, p.Hidden, weightStd))
	}
	return ts
}

func tensors(p Preset) []tensor {
	h, hd := p.Hidden, p.headDim()
	norm := func(name string) tensor { return normOf(name, h) }
	// Qwen3-MoE and OLMoE name their blocks alike and norm queries and
	// keys: over a head (Qwen3) or over the whole projection (OLMoE)
	qkNorm := map[string][2]int{"qwen3-moe": {hd, hd}, "olmoe": {p.Heads * hd, p.KVHeads * hd}, "qwen2-moe": {0, 0}}
	qk, mlpNames := qkNorm[p.Family]
	bias := func(name string, n int) tensor {
		return tensor{spec: safetensors.Spec{Name: name, DType: "BF16", Shape: []int{n}}, std: weightStd}
	}
	ts := []tensor{mat("model.embed_tokens.weight", p.Vocab, h, weightStd)}
	if p.Family == "deepseek-v3" {
		layers := deepseekV3Layers(p)
		if p.FP8 {
			layers = toFP8(layers)
		}
		return append(append(ts, layers...), finalNormAndHead(p)...)
	}
	if p.Family == "gpt-oss" {
		return append(append(ts, gptOssLayers(p)...), finalNormAndHead(p)...)
	}
	for l := range p.Layers {
		pre := fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts,
			norm(pre+"input_layernorm.weight"),
			mat(pre+"self_attn.q_proj.weight", p.Heads*hd, h, weightStd),
			mat(pre+"self_attn.k_proj.weight", p.KVHeads*hd, h, weightStd),
			mat(pre+"self_attn.v_proj.weight", p.KVHeads*hd, h, weightStd),
			mat(pre+"self_attn.o_proj.weight", h, p.Heads*hd, weightStd),
			norm(pre+"post_attention_layernorm.weight"),
		)
		// the router's rows dot a unit-RMS vector of h elements
		routerStd := routerLogitStd / math.Sqrt(float64(h))
		if qk[0] > 0 {
			ts = append(ts, normOf(pre+"self_attn.q_norm.weight", qk[0]), normOf(pre+"self_attn.k_norm.weight", qk[1]))
		}
		if p.Family == "qwen2-moe" {
			ts = append(ts,
				bias(pre+"self_attn.q_proj.bias", p.Heads*hd),
				bias(pre+"self_attn.k_proj.bias", p.KVHeads*hd),
				bias(pre+"self_attn.v_proj.bias", p.KVHeads*hd),
			)
		}
		if slices.Contains(p.MLPOnlyLayers, l) {
			ts = append(ts, swiglu(pre+"mlp.", p.denseIntermediate(), h)...)
			continue
		}
		if si := p.SharedIntermediate; si > 0 {
			ts = append(append(ts, swiglu(pre+"mlp.shared_expert.", si, h)...), mat(pre+"mlp.shared_expert_gate.weight", 1, h, routerStd))
		}
		if mlpNames {
			ts = append(ts, mat(pre+"mlp.gate.weight", p.Experts, h, routerStd))
			for e := range p.Experts {
				ts = append(ts, swiglu(fmt.Sprintf("%smlp.experts.%d.", pre, e), p.Intermediate, h)...)
			}
			continue
		}
		ts = append(ts, mat(pre+"block_sparse_moe.gate.weight", p.Experts, h, routerStd))
		for e := range p.Experts {
			ex := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", pre, e)
			ts = append(ts,
				mat(ex+"w1.weight", p.Intermediate, h, weightStd),
				mat(ex+"w2.weight", h, p.Intermediate, weightStd),
				mat(ex+"w3.weight", p.Intermediate, h, weightStd),
			)
		}
	}
	return append(ts, finalNormAndHead(p)...)
}

// deepseekV3Layers are DeepSeek-V3's layers, as its checkpoint names
// them (with FP8, every projection in F8_E4M3 with its scales).
func deepseekV3Layers(p Preset) []tensor {
	h, H := p.Hidden, p.Heads
	routerStd := routerLogitStd / math.Sqrt(float64(h))
	var ts []tensor
	for l := range p.Layers {
		pre := fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts, normOf(pre+"input_layernorm.weight", h))
		if p.QLoRA > 0 {
			ts = append(ts,
				mat(pre+"self_attn.q_a_proj.weight", p.QLoRA, h, weightStd),
				normOf(pre+"self_attn.q_a_layernorm.weight", p.QLoRA),
				// q_b_proj reads a unit-RMS vector of QLoRA elements
				mat(pre+"self_attn.q_b_proj.weight", H*(p.NopeDim+p.RopeDim), p.QLoRA, 1/math.Sqrt(float64(p.QLoRA))),
			)
		} else {
			ts = append(ts, mat(pre+"self_attn.q_proj.weight", H*(p.NopeDim+p.RopeDim), h, weightStd))
		}
		ts = append(ts,
			mat(pre+"self_attn.kv_a_proj_with_mqa.weight", p.KVLoRA+p.RopeDim, h, weightStd),
			normOf(pre+"self_attn.kv_a_layernorm.weight", p.KVLoRA),
			mat(pre+"self_attn.kv_b_proj.weight", H*(p.NopeDim+p.VDim), p.KVLoRA, 1/math.Sqrt(float64(p.KVLoRA))),
			mat(pre+"self_attn.o_proj.weight", h, H*p.VDim, weightStd),
			normOf(pre+"post_attention_layernorm.weight", h),
		)
		if slices.Contains(p.MLPOnlyLayers, l) {
			ts = append(ts, swiglu(pre+"mlp.", p.denseIntermediate(), h)...)
			continue
		}
		bias := tensor{spec: safetensors.Spec{Name: pre + "mlp.gate.e_score_correction_bias", DType: "F32", Shape: []int{p.Experts}}, std: 0.1}
		ts = append(ts, mat(pre+"mlp.gate.weight", p.Experts, h, routerStd), bias)
		for e := range p.Experts {
			ts = append(ts, swiglu(fmt.Sprintf("%smlp.experts.%d.", pre, e), p.Intermediate, h)...)
		}
		ts = append(ts, swiglu(pre+"mlp.shared_experts.", p.SharedIntermediate, h)...)
	}
	return ts
}

// gptOssLayers are gpt-oss's layers, as transformers names them: its
// experts stacked per layer, gate_up_proj [experts, hidden,
// 2*intermediate] (gate and up columns interleaved) and down_proj
// [experts, intermediate, hidden], each with a bias row per expert. The
// gate/up products are drawn with a spread of 3 on a unit-RMS input, so
// that some cross the clamp of 7 as real ones do; the sinks are of the
// order of the attention scores.
func gptOssLayers(p Preset) []tensor {
	h, hd, E, in := p.Hidden, p.headDim(), p.Experts, p.Intermediate
	routerStd := routerLogitStd / math.Sqrt(float64(h))
	vec := func(name string, std float64, shape ...int) tensor {
		return tensor{spec: safetensors.Spec{Name: name, DType: "BF16", Shape: shape}, std: std}
	}
	var ts []tensor
	for l := range p.Layers {
		pre := fmt.Sprintf("model.layers.%d.", l)
		at, ex := pre+"self_attn.", pre+"mlp.experts."
		ts = append(ts,
			normOf(pre+"input_layernorm.weight", h),
			mat(at+"q_proj.weight", p.Heads*hd, h, weightStd), vec(at+"q_proj.bias", weightStd, p.Heads*hd),
			mat(at+"k_proj.weight", p.KVHeads*hd, h, weightStd), vec(at+"k_proj.bias", weightStd, p.KVHeads*hd),
			mat(at+"v_proj.weight", p.KVHeads*hd, h, weightStd), vec(at+"v_proj.bias", weightStd, p.KVHeads*hd),
			mat(at+"o_proj.weight", h, p.Heads*hd, weightStd), vec(at+"o_proj.bias", weightStd, h),
			vec(at+"sinks", 1, p.Heads),
			normOf(pre+"post_attention_layernorm.weight", h),
			mat(pre+"mlp.router.weight", E, h, routerStd), vec(pre+"mlp.router.bias", routerLogitStd, E),
			vec(ex+"gate_up_proj_bias", 0.5, E, 2*in), vec(ex+"down_proj_bias", weightStd, E, h),
		)
		if p.MXFP4 { // one row per output, as published
			ts = append(ts, mxfp4Tensors(ex+"gate_up_proj", 3/math.Sqrt(float64(h)), E, 2*in, h)...)
			ts = append(ts, mxfp4Tensors(ex+"down_proj", weightStd, E, h, in)...)
			continue
		}
		ts = append(ts, vec(ex+"gate_up_proj", 3/math.Sqrt(float64(h)), E, h, 2*in), vec(ex+"down_proj", weightStd, E, in, h))
	}
	return ts
}

// mxfp4Tensors are name_blocks [n, rows, cols/32, 16] and name_scales
// [n, rows, cols/32], U8: weights drawn with std and quantized to MXFP4
// (fillMXFP4), both from the same draws.
func mxfp4Tensors(name string, std float64, n, rows, cols int) []tensor {
	return []tensor{
		{spec: safetensors.Spec{Name: name + "_blocks", DType: "U8", Shape: []int{n, rows, cols / 32, 16}}, std: std, mxfp4: name},
		{spec: safetensors.Spec{Name: name + "_scales", DType: "U8", Shape: []int{n, rows, cols / 32}}, std: std, mxfp4: name},
	}
}

// mxfp4BlocksPerChunk is fillMXFP4's unit of parallel, deterministic
// drawing.
const mxfp4BlocksPerChunk = 4096

// fillMXFP4 draws the blocks of 32 weights of the MXFP4 tensor t.mxfp4
// (N(0, t.std), one stream per chunk of blocks, as fill's) and writes
// either their codes (a _blocks tensor: 16 bytes a block) or their scales
// (a _scales tensor: 1 byte a block), quantized as the OCP MX v1.0
// specification does: the scale is 2^(floor(log2(amax)) - 2) (2: E2M1's
// largest exponent) and each weight the E2M1 value nearest its quotient,
// clamped to ±6.
func fillMXFP4(buf []byte, t tensor, seed uint64) {
	hsh := fnv.New64a()
	hsh.Write([]byte(t.mxfp4))
	stream := hsh.Sum64()
	scales := len(t.spec.Shape) == 3
	per := 16
	if scales {
		per = 1
	}
	nb := len(buf) / per
	chunks := (nb + mxfp4BlocksPerChunk - 1) / mxfp4BlocksPerChunk
	var wg sync.WaitGroup
	for c := range chunks {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed^stream, uint64(c)))
			var w [32]float64
			for b := c * mxfp4BlocksPerChunk; b < min((c+1)*mxfp4BlocksPerChunk, nb); b++ {
				amax := 0.0
				for i := range w {
					w[i] = t.std * rng.NormFloat64()
					amax = math.Max(amax, math.Abs(w[i]))
				}
				e := -127
				if amax > 0 {
					e = max(-127, min(127, int(math.Floor(math.Log2(amax)))-2))
				}
				if scales {
					buf[b] = byte(e + 127)
					continue
				}
				for i := 0; i < 32; i += 2 {
					buf[16*b+i/2] = e2m1Nearest(math.Ldexp(w[i], -e)) | e2m1Nearest(math.Ldexp(w[i+1], -e))<<4
				}
			}
		})
	}
	wg.Wait()
}

// e2m1Nearest is the E2M1 code nearest v (ties to the smaller magnitude),
// clamped to ±6.
func e2m1Nearest(v float64) byte {
	mags := [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	best := 0
	for q, m := range mags {
		if math.Abs(math.Abs(v)-m) < math.Abs(math.Abs(v)-mags[best]) {
			best = q
		}
	}
	if v < 0 && best > 0 {
		return byte(best) | 8
	}
	return byte(best)
}

// toFP8 replaces every projection (a 2-D BF16 tensor named *_proj.weight
// or *_proj_with_mqa.weight) of ts by its F8_E4M3 codes and float32
// weight_scale_inv, as DeepSeek-V3's FP8 checkpoint holds them.
func toFP8(ts []tensor) []tensor {
	var out []tensor
	for _, t := range ts {
		n := t.spec.Name
		if len(t.spec.Shape) != 2 || !(strings.HasSuffix(n, "_proj.weight") || strings.HasSuffix(n, "_proj_with_mqa.weight")) {
			out = append(out, t)
			continue
		}
		r, c := t.spec.Shape[0], t.spec.Shape[1]
		codes, scales := t, t
		codes.spec = safetensors.Spec{Name: n, DType: "F8_E4M3", Shape: []int{r, c}}
		scales.spec = safetensors.Spec{Name: n + "_scale_inv", DType: "F32", Shape: []int{(r + 127) / 128, (c + 127) / 128}}
		codes.fp8, scales.fp8 = [2]int{r, c}, [2]int{r, c}
		codes.fp8Of, scales.fp8Of = n, n
		out = append(out, codes, scales)
	}
	return out
}

// fillFP8 draws the weights of t.fp8Of (a t.fp8[0] x t.fp8[1] matrix:
// t.std * N(0, 1) in fill's chunked streams) and writes either their
// E4M3 codes (the weight itself) or their scales (its _scale_inv): per
// 128x128 block, scale = amax / 448 as a float32 and each code the E4M3
// value nearest w / scale.
func fillFP8(buf []byte, t tensor, seed uint64) {
	rows, cols := t.fp8[0], t.fp8[1]
	src := tensor{spec: safetensors.Spec{Name: t.fp8Of, DType: "F32", Shape: []int{rows, cols}}, std: t.std, mean: t.mean}
	raw := make([]byte, 4*rows*cols)
	fill(raw, src, seed)
	w := func(r, c int) float64 {
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(r*cols+c):])))
	}
	rb, cb := (rows+127)/128, (cols+127)/128
	for br := range rb {
		for bc := range cb {
			amax := 0.0
			for r := br * 128; r < min(rows, (br+1)*128); r++ {
				for c := bc * 128; c < min(cols, (bc+1)*128); c++ {
					amax = math.Max(amax, math.Abs(w(r, c)))
				}
			}
			sc := float32(amax / 448)
			if sc == 0 {
				sc = 1
			}
			if t.spec.DType == "F32" {
				binary.LittleEndian.PutUint32(buf[4*(br*cb+bc):], math.Float32bits(sc))
				continue
			}
			for r := br * 128; r < min(rows, (br+1)*128); r++ {
				for c := bc * 128; c < min(cols, (bc+1)*128); c++ {
					buf[r*cols+c] = e4m3Nearest(w(r, c) / float64(sc))
				}
			}
		}
	}
}

// e4m3Values are the non-negative finite E4M3FN values by code (0..126).
var e4m3Values = func() (v [127]float64) {
	for b := range v {
		e, m := b>>3, float64(b&7)
		if e == 0 {
			v[b] = math.Ldexp(m/8, -6)
		} else {
			v[b] = math.Ldexp(1+m/8, e-7)
		}
	}
	return v
}()

// e4m3Nearest is the E4M3FN code nearest v (ties to the smaller
// magnitude), clamped to ±448.
func e4m3Nearest(v float64) byte {
	a := math.Abs(v)
	q := sort.SearchFloat64s(e4m3Values[:], a) // first value >= a
	switch {
	case q == len(e4m3Values):
		q--
	case q > 0 && a-e4m3Values[q-1] <= e4m3Values[q]-a:
		q--
	}
	if v < 0 {
		return byte(q) | 0x80
	}
	return byte(q)
}

// chunkElems is the unit of parallel, deterministic drawing: chunk i of a
// tensor always comes from the same generator stream, however many
// goroutines draw.
const chunkElems = 1 << 18

// Specs are the tensors a checkpoint of p's shape holds, named, typed
// and shaped as its family publishes them: what Generate writes (p's
// Vocab set).
func Specs(p Preset) []safetensors.Spec { return specsOf(tensors(p)) }

// specsOf is ts's specs.
func specsOf(ts []tensor) []safetensors.Spec {
	specs := make([]safetensors.Spec, len(ts))
	for i, t := range ts {
		specs[i] = t.spec
	}
	return specs
}

func writeWeights(path string, p Preset, opt Options) error {
	ts := tensors(p)
	specs := specsOf(ts)
	var total int64
	for _, t := range ts {
		total += int64(elements(t.spec.Shape) * elemBytes(t.spec.DType))
	}
	var done int64
	meta := map[string]string{"format": "pt", "odmoe_synth_preset": p.Name, "odmoe_synth_seed": fmt.Sprint(opt.Seed)}
	return safetensors.Write(path, specs, meta, func(i int, buf []byte) error {
		if ts[i].mxfp4 != "" {
			fillMXFP4(buf, ts[i], opt.Seed)
		} else if ts[i].fp8Of != "" {
			fillFP8(buf, ts[i], opt.Seed)
		} else {
			fill(buf, ts[i], opt.Seed)
		}
		done += int64(len(buf))
		if opt.Progress != nil {
			opt.Progress(done, total)
		}
		return nil
	})
}

// elemBytes is the bytes of one element of the dtypes synth writes.
func elemBytes(dtype string) int {
	switch dtype {
	case "F32":
		return 4
	case "U8", "F8_E4M3":
		return 1
	}
	return 2
}

func elements(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// fill draws tensor t as BF16 (or F32) into buf, chunks in parallel.
func fill(buf []byte, t tensor, seed uint64) {
	hsh := fnv.New64a()
	hsh.Write([]byte(t.spec.Name))
	stream := hsh.Sum64()
	size := elemBytes(t.spec.DType)
	n := len(buf) / size
	chunks := (n + chunkElems - 1) / chunkElems
	var wg sync.WaitGroup
	next := make(chan int, chunks)
	for c := range chunks {
		next <- c
	}
	close(next)
	for range min(runtime.GOMAXPROCS(0), chunks) {
		wg.Go(func() {
			for c := range next {
				rng := rand.New(rand.NewPCG(seed^stream, uint64(c)))
				lo, hi := c*chunkElems, min((c+1)*chunkElems, n)
				for i := lo; i < hi; i++ {
					x := float32(t.mean + t.std*rng.NormFloat64())
					if size == 4 {
						binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
						continue
					}
					v := kernels.F32ToBF16(x)
					buf[2*i], buf[2*i+1] = byte(v), byte(v>>8)
				}
			}
		})
	}
	wg.Wait()
}
