package skew

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/model/synth"
)

// TestSharesFollowTheFittedSpread: the shares are a distribution, even at
// skew 0, and their log loads against the normal quantiles of the ranks
// have slope skew*Sigma (the fit Sigma's comment describes, run back).
func TestSharesFollowTheFittedSpread(t *testing.T) {
	for _, n := range []int{8, 64, 128} {
		for _, s := range []float64{0, 0.5, 1, 2} {
			sh := Shares(n, s)
			var sum float64
			for _, v := range sh {
				sum += v
			}
			if math.Abs(sum-1) > 1e-12 || !slices.IsSortedFunc(sh, func(a, b float64) int { return -cmpFloat(a, b) }) {
				t.Fatalf("Shares(%d, %v) = %v: not a descending distribution", n, s, sh)
			}
			var zs, ys []float64
			for r, v := range sh {
				zs = append(zs, math.Sqrt2*math.Erfinv(1-2*(float64(r)+0.5)/float64(n)))
				ys = append(ys, math.Log(v*float64(n)))
			}
			if slope := leastSquaresSlope(zs, ys); math.Abs(slope-s*Sigma) > 1e-9 {
				t.Errorf("Shares(%d, %v): log-load slope %v, want %v", n, s, slope, s*Sigma)
			}
		}
	}
	// OLMoE's C4 layer 7, the measurement skew 1 stands for: its hottest
	// expert takes 2.66 times an even share; the lognormal of its fit
	// gives its 64 experts' hottest between 2 and 3 times
	if top := Shares(64, 1)[0] * 64; top < 2 || top > 3 {
		t.Errorf("skew 1's hottest of 64 experts takes %.2f times an even share, want OLMoE's 2-3", top)
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func leastSquaresSlope(x, y []float64) float64 {
	var mx, my float64
	for i := range x {
		mx, my = mx+x[i], my+y[i]
	}
	mx, my = mx/float64(len(x)), my/float64(len(y))
	var num, den float64
	for i := range x {
		num += (x[i] - mx) * (y[i] - my)
		den += (x[i] - mx) * (x[i] - mx)
	}
	return num / den
}

// generate writes preset (seed 3) into a new directory.
func generate(t *testing.T, preset string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), preset)
	if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSkewedModelsRouteAsMeasured: after Apply, the model routes tokens
// it was not calibrated on (other random prompts, and the benchmark's
// kind of text) to each layer's experts in the shares Shares gives, by
// rank, within Tolerance; each layer ranks its experts in an order of its
// own; only the routers' bytes changed; the report says what it did.
func TestSkewedModelsRouteAsMeasured(t *testing.T) {
	for _, c := range []struct {
		preset string
		skew   float64
	}{{"tiny", 1}, {"qwen3-moe-tiny", 1}, {"olmoe-tiny", 2}} {
		t.Run(c.preset, func(t *testing.T) {
			dir := generate(t, c.preset)
			before, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Apply(context.Background(), dir, Options{Skew: c.skew, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			m, err := model.Load(dir, model.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			want := Shares(m.Config.NumExperts, c.skew)
			// other prompts than the calibration's
			got, err := routedShares(context.Background(), m, calibration(Options{Seed: 99, Prompts: 256, Tokens: 32}, m.Config.VocabSize))
			if err != nil {
				t.Fatal(err)
			}
			orders := map[string]bool{}
			for _, lf := range rep.Layers {
				for r, e := range lf.Experts {
					if d := math.Abs(got[lf.Layer][e] - want[r]); d > Tolerance*want[r]+0.01 {
						t.Errorf("layer %d: rank %d (expert %d) takes %.3f of unseen tokens, want %.3f", lf.Layer, r, e, got[lf.Layer][e], want[r])
					}
				}
				orders[fmt.Sprint(lf.Experts)] = true
			}
			if len(rep.Layers) != len(m.Config.ExpertLayers()) || len(orders) != len(rep.Layers) {
				t.Errorf("%d layers fitted of %d, %d orders of popularity: each layer wants its own", len(rep.Layers), len(m.Config.ExpertLayers()), len(orders))
			}
			after, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
			changed := changedTensors(t, filepath.Join(dir, "model.safetensors"), before, after)
			for _, name := range changed {
				if !strings.HasSuffix(name, "block_sparse_moe.gate.weight") && !strings.HasSuffix(name, "mlp.gate.weight") {
					t.Errorf("%s changed: only the routers may", name)
				}
			}
			if len(changed) != len(m.Config.ExpertLayers()) {
				t.Errorf("%d tensors changed (%v), want the %d routers", len(changed), changed, len(m.Config.ExpertLayers()))
			}
			var onDisk Report
			if b, err := os.ReadFile(filepath.Join(dir, ReportFile)); err != nil || json.Unmarshal(b, &onDisk) != nil || onDisk.Skew != c.skew || onDisk.Source != Source || len(onDisk.Layers) != len(rep.Layers) {
				t.Errorf("%s: %+v (%v)", ReportFile, onDisk, err)
			}
		})
	}
}

// changedTensors names the tensors whose bytes differ between two
// versions of the safetensors file at path (a, then b: same header).
func changedTensors(t *testing.T, path string, a, b []byte) []string {
	t.Helper()
	if len(a) != len(b) || !bytes.Equal(a[:8], b[:8]) {
		t.Fatalf("file size %d -> %d, or its header changed", len(a), len(b))
	}
	set, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	data := 8 + int64(binary.LittleEndian.Uint64(a))
	var out []string
	for _, name := range set.Names() {
		info, _ := set.Info(name)
		if !bytes.Equal(a[data+info.Begin:data+info.End], b[data+info.Begin:data+info.End]) {
			out = append(out, name)
		}
	}
	return out
}

// TestSkewZeroAndWhatItCannotDraw: skew 0 leaves the model alone; a
// negative skew and a family whose routing it does not model are refused
// by name, and so is a shape the fit cannot reach.
func TestSkewZeroAndWhatItCannotDraw(t *testing.T) {
	dir := generate(t, "tiny")
	before, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if rep, err := Apply(context.Background(), dir, Options{Skew: 0}); rep != nil || err != nil {
		t.Fatalf("skew 0: %v, %v", rep, err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if !bytes.Equal(before, after) {
		t.Error("skew 0 changed the weights")
	}
	if _, err := os.Stat(filepath.Join(dir, ReportFile)); !os.IsNotExist(err) {
		t.Errorf("skew 0 wrote %s (%v)", ReportFile, err)
	}
	for _, c := range []struct {
		preset string
		skew   float64
		want   string
	}{
		{"tiny", -1, "-skew -1"},
		{"deepseek-v3-tiny", 1, "deepseek_v3"},
		{"gpt-oss-tiny", 1, "gpt_oss"},
		{"tiny", 12, "falls short"},
	} {
		dir := generate(t, c.preset)
		before, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
		_, err := Apply(context.Background(), dir, Options{Skew: c.skew, Seed: 1})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s -skew %v: error %v, want one naming %q", c.preset, c.skew, err, c.want)
		}
		if after, _ := os.ReadFile(filepath.Join(dir, "model.safetensors")); !bytes.Equal(before, after) {
			t.Errorf("%s -skew %v: refused, yet the weights changed", c.preset, c.skew)
		}
	}
}
