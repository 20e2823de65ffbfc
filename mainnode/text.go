package mainnode

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/odmoe/odmoe/passloop"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/odmoe/odmoe/internal/npy"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
)

// Text is one prompt to answer, as `odmoe run` takes it: what to generate,
// how to sample, and where the run's files go.
type Text struct {
	Prompt       string
	MaxTokens    int
	PromptTokens int // make the prompt exactly this many tokens (benchmarks); 0: as it encodes
	Temperature  float64
	TopP         float64
	Seed         uint64
	IgnoreEOS    bool   // keep generating past an end-of-sequence token
	Dump         string // directory for tokens.json and logits.npy; "" for none
	Stats        string // file for the run's figures as JSON; "" for none
}

// generateText encodes the prompt, generates it on b, streams the text
// to stdout, writes the dump files, and prints the summary line. Text
// mode is a batch of one in the same pass loop the API serves from; its
// prompt goes in whole (one pass: nothing runs beside it to wait), so
// pass 1 is the prompt and i+1 feeds token i, as OD-MoE numbers
// them. It closes b: the run's figures are read after. decodes, if set,
// is called when the prompt's pass has given the first token and decode
// begins.
func generateText(ctx context.Context, modelDir string, t Text, m *model.Model, b *passloop.Batcher, stdout io.Writer, decodes func()) (model.GenerateStats, error) {
	defer b.Close()
	b.ChunkPrompts(0)
	tok, err := tokenizer.LoadDir(modelDir)
	if err != nil {
		return model.GenerateStats{}, err
	}
	ids := tok.Encode(t.Prompt, true)
	if len(ids) == 0 {
		return model.GenerateStats{}, fmt.Errorf("prompt %q encodes to no tokens", t.Prompt)
	}
	if t.PromptTokens > 0 {
		ids = CycleTokens(ids, t.PromptTokens, tok.BOS())
	}
	// n tokens need len(ids)+n-1 positions: the last one is never fed back
	if limit, need := m.Config.MaxPositions, len(ids)+max(t.MaxTokens, 1)-1; need > limit {
		return model.GenerateStats{}, fmt.Errorf("a prompt of %d tokens and -n %d need %d positions, more than the context of %d (max_position_embeddings, or -context): shorten the prompt or use -n %d or less",
			len(ids), t.MaxTokens, need, limit, max(limit-len(ids)+1, 0))
	}
	var logits *npy.Writer
	if t.Dump != "" {
		if err := os.MkdirAll(t.Dump, 0o755); err != nil {
			return model.GenerateStats{}, err
		}
		// written under temporary names, renamed only once the run has
		// completed: a failed run never leaves a partial dump beside
		// another run's files
		if logits, err = npy.Create(filepath.Join(t.Dump, partial("logits.npy")), m.Config.VocabSize); err != nil {
			return model.GenerateStats{}, err
		}
		defer func() {
			if logits != nil {
				logits.Close()
			}
			os.Remove(filepath.Join(t.Dump, partial("logits.npy")))
			os.Remove(filepath.Join(t.Dump, partial("tokens.json")))
		}()
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	if t.PromptTokens > 0 {
		fmt.Fprint(out, tok.Decode(ids, true))
	} else {
		fmt.Fprint(out, t.Prompt)
	}
	out.Flush()
	stream := tok.NewStreamDecoder()
	generated, st, err := b.Generate(ctx, ids, model.GenerateOptions{
		MaxTokens: t.MaxTokens,
		Sampler:   model.NewSampler(t.Temperature, t.TopP, t.Seed),
		StopAtEOS: !t.IgnoreEOS,
		OnToken: func(step, id int, lg []float32) error {
			if step == 0 && decodes != nil {
				decodes()
			}
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
	b.Close() // ends the sequence on the swarm before its figures are read
	if err != nil {
		return st, err
	}
	if t.Dump != "" {
		if err := logits.Close(); err != nil {
			return st, err
		}
		logits = nil
		if generated == nil {
			generated = []int{}
		}
		b, _ := json.Marshal(map[string][]int{"prompt": ids, "generated": generated})
		if err := os.WriteFile(filepath.Join(t.Dump, partial("tokens.json")), append(b, '\n'), 0o644); err != nil {
			return st, err
		}
		for _, name := range []string{"logits.npy", "tokens.json"} {
			if err := os.Rename(filepath.Join(t.Dump, partial(name)), filepath.Join(t.Dump, name)); err != nil {
				return st, err
			}
		}
	}
	finish := st.FinishReason
	if st.ContextFull {
		finish += ": the model's context is full"
	}
	fmt.Fprintf(out, "prompt tokens: %d, generated tokens: %d (finish: %s), prefill: %v (%.1f tok/s), decode: %s\n",
		st.PromptTokens, st.GeneratedTokens, finish, st.Prefill.Round(time.Microsecond), st.PrefillTokensPerSec(), decodeRate(st))
	return st, nil
}

// CycleTokens returns exactly n tokens: ids (which start with bos, if
// bos >= 0 and they do) and then ids without bos again, as often as
// needed: text mode's prompt at -prompt-tokens n (bench serve sends the API
// the same).
func CycleTokens(ids []int, n, bos int) []int {
	body := ids
	if bos >= 0 && len(ids) > 1 && ids[0] == bos {
		body = ids[1:]
	}
	out := make([]int, 0, n)
	out = append(out, ids[:min(len(ids), n)]...)
	for len(out) < n {
		out = append(out, body[:min(len(body), n-len(out))]...)
	}
	return out
}

// partial is the name a dump file has until the run completes.
func partial(name string) string { return "." + name + ".partial" }

// decodeRate is the decode speed for people: there is none before the
// second generated token (the first comes from the prompt's forward pass).
func decodeRate(st model.GenerateStats) string {
	if st.GeneratedTokens < 2 {
		return "none (decode starts with the 2nd generated token)"
	}
	rate := fmt.Sprintf("%.2f tok/s", st.DecodeTokensPerSec())
	if st.Drafted > 0 { // the passes checked the shadow's guesses
		passes := max(st.GeneratedTokens-1-st.Accepted, 1)
		rate += fmt.Sprintf(" (%d of %d guesses kept, %.2f tokens a pass)", st.Accepted, st.Drafted, float64(passes+st.Accepted)/float64(passes))
	}
	return rate
}
