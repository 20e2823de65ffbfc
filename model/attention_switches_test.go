package model

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestAttentionSinksAndLayerWindowsAreUsed: per-head sinks of -Inf give
// the bits of no sinks, finite ones other logits; a window set on every
// layer gives the bits of the same window in the config, and a window on
// one layer only differs from both none and all; an output bias of zeros
// gives the bits of none, another bias other logits.
func TestAttentionSinksAndLayerWindowsAreUsed(t *testing.T) {
	tokens := testTokens // 12 positions
	run := func(edit func(m *Model)) []float32 {
		t.Helper()
		m := loadTiny(t)
		edit(m)
		out, err := NewSession(m, NewResidentExperts(m), 0).Forward(context.Background(), tokens)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), out...)
	}
	plain := run(func(*Model) {})
	sinks := func(v float32) func(m *Model) {
		return func(m *Model) {
			for l := range m.Layers {
				m.Layers[l].Attention.Sinks = make([]float32, m.Config.NumHeads)
				for h := range m.Layers[l].Attention.Sinks {
					m.Layers[l].Attention.Sinks[h] = v
				}
			}
		}
	}
	if d := firstDiff(run(sinks(float32(math.Inf(-1)))), plain); d >= 0 {
		t.Fatalf("sinks of -Inf changed logit %d", d)
	}
	if firstDiff(run(sinks(1)), plain) < 0 {
		t.Fatal("sinks of 1 left every logit as it was")
	}
	layerWindows := func(w int, layers ...int) func(m *Model) {
		return func(m *Model) {
			for _, l := range layers {
				m.Layers[l].Attention.Window = w
			}
		}
	}
	all := []int{0, 1, 2, 3}
	// the config's sliding_window (Mixtral reads it), through Load
	orig, err := os.ReadFile(filepath.Join(tinyModel(t), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	windowed, err := Load(withConfigField(t, tinyModel(t), orig, "sliding_window", "4"), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer windowed.Close()
	configWindow, err := NewSession(windowed, NewResidentExperts(windowed), 0).Forward(context.Background(), tokens)
	if err != nil {
		t.Fatal(err)
	}
	configWindow = append([]float32(nil), configWindow...)
	if d := firstDiff(run(layerWindows(4, all...)), configWindow); d >= 0 {
		t.Fatalf("a window of 4 on every layer differs from the config's at logit %d", d)
	}
	one := run(layerWindows(4, 1))
	if firstDiff(one, plain) < 0 || firstDiff(one, configWindow) < 0 {
		t.Fatal("a window on one layer is the same as none or as all")
	}
	oBias := func(v float32) func(m *Model) {
		return func(m *Model) {
			b := make([]float32, m.Config.HiddenSize)
			for i := range b {
				b[i] = v
			}
			m.Layers[2].Attention.OBias = b
		}
	}
	if d := firstDiff(run(oBias(0)), plain); d >= 0 {
		t.Fatalf("an output bias of zeros changed logit %d", d)
	}
	if firstDiff(run(oBias(0.1)), plain) < 0 {
		t.Fatal("an output bias of 0.1 left every logit as it was")
	}
}
