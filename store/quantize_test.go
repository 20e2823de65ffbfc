package store

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
)

// A shadow whose experts come from the store (model.QuantizedWith over a
// model loaded without them) holds the same quantized copy, byte for
// byte, as one quantizing them bound from the checkpoint, in every
// family and format (BF16, FP8 with its scales, gpt-oss's fused MXFP4
// with biases), and so decodes the same logits.
func TestAShadowQuantizesExpertsFromTheStoreAsFromTheCheckpoint(t *testing.T) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny", "gpt-oss-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny", "deepseek-v3-tiny-fp8"} {
		t.Run(preset, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), preset)
			if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: 21}); err != nil {
				t.Fatal(err)
			}
			storeDir := filepath.Join(t.TempDir(), "store")
			if err := Convert(context.Background(), dir, storeDir, ConvertOptions{}); err != nil {
				t.Fatal(err)
			}
			st, err := Open(storeDir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			for _, dt := range []kernels.DType{kernels.Q8, kernels.NF4} {
				bound, err := model.Load(dir, model.LoadOptions{})
				if err != nil {
					t.Fatal(err)
				}
				want, err := bound.Quantized(dt, nil)
				bound.Close()
				if err != nil {
					t.Fatal(err)
				}
				bare, err := model.Load(dir, model.LoadOptions{SkipExperts: true})
				if err != nil {
					t.Fatal(err)
				}
				var last, total int64
				got, err := bare.QuantizedWith(dt, st, func(done, all int64) { last, total = done, all })
				bare.Close()
				if err != nil {
					t.Fatal(err)
				}
				if last != total || total == 0 {
					t.Errorf("%v: progress ended at %d of %d", dt, last, total)
				}
				// the footprint a shadow says at start, counted from the store
				// (one expert a layer read), is the checkpoint's
				all := model.AllLayers(want.Config.NumLayers)
				fopt := model.FootprintOptions{Quantized: true, Quant: dt, Experts: true}
				bound, err = model.Load(dir, model.LoadOptions{})
				if err != nil {
					t.Fatal(err)
				}
				wantF, err := bound.FootprintOf(all, fopt)
				bound.Close()
				if err != nil {
					t.Fatal(err)
				}
				bare, err = model.Load(dir, model.LoadOptions{SkipExperts: true})
				if err != nil {
					t.Fatal(err)
				}
				fopt.ExpertsFrom = st
				gotF, err := bare.FootprintOf(all, fopt)
				bare.Close()
				if err != nil || gotF != wantF {
					t.Errorf("%v: footprint from the store %+v (%v), from the checkpoint %+v", dt, gotF, err, wantF)
				}
				if got.ExpertBytes() != want.ExpertBytes() || got.NonExpertBytes() != want.NonExpertBytes() {
					t.Errorf("%v: holds experts %d, the rest %d; from the checkpoint %d, %d", dt, got.ExpertBytes(), got.NonExpertBytes(), want.ExpertBytes(), want.NonExpertBytes())
				}
				compared := 0
				for l := range want.Layers {
					wm, gm := want.Layers[l].MoE, got.Layers[l].MoE
					if wm == nil {
						continue
					}
					if len(gm.Experts) != len(wm.Experts) {
						t.Fatalf("%v: layer %d has %d experts, want %d", dt, l, len(gm.Experts), len(wm.Experts))
					}
					for e := range wm.Experts {
						w, g := wm.Experts[e], gm.Experts[e]
						for _, p := range [][2]kernels.Matrix{{w.Gate, g.Gate}, {w.Up, g.Up}, {w.GateUp, g.GateUp}, {w.Down, g.Down}, {w.GateUpBias, g.GateUpBias}, {w.DownBias, g.DownBias}} {
							if p[0].DType != p[1].DType || p[0].Rows != p[1].Rows || p[0].Cols != p[1].Cols ||
								!bytes.Equal(p[0].Data, p[1].Data) || !bytes.Equal(p[0].Scales, p[1].Scales) {
								t.Fatalf("%v: layer %d expert %d: a matrix differs (%v %dx%d against %v %dx%d, or its bytes)", dt, l, e, p[1].DType, p[1].Rows, p[1].Cols, p[0].DType, p[0].Rows, p[0].Cols)
							}
						}
						if w.Limit != g.Limit || w.Alpha != g.Alpha {
							t.Fatalf("%v: layer %d expert %d: limit/alpha %v/%v, want %v/%v", dt, l, e, g.Limit, g.Alpha, w.Limit, w.Alpha)
						}
						compared++
					}
				}
				if compared == 0 {
					t.Fatal("no expert compared")
				}
				prompt := []int{1, 5, 9, 2}
				if a, b := logitsOf(t, got, prompt), logitsOf(t, want, prompt); !slices.Equal(a, b) {
					t.Fatalf("%v: logits differ", dt)
				}
			}
		})
	}
}

func logitsOf(t *testing.T, m *model.Model, prompt []int) []float32 {
	t.Helper()
	s := model.NewSession(m, model.NewResidentExperts(m), len(prompt)+1)
	logits, err := s.Forward(context.Background(), prompt)
	if err != nil {
		t.Fatal(err)
	}
	return logits
}

// BenchmarkShadowQuantizes: a shadow's int8 copy of the benchmark model
// (ODMOE_BENCH_PRESET; `make bench` uses small) made from the
// checkpoint's bf16 tensors and from the store (its experts decompressed
// one at a time), alternating: what taking the experts as chunks costs
// the shadow's start.
func BenchmarkShadowQuantizes(b *testing.B) {
	modelDir, storeDir := benchDirs(b)
	st, err := Open(storeDir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for _, from := range []string{"checkpoint", "store"} {
		b.Run(from, func(b *testing.B) {
			for range b.N {
				m, err := model.Load(modelDir, model.LoadOptions{SkipExperts: from == "store"})
				if err != nil {
					b.Fatal(err)
				}
				var reader model.ExpertReader
				if from == "store" {
					reader = st
				}
				q, err := m.QuantizedWith(kernels.Q8, reader, nil)
				m.Close()
				if err != nil || q.ExpertBytes() == 0 {
					b.Fatalf("%v (%d expert bytes)", err, q.ExpertBytes())
				}
			}
		})
	}
}
