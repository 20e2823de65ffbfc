package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites one piece of input text before pre-tokenization,
// as a tokenizers normalizer does.
type normalizer interface {
	normalize(s string) string
}

type normSequence []normalizer

func (q normSequence) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// normPrepend is Prepend: it prefixes every non-empty piece.
type normPrepend string

func (p normPrepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return string(p) + s
}

// normReplace is Replace with a literal (String) pattern.
type normReplace struct{ old, new string }

func (r normReplace) normalize(s string) string {
	if r.old == "" {
		return s
	}
	return strings.ReplaceAll(s, r.old, r.new)
}

// normUnicode is NFC, NFD, NFKC or NFKD.
type normUnicode struct{ form norm.Form }

func (u normUnicode) normalize(s string) string { return u.form.String(s) }

// normStrip is Strip: it trims Unicode white space.
type normStrip struct{ left, right bool }

func (t normStrip) normalize(s string) string {
	if t.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if t.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// patternJSON is a tokenizers Pattern: {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// literal returns the pattern's text if it is a String pattern.
func (p patternJSON) literal(path string) (string, error) {
	switch {
	case p.String != nil:
		return *p.String, nil
	case p.Regex != nil:
		return "", fmt.Errorf("%s.pattern.Regex %q is not supported (only String patterns are)", path, *p.Regex)
	}
	return "", fmt.Errorf("%s.pattern: want String or Regex", path)
}

func parseNormalizer(raw json.RawMessage, path string) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
		Prepend     *string           `json:"prepend"`
		Pattern     patternJSON       `json:"pattern"`
		Content     *string           `json:"content"`
		StripLeft   *bool             `json:"strip_left"`
		StripRight  *bool             `json:"strip_right"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch c.Type {
	case "Sequence":
		seq := make(normSequence, 0, len(c.Normalizers))
		for i, r := range c.Normalizers {
			n, err := parseNormalizer(r, fmt.Sprintf("%s.normalizers[%d]", path, i))
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	case "Prepend":
		if c.Prepend == nil {
			return nil, fmt.Errorf("%s.prepend is missing", path)
		}
		return normPrepend(*c.Prepend), nil
	case "Replace":
		old, err := c.Pattern.literal(path)
		if err != nil {
			return nil, err
		}
		if c.Content == nil {
			return nil, fmt.Errorf("%s.content is missing", path)
		}
		return normReplace{old: old, new: *c.Content}, nil
	case "NFC":
		return normUnicode{norm.NFC}, nil
	case "NFD":
		return normUnicode{norm.NFD}, nil
	case "NFKC":
		return normUnicode{norm.NFKC}, nil
	case "NFKD":
		return normUnicode{norm.NFKD}, nil
	case "Strip":
		return normStrip{left: c.StripLeft == nil || *c.StripLeft, right: c.StripRight == nil || *c.StripRight}, nil
	}
	return nil, fmt.Errorf("%s.type %q is not supported", path, c.Type)
}

// isNull reports whether a JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
