package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// FromSchema compiles a JSON Schema into the node of the JSON texts it
// accepts. It knows type (one or a list), properties, required,
// additionalProperties, items, minItems, maxItems, enum, const, anyOf,
// oneOf (read as anyOf: the alternatives of a schema meant for output
// rarely overlap), and $ref to "#", "#/$defs/..." or "#/definitions/...";
// annotations (title, description, default, examples, ...) are ignored;
// any other keyword is refused by name rather than left unchecked.
//
// Properties come in the order the schema declares them; an optional one
// may be left out, a required one may not. An object takes properties
// beyond those declared only where additionalProperties says so (true or
// a schema): a schema written for output means the properties it lists.
func FromSchema(schema json.RawMessage) (*Node, error) {
	c := &compiler{root: schema, refs: map[string]*Node{}}
	return c.compile(schema, "#")
}

type compiler struct {
	root json.RawMessage
	refs map[string]*Node
}

// annotations change nothing a document may be.
var annotations = []string{"title", "description", "default", "examples", "$schema", "$id", "$comment",
	"deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict", "name"}

// keywords this compiler acts on.
var keywords = []string{"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
	"enum", "const", "anyOf", "oneOf", "$ref"}

func (c *compiler) compile(raw json.RawMessage, path string) (*Node, error) {
	raw = bytes.TrimSpace(raw)
	switch string(raw) {
	case "true", "{}":
		return anyValue(), nil
	case "false":
		return nil, fmt.Errorf("%s: the schema false accepts nothing", path)
	}
	keys, fields, err := members(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: a schema must be an object or a boolean: %v", path, err)
	}
	for _, k := range keys {
		if !slices.Contains(keywords, k) && !slices.Contains(annotations, k) {
			return nil, fmt.Errorf("%s: the schema keyword %q is not supported (supported: %s)", path, k, strings.Join(keywords, ", "))
		}
	}
	// a keyword that stands for the whole schema takes no sibling that
	// would narrow it: each would be left unchecked
	for _, whole := range []string{"$ref", "const", "enum", "anyOf", "oneOf"} {
		if _, ok := fields[whole]; !ok {
			continue
		}
		for _, k := range keys {
			if k != whole && slices.Contains(keywords, k) && !(k == "type" && (whole == "const" || whole == "enum")) {
				return nil, fmt.Errorf("%s: %q beside %q is not supported: put it inside (each alternative of) %s", path, k, whole, whole)
			}
		}
	}
	if ref, ok := fields["$ref"]; ok {
		return c.ref(ref, path)
	}
	if v, ok := fields["const"]; ok {
		lit, err := canonical(v)
		if err != nil {
			return nil, fmt.Errorf("%s/const: %v", path, err)
		}
		if err := matchesType(fields, v); err != nil {
			return nil, fmt.Errorf("%s/const: %s %v", path, lit, err)
		}
		return Literal(lit), nil
	}
	if v, ok := fields["enum"]; ok {
		var values []json.RawMessage
		if err := json.Unmarshal(v, &values); err != nil || len(values) == 0 {
			return nil, fmt.Errorf("%s/enum: must be a non-empty array", path)
		}
		if len(values) > maxEnum {
			return nil, fmt.Errorf("%s/enum: %d values, more than the %d supported", path, len(values), maxEnum)
		}
		var alts []*Node
		for _, v := range values {
			lit, err := canonical(v)
			if err != nil {
				return nil, fmt.Errorf("%s/enum: %v", path, err)
			}
			if err := matchesType(fields, v); err != nil {
				return nil, fmt.Errorf("%s/enum: %s %v", path, lit, err)
			}
			alts = append(alts, Literal(lit))
		}
		return OneOf(alts...), nil
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if v, ok := fields[k]; ok {
			var list []json.RawMessage
			if err := json.Unmarshal(v, &list); err != nil || len(list) == 0 {
				return nil, fmt.Errorf("%s/%s: must be a non-empty array of schemas", path, k)
			}
			var alts []*Node
			for i, s := range list {
				n, err := c.compile(s, fmt.Sprintf("%s/%s/%d", path, k, i))
				if err != nil {
					return nil, err
				}
				alts = append(alts, n)
			}
			return OneOf(alts...), nil
		}
	}
	types, err := typesOf(fields, path)
	if err != nil {
		return nil, err
	}
	var alts []*Node
	for _, t := range types {
		n, err := c.typed(t, fields, path)
		if err != nil {
			return nil, err
		}
		alts = append(alts, n)
	}
	return OneOf(alts...), nil
}

// maxEnum bounds an enum: each value is a way to read the output until
// it differs from the others.
const maxEnum = 256

// matchesType checks a const or enum value against the schema's type,
// if it has one.
func matchesType(fields map[string]json.RawMessage, v json.RawMessage) error {
	if _, ok := fields["type"]; !ok {
		return nil
	}
	types, err := typesOf(fields, "")
	if err != nil {
		return err
	}
	var x any
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	if err := dec.Decode(&x); err != nil {
		return err
	}
	var is string
	switch x := x.(type) {
	case nil:
		is = "null"
	case bool:
		is = "boolean"
	case string:
		is = "string"
	case []any:
		is = "array"
	case map[string]any:
		is = "object"
	case json.Number:
		is = "number"
		if _, err := x.Int64(); err == nil {
			is = "integer"
		}
	}
	if slices.Contains(types, is) || is == "integer" && slices.Contains(types, "number") {
		return nil
	}
	return fmt.Errorf("is not of the type %v", types)
}

// typesOf reads "type", or infers it from the keywords present.
func typesOf(fields map[string]json.RawMessage, path string) ([]string, error) {
	v, ok := fields["type"]
	if !ok {
		has := func(ks ...string) bool {
			return slices.ContainsFunc(ks, func(k string) bool { _, ok := fields[k]; return ok })
		}
		switch {
		case has("properties", "additionalProperties", "required"):
			if has("items", "minItems", "maxItems") {
				return nil, fmt.Errorf("%s: object and array keywords without a type", path)
			}
			return []string{"object"}, nil
		case has("items", "minItems", "maxItems"):
			return []string{"array"}, nil
		}
		return []string{"any"}, nil
	}
	var one string
	if json.Unmarshal(v, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(v, &many); err != nil || len(many) == 0 {
		return nil, fmt.Errorf("%s/type: must be a type name or a non-empty list of them", path)
	}
	return many, nil
}

func (c *compiler) typed(t string, fields map[string]json.RawMessage, path string) (*Node, error) {
	switch t {
	case "any":
		return anyValue(), nil
	case "string":
		return stringNode(), nil
	case "number":
		return numberNode(false), nil
	case "integer":
		return numberNode(true), nil
	case "boolean":
		return OneOf(Literal("true"), Literal("false")), nil
	case "null":
		return Literal("null"), nil
	case "object":
		return c.object(fields, path)
	case "array":
		return c.array(fields, path)
	}
	return nil, fmt.Errorf("%s/type: unknown type %q", path, t)
}

func (c *compiler) object(fields map[string]json.RawMessage, path string) (*Node, error) {
	n := &Node{kind: kObject}
	var required []string
	if v, ok := fields["required"]; ok {
		if err := json.Unmarshal(v, &required); err != nil {
			return nil, fmt.Errorf("%s/required: must be an array of names", path)
		}
	}
	if v, ok := fields["properties"]; ok {
		names, props, err := members(v)
		if err != nil {
			return nil, fmt.Errorf("%s/properties: %v", path, err)
		}
		for _, name := range names {
			value, err := c.compile(props[name], path+"/properties/"+name)
			if err != nil {
				return nil, err
			}
			n.props = append(n.props, property{name: name, key: Literal(jsonString(name) + ":"), value: value, required: slices.Contains(required, name)})
		}
	}
	for _, r := range required {
		if !slices.ContainsFunc(n.props, func(p property) bool { return p.name == r }) {
			return nil, fmt.Errorf("%s/required: %q is required but not among the properties", path, r)
		}
	}
	if v, ok := fields["additionalProperties"]; ok && string(bytes.TrimSpace(v)) != "false" {
		if len(n.props) > 0 {
			// an extra key could repeat a declared one with a value of
			// its own, which the client would read instead
			return nil, fmt.Errorf("%s/additionalProperties: other properties beside the declared ones are not supported (declare them, or set it false)", path)
		}
		extra, err := c.compile(v, path+"/additionalProperties")
		if err != nil {
			return nil, err
		}
		n.extra = extra
	} else if !ok && len(n.props) == 0 {
		n.extra = anyValue() // {"type": "object"} alone: any object
	}
	return n, nil
}

func (c *compiler) array(fields map[string]json.RawMessage, path string) (*Node, error) {
	n := &Node{kind: kArray, maxItems: -1}
	if v, ok := fields["items"]; ok {
		items, err := c.compile(v, path+"/items")
		if err != nil {
			return nil, err
		}
		n.items = items
	} else {
		n.items = anyValue()
	}
	for _, b := range []struct {
		name string
		to   *int
	}{{"minItems", &n.minItems}, {"maxItems", &n.maxItems}} {
		if v, ok := fields[b.name]; ok {
			if err := json.Unmarshal(v, b.to); err != nil || *b.to < 0 {
				return nil, fmt.Errorf("%s/%s: must be a non-negative integer", path, b.name)
			}
		}
	}
	if n.maxItems >= 0 && n.maxItems < n.minItems {
		return nil, fmt.Errorf("%s: maxItems %d is below minItems %d", path, n.maxItems, n.minItems)
	}
	return n, nil
}

// ref resolves a local reference, once: a recursive schema becomes a
// cycle in the graph.
func (c *compiler) ref(raw json.RawMessage, path string) (*Node, error) {
	var ref string
	if err := json.Unmarshal(raw, &ref); err != nil {
		return nil, fmt.Errorf("%s/$ref: must be a string", path)
	}
	if n, ok := c.refs[ref]; ok {
		return n, nil
	}
	target := c.root
	rest, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, fmt.Errorf("%s/$ref: only references inside the schema (#...) are supported, not %q", path, ref)
	}
	for _, part := range strings.Split(strings.TrimPrefix(rest, "/"), "/") {
		if part == "" {
			continue
		}
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		_, fields, err := members(target)
		if err != nil || fields[part] == nil {
			return nil, fmt.Errorf("%s/$ref: %q does not resolve", path, ref)
		}
		target = fields[part]
	}
	// a placeholder first, filled once compiled, so that references to
	// ref inside it close the cycle
	n := &Node{kind: kSeq}
	c.refs[ref] = n
	inner, err := c.compile(target, ref)
	if err != nil {
		return nil, err
	}
	n.alts = []*Node{inner}
	return n, nil
}

// members reads a JSON object's keys in order, and its values.
func members(raw json.RawMessage) ([]string, map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, fmt.Errorf("not a JSON object")
	}
	var keys []string
	fields := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		k := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, err
		}
		if _, dup := fields[k]; !dup {
			keys = append(keys, k)
		}
		fields[k] = v
	}
	return keys, fields, nil
}

// canonical is v as compact JSON, strings escaped as a model would write
// them (no HTML escapes), numbers as written.
func canonical(v json.RawMessage) (string, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, v); err != nil {
		return "", err
	}
	var x any
	dec := json.NewDecoder(&b)
	dec.UseNumber()
	if err := dec.Decode(&x); err != nil {
		return "", err
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return "", err
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}

// jsonString is s as a JSON string, escaped as a model would write it
// (no HTML escapes).
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
