package model

import (
	"fmt"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/safetensors"
)

// gpt-oss (GptOssForCausalLM: gpt-oss-20b and -120b): grouped-query
// attention with biases on all four projections, a learned sink per head
// (kernels.AttendSink), layers alternating a sliding window and full
// attention (layer_types, sliding_window), YaRN; a sparse block on every
// layer whose router has a bias and weights the top-k logits by their
// own softmax; experts stacked per layer in fused tensors (gate_up_proj
// [experts, hidden, 2*intermediate] with gate and up columns interleaved,
// down_proj [experts, intermediate, hidden], each with a bias) and the
// clamped SwiGLU (swiglu_limit, alpha 1.702, (up + 1) * glu). Defaults
// are transformers' GptOssConfig's.
func init() {
	register("GptOssForCausalLM", &architecture{
		modelType: "gpt_oss",
		defaults: Config{
			HiddenSize: 2880, IntermediateSize: 2880, NumLayers: 36,
			NumHeads: 64, NumKVHeads: 8, HeadDim: 64, NumExperts: 128, TopK: 4,
			VocabSize: 201088, MaxPositions: 131072,
			RMSNormEps: 1e-5, RopeTheta: 150000,
		},
		config:    gptOssConfig,
		embed:     "model.embed_tokens.weight",
		finalNorm: "model.norm.weight",
		lmHead:    "lm_head.weight",
		layer: func(b *binder, c Config, l int) Layer {
			h, H, q, kv := c.HiddenSize, c.NumHeads, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
			p := per("model.layers.%d.", l)
			a := b.attention(c, p)
			if c.AttentionBias {
				a.QBias = b.vector(p+"self_attn.q_proj.bias", q)
				a.KBias = b.vector(p+"self_attn.k_proj.bias", kv)
				a.VBias = b.vector(p+"self_attn.v_proj.bias", kv)
				a.OBias = b.vector(p+"self_attn.o_proj.bias", h)
			}
			a.Sinks = b.vector(p+"self_attn.sinks", H)
			moe := b.moe(c, p, "mlp.router.weight")
			moe.RouterBias = b.vector(p+"mlp.router.bias", c.NumExperts)
			moe.SoftmaxOfTopK = true
			return Layer{Attention: a, MoE: moe}
		},
		stackedExperts: func(c Config, l int) []string {
			p := per("model.layers.%d.mlp.experts.", l)
			if c.Quantization == "mxfp4" {
				return []string{p + "gate_up_proj_blocks", p + "gate_up_proj_scales", p + "gate_up_proj_bias",
					p + "down_proj_blocks", p + "down_proj_scales", p + "down_proj_bias"}
			}
			return []string{p + "gate_up_proj", p + "gate_up_proj_bias", p + "down_proj", p + "down_proj_bias"}
		},
		experts:      gptOssExperts,
		quantMethods: []string{"mxfp4"},
	})
}

// gptOssAlpha is the clamped SwiGLU's sigmoid scale, fixed in
// transformers' GptOssExperts (and openai's reference code).
const gptOssAlpha = 1.702

// gptOssConfig reads GptOssConfig's own fields: layer_types (default:
// sliding windows on even layers, full attention on odd ones),
// sliding_window (128), head_dim (64), swiglu_limit (7), attention_bias
// (true), and
// rope_scaling, which an absent field defaults to GptOssConfig's YaRN.
func gptOssConfig(r *rawConfig, c *Config) error {
	window := or(r.SlidingWindow, 128)
	if window <= 0 {
		return fmt.Errorf(`field "sliding_window" is %d; must be positive`, window)
	}
	c.SlidingWindow = 0 // each layer's is its own
	c.LayerWindows = make([]int, c.NumLayers)
	types := r.LayerTypes
	if types == nil {
		for l := range c.NumLayers {
			types = append(types, map[bool]string{true: "sliding_attention", false: "full_attention"}[l%2 == 0])
		}
	}
	if len(types) != c.NumLayers {
		return fmt.Errorf(`field "layer_types" has %d entries for %d layers`, len(types), c.NumLayers)
	}
	for l, t := range types {
		switch t {
		case "sliding_attention":
			c.LayerWindows[l] = window
		case "full_attention":
		default:
			return fmt.Errorf(`field "layer_types" gives layer %d %q; want "sliding_attention" or "full_attention"`, l, t)
		}
	}
	if r.HeadDim == nil {
		c.HeadDim = 64 // GptOssConfig's, not hidden_size / num_attention_heads
	}
	c.SwiGLULimit = or(r.SwiGLULimit, 7)
	if !(c.SwiGLULimit > 0) {
		return fmt.Errorf(`field "swiglu_limit" is %g; must be positive`, c.SwiGLULimit)
	}
	c.AttentionBias = or(r.AttentionBias, true)
	if len(r.RopeScaling) == 0 {
		c.RopeScaling = &RopeScaling{Type: "yarn", Factor: 32, BetaFast: 32, BetaSlow: 1, OriginalMaxPosition: 4096}
	}
	return nil
}

// gptOssExperts binds layer l's stacked experts: each expert's slice of
// gate_up_proj and down_proj transposed to one row per output (so that
// GateUp's rows alternate gate and up, as its columns do), its biases as
// they are.
//
// As published (quantization_config "mxfp4"), the matrices are
// gate_up_proj_blocks [experts, 2*intermediate, hidden/32, 16] and
// gate_up_proj_scales [experts, 2*intermediate, hidden/32] (one row per
// output already), down_proj alike: each expert's GateUp and Down are
// MXFP4 matrices over its slices of them, read in place.
func gptOssExperts(b *binder, c Config, l int) []Expert {
	p := per("model.layers.%d.mlp.experts.", l)
	E, h, in := c.NumExperts, c.HiddenSize, c.IntermediateSize
	gub := b.tensor(p+"gate_up_proj_bias", E, 2*in)
	dnb := b.tensor(p+"down_proj_bias", E, h)
	var gateUp, down func(e int) kernels.Matrix
	if c.Quantization == "mxfp4" {
		gateUp = b.mxfp4(p+"gate_up_proj", E, 2*in, h)
		down = b.mxfp4(p+"down_proj", E, h, in)
	} else {
		// each expert's slice is transposed into memory of its own:
		// the stacked tensors stay mapped
		b.mapped = true
		gu, dn := b.tensor(p+"gate_up_proj", E, h, 2*in), b.tensor(p+"down_proj", E, in, h)
		b.mapped = false
		slice := transposedSlice
		if b.shapes { // its dtype and shape, not its data
			slice = func(t safetensors.Tensor, _ int) kernels.Matrix {
				return kernels.Matrix{DType: t.DType, Rows: t.Shape[2], Cols: t.Shape[1]}
			}
		}
		gateUp = func(e int) kernels.Matrix { return slice(gu, e) }
		down = func(e int) kernels.Matrix { return slice(dn, e) }
	}
	if b.err != nil {
		return nil
	}
	xs := make([]Expert, E)
	for e := range xs {
		xs[e] = Expert{
			GateUp: gateUp(e), GateUpBias: rowOf(gub, e),
			Down: down(e), DownBias: rowOf(dnb, e),
			Limit: float32(c.SwiGLULimit), Alpha: gptOssAlpha,
		}
	}
	return xs
}

// mxfp4 binds the stacked MXFP4 matrices name_blocks [n, rows, cols/32,
// 16] and name_scales [n, rows, cols/32] (U8 both), returning slice e of
// them as a rows x cols MXFP4 matrix aliasing the checkpoint.
func (b *binder) mxfp4(name string, n, rows, cols int) func(e int) kernels.Matrix {
	if b.err != nil {
		return nil
	}
	if cols%32 != 0 {
		b.err = fmt.Errorf("%s: MXFP4 rows of %d weights; they come in blocks of 32", name, cols)
		return nil
	}
	blocks, err := b.set.Raw(name+"_blocks", "U8", n, rows, cols/32, 16)
	if err != nil {
		b.err = err
		return nil
	}
	scales, err := b.set.Raw(name+"_scales", "U8", n, rows, cols/32)
	if err != nil {
		b.err = err
		return nil
	}
	*b.bytes += int64(len(blocks) + len(scales))
	blocks, scales = b.keep(blocks), b.keep(scales)
	cb, sb := rows*cols/2, rows*cols/32
	return func(e int) kernels.Matrix {
		return kernels.Matrix{DType: kernels.MXFP4, Rows: rows, Cols: cols,
			Data: blocks[e*cb : (e+1)*cb : (e+1)*cb], Scales: scales[e*sb : (e+1)*sb : (e+1)*sb]}
	}
}

// tensor binds a tensor of exactly shape, of a float dtype, counting its
// bytes.
func (b *binder) tensor(name string, shape ...int) safetensors.Tensor {
	if b.err != nil {
		return safetensors.Tensor{}
	}
	t, err := b.set.TensorShape(name, shape...)
	if err == nil && t.DType.Size() == 0 {
		err = fmt.Errorf("tensor %q is %v; want a float dtype", name, t.DType)
	}
	if err != nil {
		b.err = err
		return safetensors.Tensor{}
	}
	*b.bytes += int64(len(t.Data))
	t.Data = b.keep(t.Data)
	return t
}

// rowOf is row e of a 2-D tensor, as a [1, cols] matrix aliasing it.
func rowOf(t safetensors.Tensor, e int) kernels.Matrix {
	cols, n := t.Shape[1], t.DType.RowBytes(t.Shape[1])
	return kernels.Matrix{DType: t.DType, Rows: 1, Cols: cols, Data: t.Data[e*n : (e+1)*n]}
}

// transposedSlice is slice e of a 3-D tensor [n, r, c], transposed into
// a new [c, r] matrix of the same dtype: element (i, j) of the slice is
// element (j, i) of the result, bits unchanged.
func transposedSlice(t safetensors.Tensor, e int) kernels.Matrix {
	r, c, es := t.Shape[1], t.Shape[2], t.DType.Size()
	src := t.Data[e*r*c*es : (e+1)*r*c*es]
	dst := make([]byte, len(src))
	const tile = 32 // a tile of rows and columns at a time keeps both sides in cache
	for i0 := 0; i0 < r; i0 += tile {
		for j0 := 0; j0 < c; j0 += tile {
			for i := i0; i < min(i0+tile, r); i++ {
				for j := j0; j < min(j0+tile, c); j++ {
					copy(dst[(j*r+i)*es:(j*r+i+1)*es], src[(i*c+j)*es:(i*c+j+1)*es])
				}
			}
		}
	}
	return kernels.Matrix{DType: t.DType, Rows: c, Cols: r, Data: dst}
}
