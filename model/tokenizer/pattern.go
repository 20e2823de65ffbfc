package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The pre-tokenization regexes we implement by hand. Go's regexp has no
// lookahead, which `\s+(?!\S)` needs, so each known pattern is a small
// scanner that reproduces the leftmost-first (Perl/Oniguruma) semantics
// of the regex. Any other pattern is refused when the file is loaded.
const (
	// patternQwen2 is the Split regex of Qwen2, Qwen2.5 and Qwen3.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternLlama3 is the Split regex of Llama 3 (cl100k-like): as Qwen's
	// but with numbers in groups of up to three digits.
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternGPT2 is the regex of the ByteLevel pre-tokenizer with
	// use_regex true.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

type patternKind int

const (
	kindCL100K patternKind = iota // Qwen2 and Llama 3 shapes
	kindGPT2
)

// splitPattern is one of the known pre-tokenization regexes.
type splitPattern struct {
	kind      patternKind
	maxDigits int // \p{N}{1,maxDigits}; CL100K kind only
}

var knownPatterns = map[string]*splitPattern{
	patternQwen2:  {kind: kindCL100K, maxDigits: 1},
	patternLlama3: {kind: kindCL100K, maxDigits: 3},
	patternGPT2:   {kind: kindGPT2},
}

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isSpace(r rune) bool  { return unicode.IsSpace(r) }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// runeAt decodes the rune at s[i]; at the end of s it returns -1.
func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// scan returns the end of the run of runes from i that satisfy in.
func scan(s string, i int, in func(rune) bool) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if !in(r) {
			break
		}
		i += n
	}
	return i
}

// findMatches calls emit for consecutive spans covering s, in order,
// flagging those matched by the pattern (regex find_iter semantics:
// the leftmost match, then the next one after its end).
func (p *splitPattern) findMatches(s string, emit func(start, end int, match bool)) {
	gap := 0
	for i := 0; i < len(s); {
		end := p.matchAt(s, i)
		if end < 0 {
			_, n := runeAt(s, i)
			i += n
			continue
		}
		if gap < i {
			emit(gap, i, false)
		}
		emit(i, end, true)
		i, gap = end, end
	}
	if gap < len(s) {
		emit(gap, len(s), false)
	}
}

// matchAt returns the end of the pattern's match starting at s[i], or
// -1 if no alternative matches there. Alternatives are tried in order
// and the first that matches wins, as in a backtracking engine.
func (p *splitPattern) matchAt(s string, i int) int {
	if p.kind == kindGPT2 {
		return matchGPT2(s, i)
	}
	r, n := runeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if m := contraction(s, i+n, true); m > 0 {
			return m
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(r) {
		return scan(s, i+n, isLetter)
	}
	if r != '\r' && r != '\n' && !isNumber(r) {
		if r2, n2 := runeAt(s, i+n); r2 >= 0 && isLetter(r2) {
			return scan(s, i+n+n2, isLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if isNumber(r) {
		j := i + n
		for k := 1; k < p.maxDigits; k++ {
			r2, n2 := runeAt(s, j)
			if r2 < 0 || !isNumber(r2) {
				break
			}
			j += n2
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j := i
	if r == ' ' {
		if r2, _ := runeAt(s, i+1); r2 >= 0 && isOther(r2) {
			j = i + 1
		}
	}
	if r2, _ := runeAt(s, j); r2 >= 0 && isOther(r2) {
		j = scan(s, j, isOther)
		return scan(s, j, func(r rune) bool { return r == '\r' || r == '\n' })
	}
	if !isSpace(r) {
		return -1
	}
	// \s*[\r\n]+ : the whitespace run up to its last line break.
	end := scan(s, i, isSpace)
	lastBreak := -1
	for k := i; k < end; k++ {
		if s[k] == '\r' || s[k] == '\n' {
			lastBreak = k
		}
	}
	if lastBreak >= 0 {
		return lastBreak + 1
	}
	return spaceRun(s, i, end)
}

// matchGPT2 is matchAt for patternGPT2.
func matchGPT2(s string, i int) int {
	r, n := runeAt(s, i)
	if r == '\'' {
		if m := contraction(s, i+n, false); m > 0 {
			return m
		}
	}
	// ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
	for _, class := range [...]func(rune) bool{isLetter, isNumber, isOther} {
		j := i
		if r == ' ' {
			if r2, _ := runeAt(s, i+1); r2 >= 0 && class(r2) {
				j = i + 1
			}
		}
		if r2, _ := runeAt(s, j); r2 >= 0 && class(r2) {
			return scan(s, j, class)
		}
	}
	if !isSpace(r) {
		return -1
	}
	return spaceRun(s, i, scan(s, i, isSpace))
}

// spaceRun resolves `\s+(?!\S)|\s+` for the whitespace run s[i:end].
func spaceRun(s string, i, end int) int {
	if end == len(s) {
		return end
	}
	// Followed by a non-space: \s+(?!\S) backtracks one rune, leaving
	// the last space to start the next token, if the run is longer than
	// one rune; otherwise \s+ takes the single rune.
	_, last := utf8.DecodeLastRuneInString(s[i:end])
	if end-last > i {
		return end - last
	}
	return end
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d after the apostrophe at
// s[j-1], returning the end of the match or -1. With fold set it matches
// case-insensitively as Oniguruma's (?i:) does, including U+017F (long s,
// which case-folds to s).
func contraction(s string, j int, fold bool) int {
	lower := func(r rune) rune {
		if !fold {
			return r
		}
		if r == 'ſ' {
			return 's'
		}
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}
	r1, n1 := runeAt(s, j)
	switch lower(r1) {
	case 's', 't', 'm', 'd':
		return j + n1
	case 'r', 'v':
		if r2, n2 := runeAt(s, j+n1); lower(r2) == 'e' {
			return j + n1 + n2
		}
	case 'l':
		if r2, n2 := runeAt(s, j+n1); lower(r2) == 'l' {
			return j + n1 + n2
		}
	}
	return -1
}
