package grammar

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/internal/schematest"
)

// feed runs text through g byte by byte: whether every byte was taken,
// and whether the text is then complete.
func feed(t *testing.T, g *Grammar, text string) (taken, complete bool) {
	t.Helper()
	states, err := g.start()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(text); i++ {
		if states, err = stepAll(states, text[i], nil); err != nil {
			t.Fatal(err)
		}
		if len(states) == 0 {
			return false, false
		}
	}
	c := &Constraint{states: states}
	return true, c.Complete()
}

func mustSchema(t testing.TB, schema string) *Grammar {
	t.Helper()
	n, err := FromSchema(json.RawMessage(schema))
	if err != nil {
		t.Fatal(err)
	}
	return mustNew(t, n)
}

func mustNew(t testing.TB, root *Node) *Grammar {
	t.Helper()
	g, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

const personSchema = `{"type": "object", "properties": {
	"name": {"type": "string"},
	"age": {"type": "integer"},
	"email": {"type": "string"},
	"tags": {"type": "array", "items": {"enum": ["a", "b\"c", 3]}, "minItems": 1, "maxItems": 2},
	"score": {"type": ["number", "null"]},
	"kind": {"const": "person"}},
 "required": ["name", "age", "kind"], "additionalProperties": false}`

func TestGrammarTakesWhatTheSchemaSaysAndNothingElse(t *testing.T) {
	g := mustSchema(t, personSchema)
	cases := []struct {
		text     string
		complete bool
		taken    bool
	}{
		{`{"name":"x","age":3,"kind":"person"}`, true, true},
		{`{"name": "x", "age": -30, "email": "e\u00e9\n", "tags": ["a", 3], "score": 1.5e+3, "kind": "person"}`, true, true},
		{"{\n  \"name\": \"x\",\n  \"age\": 0,\n  \"score\": null,\n  \"kind\": \"person\"\n}", true, true},
		{`{"name":"x","age":3`, false, true},                   // a prefix
		{`{"age":3,"name":"x","kind":"person"}`, false, false}, // out of order
		{`{"name":"x","kind":"person"}`, false, false},         // age is required
		{`{"name":"x","age":3,"kind":"person","x":1}`, false, false},
		{`{"name":"x","age":3.5`, false, false},                               // an integer
		{`{"name":"x","age":03`, false, false},                                // a leading zero
		{`{"name":"x","age":3,"tags":[],"kind":"person"}`, false, false},      // minItems
		{`{"name":"x","age":3,"tags":["a","a","a"]`, false, false},            // maxItems
		{`{"name":"x","age":3,"tags":["b\"c"],"kind":"person"}`, true, true},  // enum with an escape
		{`{"name":"x","age":3,"kind":"persona"`, false, false},                // const
		{`{"name":"x\q"`, false, false},                                       // bad escape
		{"{\"name\":\"a\tb\"", false, false},                                  // a raw control byte
		{`{"name":"x","age":3,"score":1.,"kind":"person"}`, false, false},     // 1.
		{`{"name":"x","age":3,"score":-,"kind":"person"}`, false, false},      // -
		{`{"name":"x","age":3,"score":1e5,"kind":"person"}`, true, true},      // exponent
		{` {"name":"x"`, false, false},                                        // space before the value
		{`{"name":"x","age":3,"kind":"person"} `, false, false},               // space after it
		{`{` + strings.Repeat(" ", maxSpace) + `"name"`, true && false, true}, // the most whitespace
		{`{` + strings.Repeat(" ", maxSpace+1) + `"name"`, false, false},      // more
		{`{"name":"x","age":12345678901234567`, false, false},                 // 17 digits
	}
	for _, tc := range cases {
		taken, complete := feed(t, g, tc.text)
		if taken != tc.taken || complete != tc.complete {
			t.Errorf("%s: taken %v complete %v, want %v %v", tc.text, taken, complete, tc.taken, tc.complete)
		}
	}
}

func TestAnyObjectTakesJSONObjectsAsEncodersWriteThem(t *testing.T) {
	g := mustNew(t, AnyObject())
	docs := []any{
		map[string]any{},
		map[string]any{"a": []any{1.5, "x", nil, true, false, map[string]any{"b": []any{}}}},
		map[string]any{"deep": map[string]any{"er": map[string]any{"est": -0.25e-7}}},
		map[string]any{"s": "quote \" back \\ slash / tab \t nl \n uni é ☃"},
	}
	for _, d := range docs {
		compact, _ := json.Marshal(d)
		indented, _ := json.MarshalIndent(d, "", "  ")
		for _, text := range []string{string(compact), string(indented)} {
			if taken, complete := feed(t, g, text); !taken || !complete {
				t.Errorf("%s: taken %v complete %v", text, taken, complete)
			}
		}
	}
	for _, text := range []string{`[1]`, `"s"`, `3`, `{"a":}`, `{"a" 1}`, `{,}`, `{"a":1,}`, `{"a":[1,]}`, `{"a":tru}`, `{"a":01}`} {
		if _, complete := feed(t, g, text); complete {
			t.Errorf("%s: complete", text)
		}
	}
}

// generate walks g at random, one byte at a time, among the bytes it
// can take (closing bytes favoured so that texts end), and returns a
// complete text, or "" if none came within 600 bytes.
func generate(t *testing.T, rng *rand.Rand, g *Grammar) string {
	states, err := g.start()
	if err != nil {
		t.Fatal(err)
	}
	var text []byte
	for len(text) < 600 {
		if (&Constraint{states: states}).Complete() && rng.IntN(4) == 0 {
			return string(text)
		}
		type option struct {
			c      byte
			states []*frame
		}
		var opts []option
		weight := 0
		for c := byte(0x09); c < 0x7f; c++ {
			next, err := stepAll(states, c, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(next) > 0 {
				opts = append(opts, option{c, next})
				weight += weightOf(c, len(text))
			}
		}
		if len(opts) == 0 {
			if (&Constraint{states: states}).Complete() {
				return string(text)
			}
			t.Fatalf("a dead end after %q", text)
		}
		r := rng.IntN(weight)
		for _, o := range opts {
			if r -= weightOf(o.c, len(text)); r < 0 {
				text, states = append(text, o.c), o.states
				break
			}
		}
	}
	return ""
}

func weightOf(c byte, at int) int {
	if strings.IndexByte(`"}]`, c) >= 0 {
		return 20 + at
	}
	if strings.IndexByte("0123456789,:", c) >= 0 {
		return 10
	}
	return 1
}

// TestEveryTextTheGrammarWritesIsValidForTheSchema walks grammars at
// random and checks each complete text with encoding/json and an
// independent JSON Schema validator (santhosh-tekuri/jsonschema).
func TestEveryTextTheGrammarWritesIsValidForTheSchema(t *testing.T) {
	schemas := map[string]string{
		"person": personSchema,
		"tree": `{"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
			"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}},
			"$ref": "#/$defs/node"}`,
		"union":  `{"anyOf": [{"type": "string"}, {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}, {"type": "array", "items": {"type": "boolean"}}]}`,
		"extras": `{"type": "object", "additionalProperties": {"type": "string"}}`,
		"enum":   `{"type": "array", "items": {"enum": [` + manyValues(200) + `]}, "maxItems": 3}`,
		"object": `{"type": "object"}`,
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for name, schema := range schemas {
		validator := schematest.Compile(t, []byte(schema))
		g := mustSchema(t, schema)
		texts := 0
		for range 300 {
			text := generate(t, rng, g)
			if text == "" {
				continue
			}
			texts++
			if !json.Valid([]byte(text)) {
				t.Fatalf("%s: the grammar wrote invalid JSON %s", name, text)
			}
			if err := schematest.Validate(validator, text); err != nil {
				t.Fatalf("%s: the grammar wrote %s, which the schema refuses: %v", name, text, err)
			}
		}
		if texts < 150 {
			t.Fatalf("%s: only %d of 300 walks ended", name, texts)
		}
	}
}

func TestSchemasItCannotKeepAreRefusedByName(t *testing.T) {
	for schema, want := range map[string]string{
		`{"type": "string", "pattern": "^a"}`:                     `"pattern"`,
		`{"type": "string", "format": "date"}`:                    `"format"`,
		`{"type": "object", "properties": {"a": {"minimum": 1}}}`: `#/properties/a: the schema keyword "minimum"`,
		`{"type": "object", "required": ["b"]}`:                   `"b" is required but not among the properties`,
		`{"$ref": "https://example.com/s.json"}`:                  "only references inside the schema",
		`{"$ref": "#/$defs/missing"}`:                             "does not resolve",
		`{"type": "strin"}`:                                       `unknown type "strin"`,
		`false`:                                                   "accepts nothing",
		`[1]`:                                                     "must be an object or a boolean",
	} {
		_, err := FromSchema(json.RawMessage(schema))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to say %s", schema, err, want)
		}
	}
}

// manyValues is n distinct string values, as a JSON list's insides.
func manyValues(n int) string {
	vs := make([]string, n)
	for i := range vs {
		vs[i] = fmt.Sprintf(`"v%d"`, i)
	}
	return strings.Join(vs, ", ")
}

// TestKeywordsWithoutATypeStillConstrain: required alone means an object
// and minItems/maxItems alone an array, not any value.
func TestKeywordsWithoutATypeStillConstrain(t *testing.T) {
	for schema, texts := range map[string]map[string]bool{
		`{"maxItems": 1}`: {`[1]`: true, `[1,2]`: false, `{}`: false},
		`{"required": ["a"], "properties": {"a": {"type": "integer"}}}`: {`{"a":1}`: true, `{}`: false, `[]`: false},
		`{"type": "integer", "enum": [1, 2]}`:                           {`1`: true, `3`: false},
	} {
		g := mustSchema(t, schema)
		for text, want := range texts {
			if _, complete := feed(t, g, text); complete != want {
				t.Errorf("%s: %s complete %v, want %v", schema, text, complete, want)
			}
		}
	}
}
