package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// piece is a span of normalized text on its way to the model. first
// marks the piece that starts the input (tokenizers: original offset 0),
// which Metaspace's "first" prepend scheme looks at.
type piece struct {
	text  string
	first bool
}

// preTokenizer splits a piece into the words the model encodes one by
// one. It calls emit for each non-empty word, in order.
type preTokenizer interface {
	preTokenize(p piece, emit func(piece))
}

type preSequence []preTokenizer

func (q preSequence) preTokenize(p piece, emit func(piece)) { q.apply(0, p, emit) }

func (q preSequence) apply(k int, p piece, emit func(piece)) {
	if k == len(q) {
		emit(p)
		return
	}
	q[k].preTokenize(p, func(w piece) { q.apply(k+1, w, emit) })
}

type prependScheme int

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// metaspace is the Metaspace pre-tokenizer (and decoder): spaces become
// the replacement rune, which is prepended to the text per the scheme.
type metaspace struct {
	repl   string
	scheme prependScheme
	split  bool
}

func (m *metaspace) preTokenize(p piece, emit func(piece)) {
	s := strings.ReplaceAll(p.text, " ", m.repl)
	if !strings.HasPrefix(s, m.repl) && (m.scheme == prependAlways || m.scheme == prependFirst && p.first) {
		s = m.repl + s
	}
	if !m.split {
		emit(piece{s, p.first})
		return
	}
	// Split on the replacement, each one merged with what follows it.
	start := 0
	for i := 1; i < len(s); {
		k := strings.Index(s[i:], m.repl)
		if k < 0 {
			break
		}
		end := i + k
		emit(piece{s[start:end], p.first && start == 0})
		start, i = end, end+len(m.repl)
	}
	if start < len(s) {
		emit(piece{s[start:], p.first && start == 0})
	}
}

func (m *metaspace) decodeChain(tokens []string) []string {
	for i, tok := range tokens {
		if i == 0 && m.scheme != prependNever {
			tokens[i] = strings.ReplaceAll(tok, m.repl, "")
		} else {
			tokens[i] = strings.ReplaceAll(tok, m.repl, " ")
		}
	}
	return tokens
}

// byteLevel is the ByteLevel pre-tokenizer: optionally a leading space
// and GPT-2's regex split, then every byte mapped to its printable rune.
type byteLevel struct {
	addPrefixSpace bool
	useRegex       bool
}

var gpt2Pattern = knownPatterns[patternGPT2]

func (b *byteLevel) preTokenize(p piece, emit func(piece)) {
	s := p.text
	if b.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if !b.useRegex {
		emit(piece{byteLevelString(s), p.first})
		return
	}
	gpt2Pattern.findMatches(s, func(start, end int, _ bool) {
		emit(piece{byteLevelString(s[start:end]), p.first && start == 0})
	})
}

type splitBehavior int

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

var splitBehaviors = map[string]splitBehavior{
	"Removed":            splitRemoved,
	"Isolated":           splitIsolated,
	"MergedWithPrevious": splitMergedWithPrevious,
	"MergedWithNext":     splitMergedWithNext,
	"Contiguous":         splitContiguous,
}

// split is the Split pre-tokenizer with a literal or a known regex.
type split struct {
	literal  string        // String pattern, when regex is nil
	regex    *splitPattern // one of knownPatterns
	behavior splitBehavior
	invert   bool
}

type span struct {
	start, end int
	match      bool
}

// eachSpan calls add for the consecutive spans covering s, in order,
// each a match of the pattern or the text between two.
func (sp *split) eachSpan(s string, add func(span)) {
	if sp.regex != nil {
		sp.regex.findMatches(s, func(start, end int, match bool) { add(span{start, end, match != sp.invert}) })
		return
	}
	gap := 0
	if sp.literal != "" {
		for i := 0; i < len(s); {
			k := strings.Index(s[i:], sp.literal)
			if k < 0 {
				break
			}
			if i+k > gap {
				add(span{gap, i + k, sp.invert})
			}
			add(span{i + k, i + k + len(sp.literal), !sp.invert})
			i = i + k + len(sp.literal)
			gap = i
		}
	}
	if gap < len(s) {
		add(span{gap, len(s), sp.invert})
	}
}

// preTokenize emits the pieces as the spans are found, holding at most
// one back (to merge the next into it, or it into the next), so that a
// long text is never split whole before its first word is emitted.
func (sp *split) preTokenize(p piece, emit func(piece)) {
	s := p.text
	out := func(m span) {
		if m.end > m.start {
			emit(piece{s[m.start:m.end], p.first && m.start == 0})
		}
	}
	var held span
	holding, prevMatch, first := false, false, true
	sp.eachSpan(s, func(m span) {
		switch sp.behavior {
		case splitIsolated:
			out(m)
		case splitRemoved:
			if !m.match {
				out(m)
			}
		case splitContiguous: // runs of matches, and of the rest, each one piece
			if holding && m.match == held.match {
				held.end = m.end
			} else {
				if holding {
					out(held)
				}
				held, holding = m, true
			}
		case splitMergedWithPrevious: // a match joins the piece before it
			if m.match && (first || !prevMatch) && holding {
				held.end = m.end
			} else {
				if holding {
					out(held)
				}
				held, holding = m, true
			}
		case splitMergedWithNext: // a match joins the piece after it
			switch {
			case holding && !m.match:
				out(span{held.start, m.end, false})
				holding = false
			case holding:
				out(held)
				held = m
			case m.match:
				held, holding = m, true
			default:
				out(m)
			}
		}
		prevMatch, first = m.match, false
	})
	if holding {
		out(held)
	}
}

func parsePreTokenizer(raw json.RawMessage, path string) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c struct {
		Type           string            `json:"type"`
		PreTokenizers  []json.RawMessage `json:"pretokenizers"`
		Replacement    *string           `json:"replacement"`
		AddPrefixSpace *bool             `json:"add_prefix_space"`
		PrependScheme  *string           `json:"prepend_scheme"`
		Split          *bool             `json:"split"`
		UseRegex       *bool             `json:"use_regex"`
		Pattern        patternJSON       `json:"pattern"`
		Behavior       string            `json:"behavior"`
		Invert         bool              `json:"invert"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch c.Type {
	case "Sequence":
		seq := make(preSequence, 0, len(c.PreTokenizers))
		for i, r := range c.PreTokenizers {
			p, err := parsePreTokenizer(r, fmt.Sprintf("%s.pretokenizers[%d]", path, i))
			if err != nil {
				return nil, err
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, nil
	case "Metaspace":
		return parseMetaspace(c.Replacement, c.AddPrefixSpace, c.PrependScheme, c.Split, path)
	case "ByteLevel":
		return &byteLevel{
			addPrefixSpace: c.AddPrefixSpace == nil || *c.AddPrefixSpace,
			useRegex:       c.UseRegex == nil || *c.UseRegex,
		}, nil
	case "Split":
		b, ok := splitBehaviors[c.Behavior]
		if !ok {
			return nil, fmt.Errorf("%s.behavior %q is not supported", path, c.Behavior)
		}
		sp := &split{behavior: b, invert: c.Invert}
		switch {
		case c.Pattern.Regex != nil:
			re, ok := knownPatterns[*c.Pattern.Regex]
			if !ok {
				return nil, fmt.Errorf("%s.pattern.Regex %q is not supported (only the Qwen2, Llama 3 and GPT-2 pre-tokenization regexes are implemented)", path, *c.Pattern.Regex)
			}
			sp.regex = re
		case c.Pattern.String != nil:
			sp.literal = *c.Pattern.String
		default:
			return nil, fmt.Errorf("%s.pattern: want String or Regex", path)
		}
		return sp, nil
	}
	return nil, fmt.Errorf("%s.type %q is not supported", path, c.Type)
}

// parseMetaspace reads Metaspace in both shapes: the old one with
// add_prefix_space and the newer one with prepend_scheme and split.
func parseMetaspace(replacement *string, addPrefixSpace *bool, scheme *string, splitFlag *bool, path string) (*metaspace, error) {
	if replacement == nil || utf8.RuneCountInString(*replacement) != 1 {
		return nil, fmt.Errorf("%s.replacement: want one character", path)
	}
	m := &metaspace{repl: *replacement, scheme: prependAlways, split: splitFlag == nil || *splitFlag}
	if scheme != nil {
		switch *scheme {
		case "always":
			m.scheme = prependAlways
		case "first":
			m.scheme = prependFirst
		case "never":
			m.scheme = prependNever
		default:
			return nil, fmt.Errorf("%s.prepend_scheme %q is not supported", path, *scheme)
		}
	}
	if addPrefixSpace != nil && !*addPrefixSpace {
		if m.scheme != prependNever && scheme != nil {
			return nil, fmt.Errorf("%s: add_prefix_space false does not match prepend_scheme %q", path, *scheme)
		}
		m.scheme = prependNever
	}
	return m, nil
}
