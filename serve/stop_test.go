package serve

import (
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
