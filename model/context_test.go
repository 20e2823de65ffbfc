package model

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model/synth"
)

// TestAShorterContextHoldsLessAndComputesTheSameBits: a model loaded with
// LoadOptions.Context (-context) sizes its KV cache to it, as FootprintOf
// says, refuses a position past it by naming it, and computes every
// logit below it bit for bit as the model's whole context does, also
// where YaRN reads the context it was trained for from
// max_position_embeddings (deepseek-v3-tiny with its rope_scaling's
// original_max_position_embeddings taken out). A context longer than the
// model's is refused.
func TestAShorterContextHoldsLessAndComputesTheSameBits(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ds")
	if err := synth.Generate(dir, synth.Options{Preset: "deepseek-v3-tiny", Seed: 3}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.json")
	var cfg map[string]any
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &cfg) != nil {
		t.Fatalf("config.json: %v", err)
	}
	delete(cfg["rope_scaling"].(map[string]any), "original_max_position_embeddings")
	if b, err = json.Marshal(cfg); err != nil || os.WriteFile(path, b, 0o644) != nil {
		t.Fatalf("config.json: %v", err)
	}
	whole, err := Load(dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	short, err := Load(dir, LoadOptions{Context: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	full := whole.Config.MaxPositions
	if short.Config.MaxPositions != 64 || full <= 64 {
		t.Fatalf("contexts %d and %d: want 64 and the model's, above it", short.Config.MaxPositions, full)
	}
	fw, err := whole.FootprintOf(whole.HeldLayers(), FootprintOptions{Head: true})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := short.FootprintOf(short.HeldLayers(), FootprintOptions{Head: true})
	if err != nil {
		t.Fatal(err)
	}
	if fs.KV*int64(full) != fw.KV*64 || fs.Weights() != fw.Weights() {
		t.Fatalf("footprints %+v and %+v: want the KV cache 64/%d of the whole context's, the weights the same", fs, fw, full)
	}
	tokens := []int{5, 17, 3, 99, 42, 7, 7, 8, 1, 60}
	run := func(m *Model) [][]float32 {
		s := NewSession(m, NewResidentExperts(m), 64)
		var out [][]float32
		for i := range tokens {
			logits, err := s.Forward(context.Background(), tokens[i:i+1])
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, slices.Clone(logits))
		}
		return out
	}
	a, c := run(whole), run(short)
	for i := range a {
		if !slices.Equal(a[i], c[i]) {
			t.Fatalf("position %d: the logits under -context 64 differ from the whole context's", i)
		}
	}
	s := NewSession(short, NewResidentExperts(short), 64)
	if _, err := s.Forward(context.Background(), make([]int, 65)); err == nil || !strings.Contains(err.Error(), "-context") {
		t.Fatalf("65 positions under -context 64: %v; want an error naming -context", err)
	}
	if _, err := Load(dir, LoadOptions{Context: full + 1}); err == nil || !strings.Contains(err.Error(), "-context") {
		t.Fatalf("-context past the model's: %v", err)
	}
}
