package serve

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
)

// TestStopFilterMatchesAcrossPieces feeds texts in every split into two
// and three pieces and checks the emitted text is the text up to the
// first stop string, whichever way it was cut.
func TestStopFilterMatchesAcrossPieces(t *testing.T) {
	cases := []struct {
		text  string
		stops []string
		want  string
		stop  bool
	}{
		{"Hello world. Bye", []string{"."}, "Hello world", true},
		{"Hello world. Bye", []string{"world", "Hello"}, "", true},
		{"Hello world. Bye", []string{"orl", "wor"}, "Hello ", true},
		{"Hello world", []string{"worlds"}, "Hello world", false},
		{"aaab", []string{"aab"}, "a", true},
		{"abcabd", []string{"abd"}, "abc", true},
		{"plain text", nil, "plain text", false},
		{"x\n\nUser: y", []string{"\nUser:"}, "x\n", true},
		{"xabcd", []string{"abcd", "bc"}, "xa", true}, // bc is completed first, however the text was cut
	}
	for _, c := range cases {
		for i := 0; i <= len(c.text); i++ {
			for j := i; j <= len(c.text); j++ {
				f := newStopFilter(c.stops)
				var b strings.Builder
				stopped := false
				for _, piece := range []string{c.text[:i], c.text[i:j], c.text[j:]} {
					out, s := f.Push(piece)
					b.WriteString(out)
					stopped = stopped || s
				}
				b.WriteString(f.Flush())
				if b.String() != c.want || stopped != c.stop {
					t.Fatalf("%q stops %q cut at %d,%d: %q (stopped %v), want %q (%v)", c.text, c.stops, i, j, b.String(), stopped, c.want, c.stop)
				}
			}
		}
	}
}

// TestStopFilterHoldsOnlyPossibleStarts: text that cannot begin a stop
// string is emitted at once, so streaming is not delayed.
func TestStopFilterHoldsOnlyPossibleStarts(t *testing.T) {
	f := newStopFilter([]string{"</s>"})
	if out, _ := f.Push("abc"); out != "abc" {
		t.Fatalf("emitted %q", out)
	}
	if out, _ := f.Push("de<"); out != "de" {
		t.Fatalf("emitted %q, want the '<' held", out)
	}
	if out, _ := f.Push("x"); out != "<x" {
		t.Fatalf("emitted %q", out)
	}
}

// TestStopFilterIsTheFirstStopCompleted holds the automaton to a plain
// reference on random texts and stop strings over a small alphabet (so
// that stops overlap, nest and share prefixes), cut into random pieces:
// the text up to the start of the first stop string completed, in byte
// order (of those completed by one byte, the longest), or all of it.
func TestStopFilterIsTheFirstStopCompleted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "abc"[rng.IntN(3)]
		}
		return string(b)
	}
	reference := func(text string, stops []string) (string, bool) {
		for end := 1; end <= len(text); end++ {
			longest := 0
			for _, s := range stops {
				if s != "" && len(s) <= end && text[end-len(s):end] == s {
					longest = max(longest, len(s))
				}
			}
			if longest > 0 {
				return text[:end-longest], true
			}
		}
		return text, false
	}
	for range 3000 {
		stops := make([]string, 1+rng.IntN(6))
		for i := range stops {
			stops[i] = word(rng.IntN(6))
		}
		text := word(rng.IntN(40))
		want, wantStop := reference(text, stops)
		f := newStopFilter(stops)
		var b strings.Builder
		stopped := false
		for rest := text; len(rest) > 0 || !stopped && rest != ""; {
			n := min(len(rest), rng.IntN(5))
			out, s := f.Push(rest[:n])
			b.WriteString(out)
			stopped = stopped || s
			rest = rest[n:]
		}
		b.WriteString(f.Flush())
		if b.String() != want || stopped != wantStop {
			t.Fatalf("%q stops %q: %q (stopped %v), want %q (%v)", text, stops, b.String(), stopped, want, wantStop)
		}
	}
}

// BenchmarkStopFilter: a token's text through a request's stop strings,
// OpenAI's 4 short ones against 126 of 11 KB (hostile round three's
// probe, which cost other clients seconds when each token scanned them
// all): the automaton feeds each byte once.
func BenchmarkStopFilter(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	long := make([]string, 126)
	for i := range long {
		w := make([]byte, 11<<10)
		for j := range w {
			w[j] = byte('a' + rng.IntN(26))
		}
		long[i] = string(w)
	}
	for _, bc := range []struct {
		name  string
		stops []string
	}{{"4 short", []string{"\n\n", "User:", "</s>", "###"}}, {"126 of 11KB", long}} {
		b.Run(bc.name, func(b *testing.B) {
			f := newStopFilter(bc.stops)
			b.ResetTimer()
			for range b.N {
				f.Push(" word") // a token's text
			}
		})
	}
}

// Stop strings are bounded: more than the server's -max-stops (OpenAI's
// 4 by default), or one past 1 KiB, are refused with a 400 naming the
// limit, before any work; a server that allows more takes them.
func TestStopStringsAreBoundedByName(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	five, _ := json.Marshal([]string{"a", "b", "c", "d", "e"})
	long, _ := json.Marshal(strings.Repeat("x", 1025))
	for stop, says := range map[string]string{string(five): "5 stop strings, at most 4", string(long): "stop string 0 is 1025 bytes, at most 1024"} {
		resp, b := post(t, hs.URL+"/v1/completions", `{"prompt": "hi", "max_tokens": 2, "stop": `+stop+`}`)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), says) || !strings.Contains(string(b), `"param":"stop"`) {
			t.Errorf("stop %.40s...: %d %s, want a 400 saying %q", stop, resp.StatusCode, b, says)
		}
	}
	more := f.server(t, func(c *Config) { c.MaxStops = 8 })
	if resp, b := post(t, more.URL+"/v1/completions", `{"prompt": "hi", "max_tokens": 2, "stop": `+string(five)+`}`); resp.StatusCode != http.StatusOK {
		t.Errorf("5 stops on a server of -max-stops 8: %d %s", resp.StatusCode, b)
	}
}
