package model

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/odmoe/odmoe/kernels"
)

// MLAWeights are Multi-head Latent Attention's projections (DeepSeek-V3)
// beyond the Attention's Norm, O and (without q_lora_rank) Q.
type MLAWeights struct {
	QA, QB  kernels.Matrix // q_a_proj, q_b_proj (empty: Attention.Q is q_proj)
	QANorm  []float32      // q_a_layernorm
	KVA     kernels.Matrix // kv_a_proj_with_mqa: [kv_lora_rank + rope, hidden]
	KVANorm []float32      // kv_a_layernorm
	KVB     kernels.Matrix // kv_b_proj: [heads * (nope + v), kv_lora_rank]
	// ukT is each head's key part of KVB transposed ([heads * rank,
	// nope]: the same values, moved), which turns the head's no-RoPE
	// query into the latent space: attention then runs over the cached
	// latents themselves, never over per-head keys and values.
	ukT kernels.Matrix
	// uv, when set, are each head's value rows of KVB, made at bind for
	// an F8E4M3 KVB (block scales do not follow a head's rows unless
	// they start a block: those heads' rows are dequantized to F32);
	// nil: row blocks of KVB.
	uv []kernels.Matrix
}

// dequantizedRows is rows [from, from+n) of m as a new F32 matrix, each
// weight as kernels.RowToFloat32 gives it.
func dequantizedRows(m kernels.Matrix, from, n int) kernels.Matrix {
	out := kernels.Matrix{DType: kernels.F32, Rows: n, Cols: m.Cols, Data: make([]byte, 0, 4*n*m.Cols)}
	row := make([]float32, m.Cols)
	for r := range n {
		kernels.RowToFloat32(row, m, from+r)
		for _, v := range row {
			out.Data = binary.LittleEndian.AppendUint32(out.Data, math.Float32bits(v))
		}
	}
	return out
}

// valueRows is head's value rows of KVB ([v, rank]).
func (w *MLAWeights) valueRows(m *MLAConfig, head int) kernels.Matrix {
	if w.uv != nil {
		return w.uv[head]
	}
	return rowBlock(w.KVB, head*(m.NopeDim+m.VDim)+m.NopeDim, m.VDim)
}

// headValueRows makes uv for an F8E4M3 KVB: a head whose value rows
// start a 128-row block keeps them in F8 with their scales; another's
// are dequantized to F32 (each weight exactly as the F8 product reads
// it, so results do not change).
// With shapes set (LoadOptions.Shapes), a dequantized head's rows get
// their dtype and shape, not their data.
func headValueRows(kvb kernels.Matrix, m *MLAConfig, heads int, shapes bool) []kernels.Matrix {
	uv := make([]kernels.Matrix, heads)
	cb := 4 * ((kvb.Cols + 127) / 128) // scale bytes of a 128-row block
	for h := range uv {
		from := h*(m.NopeDim+m.VDim) + m.NopeDim
		switch {
		case from%128 == 0 && (m.VDim%128 == 0 || from+m.VDim == kvb.Rows):
			b := rowBlock(kvb, from, m.VDim)
			b.Scales = kvb.Scales[from/128*cb : (from+m.VDim+127)/128*cb]
			uv[h] = b
		case shapes:
			uv[h] = kernels.Matrix{DType: kernels.F32, Rows: m.VDim, Cols: kvb.Cols}
		default:
			uv[h] = dequantizedRows(kvb, from, m.VDim)
		}
	}
	return uv
}

// mlaNormEps is the epsilon of q_a_layernorm and kv_a_layernorm:
// transformers builds them with DeepseekV3RMSNorm's default, not
// rms_norm_eps.
const mlaNormEps = 1e-6

// absorbedKeys transposes each head's key rows of kv_b_proj (kvb: heads
// blocks of nope key rows then v value rows, rank columns) into a
// [heads*rank, nope] matrix of the same dtype: element moves only, so it
// is exact.
func absorbedKeys(kvb kernels.Matrix, heads, nope, v int) (kernels.Matrix, error) {
	out := absorbedKeysShape(kvb, heads, nope)
	if kvb.DType == kernels.F8E4M3 {
		// block scales do not survive the transpose: dequantize (exactly
		// as the F8 product reads each weight) and transpose F32
		kvb = dequantizedRows(kvb, 0, kvb.Rows)
	}
	size := kvb.DType.RowBytes(1)
	if kvb.DType.RowBytes(kvb.Cols) != size*kvb.Cols {
		return kernels.Matrix{}, fmt.Errorf("model: kv_b_proj of dtype %v: MLA needs a dtype of whole elements", kvb.DType)
	}
	rank := kvb.Cols
	out.Data = make([]byte, heads*rank*nope*size)
	for h := range heads {
		for i := range nope {
			src := kvb.Data[((h*(nope+v))+i)*rank*size:]
			for r := range rank {
				copy(out.Data[((h*rank+r)*nope+i)*size:][:size], src[r*size:][:size])
			}
		}
	}
	return out, nil
}

// absorbedKeysShape is absorbedKeys' matrix without its data: its dtype
// (an F8 kv_b_proj's dequantized to F32) and shape, which
// LoadOptions.Shapes binds alone.
func absorbedKeysShape(kvb kernels.Matrix, heads, nope int) kernels.Matrix {
	dt := kvb.DType
	if dt == kernels.F8E4M3 {
		dt = kernels.F32
	}
	return kernels.Matrix{DType: dt, Rows: heads * kvb.Cols, Cols: nope}
}

// rowBlock is the block of m's rows [from, from+n).
func rowBlock(m kernels.Matrix, from, n int) kernels.Matrix {
	rb := m.DType.RowBytes(m.Cols)
	return kernels.Matrix{DType: m.DType, Rows: n, Cols: m.Cols, Data: m.Data[from*rb : (from+n)*rb]}
}

// mlaScale is the softmax scale of MLA's scores: 1/sqrt(nope + rope),
// times mscale^2 when rope_scaling has mscale_all_dim (transformers'
// DeepseekV3Attention: yarn_get_mscale(factor, mscale_all_dim)).
func (c Config) mlaScale() float32 {
	s := 1 / math.Sqrt(float64(c.MLA.NopeDim+c.MLA.RopeDim))
	if r := c.RopeScaling; r != nil && r.MScaleAll != 0 && r.Factor > 1 {
		m := 0.1*r.MScaleAll*math.Log(r.Factor) + 1
		s *= m * m
	}
	return float32(s)
}

// forwardMLA is Attention.forward for Multi-head Latent Attention: x +=
// O(attn(norm(x))) over each row's latent KV cache. Each head's query is
// absorbed into the latent space (its no-RoPE part through the head's
// kv_b_proj key rows, transposed), scored against every cached [latent,
// rotary key] row, the rows mixed by the softmax (kernels.Attend, the
// same arithmetic as every attention here), and the mix taken out of the
// latent space through the head's kv_b_proj value rows.
func (a *Attention) forwardMLA(s *Session, l, n int, rows kvRows) error {
	c := s.m.Config
	m, w := c.MLA, a.MLA
	h, H := c.HiddenSize, c.NumHeads
	qk, rank, rope := m.NopeDim+m.RopeDim, m.KVLoRARank, m.RopeDim
	width := rank + rope // a cache row, an absorbed query
	s.hn = grow(s.hn, n*h)
	for t := range n {
		kernels.RMSNorm(s.hn[t*h:(t+1)*h], s.x[t*h:(t+1)*h], a.Norm, float32(c.RMSNormEps))
	}
	s.q, s.k = grow(s.q, n*H*qk), grow(s.k, n*width)
	if w.QA.Rows > 0 {
		ql := w.QA.Rows
		s.v = grow(s.v, n*ql) // q_a's output
		s.qkv = [3]kernels.Product{{Out: s.v[:n*ql], W: w.QA}, {Out: s.k[:n*width], W: w.KVA}}
		kernels.MatMulEach(s.hn[:n*h], n, s.qkv[:2])
		for t := range n {
			kernels.RMSNorm(s.v[t*ql:(t+1)*ql], s.v[t*ql:(t+1)*ql], w.QANorm, mlaNormEps)
		}
		kernels.MatMul(s.q[:n*H*qk], w.QB, s.v[:n*ql], n)
	} else {
		s.qkv = [3]kernels.Product{{Out: s.q[:n*H*qk], W: a.Q}, {Out: s.k[:n*width], W: w.KVA}}
		kernels.MatMulEach(s.hn[:n*h], n, s.qkv[:2])
	}
	s.cos, s.sin = grow(s.cos, rope/2), grow(s.sin, rope/2)
	span, positions := 0, 0
	for t := range n {
		row := s.k[t*width : (t+1)*width]
		kernels.RMSNorm(row[:rank], row[:rank], w.KVANorm, mlaNormEps)
		cache, pos := rows.at(t)
		s.ropeAt(pos)
		ropeInterleaved(row[rank:], s.cos, s.sin)
		for head := range H {
			ropeInterleaved(s.q[t*H*qk+head*qk+m.NopeDim:t*H*qk+(head+1)*qk], s.cos, s.sin)
		}
		if err := cache.Put(l, pos, row, nil); err != nil {
			return err
		}
		span, positions = max(span, pos+1), positions+pos+1
	}
	// absorbed queries [t][head][width]: each head's latent part for all
	// rows at once (its no-RoPE queries gathered into s.proj, the
	// product into s.shared), then its rotary part copied
	vd := m.VDim
	s.att = grow(s.att, n*H*width)
	s.proj = grow(s.proj, n*max(m.NopeDim, vd, h))
	s.shared = grow(s.shared, n*rank)
	lat := s.shared[:n*rank]
	for head := range H {
		nope := s.proj[:n*m.NopeDim]
		for t := range n {
			copy(nope[t*m.NopeDim:(t+1)*m.NopeDim], s.q[t*H*qk+head*qk:])
		}
		kernels.MatMul(lat, rowBlock(w.ukT, head*rank, rank), nope, n)
		for t := range n {
			dst := s.att[(t*H+head)*width : (t*H+head+1)*width]
			copy(dst[:rank], lat[t*rank:(t+1)*rank])
			copy(dst[rank:], s.q[t*H*qk+head*qk+m.NopeDim:t*H*qk+(head+1)*qk])
		}
	}
	// attention over the latent rows: each (row, head)'s mix, in the
	// latent space, into s.v (its last rope floats mix rotary keys: unused)
	scale := c.mlaScale()
	s.v = grow(s.v, n*H*width)
	heads := n * H
	chunks := kernels.ParallelChunks(heads, 2*H*positions*width)
	s.scores = grow(s.scores, chunks*span)
	kernels.ParallelFor(chunks, heads, func(ch, i0, i1 int) {
		scores := s.scores[ch*span : (ch+1)*span]
		for i := i0; i < i1; i++ {
			cache, pos := rows.at(i / H)
			latents := cache.Keys(l, pos+1)
			kernels.Attend(s.v[i*width:(i+1)*width], scores[:pos+1], s.att[i*width:(i+1)*width], latents, latents, width, 0, scale)
		}
	})
	// out of the latent space through each head's value rows of
	// kv_b_proj, into s.hn as [t][head][v], then o_proj
	s.hn = grow(s.hn, n*max(h, H*vd))
	out := s.proj[:n*vd]
	for head := range H {
		for t := range n {
			copy(lat[t*rank:(t+1)*rank], s.v[(t*H+head)*width:])
		}
		kernels.MatMul(out, w.valueRows(m, head), lat, n)
		for t := range n {
			copy(s.hn[(t*H+head)*vd:(t*H+head+1)*vd], out[t*vd:(t+1)*vd])
		}
	}
	s.proj = grow(s.proj, n*h)
	kernels.MatMul(s.proj[:n*h], a.O, s.hn[:n*H*vd], n)
	kernels.Add(s.x[:n*h], s.proj[:n*h])
	return nil
}

// ropeInterleaved rotates x (a head's rotary part, pairs (x[2i],
// x[2i+1]) at frequency i) as transformers' apply_rotary_pos_emb_interleave
// does: de-interleaved to [x[0], x[2], ..., x[1], x[3], ...], then the
// rotate-half rotation. x stays in that order: queries and keys are
// rotated alike, so their products are those of the interleaved order.
func ropeInterleaved(x, cos, sin []float32) {
	d := len(x)
	var buf [256]float32
	tmp := buf[:d]
	if d > len(buf) {
		tmp = make([]float32, d)
	}
	for i := range d / 2 {
		tmp[i], tmp[d/2+i] = x[2*i], x[2*i+1]
	}
	copy(x, tmp)
	kernels.RoPE(x, 1, d, cos, sin)
}
