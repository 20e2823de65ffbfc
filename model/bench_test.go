package model

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/odmoe/odmoe/model/synth"
)

// benchModel returns the model the decode/prefill benchmarks run on: the
// preset named by ODMOE_BENCH_PRESET (default tiny; `make bench` uses
// small), generated once into ODMOE_CACHE (default the user cache dir).
func benchModel(b *testing.B) *Model {
	b.Helper()
	preset := os.Getenv("ODMOE_BENCH_PRESET")
	if preset == "" {
		preset = "tiny"
	}
	cache, err := synth.CacheDir()
	if err != nil {
		b.Fatal(err)
	}
	dir, err := synth.Cached(cache, preset, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	m, err := Load(dir, LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkLocalDecode measures single-token decode steps after a 16-token
// prompt, all experts resident (local mode).
func BenchmarkLocalDecode(b *testing.B) {
	m := benchModel(b)
	ctx := context.Background()
	prompt := make([]int, 16)
	for i := range prompt {
		prompt[i] = (i*7919 + 1) % m.Config.VocabSize
	}
	s := NewSession(m, NewResidentExperts(m), 16+b.N)
	logits, err := s.Forward(ctx, prompt)
	if err != nil {
		b.Fatal(err)
	}
	next := Argmax(logits)
	b.ResetTimer()
	for range b.N {
		if s.Len() >= m.Config.MaxPositions-1 {
			b.StopTimer()
			s = NewSession(m, NewResidentExperts(m), 0)
			s.Forward(ctx, prompt)
			b.StartTimer()
		}
		if logits, err = s.Forward(ctx, []int{next}); err != nil {
			b.Fatal(err)
		}
		next = Argmax(logits)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkLocalPrefill measures a 128-token prompt in one batch.
func BenchmarkLocalPrefill(b *testing.B) {
	m := benchModel(b)
	ctx := context.Background()
	prompt := make([]int, 128)
	for i := range prompt {
		prompt[i] = (i*7919 + 1) % m.Config.VocabSize
	}
	b.ResetTimer()
	for range b.N {
		s := NewSession(m, NewResidentExperts(m), len(prompt))
		if _, err := s.Forward(ctx, prompt); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(prompt))/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkBatchDecode measures continuous batching: decode passes of
// rows sequences in one Batch (each after its own 16-token prompt), all
// experts resident. tokens/s counts every row's token.
func BenchmarkBatchDecode(b *testing.B) {
	m := benchModel(b)
	ctx := context.Background()
	for _, rows := range []int{1, 4} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			sessions, tokens, feeds := make([]*Session, rows), make([]int, rows), make([][]int, rows)
			start := func() {
				for i := range sessions {
					prompt := make([]int, 16)
					for j := range prompt {
						prompt[j] = (j*7919 + 1 + i*131) % m.Config.VocabSize
					}
					sessions[i] = NewSession(m, NewResidentExperts(m), 0)
					logits, err := sessions[i].Forward(ctx, prompt)
					if err != nil {
						b.Fatal(err)
					}
					tokens[i] = Argmax(logits)
				}
			}
			start()
			batch := NewBatch(m, NewResidentExperts(m))
			b.ResetTimer()
			for range b.N {
				if sessions[0].Len() >= m.Config.MaxPositions-1 {
					b.StopTimer()
					start()
					b.StartTimer()
				}
				for i := range feeds {
					feeds[i] = tokens[i : i+1]
				}
				if err := batch.Forward(ctx, sessions, feeds); err != nil {
					b.Fatal(err)
				}
				if err := batch.Logits(sessions); err != nil {
					b.Fatal(err)
				}
				for i, s := range sessions {
					tokens[i] = Argmax(s.Logits())
				}
			}
			b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
