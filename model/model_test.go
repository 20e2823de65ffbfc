package model

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/model/synth"
)

var (
	tinyOnce sync.Once
	tinyDir  string
	tinyErr  error
)

// tinyModel generates the tiny preset once per test binary.
func tinyModel(t testing.TB) string {
	t.Helper()
	tinyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "odmoe-tiny-")
		if err != nil {
			tinyErr = err
			return
		}
		tinyDir = filepath.Join(dir, "tiny")
		tinyErr = synth.Generate(tinyDir, synth.Options{Preset: "tiny", Seed: 7})
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if tinyDir != "" {
		os.RemoveAll(filepath.Dir(tinyDir))
	}
	os.Exit(code)
}

func loadTiny(t *testing.T) *Model {
	t.Helper()
	m, err := Load(tinyModel(t), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

var testTokens = []int{1, 17, 300, 42, 999, 5, 77, 512, 3, 250, 100, 64}

// TestForwardMatchesFloat64Reference checks the whole forward pass against
// an independent float64 implementation of the HF formulas: float32
// arithmetic must stay within 1e-4 relative L2 of it on every position.
func TestForwardMatchesFloat64Reference(t *testing.T) {
	m := loadTiny(t)
	set, err := safetensors.Open(tinyModel(t))
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	decodeAgainst(t, "mixtral", m, testTokens, refModel{cfg: m.Config, set: set, t: t}.forward(testTokens))
}

// TestKVCacheDecodingEqualsFullRecompute: decoding token by token with the
// cache gives the same bits as recomputing each prefix from scratch in one
// batch (which runs the batched MatMul path).
func TestKVCacheDecodingEqualsFullRecompute(t *testing.T) {
	m := loadTiny(t)
	ctx := context.Background()
	inc := NewSession(m, NewResidentExperts(m), 4)
	for i := range testTokens {
		step, err := inc.Forward(ctx, testTokens[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		step = append([]float32(nil), step...)
		full, err := NewSession(m, NewResidentExperts(m), 0).Forward(ctx, testTokens[:i+1])
		if err != nil {
			t.Fatal(err)
		}
		if d := firstDiff(step, full); d >= 0 {
			t.Fatalf("prefix %d: logit %d differs: cached %v, recomputed %v", i+1, d, step[d], full[d])
		}
	}
}

func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestLogitsIndependentOfThreads: the swarm must match local mode bit for
// bit whatever the core counts, so kernel results may not depend on them.
func TestLogitsIndependentOfThreads(t *testing.T) {
	checkLogitsIndependentOfThreads(t, loadTiny(t), testTokens, 0)
}

// TestLongContextIndependentOfThreads: past ~256 positions on tiny the
// attention of a step splits its heads over the thread team (and prefill
// its tokens' heads): a 300-token prompt and three decode steps give the
// same logits, bit for bit, at 1, 2, 3 and 7 threads.
func TestLongContextIndependentOfThreads(t *testing.T) {
	m := loadTiny(t)
	prompt := make([]int, 300)
	for i := range prompt {
		prompt[i] = (i*7919 + 3) % m.Config.VocabSize
	}
	checkLogitsIndependentOfThreads(t, m, prompt, 3)
	defer kernels.SetThreads(kernels.SetThreads(2))
	if kernels.ParallelChunks(m.Config.NumHeads, 2*m.Config.NumHeads*301*m.Config.HeadDim) < 2 {
		t.Fatal("a decode step at 301 positions does not split its attention at 2 threads: the test checks nothing")
	}
}

// checkLogitsIndependentOfThreads runs prompt, then steps greedy decode
// steps, at 1, 2, 3 and 7 threads, and fails unless every logit of every
// pass is the same bit for bit.
func checkLogitsIndependentOfThreads(t *testing.T, m *Model, prompt []int, steps int) {
	t.Helper()
	defer kernels.SetThreads(kernels.SetThreads(1))
	var ref []float32
	for _, th := range []int{1, 2, 3, 7} {
		kernels.SetThreads(th)
		s := NewSession(m, NewResidentExperts(m), 0)
		logits, err := s.Forward(context.Background(), prompt)
		if err != nil {
			t.Fatal(err)
		}
		all := slices.Clone(logits)
		for range steps {
			if logits, err = s.Forward(context.Background(), []int{Argmax(logits)}); err != nil {
				t.Fatal(err)
			}
			all = append(all, logits...)
		}
		if ref == nil {
			ref = all
		} else if d := firstDiff(all, ref); d >= 0 {
			t.Fatalf("threads %d: logit %d = %v, with 1 thread %v", th, d, all[d], ref[d])
		}
	}
}

// TestRouterSpreadLikeTrainedModel: the generated router must be neither a
// coin toss nor deterministic: mean top-1 probability in [0.3, 0.6].
func TestRouterSpreadLikeTrainedModel(t *testing.T) {
	m := loadTiny(t)
	var sum float64
	var count int
	s := NewSession(m, NewResidentExperts(m), 0)
	E := m.Config.NumExperts
	s.OnRoute = func(_ Step, layer int, logits []float32, routes []Route) {
		for t := 0; t < len(logits)/E; t++ {
			p := append([]float32(nil), logits[t*E:(t+1)*E]...)
			kernels.Softmax(p)
			sum += float64(p[Argmax(p)])
			count++
		}
	}
	if _, err := s.Forward(context.Background(), testTokens); err != nil {
		t.Fatal(err)
	}
	mean := sum / float64(count)
	t.Logf("mean top-1 router probability over %d decisions: %.3f", count, mean)
	if mean < 0.3 || mean > 0.6 {
		t.Fatalf("mean top-1 router probability %.3f outside [0.3, 0.6]", mean)
	}
}

func TestConfigRefusesOtherArchitectures(t *testing.T) {
	cases := []struct{ json, want string }{
		{`{"architectures":["LlamaForCausalLM"]}`, `"architectures" is "LlamaForCausalLM"`},
		{`{"hidden_size":8}`, `"architectures" is missing`},
		{`{"architectures":["MixtralForCausalLM"],"num_attention_heads":6,"num_key_value_heads":4}`, "not a multiple"},
		{`{"architectures":["MixtralForCausalLM"],"num_experts_per_tok":9}`, "exceeds"},
		{`{"architectures":["MixtralForCausalLM"],"eos_token_id":"x"}`, "eos_token_id"},
		{`not json`, "bad config JSON"},
	}
	for _, tc := range cases {
		_, err := ParseConfig([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tc.json, err, tc.want)
		}
	}
	c, err := ParseConfig([]byte(`{"architectures":["MixtralForCausalLM"],"eos_token_id":[2,7]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.HiddenSize != 4096 || c.HeadDim != 128 || c.TopK != 2 || !c.IsEOS(7) || c.BOS != -1 {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestLoadNamesMissingOrMisshapenTensor(t *testing.T) {
	src := tinyModel(t)
	set, err := safetensors.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	cases := []struct {
		name   string
		mutate func(specs []safetensors.Spec) []safetensors.Spec
		want   string
	}{
		{"missing", func(s []safetensors.Spec) []safetensors.Spec {
			for i := range s {
				if s[i].Name == "model.layers.1.self_attn.k_proj.weight" {
					return append(s[:i], s[i+1:]...)
				}
			}
			return s
		}, "model.layers.1.self_attn.k_proj.weight"},
		{"misshapen", func(s []safetensors.Spec) []safetensors.Spec {
			for i := range s {
				if s[i].Name == "model.layers.0.block_sparse_moe.experts.3.w2.weight" {
					s[i].Shape = []int{s[i].Shape[1], s[i].Shape[0]}
				}
			}
			return s
		}, "experts.3.w2.weight\" has shape"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg, _ := os.ReadFile(filepath.Join(src, "config.json"))
			os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
			var specs []safetensors.Spec
			for _, n := range set.Names() {
				info, _ := set.Info(n)
				specs = append(specs, safetensors.Spec{Name: n, DType: info.DType, Shape: info.Shape})
			}
			specs = tc.mutate(specs)
			err := safetensors.Write(filepath.Join(dir, "model.safetensors"), specs, nil, func(int, []byte) error { return nil })
			if err != nil {
				t.Fatal(err)
			}
			_, err = Load(dir, LoadOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestForwardHiddenThenLogitsEqualsForward: the head run later (as the
// shadow does) gives Forward's logits bit for bit, and nothing before a
// forward pass.
func TestForwardHiddenThenLogitsEqualsForward(t *testing.T) {
	m := loadTiny(t)
	a := NewSession(m, NewResidentExperts(m), 16)
	b := NewSession(m, NewResidentExperts(m), 16)
	if b.Logits() != nil {
		t.Fatal("logits before any forward pass")
	}
	for _, toks := range [][]int{{1, 9, 33, 4}, {17}, {250}} {
		want, err := a.Forward(context.Background(), toks)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ForwardHidden(context.Background(), toks); err != nil {
			t.Fatal(err)
		}
		got := b.Logits()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("tokens %v: logit %d is %v, Forward gives %v", toks, i, got[i], want[i])
			}
		}
	}
}

// TestAModelTypeThatDisagreesWithTheArchitectureIsRefused: every family
// takes its own model_type (or none, or Kimi K2's kimi_k2 for
// DeepSeek-V3's), and refuses another by name.
func TestAModelTypeThatDisagreesWithTheArchitectureIsRefused(t *testing.T) {
	for _, arch := range SupportedArchitectures() {
		own := architectures[arch].modelType
		kimi := arch == "DeepseekV3ForCausalLM"
		for _, c := range []struct {
			modelType string
			ok        bool
		}{{"", true}, {own, true}, {"llama", false}, {"kimi_k2", kimi}} {
			cfg := `{"architectures": ["` + arch + `"]`
			if c.modelType != "" {
				cfg += `, "model_type": "` + c.modelType + `"`
			}
			_, err := ParseConfig([]byte(cfg + `}`))
			switch {
			case c.ok && err != nil:
				t.Errorf("%s with model_type %q: %v", arch, c.modelType, err)
			case !c.ok && (err == nil || !strings.Contains(err.Error(), `"model_type" is "`+c.modelType+`"`) || !strings.Contains(err.Error(), own)):
				t.Errorf("%s with model_type %s: %v, want an error naming both", arch, c.modelType, err)
			}
		}
	}
}
