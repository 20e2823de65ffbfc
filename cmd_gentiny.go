package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/model/synth/skew"
	"github.com/odmoe/odmoe/runflags"
)

func runGenTiny(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
	fs := newFlagSet("gen-tiny", stderr)
	out := fs.String("out", "", "directory to write the model into (required; must be empty or absent)")
	preset := fs.String("preset", "tiny", "model shape: "+strings.Join(synth.PresetNames(), ", "))
	seed := fs.Uint64("seed", 1, "random seed; the same seed and preset give the same bytes")
	tok := fs.String("tokenizer", "", "adopt this tokenizer.json (vocabulary sized to it) instead of the built-in one")
	force := fs.Bool("force", false, "write into a non-empty -out directory")
	skewBy := fs.Float64("skew", 0, "route unevenly, as trained MoEs do: each layer's experts take shares of its tokens spread as measured on OLMoE (1; Mixtral's spread is about 0.3, OLMoE on code 1.4-3.9) instead of evenly (0, every preset's default); the routers are fitted to it on calibration tokens and "+skew.ReportFile+" says how; softmax routers only (mixtral, qwen3-moe, olmoe, qwen2-moe presets)")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	if *out == "" {
		return usagef("-out is required")
	}
	if entries, err := os.ReadDir(*out); err == nil && len(entries) > 0 && !*force {
		return fmt.Errorf("%s is not empty (use -force to write into it)", *out)
	}
	update, finish := progress.Reporter("weights")
	err = synth.Generate(*out, synth.Options{Preset: *preset, Seed: *seed, Tokenizer: *tok, Progress: update})
	finish()
	if err != nil {
		return err
	}
	if *skewBy != 0 {
		log.Info().Float64("skew", *skewBy).Msg("fitting the routers to the skew on calibration tokens")
		rep, err := skew.Apply(ctx, *out, skew.Options{Skew: *skewBy, Seed: *seed})
		if err != nil {
			return err
		}
		for _, l := range rep.Layers {
			log.Info().Int("layer", l.Layer).Int("hottest_expert", l.Experts[0]).Float64("hottest_share", l.Got[0]).Float64("want", l.Want[0]).
				Float64("coldest_share", l.Got[len(l.Got)-1]).Msg("routing skewed")
		}
	}
	log.Info().Str("dir", *out).Str("preset", *preset).Uint64("seed", *seed).Float64("skew", *skewBy).Msg("model written")
	return nil
}
