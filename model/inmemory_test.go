package model

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/synth"
)

// A model whose weights are copied into memory of its own decodes bit
// for bit as the mapped one, every family; every weight but the token
// embedding (unless it is the head) is copied, and what a Check refuses
// is never copied.
func TestWeightsInMemoryDecodeAsTheMapping(t *testing.T) {
	prompts := [][]int{{1, 5, 9, 2}, {3}}
	eachFamilyIn(t, 11, func(t *testing.T, dir string, mapped *Model) {
		want := aloneLogits(t, mapped, prompts, 4)
		var copied, total int64
		mem, err := Load(dir, LoadOptions{Weights: WeightsInMemory, Progress: func(done, all int64) { copied, total = done, all }})
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		if got := aloneLogits(t, mem, prompts, 4); !slices.EqualFunc(got, want, func(a, b [][]float32) bool {
			return slices.EqualFunc(a, b, func(x, y []float32) bool { return slices.Equal(x, y) })
		}) {
			t.Fatal("logits differ between the weights in memory and mapped")
		}
		held := mem.NonExpertBytes() + mem.ExpertBytes()
		embed := int64(0)
		if mem.Embed.Bytes() > 0 && (len(mem.LMHead.Data) == 0 || &mem.Embed.Data[0] != &mem.LMHead.Data[0]) {
			embed = int64(mem.Embed.Bytes()) // stays mapped
		}
		// BF16 gpt-oss's stacked experts are transposed into memory of
		// the model's own, expert by expert: not copied first
		var stacked int64
		if c := mem.Config; filepath.Base(dir) == "gpt-oss-tiny" {
			stacked = int64(len(c.ExpertLayers())) * int64(c.NumExperts) * int64(c.HiddenSize) * int64(3*c.IntermediateSize) * 2
		}
		// every other weight but the embedding, less what the load makes
		// of its own: the norms' vectors (float32) and DeepSeek's MLA key
		// and value blocks (11% of deepseek-v3-tiny-fp8's)
		if want := held - embed - stacked; copied != total || total > want || total < want*4/5 {
			t.Errorf("progress said %d of %d bytes copied; the model binds %d, %d of them the mapped embedding, %d stacked experts", copied, total, held, embed, stacked)
		}
		if got := mem.WeightsInMemory(); got != total {
			t.Errorf("WeightsInMemory %d, want the %d copied", got, total)
		}
		if mapped.WeightsInMemory() != 0 {
			t.Errorf("the mapped model says %d bytes in memory", mapped.WeightsInMemory())
		}
	})
	for _, preset := range []string{"deepseek-v3-tiny-fp8", "gpt-oss-tiny"} { // MLA's derived matrices; experts transposed
		t.Run("check counts what the load holds/"+preset, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), preset)
			if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: 3}); err != nil {
				t.Fatal(err)
			}
			var counted Footprint
			var nonExpert, experts int64
			m, err := Load(dir, LoadOptions{Weights: WeightsInMemory, Check: func(m *Model) error {
				var err error
				counted, err = m.FootprintOf(m.HeldLayers(), FootprintOptions{Experts: true, Head: true})
				nonExpert, experts = m.NonExpertBytes(), m.ExpertBytes()
				return err
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			held, err := m.FootprintOf(m.HeldLayers(), FootprintOptions{Experts: true, Head: true})
			if err != nil {
				t.Fatal(err)
			}
			if counted != held || nonExpert != m.NonExpertBytes() || experts != m.ExpertBytes() {
				t.Errorf("Check counted %v (non-expert %d, experts %d bytes); the model loaded holds %v (%d, %d)",
					counted, nonExpert, experts, held, m.NonExpertBytes(), m.ExpertBytes())
			}
		})
	}
	t.Run("check refuses", func(t *testing.T) {
		dir := tinyModel(t)
		refused := errors.New("over budget")
		_, err := Load(dir, LoadOptions{Weights: WeightsInMemory, Check: func(m *Model) error {
			if m.WeightsInMemory() != 0 {
				t.Error("Check was given a model already copied")
			}
			return refused
		}})
		if !errors.Is(err, refused) {
			t.Fatalf("Load: %v, want the Check's error", err)
		}
	})
}

// Packed weights (kernels.BF16P: every BF16 product weight whose rows are
// whole blocks of 64) decode bit for bit as the mapping, every family,
// and hold about 13/16 of the BF16 bytes they packed.
func TestPackedWeightsDecodeAsTheMapping(t *testing.T) {
	prompts := [][]int{{1, 5, 9, 2}, {3}}
	eachFamilyIn(t, 12, func(t *testing.T, dir string, mapped *Model) {
		want := aloneLogits(t, mapped, prompts, 4)
		packed, err := Load(dir, LoadOptions{Weights: WeightsPacked})
		if err != nil {
			t.Fatal(err)
		}
		defer packed.Close()
		if got := aloneLogits(t, packed, prompts, 4); !slices.EqualFunc(got, want, func(a, b [][]float32) bool {
			return slices.EqualFunc(a, b, func(x, y []float32) bool { return slices.Equal(x, y) })
		}) {
			t.Fatal("logits differ between the packed weights and mapped")
		}
		from, to := packed.WeightsPacked()
		bf16 := packed.Config.Quantization != "fp8" // FP8's products are F8E4M3
		if bf16 && (from == 0 || to < from*13/16 || to > from*14/16) {
			t.Errorf("%d bytes of BF16 packed into %d: want about 13/16", from, to)
		}
		if got := packed.Layers[0].Attention.O.DType; bf16 && got != kernels.BF16P {
			t.Errorf("layer 0's o_proj is %v, want BF16P", got)
		}
	})
}

// A packed model whose head and a layer-1 expert hold rows with a high
// byte outside their tables (a subnormal weight: exception rows, computed
// from their BF16 copies) still decodes bit for bit as the mapping.
func TestPackedExceptionRowsDecodeAsTheMapping(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := synth.Generate(dir, synth.Options{Preset: "tiny", Seed: 13}); err != nil {
		t.Fatal(err)
	}
	mapped, err := Load(dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expert, _ := mapped.ExpertTensors(1, 0)
	vocab := mapped.Config.VocabSize
	mapped.Close()
	spoilHighBytes(t, filepath.Join(dir, "model.safetensors"), map[string][]int{
		"lm_head.weight": {0, 5, vocab / 2, vocab - 1},
		expert[2]:        {1, 3}, // down_proj: hidden rows
	})
	mapped, err = Load(dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	packed, err := Load(dir, LoadOptions{Weights: WeightsPacked})
	if err != nil {
		t.Fatal(err)
	}
	defer packed.Close()
	down := packed.Layers[1].MoE.Experts[0].Down
	for name, m := range map[string]kernels.Matrix{"head": packed.LMHead, "layer 1 expert 0 down": down} {
		if m.DType != kernels.BF16P || len(m.Scales) <= 68 {
			t.Fatalf("%s: %v with %d bytes of table and exceptions: want BF16P with exception rows", name, m.DType, len(m.Scales))
		}
	}
	prompts := [][]int{{1, 5, 9, 2}, {3}}
	want, got := aloneLogits(t, mapped, prompts, 4), aloneLogits(t, packed, prompts, 4)
	if !slices.EqualFunc(got, want, func(a, b [][]float32) bool {
		return slices.EqualFunc(a, b, func(x, y []float32) bool { return slices.Equal(x, y) })
	}) {
		t.Fatal("logits differ between the packed weights with exception rows and mapped")
	}
}

// spoilHighBytes gives the first 40 weights of each listed row of each
// BF16 tensor of a safetensors file the high bytes 0x00 to 0x27 (tiny
// magnitudes, low bytes kept): more rare high bytes than a table holds
// beside the common ones, so those rows are exceptions.
func spoilHighBytes(t *testing.T, path string, rows map[string][]int) {
	t.Helper()
	f, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(f)
	var header map[string]json.RawMessage
	if err := json.Unmarshal(f[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	for name, rs := range rows {
		var info struct {
			DType       string  `json:"dtype"`
			Shape       []int   `json:"shape"`
			DataOffsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(header[name], &info); err != nil || info.DType != "BF16" || len(info.Shape) != 2 {
			t.Fatalf("tensor %q: %s %v (%v): want a BF16 matrix", name, info.DType, info.Shape, err)
		}
		data := f[8+int64(n)+info.DataOffsets[0]:]
		for _, r := range rs {
			for i := range 40 {
				data[2*(r*info.Shape[1]+i)+1] = byte(i)
			}
		}
	}
	if err := os.WriteFile(path, f, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Shapes mode gives an F8 kv_b_proj's value rows the dtype and shape the
// values would have, head by head: the rows kept in F8 (a head whose
// rows start a 128-row block) and those dequantized to F32 alike.
func TestHeadValueRowsShapesAreTheValuesShapes(t *testing.T) {
	const heads, rank = 6, 64
	m := &MLAConfig{NopeDim: 64, VDim: 128} // head h's value rows start at 192h+64: a 128-row block for odd h
	rows := heads * (m.NopeDim + m.VDim)
	kvb := kernels.Matrix{DType: kernels.F8E4M3, Rows: rows, Cols: rank,
		Data: make([]byte, rows*rank), Scales: make([]byte, kernels.ScalesBytes(kernels.F8E4M3, rows, rank))}
	for i := range kvb.Data {
		kvb.Data[i] = byte(i % 0x7e)
	}
	values, shapes := headValueRows(kvb, m, heads, false), headValueRows(kvb, m, heads, true)
	f32 := 0
	for h := range values {
		v, s := values[h], shapes[h]
		if v.DType != s.DType || v.Rows != s.Rows || v.Cols != s.Cols {
			t.Errorf("head %d: values %v %dx%d, shapes %v %dx%d", h, v.DType, v.Rows, v.Cols, s.DType, s.Rows, s.Cols)
		}
		if v.DType == kernels.F32 {
			f32++
			if int64(len(v.Data)) != int64(s.Rows)*int64(s.DType.RowBytes(s.Cols)) {
				t.Errorf("head %d: %d bytes of values, the shape says %d", h, len(v.Data), s.Rows*s.DType.RowBytes(s.Cols))
			}
		}
	}
	if f32 == 0 || f32 == heads {
		t.Fatalf("%d of %d heads dequantized: the test wants both kinds", f32, heads)
	}
}
