package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// decoder turns token strings back into text, as a tokenizers decoder's
// decode_chain does; the results are joined without separator.
type decoder interface {
	decodeChain(tokens []string) []string
}

type decSequence []decoder

func (q decSequence) decodeChain(tokens []string) []string {
	for _, d := range q {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}

// decReplace is the Replace decoder with a literal pattern.
type decReplace normReplace

func (r decReplace) decodeChain(tokens []string) []string {
	for i, t := range tokens {
		tokens[i] = normReplace(r).normalize(t)
	}
	return tokens
}

// decByteFallback turns runs of "<0xXX>" tokens into text: the run's
// bytes if they are valid UTF-8, else one U+FFFD per byte.
type decByteFallback struct{}

func (decByteFallback) decodeChain(tokens []string) []string {
	out := tokens[:0:0]
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range tokens {
		if b, ok := byteTokenValue(t); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// decFuse joins all tokens into one.
type decFuse struct{}

func (decFuse) decodeChain(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// decStrip removes up to start leading and stop trailing content runes
// from every token.
type decStrip struct {
	content     rune
	start, stop int
}

func (d decStrip) decodeChain(tokens []string) []string {
	for i, t := range tokens {
		for k := 0; k < d.start; k++ {
			r, n := utf8.DecodeRuneInString(t)
			if n == 0 || r != d.content {
				break
			}
			t = t[n:]
		}
		for k := 0; k < d.stop; k++ {
			r, n := utf8.DecodeLastRuneInString(t)
			if n == 0 || r != d.content {
				break
			}
			t = t[:len(t)-n]
		}
		tokens[i] = t
	}
	return tokens
}

// decByteLevel maps byte-level runes back to bytes and decodes them as
// UTF-8, lossily. A token with a rune outside the byte alphabet (an
// added token such as "<think>" in another script) is taken as is.
type decByteLevel struct{}

func (decByteLevel) decodeChain(tokens []string) []string {
	var buf []byte
	for _, t := range tokens {
		buf = appendByteLevelToken(buf, t)
	}
	return []string{string(appendLossy(nil, buf))}
}

func appendByteLevelToken(buf []byte, t string) []byte {
	n := len(buf)
	for _, r := range t {
		b, ok := runeToByte[r]
		if !ok {
			return append(buf[:n], t...)
		}
		buf = append(buf, b)
	}
	return buf
}

func parseDecoder(raw json.RawMessage, path string) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c struct {
		Type           string            `json:"type"`
		Decoders       []json.RawMessage `json:"decoders"`
		Pattern        patternJSON       `json:"pattern"`
		Content        *json.RawMessage  `json:"content"`
		Start          int               `json:"start"`
		Stop           int               `json:"stop"`
		Replacement    *string           `json:"replacement"`
		AddPrefixSpace *bool             `json:"add_prefix_space"`
		PrependScheme  *string           `json:"prepend_scheme"`
		Split          *bool             `json:"split"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var content string
	if c.Content != nil {
		if err := json.Unmarshal(*c.Content, &content); err != nil {
			return nil, fmt.Errorf("%s.content: %w", path, err)
		}
	}
	switch c.Type {
	case "Sequence":
		seq := make(decSequence, 0, len(c.Decoders))
		for i, r := range c.Decoders {
			d, err := parseDecoder(r, fmt.Sprintf("%s.decoders[%d]", path, i))
			if err != nil {
				return nil, err
			}
			if d != nil {
				seq = append(seq, d)
			}
		}
		return seq, nil
	case "Replace":
		old, err := c.Pattern.literal(path)
		if err != nil {
			return nil, err
		}
		if c.Content == nil {
			return nil, fmt.Errorf("%s.content is missing", path)
		}
		return decReplace{old: old, new: content}, nil
	case "ByteFallback":
		return decByteFallback{}, nil
	case "Fuse":
		return decFuse{}, nil
	case "Strip":
		if utf8.RuneCountInString(content) != 1 {
			return nil, fmt.Errorf("%s.content %q: want one character", path, content)
		}
		if c.Start < 0 || c.Stop < 0 {
			return nil, fmt.Errorf("%s: start %d and stop %d must not be negative", path, c.Start, c.Stop)
		}
		r, _ := utf8.DecodeRuneInString(content)
		return decStrip{content: r, start: c.Start, stop: c.Stop}, nil
	case "Metaspace":
		return parseMetaspace(c.Replacement, c.AddPrefixSpace, c.PrependScheme, c.Split, path)
	case "ByteLevel":
		return decByteLevel{}, nil
	}
	return nil, fmt.Errorf("%s.type %q is not supported", path, c.Type)
}

// hasByteFallback reports whether d decodes "<0xXX>" runs, whose text
// is only known once the run ends.
func hasByteFallback(d decoder) bool {
	switch d := d.(type) {
	case decByteFallback:
		return true
	case decSequence:
		for _, x := range d {
			if hasByteFallback(x) {
				return true
			}
		}
	}
	return false
}

// TokenBytes returns the bytes id adds to a text it does not begin (the
// decoder's strip of a text's first space does not apply), or nil for a
// special token or an id outside the vocabulary: what a constraint on the
// output's bytes needs, and what OpenAI's logprobs call a token's bytes.
// A byte-fallback token ("<0xE2>") is its one byte, which alone may be
// incomplete UTF-8.
func (t *Tokenizer) TokenBytes(id int) []byte {
	tok, ok := t.decodable(id, true)
	if !ok {
		return nil
	}
	if t.decoder == nil {
		return []byte(" " + tok) // tokens are joined with spaces
	}
	return tokenBytes(t.decoder, tok)
}

func tokenBytes(d decoder, tok string) []byte {
	switch d := d.(type) {
	case decSequence:
		for _, step := range d {
			if _, ok := step.(decStrip); ok {
				continue
			}
			switch step.(type) {
			case decByteFallback, decByteLevel:
				return tokenBytes(step, tok)
			}
			tok = step.decodeChain([]string{tok})[0]
		}
		return []byte(tok)
	case decByteFallback:
		if b, ok := byteTokenValue(tok); ok {
			return []byte{b}
		}
	case decByteLevel:
		return appendByteLevelToken(nil, tok)
	case decStrip:
	default:
		tok = d.decodeChain([]string{tok})[0]
	}
	return []byte(tok)
}
