package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// FromSchema compiles a JSON Schema into the node of the JSON texts it
// accepts, within DefaultLimits. It knows type (one or a list),
// properties, required, additionalProperties, items, minItems, maxItems,
// enum, const, anyOf, oneOf (read as anyOf: the alternatives of a schema
// meant for output rarely overlap), $ref to "#", "#/$defs/..." or
// "#/definitions/..."; for strings minLength and maxLength (characters,
// as JSON Schema counts them), pattern (a regular expression of the
// subset pattern.go names) or format (date, time, date-time, uuid,
// email, ipv4, hostname, uri: see formats); for numbers minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (a bounded number is written
// without an exponent) and, for integers, multipleOf. Annotations
// (title, description, default, examples, ...) are ignored; any other
// keyword is refused by name rather than left unchecked.
//
// Properties come in the order the schema declares them; an optional one
// may be left out, a required one may not. An object takes properties
// beyond those declared only where additionalProperties says so (true or
// a schema): a schema written for output means the properties it lists.
func FromSchema(schema json.RawMessage) (*Node, error) {
	return NewCompiler(DefaultLimits).Schema(schema)
}

// Limits bound what schemas may cost: a schema past one is refused, the
// limit named, as the compiler meets it, before the grammar runs.
type Limits struct {
	Depth        int // objects and arrays nested in one another, in the schema's text (a definition's from its start)
	Properties   int // properties declared, in all
	Alternatives int // anyOf and oneOf branches, enum values and listed types, in all
	Text         int // bytes of property names and of enum and const values, in all
	Nodes        int // the grammar's nodes, in all
	Bytes        int // one schema's text, in all (descriptions too)
}

// DefaultLimits are OpenAI's for a strict schema (10 levels of nesting,
// 5,000 properties, 1,000 enum values, 15,000 characters of names and
// values), a grammar of at most 50,000 nodes (each property is
// three), and a schema of at most 1 MiB (refused before it is read).
var DefaultLimits = Limits{Depth: 10, Properties: 5000, Alternatives: 1000, Text: 15000, Nodes: 50000, Bytes: 1 << 20}

// Compiler compiles schemas within one set of Limits, counted across
// every schema it compiles (a request's tools share them).
type Compiler struct {
	limits Limits
	used   Limits
	dfas   map[string]*dfa // the patterns' automata built, by source
}

// NewCompiler returns a compiler within limits.
func NewCompiler(limits Limits) *Compiler { return &Compiler{limits: limits} }

// Schema compiles one JSON Schema (see FromSchema).
func (cc *Compiler) Schema(schema json.RawMessage) (*Node, error) {
	if len(schema) > cc.limits.Bytes {
		return nil, fmt.Errorf("#: a schema of %d bytes, more than %d (a limit of the server's)", len(schema), cc.limits.Bytes)
	}
	v, err := parseValue(schema)
	if err != nil {
		return nil, fmt.Errorf("#: %v", err)
	}
	c := &compiler{Compiler: cc, root: v, refs: map[string]*Node{}, paths: map[*Node]string{}}
	n, err := c.compile(v, "#", 0)
	if err != nil {
		return nil, err
	}
	if bad, _, err := check(n); err != nil {
		if path, ok := c.paths[bad]; ok {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		return nil, err
	}
	return n, nil
}

type compiler struct {
	*Compiler
	root *value
	refs map[string]*Node
	// paths names the choices and references made, for check's refusals
	paths map[*Node]string
}

// count adds n to what one limit has used, refusing past it.
func (c *compiler) count(used *int, n int, limit int, what, path string) error {
	*used += n
	if *used > limit {
		return fmt.Errorf("%s: more than %d %s (a limit of the server's)", path, limit, what)
	}
	return nil
}

// node counts a node made.
func (c *compiler) node(n *Node, path string) (*Node, error) {
	return n, c.count(&c.used.Nodes, 1, c.limits.Nodes, "grammar nodes", path)
}

// annotations change nothing a document may be.
var annotations = []string{"title", "description", "default", "examples", "$schema", "$id", "$comment",
	"deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict", "name"}

// keywords this compiler acts on.
var keywords = []string{"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
	"enum", "const", "anyOf", "oneOf", "$ref", "minLength", "maxLength", "pattern", "format",
	"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}

// stringKeywords and numberKeywords say, without a type, a string or a
// number.
var (
	stringKeywords = []string{"minLength", "maxLength", "pattern", "format"}
	numberKeywords = []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
)

// compile compiles the schema v at path, depth objects and arrays deep.
func (c *compiler) compile(v *value, path string, depth int) (*Node, error) {
	switch v.kind {
	case vBool:
		if v.text == "false" {
			return nil, fmt.Errorf("%s: the schema false accepts nothing", path)
		}
		return c.anyValue(path)
	case vObject:
	default:
		return nil, fmt.Errorf("%s: a schema must be an object or a boolean, not %s", path, v.typeName())
	}
	keys, fields := v.keys, make(map[string]*value, len(v.keys)) // a schema's keywords: a few
	for i, k := range keys {
		fields[k] = v.vals[i]
	}
	if len(keys) == 0 {
		return c.anyValue(path)
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
		lit := v.canonical()
		if err := c.count(&c.used.Text, len(lit), c.limits.Text, "bytes of property names, enum and const values", path+"/const"); err != nil {
			return nil, err
		}
		if err := matchesType(fields, v); err != nil {
			return nil, fmt.Errorf("%s/const: %s %v", path, lit, err)
		}
		return c.node(Literal(lit), path)
	}
	if v, ok := fields["enum"]; ok {
		if v.kind != vArray || len(v.items) == 0 {
			return nil, fmt.Errorf("%s/enum: must be a non-empty array", path)
		}
		if err := c.count(&c.used.Alternatives, len(v.items), c.limits.Alternatives, "alternatives (anyOf and oneOf branches, enum values, types listed)", path+"/enum"); err != nil {
			return nil, err
		}
		var lits []string
		for _, v := range v.items {
			lit := v.canonical()
			if err := c.count(&c.used.Text, len(lit), c.limits.Text, "bytes of property names, enum and const values", path+"/enum"); err != nil {
				return nil, err
			}
			if err := matchesType(fields, v); err != nil {
				return nil, fmt.Errorf("%s/enum: %s %v", path, lit, err)
			}
			lits = append(lits, lit)
		}
		return c.node(Literals(lits...), path)
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if v, ok := fields[k]; ok {
			if v.kind != vArray || len(v.items) == 0 {
				return nil, fmt.Errorf("%s/%s: must be a non-empty array of schemas", path, k)
			}
			if err := c.count(&c.used.Alternatives, len(v.items), c.limits.Alternatives, "alternatives (anyOf and oneOf branches, enum values, types listed)", path+"/"+k); err != nil {
				return nil, err
			}
			var alts []*Node
			for i, s := range v.items {
				n, err := c.compile(s, fmt.Sprintf("%s/%s/%d", path, k, i), depth)
				if err != nil {
					return nil, err
				}
				alts = append(alts, n)
			}
			return c.choice(alts, path+"/"+k)
		}
	}
	types, err := typesOf(fields, path)
	if err != nil {
		return nil, err
	}
	if len(types) > 1 {
		if err := c.count(&c.used.Alternatives, len(types), c.limits.Alternatives, "alternatives (anyOf and oneOf branches, enum values, types listed)", path+"/type"); err != nil {
			return nil, err
		}
	}
	var alts []*Node
	for _, t := range types {
		n, err := c.typed(t, fields, path, depth)
		if err != nil {
			return nil, err
		}
		alts = append(alts, n)
	}
	return c.choice(alts, path+"/type")
}

// choice is one of alts, named by path for check's refusals.
func (c *compiler) choice(alts []*Node, path string) (*Node, error) {
	if len(alts) == 1 {
		return alts[0], nil
	}
	n, err := c.node(OneOf(alts...), path)
	c.paths[n] = path
	return n, err
}

// anyValue is any JSON value: its nodes counted.
func (c *compiler) anyValue(path string) (*Node, error) {
	return anyValue(), c.count(&c.used.Nodes, anyValueNodes, c.limits.Nodes, "grammar nodes", path)
}

// matchesType checks a const or enum value against the schema's type,
// if it has one.
func matchesType(fields map[string]*value, v *value) error {
	if _, ok := fields["type"]; !ok {
		return nil
	}
	types, err := typesOf(fields, "")
	if err != nil {
		return err
	}
	is := v.typeName()
	if slices.Contains(types, is) || is == "integer" && slices.Contains(types, "number") {
		return nil
	}
	return fmt.Errorf("is not of the type %v", types)
}

// typesOf reads "type", or infers it from the keywords present.
func typesOf(fields map[string]*value, path string) ([]string, error) {
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
		case has(stringKeywords...) && has(numberKeywords...):
			return nil, fmt.Errorf("%s: string and number keywords without a type", path)
		case has(stringKeywords...):
			return []string{"string"}, nil
		case has(numberKeywords...):
			return []string{"number"}, nil
		}
		return []string{"any"}, nil
	}
	if v.kind == vString {
		return []string{v.text}, nil
	}
	var many []string
	for _, t := range v.items {
		if t.kind != vString {
			break
		}
		many = append(many, t.text)
	}
	if v.kind != vArray || len(many) == 0 || len(many) != len(v.items) {
		return nil, fmt.Errorf("%s/type: must be a type name or a non-empty list of them", path)
	}
	return many, nil
}

func (c *compiler) typed(t string, fields map[string]*value, path string, depth int) (*Node, error) {
	switch t {
	case "any":
		return c.anyValue(path)
	case "string":
		n, err := c.stringOf(fields, path)
		if err != nil {
			return nil, err
		}
		return c.node(n, path)
	case "number", "integer":
		n := numberNode(t == "integer")
		var err error
		if n.bounds, err = numberBounds(fields, t == "integer", path); err != nil {
			return nil, err
		}
		if _, ok := fields["multipleOf"]; ok && t == "number" {
			return nil, fmt.Errorf("%s/multipleOf: only a positive integer multipleOf of an integer is supported", path)
		}
		return c.node(n, path)
	case "boolean":
		return c.node(OneOf(Literal("true"), Literal("false")), path)
	case "null":
		return c.node(Literal("null"), path)
	case "object", "array":
		if depth+1 > c.limits.Depth {
			return nil, fmt.Errorf("%s: objects and arrays nested more than %d deep (a limit of the server's)", path, c.limits.Depth)
		}
		if t == "object" {
			return c.object(fields, path, depth+1)
		}
		return c.array(fields, path, depth+1)
	}
	return nil, fmt.Errorf("%s/type: unknown type %q", path, t)
}

func (c *compiler) object(fields map[string]*value, path string, depth int) (*Node, error) {
	n, err := c.node(&Node{kind: kObject}, path)
	if err != nil {
		return nil, err
	}
	c.paths[n] = path
	var required []string
	isRequired := map[string]bool{}
	if v, ok := fields["required"]; ok {
		for _, r := range v.items {
			if r.kind == vString {
				required = append(required, r.text)
				isRequired[r.text] = true
			}
		}
		if v.kind != vArray || len(required) != len(v.items) {
			return nil, fmt.Errorf("%s/required: must be an array of names", path)
		}
	}
	if v, ok := fields["properties"]; ok {
		if v.kind != vObject {
			return nil, fmt.Errorf("%s/properties: not a JSON object", path)
		}
		if err := c.count(&c.used.Properties, len(v.keys), c.limits.Properties, "properties", path+"/properties"); err != nil {
			return nil, err
		}
		for i, name := range v.keys {
			at := path + "/properties/" + name
			if err := c.count(&c.used.Text, len(name), c.limits.Text, "bytes of property names, enum and const values", at); err != nil {
				return nil, err
			}
			value, err := c.compile(v.vals[i], at, depth)
			if err != nil {
				return nil, err
			}
			key, err := c.node(Literal(jsonString(name)+":"), at)
			if err != nil {
				return nil, err
			}
			n.props = append(n.props, property{name: name, key: key, value: value, required: isRequired[name]})
		}
	}
	declared := map[string]bool{}
	for _, p := range n.props {
		declared[p.name] = true
	}
	for _, r := range required {
		if !declared[r] {
			return nil, fmt.Errorf("%s/required: %q is required but not among the properties", path, r)
		}
	}
	if v, ok := fields["additionalProperties"]; ok && !(v.kind == vBool && v.text == "false") {
		if len(n.props) > 0 {
			// an extra key could repeat a declared one with a value of
			// its own, which the client would read instead
			return nil, fmt.Errorf("%s/additionalProperties: other properties beside the declared ones are not supported (declare them, or set it false)", path)
		}
		if n.extra, err = c.compile(v, path+"/additionalProperties", depth); err != nil {
			return nil, err
		}
	} else if !ok && len(n.props) == 0 {
		if n.extra, err = c.anyValue(path); err != nil { // {"type": "object"} alone: any object
			return nil, err
		}
	}
	return n, nil
}

func (c *compiler) array(fields map[string]*value, path string, depth int) (*Node, error) {
	n, err := c.node(&Node{kind: kArray, maxItems: -1}, path)
	if err != nil {
		return nil, err
	}
	c.paths[n] = path
	if v, ok := fields["items"]; ok {
		if n.items, err = c.compile(v, path+"/items", depth); err != nil {
			return nil, err
		}
	} else if n.items, err = c.anyValue(path); err != nil {
		return nil, err
	}
	for _, b := range []struct {
		name string
		to   *int
	}{{"minItems", &n.minItems}, {"maxItems", &n.maxItems}} {
		if v, ok := fields[b.name]; ok {
			count, err := strconv.Atoi(v.text)
			if v.kind != vNumber || err != nil || count < 0 {
				return nil, fmt.Errorf("%s/%s: must be a non-negative integer", path, b.name)
			}
			*b.to = count
		}
	}
	if n.maxItems >= 0 && n.maxItems < n.minItems {
		return nil, fmt.Errorf("%s: maxItems %d is below minItems %d", path, n.maxItems, n.minItems)
	}
	return n, nil
}

// stringOf is a string node with the schema's minLength, maxLength,
// and pattern or format. A pattern's automaton is built once per
// compiler (a format's once per process) and costs grammar nodes: its
// NFA's states and its own.
func (c *compiler) stringOf(fields map[string]*value, path string) (*Node, error) {
	n := stringNode()
	for _, b := range []struct {
		name string
		to   *int
	}{{"minLength", &n.minItems}, {"maxLength", &n.maxItems}} {
		if v, ok := fields[b.name]; ok {
			count, err := strconv.Atoi(v.text)
			if v.kind != vNumber || err != nil || count < 0 || count > maxStringLength {
				return nil, fmt.Errorf("%s/%s: must be an integer from 0 to %d", path, b.name, maxStringLength)
			}
			*b.to = count
		}
	}
	if n.maxItems >= 0 && n.maxItems < n.minItems {
		return nil, fmt.Errorf("%s: maxLength %d is below minLength %d", path, n.maxItems, n.minItems)
	}
	p, hasPattern := fields["pattern"]
	f, hasFormat := fields["format"]
	switch {
	case hasPattern && hasFormat:
		return nil, fmt.Errorf("%s: pattern beside format is not supported (one of them)", path)
	case hasPattern && p.kind == vString && p.text == "":
		// the empty pattern matches every string: a plain one
	case hasPattern:
		if p.kind != vString {
			return nil, fmt.Errorf("%s/pattern: must be a string", path)
		}
		d, err := c.patternDFA(p.text, path+"/pattern", compileDFA)
		if err != nil {
			return nil, err
		}
		n.pattern = &pattern{dfa: d}
	case hasFormat:
		src, ok := formats[f.text]
		if f.kind != vString || !ok {
			return nil, fmt.Errorf("%s/format: %s is not supported (supported: %s)", path, f.canonical(), strings.Join(formatNames(), ", "))
		}
		d, err := c.patternDFA(src, path+"/format", formatDFA)
		if err != nil {
			return nil, err
		}
		n.pattern = &pattern{dfa: d}
		if most, ok := formatLengths[f.text]; ok && (n.maxItems < 0 || n.maxItems > most) {
			n.maxItems = most
		}
	}
	if n.pattern != nil {
		if !n.pattern.lengthen(n.minItems, n.maxItems) {
			return nil, fmt.Errorf("%s: no string of %d to %d characters matches its pattern or format", path, n.minItems, n.maxItems)
		}
		// its lengths' table: a bit a state and a length
		if err := c.count(&c.used.Nodes, len(n.pattern.trans)*(n.pattern.limit/64+1)/16, c.limits.Nodes, "grammar nodes", path); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// patternDFA is src's automaton, built by build once per compiler, its
// cost counted then.
func (c *compiler) patternDFA(src, path string, build func(string) (*dfa, error)) (*dfa, error) {
	if d, ok := c.dfas[src]; ok {
		return d, nil
	}
	// what building it may cost, at most, before it is built
	if c.used.Nodes+len(src) > c.limits.Nodes {
		return nil, fmt.Errorf("%s: more than %d grammar nodes (a limit of the server's)", path, c.limits.Nodes)
	}
	d, err := build(src)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if err := c.count(&c.used.Nodes, d.cost(), c.limits.Nodes, "grammar nodes", path); err != nil {
		return nil, err
	}
	if c.dfas == nil {
		c.dfas = map[string]*dfa{}
	}
	c.dfas[src] = d
	return d, nil
}

// maxStringLength bounds minLength and maxLength: each character counted
// is a state of the grammar (and a bit of each pattern state's lengths).
const maxStringLength = 4096

// formatNames are the formats a schema may name, sorted.
func formatNames() []string { return slices.Sorted(maps.Keys(formats)) }

// ref resolves a local reference, once: a recursive schema becomes a
// cycle in the graph, and a definition referred to from many places is
// compiled once.
func (c *compiler) ref(raw *value, path string) (*Node, error) {
	if raw.kind != vString {
		return nil, fmt.Errorf("%s/$ref: must be a string", path)
	}
	ref := raw.text
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
		if target.kind != vObject || target.field(part) == nil {
			return nil, fmt.Errorf("%s/$ref: %q does not resolve", path, ref)
		}
		target = target.field(part)
	}
	// a placeholder first, filled once compiled, so that references to
	// ref inside it close the cycle
	n, err := c.node(&Node{kind: kSeq}, path)
	if err != nil {
		return nil, err
	}
	c.refs[ref], c.paths[n] = n, ref
	inner, err := c.compile(target, ref, 0) // a definition's nesting counts from its own start
	if err != nil {
		return nil, err
	}
	n.alts = []*Node{inner}
	return n, nil
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
