package main

import (
	"context"
	"errors"
	"io"
	"math"
	"strings"

	"github.com/odmoe/odmoe/internal/heapfloor"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/runflags"
	"github.com/rs/zerolog"
)

// runFlags are `odmoe run`'s flags (runflags.Flags, their one typed
// description) and what checking them derives.
type runFlags struct {
	runflags.Flags
	prefixCacheBytes int64
}

func runRun(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	// first, while the heap has freed nothing: a node collects per ~16 MiB
	// allocated, not per 2 MB (every worker's first collection landed on
	// the first prompt)
	heapfloor.Floor(heapfloor.DefaultBytes)
	var f runFlags
	fs := newFlagSet("run", stderr)
	f.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		var help helpRequest
		if errors.As(err, &help) {
			role := "" // every role's flags, unless -role came before -h
			if flagGiven(fs, "role") {
				role = f.Role
			}
			return helpRequest{fs: fs, write: runHelp(fs, role)}
		}
		return err
	}
	log, err := newLogger(f.Log, stderr)
	if err != nil {
		return err
	}
	if f.CPUProfile != "" {
		stop, err := f.StartCPUProfile()
		if err != nil {
			return err
		}
		defer stop()
	}
	if f.Threads > 0 {
		kernels.SetThreads(f.Threads)
	}
	if err := kernels.SetPath(f.Kernels); err != nil {
		return usagef("-kernels: %v", err)
	}
	switch f.Role {
	case runflags.RoleLocal:
		return runLocal(ctx, &f, stdout, log)
	case runflags.RoleMain:
		return runMain(ctx, &f, stdout, log)
	case runflags.RoleWorker:
		return runWorker(ctx, &f, log)
	case runflags.RoleShadow:
		return runShadow(ctx, &f, log)
	case runflags.RoleStage:
		return runStage(ctx, &f, log)
	}
	return usagef("-role %q unknown: local, main, worker, shadow or stage", f.Role)
}

// weights reads -weights.
func (f *runFlags) weights() (model.Weights, error) {
	w, err := model.ParseWeights(f.Weights)
	if err != nil {
		return 0, usagef("-weights: %v", err)
	}
	return w, nil
}

// memBytes reads -mem (0: none).
func (f *runFlags) memBytes() (int64, error) {
	if f.Context < 0 {
		return 0, usagef("-context %d: want a number of tokens, or 0 for the model's", f.Context)
	}
	if f.Mem == "" {
		return 0, nil
	}
	mem, err := runflags.ParseBytes(f.Mem)
	if err != nil || mem <= 0 {
		return 0, usagef("-mem: want a size such as 16GiB, got %q", f.Mem)
	}
	return mem, nil
}

func (f *runFlags) checkGenerate() error {
	if f.Model == "" {
		return usagef("-model is required")
	}
	var err error
	if f.prefixCacheBytes, err = runflags.ParseBytes(f.PrefixCache); err != nil || f.prefixCacheBytes < 0 {
		return usagef("-prefix-cache: want a size such as 512MiB or 0, got %q", f.PrefixCache)
	}
	switch {
	case f.N < 0:
		return usagef("-n must be >= 0, got %d", f.N)
	case f.Temperature < 0 || math.IsNaN(f.Temperature):
		return usagef("-temperature must be >= 0 (0 = greedy), got %v", f.Temperature)
	case !(f.TopP > 0 && f.TopP <= 1):
		return usagef("-top-p must be in (0, 1] (1 = off), got %v", f.TopP)
	case strings.TrimSpace(f.Prompt) == "" && f.PromptTokens == 0:
		return usagef("-prompt is empty: give the text to continue")
	case f.PromptTokens < 0:
		return usagef("-prompt-tokens must be >= 0, got %d", f.PromptTokens)
	case f.MaxBatch < 1:
		return usagef("-max-batch must be >= 1, got %d", f.MaxBatch)
	case f.MaxQueue < 0:
		return usagef("-max-queue must be >= 0, got %d", f.MaxQueue)
	case f.MaxStops < 1:
		return usagef("-max-stops must be >= 1, got %d", f.MaxStops)
	case f.PrefillChunk < 0:
		return usagef("-prefill-chunk must be >= 0 (0 = each prompt in one pass), got %d", f.PrefillChunk)
	}
	return nil
}

// serving is how local and main serve the API (-http).
func (f *runFlags) serving() mainnode.Serving {
	q := f.MaxQueue
	if q == 0 {
		q = -1 // no queue: serve's 0 means its default
	}
	chunk := f.PrefillChunk
	if chunk == 0 {
		chunk = -1 // each prompt whole: Serving's 0 means the default
	}
	return mainnode.Serving{Addr: f.HTTP, ModelName: f.ServedName, MaxBatch: f.MaxBatch, MaxQueue: q, MaxStops: f.MaxStops, PrefixCacheBytes: f.prefixCacheBytes, PrefillChunk: chunk, APIKey: f.Key(), CORSOrigin: f.CORSOrigin, NoConsole: f.NoConsole}
}

// text is the prompt and generation settings local and main share.
func (f *runFlags) text() mainnode.Text {
	return mainnode.Text{Prompt: f.Prompt, MaxTokens: f.N, PromptTokens: f.PromptTokens, Temperature: f.Temperature, TopP: f.TopP,
		Seed: f.Seed, IgnoreEOS: f.IgnoreEOS, Dump: f.Dump, Stats: f.Stats}
}

func runLocal(ctx context.Context, f *runFlags, stdout io.Writer, log zerolog.Logger) error {
	if err := f.checkGenerate(); err != nil {
		return err
	}
	mem, err := f.memBytes()
	if err != nil {
		return err
	}
	weights, err := f.weights()
	if err != nil {
		return err
	}
	sv := f.serving()
	if err := sv.Listen(); err != nil {
		return err
	}
	return mainnode.RunLocal(ctx, f.Model, f.text(), sv, mem, weights, f.Context, stdout, log)
}
