package grammar

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// matches runs p's DFA over text's bytes.
func (p *pattern) matches(text string) bool {
	s := p.start()
	for i := 0; i < len(text); i++ {
		if s = p.next(s, text[i]); s < 0 {
			return false
		}
	}
	return p.accepts(s)
}

// TestPatternsMatchAsGoRegexpDoes holds the pattern subset's DFAs against
// Go's regexp (RE2, which reads this subset as ECMA-262 does) on random
// strings of ASCII and non-ASCII characters (none a JSON string must
// escape, where the two differ by design), anchored and not.
func TestPatternsMatchAsGoRegexpDoes(t *testing.T) {
	patterns := []string{
		`^[a-z]{2,4}-\d+$`, `ab|cd`, `^(?:\w+\.)*\w+$`, `^[^aeiou]{3}$`, `^.{2}$`, `x+y`, `^a?b*c+$`,
		`^(ab|a)(c|bc)$`, `[0-9a-f]{4}`, `^\D\W\S$`, `^[\d.-]+$`, `^é+☃?$`, `^(a|b){3,}$`, `^.*$`, `z$`, `^q`,
		`^[A-Z][a-z]*( [A-Z][a-z]*){0,2}$`, `^\$\d+\.\d{2}$`, `^[-+]?\d*\.?\d+$`, `^\(\d{3}\) \d{3}-\d{4}$`,
		`^a|b`, `a|b$`, `a|^b`, `^a$|^b$|c`, `[\d-z]`,
	}
	alphabet := []string{"a", "b", "c", "d", "e", "q", "x", "y", "z", "A", "Z", "0", "1", "9", "-", ".", "+", "$", "(", ")", " ", "_", "\x7f", "é", "☃", "😀"}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, src := range patterns {
		p, err := compilePattern(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		re := regexp.MustCompile(src)
		matched := 0
		for range 3000 {
			var b strings.Builder
			for range rng.IntN(9) {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			text := b.String()
			if got, want := p.matches(text), re.MatchString(text); got != want {
				t.Fatalf("%s on %q: the DFA says %v, Go's regexp %v", src, text, got, want)
			} else if got {
				matched++
			}
		}
		// and the other way: strings the DFA walks to at random, which
		// Go's regexp must match
		if !p.lengthen(0, -1) {
			t.Fatalf("%s: no string matches", src)
		}
		for range 300 {
			var text []byte
			s := p.start()
			for len(text) < 40 && !(p.accepts(s) && rng.IntN(3) == 0) {
				var next []byte
				for c := range 256 {
					if to := p.next(s, byte(c)); to >= 0 && p.canEnd(to, 0, p.limit) {
						next = append(next, byte(c))
					}
				}
				if len(next) == 0 {
					break
				}
				c := next[rng.IntN(len(next))]
				text, s = append(text, c), p.next(s, c)
			}
			if !p.accepts(s) {
				continue
			}
			if !utf8.Valid(text) || !re.Match(text) {
				t.Fatalf("%s: the DFA took %q, which Go's regexp does not match (or is not UTF-8)", src, text)
			}
			matched++
		}
		t.Logf("%s: %d random strings and DFA walks match (%d DFA states)", src, matched, len(p.trans))
	}
}

// TestFormatsMatchTheirRFCs: each format's pattern takes the RFC's
// examples and refuses near misses.
func TestFormatsMatchTheirRFCs(t *testing.T) {
	for name, tc := range map[string]struct{ yes, no []string }{
		"date":      {[]string{"1985-04-12", "2024-02-29", "2000-02-29", "1996-12-31"}, []string{"1900-02-29", "2023-02-29", "1985-4-12", "1985-04-31", "1985-00-10"}},
		"time":      {[]string{"23:20:50.52Z", "16:39:57-08:00", "00:00:00+00:00"}, []string{"24:00:00Z", "23:20:50", "23:60:00Z"}},
		"date-time": {[]string{"1985-04-12T23:20:50.52Z", "1996-12-19T16:39:57-08:00"}, []string{"1985-04-12 23:20:50Z", "1985-04-12T23:20Z"}},
		"uuid":      {[]string{"f81d4fae-7dec-11d0-a765-00a0c91e6bf6"}, []string{"f81d4fae7dec11d0a76500a0c91e6bf6", "f81d4fae-7dec-11d0-a765-00a0c91e6bf"}},
		"email":     {[]string{"john.doe@example.com", "a_b+c%d@sub.example.org"}, []string{"john..doe@example.com", "john@", "@example.com", "john@example"}},
		"ipv4":      {[]string{"192.168.0.1", "0.0.0.0", "255.255.255.255"}, []string{"256.1.1.1", "1.2.3", "01.2.3.4"}},
		"hostname":  {[]string{"example.com", "a-b.c", "localhost"}, []string{"-a.com", "a_b.com", "a..b"}},
		"uri":       {[]string{"https://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.c"}, []string{"example.com", "http://a b", "http://%zz"}},
	} {
		p, err := compilePattern(formats[name])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, s := range tc.yes {
			if !p.matches(s) {
				t.Errorf("%s refuses %q", name, s)
			}
		}
		for _, s := range tc.no {
			if p.matches(s) {
				t.Errorf("%s takes %q", name, s)
			}
		}
	}
}
