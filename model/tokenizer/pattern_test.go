package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

type pieceCase struct {
	in   string
	want []string
}

// The expected pieces come from running the same regexes with a
// backtracking engine that has lookahead (Python's regex module), and
// agree with the word ids Hugging Face's tokenizers reports.
var pieceTables = []struct {
	pattern string
	cases   []pieceCase
}{
	{patternQwen2, []pieceCase{
		{"Hello world", []string{"Hello", " world"}},
		{"  hello", []string{" ", " hello"}},
		{"a  \n\n  b", []string{"a", "  \n\n", " ", " b"}},
		{"x\r\n\r\ny", []string{"x", "\r\n\r\n", "y"}},
		{"it's IT'S", []string{"it", "'s", " IT", "'S"}},
		{"'ſa", []string{"'ſ", "a"}},
		{"  \t x", []string{"  \t", " x"}},
		{"1234567", []string{"1", "2", "3", "4", "5", "6", "7"}},
		{"abc123def", []string{"abc", "1", "2", "3", "def"}},
		{"$100.00!", []string{"$", "1", "0", "0", ".", "0", "0", "!"}},
		{"end...\n\n", []string{"end", "...\n\n"}},
		{" !!!\n x", []string{" !!!\n", " x"}},
		{"   ", []string{"   "}},
		{"a\u3000\u3000b", []string{"a", "\u3000", "\u3000b"}},
		{"😀😀 x", []string{"😀😀", " x"}},
		{"x\u0085\u0085y", []string{"x", "\u0085", "\u0085y"}},
		{"don't'll", []string{"don", "'t", "'ll"}},
		{"\n", []string{"\n"}},
		{"x \n", []string{"x", " \n"}},
		{"x  ", []string{"x", "  "}},
		{"\t\tx", []string{"\t", "\tx"}},
		{"'re've'M", []string{"'re", "'ve", "'M"}},
		{"« Bonjour »", []string{"«", " Bonjour", " »"}},
		{"中文，测试。", []string{"中文", "，测试", "。"}},
		{"\u00a0\u00a0a", []string{"\u00a0", "\u00a0a"}},
	}},
	{patternLlama3, []pieceCase{
		{"Hello world", []string{"Hello", " world"}},
		{"  hello", []string{" ", " hello"}},
		{"a  \n\n  b", []string{"a", "  \n\n", " ", " b"}},
		{"x\r\n\r\ny", []string{"x", "\r\n\r\n", "y"}},
		{"it's IT'S", []string{"it", "'s", " IT", "'S"}},
		{"'ſa", []string{"'ſ", "a"}},
		{"  \t x", []string{"  \t", " x"}},
		{"1234567", []string{"123", "456", "7"}},
		{"abc123def", []string{"abc", "123", "def"}},
		{"$100.00!", []string{"$", "100", ".", "00", "!"}},
		{"end...\n\n", []string{"end", "...\n\n"}},
		{" !!!\n x", []string{" !!!\n", " x"}},
		{"   ", []string{"   "}},
		{"a\u3000\u3000b", []string{"a", "\u3000", "\u3000b"}},
		{"😀😀 x", []string{"😀😀", " x"}},
		{"x\u0085\u0085y", []string{"x", "\u0085", "\u0085y"}},
		{"don't'll", []string{"don", "'t", "'ll"}},
		{"\n", []string{"\n"}},
		{"x \n", []string{"x", " \n"}},
		{"x  ", []string{"x", "  "}},
		{"\t\tx", []string{"\t", "\tx"}},
		{"'re've'M", []string{"'re", "'ve", "'M"}},
		{"« Bonjour »", []string{"«", " Bonjour", " »"}},
		{"中文，测试。", []string{"中文", "，测试", "。"}},
		{"\u00a0\u00a0a", []string{"\u00a0", "\u00a0a"}},
	}},
	{patternGPT2, []pieceCase{
		{"Hello world", []string{"Hello", " world"}},
		{"  hello", []string{" ", " hello"}},
		{"a  \n\n  b", []string{"a", "  \n\n ", " b"}},
		{"x\r\n\r\ny", []string{"x", "\r\n\r", "\n", "y"}},
		{"it's IT'S", []string{"it", "'s", " IT", "'", "S"}},
		{"'ſa", []string{"'", "ſa"}},
		{"  \t x", []string{"  \t", " x"}},
		{"1234567", []string{"1234567"}},
		{"abc123def", []string{"abc", "123", "def"}},
		{"$100.00!", []string{"$", "100", ".", "00", "!"}},
		{"end...\n\n", []string{"end", "...", "\n\n"}},
		{" !!!\n x", []string{" !!!", "\n", " x"}},
		{"   ", []string{"   "}},
		{"a\u3000\u3000b", []string{"a", "\u3000", "\u3000", "b"}},
		{"😀😀 x", []string{"😀😀", " x"}},
		{"x\u0085\u0085y", []string{"x", "\u0085", "\u0085", "y"}},
		{"don't'll", []string{"don", "'t", "'ll"}},
		{"\n", []string{"\n"}},
		{"x \n", []string{"x", " \n"}},
		{"x  ", []string{"x", "  "}},
		{"\t\tx", []string{"\t", "\t", "x"}},
		{"'re've'M", []string{"'re", "'ve", "'", "M"}},
		{"« Bonjour »", []string{"«", " Bonjour", " »"}},
		{"中文，测试。", []string{"中文", "，", "测试", "。"}},
		{"\u00a0\u00a0a", []string{"\u00a0", "\u00a0", "a"}},
	}},
}

func TestPreTokenizerScannerSplitsLikeTheRegex(t *testing.T) {
	for _, table := range pieceTables {
		p := knownPatterns[table.pattern]
		for _, c := range table.cases {
			var got []string
			p.findMatches(c.in, func(start, end int, match bool) {
				if !match {
					t.Errorf("%q: span %q not matched", c.in, c.in[start:end])
				}
				got = append(got, c.in[start:end])
			})
			if strings.Join(got, "\x00") != strings.Join(c.want, "\x00") {
				t.Errorf("pattern %.20q... on %q: got %q, want %q", table.pattern, c.in, got, c.want)
			}
		}
	}
}

func TestPreTokenizerScannerCoversInput(t *testing.T) {
	for _, pattern := range []string{patternQwen2, patternLlama3, patternGPT2} {
		p := knownPatterns[pattern]
		for _, s := range referenceStrings {
			var b strings.Builder
			prev := 0
			p.findMatches(s, func(start, end int, _ bool) {
				if start != prev || end <= start {
					t.Fatalf("%q: span [%d,%d) after %d", s, start, end, prev)
				}
				b.WriteString(s[start:end])
				prev = end
			})
			if b.String() != s {
				t.Errorf("%q: pieces join to %q", s, b.String())
			}
		}
	}
}

func TestUnknownSplitRegexIsRefused(t *testing.T) {
	_, err := parsePreTokenizer([]byte(`{"type":"Split","pattern":{"Regex":"\\d+"},"behavior":"Isolated","invert":false}`), "pre_tokenizer")
	if err == nil || !strings.Contains(err.Error(), `pre_tokenizer.pattern.Regex "\\d+" is not supported`) {
		t.Fatalf("got %v", err)
	}
}

// TestSplitStreamsWhatTheWholeSplitGives: the Split pre-tokenizer emits,
// span by span, exactly the pieces of tokenizers' algorithm, which first
// collects every span and then merges (its loops are kept here as the
// reference), for every behavior, inverted or not, on random texts.
func TestSplitStreamsWhatTheWholeSplitGives(t *testing.T) {
	reference := func(sp *split, s string) []string {
		var spans, keep []span
		sp.eachSpan(s, func(m span) { spans = append(spans, m) })
		switch sp.behavior {
		case splitIsolated:
			keep = spans
		case splitRemoved:
			for _, m := range spans {
				if !m.match {
					keep = append(keep, m)
				}
			}
		case splitContiguous:
			for i, m := range spans {
				if i > 0 && m.match == spans[i-1].match {
					keep[len(keep)-1].end = m.end
				} else {
					keep = append(keep, m)
				}
			}
		case splitMergedWithPrevious:
			for i, m := range spans {
				if m.match && (i == 0 || !spans[i-1].match) && len(keep) > 0 {
					keep[len(keep)-1].end = m.end
				} else {
					keep = append(keep, m)
				}
			}
		case splitMergedWithNext:
			for i := len(spans) - 1; i >= 0; i-- {
				m := spans[i]
				if m.match && (i == len(spans)-1 || !spans[i+1].match) && len(keep) > 0 {
					keep[len(keep)-1].start = m.start
				} else {
					keep = append(keep, m)
				}
			}
			slices.Reverse(keep)
		}
		var out []string
		for _, m := range keep {
			if m.end > m.start {
				out = append(out, s[m.start:m.end])
			}
		}
		return out
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for b := range splitContiguous + 1 {
		for _, invert := range []bool{false, true} {
			for _, literal := range []string{"a", "ab"} {
				sp := &split{literal: literal, behavior: b, invert: invert}
				for range 300 {
					text := make([]byte, rng.IntN(12))
					for i := range text {
						text[i] = "ab"[rng.IntN(2)]
					}
					var got []string
					sp.preTokenize(piece{text: string(text)}, func(p piece) { got = append(got, p.text) })
					if want := reference(sp, string(text)); !slices.Equal(got, want) {
						t.Fatalf("behavior %d, invert %v, literal %q, text %q: %q, want %q", b, invert, literal, text, got, want)
					}
				}
			}
		}
	}
}
