package model

import (
	"context"
	"math"
	"sort"
	"strconv"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/safetensors"
)

// refModel is an independent float64 implementation of Hugging Face's
// MixtralForCausalLM forward pass (modeling_mixtral.py), written straight
// from the formulas with no KV cache and none of the package's code paths:
// it reads the checkpoint itself and recomputes the whole sequence.
type refModel struct {
	cfg Config
	set *safetensors.Set
	t   *testing.T
	// rot, if set, rotates one head to its position (a rope_scaling read
	// by the test from config.json itself); nil: plain RoPE of rope_theta
	rot func(x []float64, pos int) []float64
}

func (r refModel) tensor(name string) [][]float64 {
	if info, ok := r.set.Info(name); ok && info.DType == "F8_E4M3" {
		return r.f8(name, info.Shape)
	}
	t, err := r.set.Tensor(name)
	if err != nil {
		r.t.Fatal(err)
	}
	rows, cols := 1, t.Shape[0]
	if len(t.Shape) == 2 {
		rows, cols = t.Shape[0], t.Shape[1]
	}
	out := make([][]float64, rows)
	for i := range out {
		out[i] = make([]float64, cols)
		for j := range out[i] {
			k := (i*cols + j) * t.DType.Size()
			switch t.DType {
			case kernels.BF16:
				out[i][j] = float64(math.Float32frombits(uint32(t.Data[k])<<16 | uint32(t.Data[k+1])<<24))
			case kernels.F32:
				out[i][j] = float64(math.Float32frombits(uint32(t.Data[k]) | uint32(t.Data[k+1])<<8 | uint32(t.Data[k+2])<<16 | uint32(t.Data[k+3])<<24))
			default:
				r.t.Fatalf("reference reads BF16 and F32 only, %s is %v", name, t.DType)
			}
		}
	}
	return out
}

func (r refModel) vec(name string) []float64 { return r.tensor(name)[0] }

// f8 reads an F8_E4M3 weight as DeepSeek-V3's weight_dequant computes
// it, in float64: each code's E4M3 value (decoded from its bits) times
// its 128x128 block's weight_scale_inv.
func (r refModel) f8(name string, shape []int) [][]float64 {
	rows, cols := shape[0], shape[1]
	codes, err := r.set.Raw(name, "F8_E4M3", rows, cols)
	if err != nil {
		r.t.Fatal(err)
	}
	cb := (cols + 127) / 128
	scales, err := r.set.Raw(name+"_scale_inv", "F32", (rows+127)/128, cb)
	if err != nil {
		r.t.Fatal(err)
	}
	out := make([][]float64, rows)
	for i := range out {
		out[i] = make([]float64, cols)
		for j := range out[i] {
			b := codes[i*cols+j]
			e, m := int(b>>3&15), float64(b&7)
			v := math.Ldexp(m/8, -6)
			if e > 0 {
				v = math.Ldexp(1+m/8, e-7)
			}
			if b&0x80 != 0 {
				v = -v
			}
			k := 4 * (i/128*cb + j/128)
			out[i][j] = v * float64(math.Float32frombits(uint32(scales[k])|uint32(scales[k+1])<<8|uint32(scales[k+2])<<16|uint32(scales[k+3])<<24))
		}
	}
	return out
}

func linear(w [][]float64, x []float64) []float64 {
	y := make([]float64, len(w))
	for i, row := range w {
		for j, v := range row {
			y[i] += v * x[j]
		}
	}
	return y
}

func rmsnorm(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i := range x {
		y[i] = w[i] * x[i] * r
	}
	return y
}

func softmax64(x []float64) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, v)
	}
	var sum float64
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = math.Exp(v - mx)
		sum += y[i]
	}
	for i := range y {
		y[i] /= sum
	}
	return y
}

// rope applies HF's apply_rotary_pos_emb (rotate_half) to one head.
func rope(x []float64, pos int, theta float64) []float64 {
	d := len(x)
	y := make([]float64, d)
	for i := range d / 2 {
		invFreq := 1 / math.Pow(theta, float64(2*i)/float64(d))
		c, s := math.Cos(float64(pos)*invFreq), math.Sin(float64(pos)*invFreq)
		y[i] = x[i]*c - x[i+d/2]*s
		y[i+d/2] = x[i+d/2]*c + x[i]*s
	}
	return y
}

// forward returns the logits of every position of tokens.
func (r refModel) forward(tokens []int) [][]float64 {
	c := r.cfg
	hd, eps := c.HeadDim, c.RMSNormEps
	emb := r.tensor("model.embed_tokens.weight")
	xs := make([][]float64, len(tokens))
	for t, id := range tokens {
		xs[t] = append([]float64(nil), emb[id]...)
	}
	rot := r.rot
	if rot == nil {
		rot = func(x []float64, pos int) []float64 { return rope(x, pos, c.RopeTheta) }
	}
	for l := range c.NumLayers {
		p := "model.layers." + strconv.Itoa(l) + "."
		wq, wk, wv, wo := r.tensor(p+"self_attn.q_proj.weight"), r.tensor(p+"self_attn.k_proj.weight"), r.tensor(p+"self_attn.v_proj.weight"), r.tensor(p+"self_attn.o_proj.weight")
		ln1, ln2 := r.vec(p+"input_layernorm.weight"), r.vec(p+"post_attention_layernorm.weight")
		qs, ks, vs := make([][]float64, len(xs)), make([][]float64, len(xs)), make([][]float64, len(xs))
		for t := range xs {
			h := rmsnorm(xs[t], ln1, eps)
			qs[t], ks[t], vs[t] = linear(wq, h), linear(wk, h), linear(wv, h)
			for hh := range c.NumHeads {
				copy(qs[t][hh*hd:], rot(qs[t][hh*hd:(hh+1)*hd], t))
			}
			for hh := range c.NumKVHeads {
				copy(ks[t][hh*hd:], rot(ks[t][hh*hd:(hh+1)*hd], t))
			}
		}
		next := make([][]float64, len(xs))
		for t := range xs {
			att := make([]float64, c.NumHeads*hd)
			for hh := range c.NumHeads {
				kvh := hh / (c.NumHeads / c.NumKVHeads) // repeat_kv
				sc := make([]float64, t+1)
				for j := 0; j <= t; j++ {
					for i := range hd {
						sc[j] += qs[t][hh*hd+i] * ks[j][kvh*hd+i]
					}
					sc[j] /= math.Sqrt(float64(hd))
				}
				pr := softmax64(sc)
				for j := 0; j <= t; j++ {
					for i := range hd {
						att[hh*hd+i] += pr[j] * vs[j][kvh*hd+i]
					}
				}
			}
			o := linear(wo, att)
			x := make([]float64, len(xs[t]))
			for i := range x {
				x[i] = xs[t][i] + o[i]
			}
			// sparse MoE block
			h := rmsnorm(x, ln2, eps)
			probs := softmax64(linear(r.tensor(p+"block_sparse_moe.gate.weight"), h))
			idx := make([]int, len(probs))
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(a, b int) bool { return probs[idx[a]] > probs[idx[b]] })
			var wsum float64
			for _, e := range idx[:c.TopK] {
				wsum += probs[e]
			}
			for _, e := range idx[:c.TopK] {
				ep := p + "block_sparse_moe.experts." + strconv.Itoa(e) + "."
				g, u := linear(r.tensor(ep+"w1.weight"), h), linear(r.tensor(ep+"w3.weight"), h)
				for i := range g {
					g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
				}
				y := linear(r.tensor(ep+"w2.weight"), g)
				for i := range x {
					x[i] += probs[e] / wsum * y[i]
				}
			}
			next[t] = x
		}
		xs = next
	}
	norm := r.vec("model.norm.weight")
	head := "lm_head.weight"
	if c.TieEmbeddings {
		head = "model.embed_tokens.weight"
	}
	lm := r.tensor(head)
	out := make([][]float64, len(xs))
	for t := range xs {
		out[t] = linear(lm, rmsnorm(xs[t], norm, eps))
	}
	return out
}

// decodeAgainst feeds tokens to a new session of m one at a time and
// checks every position's logits against want: within 1e-4 relative L2,
// and the same greedy token. what names the case in a failure. It
// returns the worst error and the last position's logits.
func decodeAgainst(t *testing.T, what string, m *Model, tokens []int, want [][]float64) (float64, []float32) {
	t.Helper()
	s := NewSession(m, NewResidentExperts(m), len(tokens))
	var worst float64
	var got []float32
	for i, id := range tokens {
		var err error
		if got, err = s.Forward(context.Background(), []int{id}); err != nil {
			t.Fatal(err)
		}
		e := relL2(got, want[i])
		worst = max(worst, e)
		if e > 1e-4 {
			t.Fatalf("%s, position %d: relative L2 error %.3g > 1e-4", what, i, e)
		}
		if Argmax(got) != argmax64(want[i]) {
			t.Fatalf("%s, position %d: greedy token %d, reference %d", what, i, Argmax(got), argmax64(want[i]))
		}
	}
	t.Logf("%s: worst relative L2 error %.3g over %d positions", what, worst, len(tokens))
	return worst, got
}

// relL2 is ||a-b|| / ||b||.
func relL2(a []float32, b []float64) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - b[i]
		num += d * d
		den += b[i] * b[i]
	}
	return math.Sqrt(num / den)
}
