package model

import (
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

// TestDecodeBytesPerTokenCountsWhatAStepReads: tiny's figure, summed
// here from its matrices: attention and routers of every layer, TopK
// experts of each MoE layer, the final head, one embedding row.
func TestDecodeBytesPerTokenCountsWhatAStepReads(t *testing.T) {
	m := loadTiny(t)
	size := func(w kernels.Matrix) int64 { return int64(len(w.Data)) }
	want := size(m.LMHead) + int64(m.Embed.DType.RowBytes(m.Embed.Cols)) + int64(4*len(m.FinalNorm))
	for _, L := range m.Layers {
		a := L.Attention
		want += size(a.Q) + size(a.K) + size(a.V) + size(a.O) + int64(4*len(a.Norm))
		if L.MoE != nil {
			want += size(L.MoE.Router) + int64(4*len(L.MoE.Norm))
			e := L.MoE.Experts[0]
			want += int64(m.Config.TopK) * (size(e.Gate) + size(e.Up) + size(e.Down))
		}
	}
	got := m.DecodeBytesPerToken()
	t.Logf("%d bytes a token, %d summed", got, want)
	// norms may be held as float32 copies of bf16 tensors: allow their size
	if diff := got - want; diff < -want/100 || diff > want/100 {
		t.Fatalf("DecodeBytesPerToken = %d, summed from the matrices %d", got, want)
	}
}
