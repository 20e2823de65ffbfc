package grammar

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
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
	return generateOf(t, rng, g, asciiUnits, 600)
}

// asciiUnits are the bytes generate writes: tab to '~'.
var asciiUnits = func() []string {
	var us []string
	for c := byte(0x09); c < 0x7f; c++ {
		us = append(us, string(c))
	}
	return us
}()

// generateOf walks g at random, each step one of units that g takes
// whole (closing bytes favoured), and returns a complete text, or "" if
// none came within limit bytes.
func generateOf(t *testing.T, rng *rand.Rand, g *Grammar, units []string, limit int) string {
	states, err := g.start()
	if err != nil {
		t.Fatal(err)
	}
	var text []byte
	for len(text) < limit {
		if (&Constraint{states: states}).Complete() && rng.IntN(4) == 0 {
			return string(text)
		}
		type option struct {
			u      string
			states []*frame
		}
		var opts []option
		weight := 0
		for _, u := range units {
			next := states
			for i := 0; i < len(u) && len(next) > 0; i++ {
				if next, err = stepAll(next, u[i], nil); err != nil {
					t.Fatal(err)
				}
			}
			if len(next) > 0 {
				opts = append(opts, option{u, next})
				weight += weightOf(u[0], len(text))
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
			if r -= weightOf(o.u[0], len(text)); r < 0 {
				text, states = append(text, o.u...), o.states
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
		`{"type": "string", "pattern": "^(?=a)"}`:                                            `lookaround and named groups are not supported`,
		`{"type": "string", "pattern": "(a)\\1"}`:                                            `the escape \1 is not supported`,
		`{"type": "string", "pattern": "a{1,100}"}`:                                          `past 64`,
		`{"type": "string", "pattern": "\""}`:                                                `written escaped in a JSON string`,
		`{"type": "string", "format": "color"}`:                                              `#/format: "color" is not supported (supported: date, date-time, email, hostname, ipv4, time, uri, uuid)`,
		`{"type": "string", "pattern": "a", "format": "date"}`:                               `pattern beside format`,
		`{"type": "string", "minLength": 3, "maxLength": 2}`:                                 `maxLength 2 is below minLength 3`,
		`{"type": "number", "minimum": 2, "maximum": 1}`:                                     `no number is within its bounds`,
		`{"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}`:                  `no number is within its bounds`,
		`{"type": "number", "multipleOf": 0.5}`:                                              `only a positive integer multipleOf of an integer`,
		`{"type": "object", "properties": {"a": {"minimum": "x"}}}`:                          `#/properties/a/minimum: must be a number`,
		`{"minimum": 1, "maxLength": 3}`:                                                     `string and number keywords without a type`,
		`{"type": "string", "pattern": "^a{+2}$"}`:                                           `want {n}, {n,} or {n,m} of digits`,
		`{"type": "string", "pattern": "^[a-\\d]$"}`:                                         `cannot end a range`,
		`{"type": "number", "minimum": 0.00000000000000001, "maximum": 0.00000000000000009}`: `no number is within its bounds`,
		`{"type": "string", "pattern": "^(?:[a-z]{0,64}){1,64}$"}`:                           `more than 4096 automaton states`,
		`{"type": "string", "pattern": "^(a|b)*a(a|b){12}$"}`:                                `more than 512 automaton states`,
		`{"type": "object", "required": ["b"]}`:                                              `"b" is required but not among the properties`,
		`{"$ref": "https://example.com/s.json"}`:                                             "only references inside the schema",
		`{"$ref": "#/$defs/missing"}`:                                                        "does not resolve",
		`{"type": "strin"}`:                                                                  `unknown type "strin"`,
		`false`:                                                                              "accepts nothing",
		`[1]`:                                                                                "must be an object or a boolean",
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

// keywordSchemas use each string and number keyword the grammar keeps:
// lengths, patterns, formats, bounds and multipleOf.
var keywordSchemas = map[string]string{
	"length 3-5":        `{"type": "string", "minLength": 3, "maxLength": 5}`,
	"length 0":          `{"type": "string", "maxLength": 0}`,
	"length 4+":         `{"type": "string", "minLength": 4}`,
	"pattern anchored":  `{"type": "string", "pattern": "^[a-z]{2,4}-\\d+$"}`,
	"pattern loose":     `{"type": "string", "pattern": "ab|cd", "maxLength": 9}`,
	"pattern dotted":    `{"type": "string", "pattern": "^(?:\\w+\\.)*\\w+$", "maxLength": 12}`,
	"pattern negated":   `{"type": "string", "pattern": "^[^aeiou]{3}$"}`,
	"pattern any two":   `{"type": "string", "pattern": "^.{2}$"}`,
	"date":              `{"type": "string", "format": "date"}`,
	"time":              `{"type": "string", "format": "time"}`,
	"date-time":         `{"type": "string", "format": "date-time"}`,
	"uuid":              `{"type": "string", "format": "uuid"}`,
	"email":             `{"type": "string", "format": "email", "maxLength": 40}`,
	"ipv4":              `{"type": "string", "format": "ipv4"}`,
	"email, any length": `{"type": "string", "format": "email"}`,
	"uri, any length":   `{"type": "string", "format": "uri"}`,
	"host, any length":  `{"type": "string", "format": "hostname"}`,
	"pattern per alt":   `{"type": "string", "pattern": "^a+|b$", "maxLength": 12}`,
	"hostname":          `{"type": "string", "format": "hostname", "maxLength": 30}`,
	"uri":               `{"type": "string", "format": "uri", "maxLength": 30}`,
	"integer -5..12":    `{"type": "integer", "minimum": -5, "maximum": 12}`,
	"integer (100,110)": `{"type": "integer", "exclusiveMinimum": 100, "exclusiveMaximum": 110}`,
	"integer 7k":        `{"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 7}`,
	"integer <= -3":     `{"minimum": -20, "maximum": -3, "type": "integer"}`,
	"number 0..1":       `{"type": "number", "minimum": 0, "maximum": 1}`,
	"number (-0.5,.25)": `{"type": "number", "exclusiveMinimum": -0.5, "exclusiveMaximum": 0.25}`,
	"number >= 1.5":     `{"type": "number", "minimum": 1.5}`,
	"a tool's object": `{"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 8},
		"age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string", "format": "email", "maxLength": 24},
		"when": {"type": "string", "format": "date-time"}}, "required": ["name", "age", "email"], "additionalProperties": false}`,
}

// distinctTexts are the schemas of keywordSchemas with fewer than five
// texts: their number (JSON's escapes left out).
var distinctTexts = map[string]int{"length 0": 1}

func init() {
	for name := range keywordSchemas {
		if _, ok := distinctTexts[name]; !ok {
			distinctTexts[name] = 5
		}
	}
}

// units are what the keyword walks write at a step: printable ASCII
// bytes, and characters of two, three and four UTF-8 bytes.
var units = func() []string {
	var us []string
	for c := byte(0x20); c < 0x7f; c++ {
		us = append(us, string(c))
	}
	return append(us, "é", "☃", "😀")
}()

// TestEveryTextTheKeywordsAllowIsValid walks the grammars of
// keywordSchemas at random, whole characters at a time (non-ASCII ones
// too), and checks each complete text with the independent validator,
// formats asserted; and it checks that the walks reach the edges (each
// bound's value, the longest and shortest strings) rather than staying
// safe in the middle.
func TestEveryTextTheKeywordsAllowIsValid(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for name, schema := range keywordSchemas {
		validator := schematest.Compile(t, []byte(schema))
		g := mustSchema(t, schema)
		seen := map[string]bool{}
		for range 120 {
			text := generateOf(t, rng, g, units, 400)
			if text == "" {
				continue
			}
			seen[text] = true
			if !json.Valid([]byte(text)) {
				t.Fatalf("%s: the grammar wrote invalid JSON %s", name, text)
			}
			if err := schematest.Validate(validator, text); err != nil {
				t.Fatalf("%s: the grammar wrote %s, which the schema refuses: %v", name, text, err)
			}
		}
		if want := min(5, distinctTexts[name]); len(seen) < want {
			t.Fatalf("%s: only %d distinct texts of 120 walks: %q", name, len(seen), slices.Collect(maps.Keys(seen)))
		}
	}
}

// TestKeywordsTakeWhatTheSchemaAllowsAndNoMore feeds texts on each side
// of each keyword's line: the grammar takes the valid ones whole and
// never completes an invalid one.
func TestKeywordsTakeWhatTheSchemaAllowsAndNoMore(t *testing.T) {
	for name, tc := range map[string]struct {
		schema     string
		valid, not []string
	}{
		"length": {`{"type": "string", "minLength": 2, "maxLength": 3}`,
			[]string{`"ab"`, `"abc"`, `"é☃"`, `"\n\u00e9x"`, `"a😀"`}, []string{`"a"`, `"abcd"`, `"é☃😀a"`, `"\ud83d\ude00"`}},
		"pattern": {`{"type": "string", "pattern": "^[a-c]+-\\d{2}$"}`,
			[]string{`"a-12"`, `"cab-00"`}, []string{`"a-1"`, `"d-12"`, `"a-123"`, `"-12"`, `"a\u002d12"`}},
		"loose pattern": {`{"type": "string", "pattern": "x+y"}`,
			[]string{`"xy"`, `"é xxy ☃"`}, []string{`"x"`, `"yx"`}},
		"anchors per alternative": {`{"type": "string", "pattern": "^a|b$"}`,
			[]string{`"ax"`, `"xb"`, `"a"`}, []string{`"xa"`, `"bx"`}},
		"any character, DEL too": {`{"type": "string", "pattern": "^.$"}`,
			[]string{"\"\x7f\"", `"é"`}, []string{`""`, `"ab"`}},
		"the empty pattern": {`{"type": "string", "pattern": ""}`,
			[]string{`"a\nb"`, `""`}, nil},
		"email's local part": {`{"type": "string", "format": "email"}`,
			[]string{`"` + strings.Repeat("a", 30) + "." + strings.Repeat("b", 16) + "." + strings.Repeat("c", 16) + `@x.io"`},
			[]string{`"` + strings.Repeat("a", 65) + `@example.com"`}},
		"uri": {`{"type": "string", "format": "uri"}`,
			[]string{`"https://example.com:8080/a/b?c=d#e"`, `"urn:isbn:0451450523"`}, []string{`"a://h:x"`, `"a://%41"`, `"a"`}},
		"number bounds finer than its digits": {`{"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.00000000000000025}`,
			[]string{`0.0000000000000001`, `0.0000000000000002`}, []string{`0`, `0.0000000000000003`}},
		"date": {`{"type": "string", "format": "date"}`,
			[]string{`"2024-02-29"`, `"2000-02-29"`, `"2023-12-31"`, `"1999-04-30"`}, []string{`"2023-02-29"`, `"1900-02-29"`, `"2023-04-31"`, `"2023-13-01"`, `"2023-1-01"`}},
		"date-time": {`{"type": "string", "format": "date-time"}`,
			[]string{`"2024-05-06T07:08:09Z"`, `"2024-05-06T23:59:59.123+05:30"`}, []string{`"2024-05-06 07:08:09Z"`, `"2024-05-06T24:00:00Z"`, `"2024-05-06T07:08:09"`}},
		"uuid": {`{"type": "string", "format": "uuid"}`,
			[]string{`"123e4567-e89b-12d3-a456-426614174000"`}, []string{`"123e4567e89b12d3a456426614174000"`, `"123e4567-e89b-12d3-a456-42661417400g"`}},
		"email": {`{"type": "string", "format": "email"}`,
			[]string{`"a.b+c@example.co.uk"`}, []string{`"a@b"`, `"@example.com"`, `"a..b@example.com"`, `"a@-x.com"`}},
		"integer": {`{"type": "integer", "minimum": -5, "exclusiveMaximum": 12}`,
			[]string{`-5`, `0`, `11`, `-0`}, []string{`-6`, `12`, `100`, `1.5`, `1e1`}},
		"multiple": {`{"type": "integer", "minimum": 10, "multipleOf": 7}`,
			[]string{`14`, `700`}, []string{`7`, `15`, `-14`}},
		"number": {`{"type": "number", "exclusiveMinimum": 0, "maximum": 1.5}`,
			[]string{`0.001`, `1.5`, `1`, `0.25`}, []string{`0`, `0.0`, `1.51`, `-0.5`, `2`, `1e0`}},
	} {
		g := mustSchema(t, tc.schema)
		validator := schematest.Compile(t, []byte(tc.schema))
		for _, text := range tc.valid {
			if err := schematest.Validate(validator, text); err != nil {
				t.Fatalf("%s: the test's valid %s is not: %v", name, text, err)
			}
			if taken, complete := feed(t, g, text); !taken || !complete {
				t.Errorf("%s: %s taken %v complete %v, want both", name, text, taken, complete)
			}
		}
		for _, text := range tc.not {
			if _, complete := feed(t, g, text); complete {
				t.Errorf("%s: %s complete, which the schema refuses", name, text)
			}
		}
	}
}
