package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// value is a JSON value of a schema, parsed once: compiling reads each
// byte of the schema once, where re-decoding each subschema's text cost
// its depth times its size.
type value struct {
	kind   valueKind
	text   string            // a string's text; a number as written
	keys   []string          // an object's keys, in the order first met
	fields map[string]*value // an object's members (a repeated key: its last value)
	items  []*value          // an array's items
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

// parseValue reads one JSON value from raw, and nothing after it.
func parseValue(raw []byte) (*value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := readValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("text after the JSON value")
	}
	return v, nil
}

func readValue(dec *json.Decoder) (*value, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case nil:
		return &value{kind: vNull, text: "null"}, nil
	case bool:
		return &value{kind: vBool, text: fmt.Sprint(t)}, nil
	case json.Number:
		return &value{kind: vNumber, text: string(t)}, nil
	case string:
		return &value{kind: vString, text: t}, nil
	case json.Delim:
		switch t {
		case '[':
			v := &value{kind: vArray}
			for dec.More() {
				item, err := readValue(dec)
				if err != nil {
					return nil, err
				}
				v.items = append(v.items, item)
			}
			_, err := dec.Token() // ]
			return v, err
		case '{':
			v := &value{kind: vObject, fields: map[string]*value{}}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				key := k.(string) // the decoder returns an object's keys as strings
				member, err := readValue(dec)
				if err != nil {
					return nil, err
				}
				if _, dup := v.fields[key]; !dup {
					v.keys = append(v.keys, key)
				}
				v.fields[key] = member
			}
			_, err := dec.Token() // }
			return v, err
		}
	}
	return nil, fmt.Errorf("unexpected %v", t)
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
			v.fields[k].write(b)
		}
		b.WriteByte('}')
	default:
		b.WriteString(v.text)
	}
}
