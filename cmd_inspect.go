package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/store"
)

func runInspect(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", stderr)
	dir := fs.String("store", "", "store directory written by odmoe convert (required)")
	verify := fs.Bool("verify", false, "re-read every chunk, check every checksum and decode it")
	modelDir := fs.String("model", "", "also check that the store was built from this Hugging Face model directory")
	parallel := fs.Int("parallel", 0, "decoding goroutines for -verify; 0 = all cores")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	if *dir == "" {
		return usagef("-store is required")
	}
	if *parallel < 0 {
		return usagef("-parallel must be >= 0, got %d", *parallel)
	}
	opt := store.Options{Parallelism: *parallel}
	if *modelDir != "" {
		if opt.Identity, err = store.ModelIdentity(*modelDir); err != nil {
			return err
		}
	}
	st, err := store.Open(*dir, opt)
	if errors.Is(err, store.ErrModelMismatch) {
		if diff, cerr := store.Compare(*modelDir, *dir); cerr == nil && diff != "" {
			return fmt.Errorf("%w: %s", err, diff)
		}
	}
	if err != nil {
		return err
	}
	defer st.Close()
	st.Report().WriteText(stdout, *dir, *modelDir)
	if !*verify {
		return nil
	}

	t0 := time.Now()
	update, finish := progress.Reporter("verify")
	err = st.Verify(ctx, update)
	finish()
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		n := 1
		if u, ok := err.(interface{ Unwrap() []error }); ok {
			n = len(u.Unwrap())
		}
		return fmt.Errorf("verify: %d failure(s):\n%w", n, err)
	}
	r := st.Report()
	log.Info().Int("chunks", r.Chunks).Str("bytes", progress.Bytes(r.Total.OriginalBytes)).
		Dur("took", time.Since(t0).Round(time.Millisecond)).Msg("verify: every checksum matches")
	fmt.Fprintf(stdout, "\nverify: OK (%d chunks, %s decoded)\n", r.Chunks, progress.Bytes(r.Total.OriginalBytes))
	return nil
}
