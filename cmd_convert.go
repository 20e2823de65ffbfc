package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/store"
)

func runConvert(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
	fs := newFlagSet("convert", stderr)
	modelDir := fs.String("model", "", "Hugging Face model directory to convert: config.json, *.safetensors (required)")
	out := fs.String("out", "", "store directory to create (required; must not exist, or be empty)")
	shards := fs.Int("shards", store.DefaultShards, "shards per tensor (K) at most, each of 64K elements at least: the unit of parallel decompression")
	parallel := fs.Int("parallel", 0, "encoding goroutines; 0 = all cores")
	force := fs.Bool("force", false, "replace an existing store at -out")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	switch {
	case *modelDir == "":
		return usagef("-model is required")
	case *out == "":
		return usagef("-out is required")
	case *shards < 1 || *shards > 4096:
		return usagef("-shards must be in 1..4096, got %d", *shards)
	case *parallel < 0:
		return usagef("-parallel must be >= 0, got %d", *parallel)
	}
	t0 := time.Now()
	update, finish := progress.Reporter("convert")
	err = store.Convert(ctx, *modelDir, *out, store.ConvertOptions{Shards: *shards, Parallelism: *parallel, Force: *force, Progress: update})
	finish()
	if err != nil {
		return err
	}
	st, err := store.Open(*out, store.Options{})
	if err != nil {
		return fmt.Errorf("reopening the new store: %w", err)
	}
	defer st.Close()
	r := st.Report()
	log.Info().Str("store", *out).Str("model", r.Identity.Short()).
		Str("original", progress.Bytes(r.Total.OriginalBytes)).Str("stored", progress.Bytes(r.Total.StoredBytes())).
		Str("ratio", fmt.Sprintf("%.4f", r.Total.Ratio())).Str("entropy_bound", fmt.Sprintf("%.4f", r.Total.BoundRatio())).
		Dur("took", time.Since(t0).Round(time.Millisecond)).Msg("store written")
	return nil
}
