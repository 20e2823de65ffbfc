package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/runflags"
)

func runGenTiny(_ context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
	fs := newFlagSet("gen-tiny", stderr)
	out := fs.String("out", "", "directory to write the model into (required; must be empty or absent)")
	preset := fs.String("preset", "tiny", "model shape: "+strings.Join(synth.PresetNames(), ", "))
	seed := fs.Uint64("seed", 1, "random seed; the same seed and preset give the same bytes")
	tok := fs.String("tokenizer", "", "adopt this tokenizer.json (vocabulary sized to it) instead of the built-in one")
	force := fs.Bool("force", false, "write into a non-empty -out directory")
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
	log.Info().Str("dir", *out).Str("preset", *preset).Uint64("seed", *seed).Msg("model written")
	return nil
}
