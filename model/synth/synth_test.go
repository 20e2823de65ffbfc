package synth

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/chat"
	"github.com/odmoe/odmoe/model/tokenizer"
)

func TestGenerateIsDeterministicPerSeed(t *testing.T) {
	dir := t.TempDir()
	read := func(seed uint64, name string) []byte {
		d := filepath.Join(dir, name)
		if err := Generate(d, Options{Preset: "tiny", Seed: seed}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(d, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b, c := read(5, "a"), read(5, "b"), read(6, "c")
	if !bytes.Equal(a, b) {
		t.Fatal("same seed gave different weights")
	}
	if bytes.Equal(a, c) {
		t.Fatal("different seeds gave the same weights")
	}
}

func TestAdoptedTokenizerSizesVocabulary(t *testing.T) {
	tokDir := t.TempDir()
	tok, err := tokenizer.TrainSentencePieceBPE(tokenizer.BuiltinCorpus, 700)
	if err != nil {
		t.Fatal(err)
	}
	if err := tok.WriteFiles(tokDir); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "m")
	if err := Generate(out, Options{Preset: "tiny", Seed: 1, Tokenizer: filepath.Join(tokDir, "tokenizer.json")}); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Vocab int `json:"vocab_size"`
	}
	b, _ := os.ReadFile(filepath.Join(out, "config.json"))
	json.Unmarshal(b, &cfg)
	if cfg.Vocab != tok.VocabSize() {
		t.Fatalf("vocab_size %d, adopted tokenizer has %d", cfg.Vocab, tok.VocabSize())
	}
}

func TestMixtralLayersPresetHasMixtralExpertSize(t *testing.T) {
	var expert int64
	for _, ts := range tensors(Presets["mixtral-layers"]) {
		switch ts.spec.Name {
		case "model.layers.0.block_sparse_moe.experts.0.w1.weight",
			"model.layers.0.block_sparse_moe.experts.0.w2.weight",
			"model.layers.0.block_sparse_moe.experts.0.w3.weight":
			expert += int64(elements(ts.spec.Shape)) * 2
		}
	}
	// Mixtral-8x7B: 3 x 4096 x 14336 BF16 = 352,321,536 bytes per expert
	if expert != 3*4096*14336*2 {
		t.Fatalf("expert bytes %d", expert)
	}
}

// TestSmallPresetsHaveTheRealLayerShapes checks each family's -small
// preset against its real model's per-layer shapes (one expert's bytes,
// experts per layer) and the ~1.5 GB budget the presets are sized for.
func TestSmallPresetsHaveTheRealLayerShapes(t *testing.T) {
	for _, c := range []struct {
		preset, expert0 string
		expertBytes     int64 // one expert's gate, up and down projections in BF16
		experts         int
	}{
		{"small", "model.layers.0.block_sparse_moe.experts.0.", 3 * 1024 * 3584 * 2, 8},
		{"qwen3-moe-small", "model.layers.0.mlp.experts.0.", 3 * 2048 * 768 * 2, 128}, // Qwen3-30B-A3B
		{"olmoe-small", "model.layers.0.mlp.experts.0.", 3 * 2048 * 1024 * 2, 64},     // OLMoE-1B-7B
		{"qwen2-moe-small", "model.layers.0.mlp.experts.0.", 3 * 2048 * 1408 * 2, 60}, // Qwen1.5-MoE-A2.7B
	} {
		var expert, total int64
		experts := map[string]bool{}
		for _, ts := range tensors(Presets[c.preset]) {
			n := int64(elements(ts.spec.Shape)) * 2
			total += n
			if strings.HasPrefix(ts.spec.Name, c.expert0) {
				expert += n
			}
			if rest, ok := strings.CutPrefix(ts.spec.Name, "model.layers.0.mlp.experts."); ok {
				experts[strings.SplitN(rest, ".", 2)[0]] = true
			} else if rest, ok := strings.CutPrefix(ts.spec.Name, "model.layers.0.block_sparse_moe.experts."); ok {
				experts[strings.SplitN(rest, ".", 2)[0]] = true
			}
		}
		if expert != c.expertBytes || len(experts) != c.experts {
			t.Errorf("%s: expert 0 of layer 0 has %d bytes, want %d; %d experts, want %d", c.preset, expert, c.expertBytes, len(experts), c.experts)
		}
		if total > 1600<<20 {
			t.Errorf("%s: %d MiB of weights, over the ~1.5 GB budget", c.preset, total>>20)
		}
	}
}

func TestUnknownPresetIsNamed(t *testing.T) {
	err := Generate(t.TempDir(), Options{Preset: "huge"})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte(`"huge"`)) {
		t.Fatalf("err = %v", err)
	}
}

func TestCachedGeneratesOnceAndReuses(t *testing.T) {
	cache := t.TempDir()
	dir, err := Cached(cache, "tiny", 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if dir != filepath.Join(cache, "models", "tiny-seed4") {
		t.Fatalf("dir %s", dir)
	}
	st, err := os.Stat(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Cached(cache, "tiny", 4, func(int64, int64) { t.Error("generated a cached model again") })
	if err != nil || again != dir {
		t.Fatalf("second call: %s, %v", again, err)
	}
	st2, _ := os.Stat(filepath.Join(dir, "model.safetensors"))
	if !st2.ModTime().Equal(st.ModTime()) {
		t.Fatal("the cached model was rewritten")
	}
	if entries, _ := os.ReadDir(filepath.Join(cache, "models")); len(entries) != 1 {
		t.Fatalf("temporary directories left behind: %v", entries)
	}

	// a model generated from another shape of the preset (an older
	// odmoe's) is made anew, and nothing is left beside it
	stale := filepath.Join(dir, stampFile)
	b, _ := os.ReadFile(stale)
	os.WriteFile(stale, bytes.Replace(b, []byte(`"fingerprint": "`), []byte(`"fingerprint": "0`), 1), 0o644)
	regenerated := false
	again, err = Cached(cache, "tiny", 4, func(int64, int64) { regenerated = true })
	if err != nil || again != dir || !regenerated {
		t.Fatalf("stale model: %s, %v, regenerated %v", again, err, regenerated)
	}
	if b2, _ := os.ReadFile(stale); !bytes.Equal(b2, b) {
		t.Fatalf("stamp after regenerating: %s, want %s", b2, b)
	}
	if entries, _ := os.ReadDir(filepath.Join(cache, "models")); len(entries) != 1 {
		t.Fatalf("after regenerating a stale model: %v", entries)
	}
}

// TestEveryTinyPresetLoads generates each family's tiny preset and reads
// it back as the run commands do: config.json as a model config,
// tokenizer.json with tokenizer_config.json and generation_config.json
// as a tokenizer whose text round-trips, and the BOS and EOS ids the
// configs name inside the model's vocabulary.
func TestEveryTinyPresetLoads(t *testing.T) {
	for _, name := range []string{"tiny", "qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), name)
			if err := Generate(dir, Options{Preset: name, Seed: 1}); err != nil {
				t.Fatal(err)
			}
			cfg, err := model.LoadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			tok, err := tokenizer.LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			const text = "The swarm loads experts just in time."
			if got := tok.Decode(tok.Encode(text, false), false); got != text {
				t.Fatalf("round trip: %q, want %q", got, text)
			}
			if len(tok.EOS()) == 0 {
				t.Fatal("no EOS id")
			}
			for _, id := range append(tok.EOS(), tok.BOS()) {
				if id >= cfg.VocabSize {
					t.Fatalf("special id %d outside the model's vocabulary %d", id, cfg.VocabSize)
				}
			}
			// the family's chat template, whose markers are the
			// tokenizer's special tokens
			tmpl, err := chat.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			if want, _ := chat.Builtin(chatTemplates[Presets[name].Family]); tmpl.Source() != want {
				t.Errorf("chat template is not the family's %s", chatTemplates[Presets[name].Family])
			}
			prompt, err := tmpl.Render(map[string]any{"add_generation_prompt": true, "messages": []any{
				map[string]any{"role": "system", "content": "Be brief."}, map[string]any{"role": "user", "content": text},
				map[string]any{"role": "assistant", "content": "Yes."}, map[string]any{"role": "user", "content": "Why?"}}})
			if err != nil {
				t.Fatal(err)
			}
			ids := tok.Encode(prompt, false)
			markers := map[bool][]string{false: {"<s>", "</s>"}, true: {"<|im_start|>", "<|im_end|>"}}[Presets[name].byteLevel()]
			for _, m := range markers {
				id, ok := tok.TokenID(m)
				if !ok || !slices.Contains(ids, id) {
					t.Errorf("%s (id %d, %v) is not a token of the prompt %q", m, id, ok, prompt)
				}
			}
		})
	}
}

// TestGptOssSmallHasGptOss120bsLayer: gpt-oss-small's experts are
// gpt-oss-120b's as published: 128 of them, each gate_up (2*2880 x 2880)
// and down (2880 x 2880) in MXFP4 (17 bytes per 32 weights) and its two
// bias rows in BF16, stacked per layer; ~2.1 GB in all (one layer of
// 1.7 GB of experts, a 32000-token vocabulary).
func TestGptOssSmallHasGptOss120bsLayer(t *testing.T) {
	const h, in, E = 2880, 2880, 128
	want := map[string][]int{
		"model.layers.0.mlp.experts.gate_up_proj_blocks": {E, 2 * in, h / 32, 16},
		"model.layers.0.mlp.experts.gate_up_proj_scales": {E, 2 * in, h / 32},
		"model.layers.0.mlp.experts.gate_up_proj_bias":   {E, 2 * in},
		"model.layers.0.mlp.experts.down_proj_blocks":    {E, h, in / 32, 16},
		"model.layers.0.mlp.experts.down_proj_scales":    {E, h, in / 32},
		"model.layers.0.mlp.experts.down_proj_bias":      {E, h},
	}
	var experts, total int64
	for _, ts := range tensors(Presets["gpt-oss-small"]) {
		n := int64(elements(ts.spec.Shape) * elemBytes(ts.spec.DType))
		total += n
		if shape, ok := want[ts.spec.Name]; ok {
			if fmt.Sprint(shape) != fmt.Sprint(ts.spec.Shape) {
				t.Errorf("%s: shape %v, want %v", ts.spec.Name, ts.spec.Shape, shape)
			}
			experts += n
			delete(want, ts.spec.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing %v", want)
	}
	if per := experts / E; per != 3*h*in*17/32+(2*in+h)*2 {
		t.Errorf("an expert is %d bytes, want %d", per, 3*h*in*17/32+(2*in+h)*2)
	}
	if total > 2200<<20 {
		t.Errorf("%d MiB of weights, over the ~2.1 GB it is sized for", total>>20)
	}
}

// TestDeepseekV3SmallHasDeepseekV3sLayer: deepseek-v3-small's experts and
// attention are DeepSeek-V3's as published: 256 experts each gate, up
// (2048 x 7168) and down (7168 x 2048) in F8_E4M3 with a float32 scale per
// 128x128 block, MLA's projections at their real shapes, in FP8 too.
func TestDeepseekV3SmallHasDeepseekV3sLayer(t *testing.T) {
	want := map[string][]int{
		"model.layers.0.mlp.experts.255.gate_proj.weight":           {2048, 7168},
		"model.layers.0.mlp.experts.255.gate_proj.weight_scale_inv": {16, 56},
		"model.layers.0.mlp.experts.0.down_proj.weight":             {7168, 2048},
		"model.layers.0.mlp.experts.0.down_proj.weight_scale_inv":   {56, 16},
		"model.layers.0.self_attn.q_a_proj.weight":                  {1536, 7168},
		"model.layers.0.self_attn.q_b_proj.weight":                  {128 * 192, 1536},
		"model.layers.0.self_attn.kv_a_proj_with_mqa.weight":        {512 + 64, 7168},
		"model.layers.0.self_attn.kv_b_proj.weight":                 {128 * 256, 512},
		"model.layers.0.self_attn.o_proj.weight":                    {7168, 128 * 128},
		"model.layers.0.mlp.gate.weight":                            {256, 7168},
	}
	var total int64
	experts := 0
	for _, ts := range tensors(Presets["deepseek-v3-small"]) {
		total += int64(elements(ts.spec.Shape) * elemBytes(ts.spec.DType))
		if strings.HasSuffix(ts.spec.Name, ".gate_proj.weight") && strings.Contains(ts.spec.Name, ".experts.") {
			experts++
			if ts.spec.DType != "F8_E4M3" {
				t.Errorf("%s is %s", ts.spec.Name, ts.spec.DType)
			}
		}
		if shape, ok := want[ts.spec.Name]; ok {
			if fmt.Sprint(shape) != fmt.Sprint(ts.spec.Shape) {
				t.Errorf("%s: shape %v, want %v", ts.spec.Name, ts.spec.Shape, shape)
			}
			delete(want, ts.spec.Name)
		}
	}
	if len(want) > 0 || experts != 256 {
		t.Errorf("missing %v; %d experts", want, experts)
	}
	if total > 12600<<20 {
		t.Errorf("%d MiB of weights, over the ~12.4 GB it is sized for", total>>20)
	}
}
