package model

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/odmoe/odmoe/kernels"
)

// RopeScaling is config.json's rope_scaling, as transformers reads it
// (modeling_rope_utils.py) for the types odmoe computes: "linear" (every
// frequency divided by Factor) and "yarn" (YaRN: frequencies blended
// between interpolated and original by dimension, and cos and sin
// multiplied by an attention factor). A checkpoint asking for another
// type is refused by name rather than run with plain RoPE.
type RopeScaling struct {
	Type   string  // rope_type (or the older type): "linear" or "yarn"
	Factor float64 // factor
	// YaRN's parameters, transformers' defaults filled in:
	// attention_factor (0: from mscale and mscale_all_dim, else
	// 0.1 ln(factor) + 1), beta_fast (32), beta_slow (1),
	// original_max_position_embeddings (0: max_position_embeddings),
	// truncate (true).
	AttentionFactor     float64
	MScale, MScaleAll   float64 // mscale, mscale_all_dim
	BetaFast, BetaSlow  float64
	OriginalMaxPosition int
	Truncate            bool
}

// parseRopeScaling reads rope_scaling; nil for none (absent, null, or
// the "default" type).
func parseRopeScaling(raw json.RawMessage) (*RopeScaling, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var r struct {
		RopeType, Type                             string
		Factor, AttentionFactor, MScale, MScaleAll *float64
		BetaFast, BetaSlow                         *float64
		OriginalMax                                *int
		Truncate                                   *bool
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf(`field "rope_scaling" is %s; want an object or null`, raw)
	}
	for key, dst := range map[string]any{
		"rope_type": &r.RopeType, "type": &r.Type, "factor": &r.Factor, "attention_factor": &r.AttentionFactor,
		"mscale": &r.MScale, "mscale_all_dim": &r.MScaleAll, "beta_fast": &r.BetaFast, "beta_slow": &r.BetaSlow,
		"original_max_position_embeddings": &r.OriginalMax, "truncate": &r.Truncate,
	} {
		if v, ok := m[key]; ok && string(v) != "null" {
			if err := json.Unmarshal(v, dst); err != nil {
				return nil, fmt.Errorf(`field "rope_scaling.%s" is %s: %v`, key, v, err)
			}
		}
	}
	typ := r.RopeType
	if typ == "" {
		typ = r.Type
	}
	switch typ {
	case "", "default":
		return nil, nil
	case "linear", "yarn":
	default:
		return nil, fmt.Errorf(`field "rope_scaling" has type %q; odmoe computes "linear" and "yarn" (and none)`, typ)
	}
	s := &RopeScaling{Type: typ, Factor: or(r.Factor, 0), AttentionFactor: or(r.AttentionFactor, 0), MScale: or(r.MScale, 0), MScaleAll: or(r.MScaleAll, 0),
		BetaFast: or(r.BetaFast, 32), BetaSlow: or(r.BetaSlow, 1), OriginalMaxPosition: or(r.OriginalMax, 0), Truncate: or(r.Truncate, true)}
	if s.Factor < 1 {
		return nil, fmt.Errorf(`field "rope_scaling.factor" is %g; must be at least 1`, s.Factor)
	}
	return s, nil
}

// ropeTables returns the inverse frequencies of a rotary embedding of dim
// dimensions and the factor cos and sin are multiplied by (1 unless YaRN),
// as transformers computes them in float32 (ROPE_INIT_FUNCTIONS: the
// default, _compute_linear_scaling_rope_parameters,
// _compute_yarn_parameters).
func (c Config) ropeTables(dim int) ([]float32, float32) {
	inv := kernels.RoPEFreqs(dim, c.RopeTheta)
	s := c.RopeScaling
	if s == nil {
		return inv, 1
	}
	factor := float32(s.Factor)
	if s.Type == "linear" {
		for i := range inv {
			inv[i] /= factor
		}
		return inv, 1
	}
	// YaRN
	mscale := func(scale, m float64) float64 {
		if scale <= 1 {
			return 1
		}
		return 0.1*m*math.Log(scale) + 1
	}
	attn := s.AttentionFactor
	if attn == 0 {
		if s.MScale != 0 && s.MScaleAll != 0 {
			attn = mscale(s.Factor, s.MScale) / mscale(s.Factor, s.MScaleAll)
		} else {
			attn = mscale(s.Factor, 1)
		}
	}
	orig := s.OriginalMaxPosition
	if orig == 0 {
		orig = c.MaxPositions
	}
	base := float64(float32(c.RopeTheta))
	correction := func(rotations float64) float64 {
		return float64(dim) * math.Log(float64(orig)/(rotations*2*math.Pi)) / (2 * math.Log(base))
	}
	low, high := correction(s.BetaFast), correction(s.BetaSlow)
	if s.Truncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = max(low, 0), min(high, float64(dim-1))
	if low == high {
		high += 0.001
	}
	lo32, span32 := float32(low), float32(high-low)
	for i := range inv {
		pos := float32(math.Pow(base, float64(float32(2*i)/float32(dim)))) // pos_freqs
		extrapolation, interpolation := 1/pos, 1/(factor*pos)
		ramp := min(max((float32(i)-lo32)/span32, 0), 1)
		extra := 1 - ramp // inv_freq_extrapolation_factor
		inv[i] = interpolation*(1-extra) + extrapolation*extra
	}
	return inv, float32(attn)
}
