package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
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
	if err != nil {
		return err
	}
	defer st.Close()
	printReport(stdout, *dir, *modelDir, st.Report())
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

func printReport(w io.Writer, dir, modelDir string, r store.Report) {
	var dts []string
	for _, d := range r.DTypes {
		dts = append(dts, d.String())
	}
	fmt.Fprintf(w, "store    %s\n", dir)
	fmt.Fprintf(w, "format   version %d, %d shards per tensor, %d-element huff0 blocks\n", store.Version, r.Shards, r.BlockElems)
	model := r.Identity.String()
	if modelDir != "" {
		model += " (matches " + modelDir + ")"
	}
	fmt.Fprintf(w, "model    %s\n", model)
	fmt.Fprintf(w, "experts  %d layers x %d experts, %s\n", len(r.Layers), r.Experts, strings.Join(dts, ", "))
	if n := len(r.Layers); r.Layers[n-1] != n-1 {
		fmt.Fprintf(w, "layers   %v have experts; the others are dense\n", r.Layers)
	}
	fmt.Fprintf(w, "files    %s index, %s chunks (%d chunks)\n\n", progress.Bytes(r.IndexBytes), progress.Bytes(r.ChunkFileBytes), r.Chunks)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tensor\ttensors\toriginal\tstored\tratio\tentropy bound\tover bound\texponent bits\tentropy bits\t")
	for _, k := range append(r.Kinds[:], r.Total) {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.4f\t%.4f\t%+.2f%%\t%.3f\t%.3f\t\n", k.Name, k.Tensors,
			progress.Bytes(k.OriginalBytes), progress.Bytes(k.StoredBytes()), k.Ratio(), k.BoundRatio(), 100*k.Overhead(),
			bitsPer(k.ExponentBytes, k.Elements), k.EntropyBits)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nratio and entropy bound are fractions of the original size; exponent bits is what the")
	fmt.Fprintln(w, "coder spends per element on the exponent stream (tables and block headers included).")
}

func bitsPer(bytes, elems int64) float64 {
	if elems == 0 {
		return 0
	}
	return float64(bytes) * 8 / float64(elems)
}
