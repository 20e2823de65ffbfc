package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens in text before the model sees it, as
// tokenizers' AddedVocabulary::find_matches does with a leftmost-longest
// Aho-Corasick automaton.
type addedMatcher struct {
	tokens  []matchToken
	byFirst [256][]int32 // indices into tokens by first byte, longest first
}

type matchToken struct {
	pattern string
	id      int
	tok     addedToken
}

func newAddedMatcher(tokens []matchToken) *addedMatcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &addedMatcher{tokens: tokens}
	for i, t := range tokens {
		b := t.pattern[0]
		m.byFirst[b] = append(m.byFirst[b], int32(i))
	}
	for b := range m.byFirst {
		l := m.byFirst[b]
		sort.SliceStable(l, func(i, j int) bool { return len(tokens[l[i]].pattern) > len(tokens[l[j]].pattern) })
	}
	return m
}

// longestAt returns the token index of the longest pattern starting at
// s[i], or -1.
func (m *addedMatcher) longestAt(s string, i int) int {
	for _, k := range m.byFirst[s[i]] {
		if strings.HasPrefix(s[i:], m.tokens[k].pattern) {
			return int(k)
		}
	}
	return -1
}

// split calls emit for consecutive pieces of s in order: runs of plain
// text with id -1, and added tokens with their id. Empty pieces are not
// emitted.
func (m *addedMatcher) split(s string, emit func(start, end, id int)) {
	if s == "" {
		return
	}
	if m == nil {
		emit(0, len(s), -1)
		return
	}
	offset := 0
	for i := 0; i < len(s); {
		k := m.longestAt(s, i)
		if k < 0 {
			i++
			continue
		}
		t := &m.tokens[k]
		start, stop := i, i+len(t.pattern)
		i = stop
		if t.tok.SingleWord {
			startOK := start == 0 || !endsWithWord(s[:start])
			stopOK := stop == len(s) || !startsWithWord(s[stop:])
			if !startOK || !stopOK {
				continue
			}
		}
		if t.tok.LStrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), offset)
		}
		if t.tok.RStrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if offset < start {
			emit(offset, start, -1)
		}
		emit(start, stop, t.id)
		offset = stop
	}
	if offset < len(s) {
		emit(offset, len(s), -1)
	}
}

// isWordRune is Rust regex's Unicode \w.
func isWordRune(r rune) bool {
	return unicode.In(r, unicode.L, unicode.Nl, unicode.Other_Alphabetic, unicode.M, unicode.Nd, unicode.Pc, unicode.Join_Control)
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}
