// Package schematest checks JSON texts against JSON Schemas with
// santhosh-tekuri/jsonschema, a validator independent of odmoe's grammar
// package, for the tests of structured output.
package schematest

import (
	"bytes"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Compile returns schema's validator, failing t if it does not compile.
// It asserts formats (date, email, ...), as odmoe's grammars keep them.
func Compile(t testing.TB, schema []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat() // "format" checked, not an annotation alone
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	v, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Validate reports why text is not JSON that v accepts, or nil.
func Validate(v *jsonschema.Schema, text string) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(text)))
	if err != nil {
		return err
	}
	return v.Validate(doc)
}
