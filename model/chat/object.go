package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Object is a JSON object that keeps its members in the order they were
// written, as the Python dict that transformers hands its templates does.
// The order shows wherever a template prints a whole object (a tool's
// JSON schema through tojson) or walks one (dict.items()).
type Object []Member

// Member is one key and value of an Object.
type Member struct {
	Key   string
	Value any
}

// Get returns the value of key and whether it is there.
func (o Object) Get(key string) (any, bool) {
	for _, m := range o {
		if m.Key == key {
			return m.Value, true
		}
	}
	return nil, false
}

// UnmarshalJSON decodes a JSON object as DecodeJSON does.
func (o *Object) UnmarshalJSON(data []byte) error {
	v, err := DecodeJSON(data)
	if err != nil {
		return err
	}
	obj, ok := v.(Object)
	if !ok {
		return fmt.Errorf("chat: JSON %s is not an object", kindOf(v))
	}
	*o = obj
	return nil
}

// MarshalJSON writes the members in order.
func (o Object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(m.Key)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(m.Value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// DecodeJSON decodes JSON keeping what Python's json.loads keeps:
// objects become Object (members in order; a repeated key keeps its
// first place and its last value), arrays []any, numbers json.Number
// (their text, so that rendering tells 3 from 3.0 as Python does), and
// strings, booleans and null as encoding/json decodes them.
func DecodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, fmt.Errorf("chat: decoding JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("chat: decoding JSON: data after the first value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := Object{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string) // the decoder only gives strings here
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				if i := obj.index(k); i >= 0 {
					obj[i].Value = v // Python: the last value wins, in the first place
				} else {
					obj = append(obj, Member{k, v})
				}
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return obj, nil
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return list, nil
		}
	case json.Number, string, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("unexpected %v", tok)
}

func (o Object) index(key string) int {
	for i, m := range o {
		if m.Key == key {
			return i
		}
	}
	return -1
}

// number is a JSON number as Python reads it: an int unless it has a
// fraction or an exponent; integers beyond an int stay json.Number.
func number(n json.Number) (any, error) {
	s := n.String()
	if strings.ContainsAny(s, ".eE") {
		f, err := strconv.ParseFloat(s, 64)
		if errors.Is(err, strconv.ErrRange) {
			err = nil // Python: 1e400 is inf
		}
		return f, err
	}
	if i, err := strconv.ParseInt(s, 10, strconv.IntSize); err == nil {
		return int(i), nil
	}
	return n, nil
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case Object:
		return "object"
	}
	return "number"
}
