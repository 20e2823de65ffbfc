// Package plan answers what a swarm of one kind of node needs to serve a
// model (odmoe plan): how many main stages, shadow stages and workers,
// what each node holds, and the decode and prompt speed package sim
// predicts for them, from the model's config.json, a node's size and
// speed (a Device) and its link.
package plan

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/model/synth"
)

// Shaped binds a model to a checkpoint of the shape dir's config.json
// describes, written into tmp as a sparse file (safetensors.WriteShapes:
// its tensors, as the family publishes them, read as zeros and take no
// disk or memory), so that Model.FootprintOf counts what a node holding
// some of its layers would hold from the config alone, by the code each
// node counts itself with at start, its KV cache sized to contextLen (0:
// the model's context). The caller closes the model and removes tmp.
func Shaped(dir, tmp string, contextLen int) (*model.Model, error) {
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	p, err := presetOf(cfg)
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "config.json"), raw, 0o644); err != nil {
		return nil, err
	}
	if err := safetensors.WriteShapes(filepath.Join(tmp, "model.safetensors"), synth.Specs(p), map[string]string{"format": "pt", "odmoe_plan": "shapes only"}); err != nil {
		return nil, err
	}
	m, err := model.Load(tmp, model.LoadOptions{Shapes: true, Context: contextLen})
	if err != nil {
		return nil, fmt.Errorf("plan: the shape of %s: %w", dir, err)
	}
	return m, nil
}

// families are synth's names for the architectures it writes.
var families = map[string]string{
	"MixtralForCausalLM": "", "Qwen3MoeForCausalLM": "qwen3-moe", "OlmoeForCausalLM": "olmoe",
	"Qwen2MoeForCausalLM": "qwen2-moe", "DeepseekV3ForCausalLM": "deepseek-v3", "GptOssForCausalLM": "gpt-oss",
}

// presetOf is the synth preset of cfg's shape: its tensors are the
// checkpoint's.
func presetOf(cfg model.Config) (synth.Preset, error) {
	family, ok := families[cfg.Architecture]
	if !ok {
		return synth.Preset{}, fmt.Errorf("plan: no checkpoint shape for %s", cfg.Architecture)
	}
	p := synth.Preset{Name: "plan", Family: family, Hidden: cfg.HiddenSize, Intermediate: cfg.IntermediateSize, HeadDim: cfg.HeadDim,
		Layers: cfg.NumLayers, Heads: cfg.NumHeads, KVHeads: cfg.NumKVHeads, Experts: cfg.NumExperts, TopK: cfg.TopK, Vocab: cfg.VocabSize,
		MaxPositions: cfg.MaxPositions, TieWordEmbedding: cfg.TieEmbeddings, SharedIntermediate: cfg.SharedIntermediateSize,
		MLPOnlyLayers: cfg.DenseLayers, DenseIntermediate: cfg.DenseIntermediateSize,
		FP8: cfg.Quantization == "fp8", MXFP4: cfg.Quantization == "mxfp4"}
	if x := cfg.MLA; x != nil {
		p.QLoRA, p.KVLoRA, p.NopeDim, p.RopeDim, p.VDim = x.QLoRARank, x.KVLoRARank, x.NopeDim, x.RopeDim, x.VDim
	}
	return p, nil
}
