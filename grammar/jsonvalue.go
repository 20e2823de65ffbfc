package grammar

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// value is a JSON value of a schema, parsed once: compiling reads each
// byte of the schema once, where re-decoding each subschema's text cost
// its depth times its size.
type value struct {
	kind  valueKind
	text  string   // a string's text; a number as written
	keys  []string // an object's keys, in the order first met
	vals  []*value // their values (a repeated key: its last)
	items []*value // an array's items
	// index finds a large object's keys (made on first use)
	index map[string]int
}

// field is an object's member k, nil if it has none.
func (v *value) field(k string) *value {
	if len(v.keys) <= 16 {
		if i := slices.Index(v.keys, k); i >= 0 {
			return v.vals[i]
		}
		return nil
	}
	if v.index == nil {
		v.index = make(map[string]int, len(v.keys))
		for i, key := range v.keys {
			v.index[key] = i
		}
	}
	if i, ok := v.index[k]; ok {
		return v.vals[i]
	}
	return nil
}

type valueKind uint8

const (
	vNull valueKind = iota
	vBool
	vNumber
	vString
	vArray
	vObject
)

// parseValue reads one JSON value from raw, and nothing after it: checked
// whole first (json.Valid), then read in one pass.
func parseValue(raw []byte) (*value, error) {
	if !json.Valid(raw) {
		var x any
		return nil, fmt.Errorf("not JSON: %v", json.Unmarshal(raw, &x)) // says where
	}
	p := &parser{b: raw}
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// maxNesting bounds how deep a schema's JSON may nest (its objects and
// arrays, of which each schema level takes two or three).
const maxNesting = 256

// parser reads valid JSON (parseValue checked it) into values.
type parser struct {
	b []byte
	i int
}

func (p *parser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

func (p *parser) value(depth int) (*value, error) {
	p.space()
	switch c := p.b[p.i]; c {
	case '{', '[':
		if depth >= maxNesting {
			return nil, fmt.Errorf("JSON nested more than %d deep (a limit of the server's)", maxNesting)
		}
		p.i++
		if c == '[' {
			v := &value{kind: vArray}
			for p.space(); p.b[p.i] != ']'; p.space() {
				item, err := p.value(depth + 1)
				if err != nil {
					return nil, err
				}
				v.items = append(v.items, item)
				if p.space(); p.b[p.i] == ',' {
					p.i++
				}
			}
			p.i++
			return v, nil
		}
		v := &value{kind: vObject}
		var seen map[string]int // a large object's keys so far
		for p.space(); p.b[p.i] != '}'; p.space() {
			key, err := p.str()
			if err != nil {
				return nil, err
			}
			p.space()
			p.i++ // ':'
			member, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			if len(v.keys) == 16 && seen == nil {
				seen = make(map[string]int)
				for i, k := range v.keys {
					seen[k] = i
				}
			}
			dup := -1
			if seen != nil {
				if i, ok := seen[key]; ok {
					dup = i
				}
			} else {
				dup = slices.Index(v.keys, key)
			}
			if dup >= 0 {
				v.vals[dup] = member
			} else {
				if seen != nil {
					seen[key] = len(v.keys)
				}
				v.keys, v.vals = append(v.keys, key), append(v.vals, member)
			}
			if p.space(); p.b[p.i] == ',' {
				p.i++
			}
		}
		p.i++
		return v, nil
	case '"':
		s, err := p.str()
		return &value{kind: vString, text: s}, err
	case 't':
		p.i += 4
		return &value{kind: vBool, text: "true"}, nil
	case 'f':
		p.i += 5
		return &value{kind: vBool, text: "false"}, nil
	case 'n':
		p.i += 4
		return &value{kind: vNull, text: "null"}, nil
	}
	start := p.i
	for p.i < len(p.b) && strings.IndexByte("+-.eE0123456789", p.b[p.i]) >= 0 {
		p.i++
	}
	return &value{kind: vNumber, text: string(p.b[start:p.i])}, nil
}

// str reads a string at p.i: as it is, or through encoding/json where it
// has escapes.
func (p *parser) str() (string, error) {
	start := p.i
	p.i++
	escaped := false
	for ; p.b[p.i] != '"'; p.i++ {
		if p.b[p.i] == '\\' {
			escaped = true
			p.i++
		}
	}
	p.i++
	if !escaped {
		return string(p.b[start+1 : p.i-1]), nil
	}
	var s string
	err := json.Unmarshal(p.b[start:p.i], &s)
	return s, err
}

// typeName is v's JSON Schema type.
func (v *value) typeName() string {
	switch v.kind {
	case vNull:
		return "null"
	case vBool:
		return "boolean"
	case vString:
		return "string"
	case vArray:
		return "array"
	case vObject:
		return "object"
	}
	if !strings.ContainsAny(v.text, ".eE") {
		return "integer"
	}
	return "number"
}

// canonical is v as compact JSON as a model would write it: strings
// escaped without HTML escapes, numbers as written, an object's keys
// sorted (as encoding/json writes a map).
func (v *value) canonical() string {
	var b strings.Builder
	v.write(&b)
	return b.String()
}

func (v *value) write(b *strings.Builder) {
	switch v.kind {
	case vString:
		b.WriteString(jsonString(v.text))
	case vArray:
		b.WriteByte('[')
		for i, item := range v.items {
			if i > 0 {
				b.WriteByte(',')
			}
			item.write(b)
		}
		b.WriteByte(']')
	case vObject:
		b.WriteByte('{')
		for i, k := range slices.Sorted(slices.Values(v.keys)) {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(jsonString(k))
			b.WriteByte(':')
			v.field(k).write(b)
		}
		b.WriteByte('}')
	default:
		b.WriteString(v.text)
	}
}
