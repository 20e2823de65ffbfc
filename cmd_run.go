package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/odmoe/odmoe/internal/npy"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
)

// roles that `odmoe run -role` will take; only local exists so far.
const roleLocal = "local"

func runRun(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", stderr)
	role := fs.String("role", roleLocal, "node role: local (the whole model in one process; the reference the swarm must match)")
	dir := fs.String("model", "", "Hugging Face model directory: config.json, *.safetensors, tokenizer.json (required)")
	prompt := fs.String("prompt", "The capital of France is", "prompt text")
	n := fs.Int("n", 64, "tokens to generate")
	temp := fs.Float64("temperature", 0, "sampling temperature; 0 = greedy")
	topP := fs.Float64("top-p", 1, "nucleus sampling threshold in (0, 1]; 1 = off")
	seed := fs.Uint64("seed", 1, "sampling seed")
	ignoreEOS := fs.Bool("ignore-eos", false, "keep generating past an end-of-sequence token (benchmarks)")
	threads := fs.Int("threads", 0, "goroutines for matrix kernels; 0 = all cores")
	dump := fs.String("dump", "", "directory to write tokens.json and logits.npy ([steps, vocab] float32) into")
	var lf logFlags
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	if *role != roleLocal {
		return usagef("-role %q is not available yet; this build runs -role local", *role)
	}
	if *dir == "" {
		return usagef("-model is required")
	}
	if *n < 0 {
		return usagef("-n must be >= 0, got %d", *n)
	}
	if *threads > 0 {
		kernels.SetThreads(*threads)
	}

	t0 := time.Now()
	m, err := model.Load(*dir, model.LoadOptions{})
	if err != nil {
		return err
	}
	defer m.Close()
	tok, err := tokenizer.LoadDir(*dir)
	if err != nil {
		return err
	}
	c := m.Config
	log.Info().Str("model", *dir).Str("arch", c.Architecture).Int("layers", c.NumLayers).
		Int("experts", c.NumExperts).Int("top_k", c.TopK).
		Str("non_expert", progress.Bytes(m.NonExpertBytes())).Str("experts_bytes", progress.Bytes(m.ExpertBytes())).
		Int("threads", kernels.Threads()).Dur("load", time.Since(t0)).Msg("model mapped")

	ids := tok.Encode(*prompt, true)
	if len(ids) == 0 {
		return fmt.Errorf("prompt %q encodes to no tokens", *prompt)
	}
	var logits *npy.Writer
	if *dump != "" {
		if err := os.MkdirAll(*dump, 0o755); err != nil {
			return err
		}
		if logits, err = npy.Create(filepath.Join(*dump, "logits.npy"), c.VocabSize); err != nil {
			return err
		}
		defer func() {
			if logits != nil {
				logits.Close()
			}
		}()
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	fmt.Fprint(out, *prompt)
	out.Flush()
	stream := tok.NewStreamDecoder()
	sess := model.NewSession(m, model.NewResidentExperts(m), len(ids)+*n)
	gen, st, err := model.Generate(ctx, sess, ids, model.GenerateOptions{
		MaxTokens: *n,
		Sampler:   model.NewSampler(*temp, *topP, *seed),
		StopAtEOS: !*ignoreEOS,
		OnToken: func(step, id int, lg []float32) error {
			if logits != nil {
				if err := logits.Append(lg); err != nil {
					return err
				}
			}
			fmt.Fprint(out, stream.Next(id))
			return out.Flush()
		},
	})
	fmt.Fprintln(out, stream.Flush())
	if err != nil {
		return err
	}
	if *dump != "" {
		if err := logits.Close(); err != nil {
			return err
		}
		logits = nil
		b, _ := json.Marshal(map[string][]int{"prompt": ids, "generated": nonNil(gen)})
		if err := os.WriteFile(filepath.Join(*dump, "tokens.json"), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "prompt tokens: %d, generated tokens: %d, prefill: %v (%.1f tok/s), decode: %.2f tok/s\n",
		st.PromptTokens, st.GeneratedTokens, st.Prefill.Round(time.Microsecond), st.PrefillTokensPerSec(), st.DecodeTokensPerSec())
	return nil
}

func nonNil(v []int) []int {
	if v == nil {
		return []int{}
	}
	return v
}
