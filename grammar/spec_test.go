package grammar

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// A grammar read back from its Spec is the same grammar: along random
// generations the two give the same masks, token after token, to the
// end, recursive schemas ($ref, any JSON value) and literal text around
// JSON (a tool call's template) included; its Spec is the same bytes.
func TestSpecReadsBackTheSameGrammar(t *testing.T) {
	_, v := trainedVocabulary(t)
	eos := v.eos[0]
	rng := rand.New(rand.NewPCG(5, 6))
	tree := `{"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}}, "$ref": "#/$defs/node"}`
	roots := map[string]*Node{"person": mustSchema(t, personSchema).root, "any object": AnyObject(), "tree": mustSchema(t, tree).root,
		"tool call": Seq(Literal("<tool_call>\n"), OneOrMore(mustSchema(t, personSchema).root, ", "), Literal("\n</tool_call>")),
		"keywords":  mustSchema(t, keywordSchemas["a tool's object"]).root,
		"bounds":    mustSchema(t, `{"type": "array", "items": {"anyOf": [{"type": "integer", "exclusiveMinimum": -3, "maximum": 40, "multipleOf": 3}, {"type": "number", "minimum": 0.5, "exclusiveMaximum": 2}]}, "maxItems": 4}`).root,
		"pattern":   mustSchema(t, `{"type": "array", "items": {"type": "string", "pattern": "^[a-c]{1,3}(-\\d)?$", "minLength": 2}, "maxItems": 5}`).root}
	for name, root := range roots {
		g := mustNew(t, root)
		b, err := g.Spec()
		if err != nil {
			t.Fatal(err)
		}
		back, err := FromSpec(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if again, _ := back.Spec(); !bytes.Equal(again, b) {
			t.Fatalf("%s: the spec read back writes %d other bytes", name, len(again))
		}
		cache := NewMaskCache(64 << 20) // one cache: the two grammars' states must not share masks
		a, err := For(g, v, cache).New()
		if err != nil {
			t.Fatal(err)
		}
		c, err := For(back, v, cache).New()
		if err != nil {
			t.Fatal(err)
		}
		for step := 0; step < 400; step++ {
			ma, err1 := a.Allowed()
			mc, err2 := c.Allowed()
			if err1 != nil || err2 != nil || !slices.Equal(ma, mc) {
				t.Fatalf("%s step %d: masks differ (%v, %v)", name, step, err1, err2)
			}
			var ids []int
			for id := range v.size {
				if allowed(ma, id) {
					ids = append(ids, id)
				}
			}
			if len(ids) == 0 {
				t.Fatalf("%s step %d: no token allowed", name, step)
			}
			id := ids[rng.IntN(len(ids))]
			if slices.Contains(ids, eos) && rng.IntN(3) == 0 {
				id = eos
			}
			if err := a.Accept(id); err != nil {
				t.Fatal(err)
			}
			if err := c.Accept(id); err != nil {
				t.Fatalf("%s step %d: the spec's grammar refused token %d: %v", name, step, id, err)
			}
			if id == eos {
				break
			}
		}
	}
}

func TestFromSpecNamesWhatIsMalformed(t *testing.T) {
	for spec, says := range map[string]string{
		`{"v":2,"nodes":[{"k":0,"x":-1,"i":-1}]}`:                                 "version 2",
		`{"v":3,"nodes":[]}`:                                                      "0 nodes",
		`{"v":3,"nodes":[{"k":77,"x":-1,"i":-1}]}`:                                "unknown kind 77",
		`{"v":3,"nodes":[{"k":6,"x":-1,"i":-1,"a":[3]}]}`:                         "node 0's part is node 3, of 1",
		`{"v":3,"nodes":[{"k":6,"x":-1,"i":-1}]}`:                                 "a choice of no parts",
		`{"v":3,"nodes":[{"k":5,"x":-1,"i":-1}]}`:                                 "node 0's items is node -1",
		`{"v":3,"nodes":[{"k":5,"x":-1,"i":0,"min":3,"max":1}]}`:                  "3 to 1 items",
		`{"v":3,"nodes":[{"k":4,"x":-1,"i":-1,"p":[{"n":"a","key":0,"val":9}]}]}`: "property value is node 9",
		`{"v":3,"nodes":[{"k":10,"x":-1,"i":-1,"ls":["b","a"]}]}`:                 "texts not two or more, sorted, each once",
		`{"v":3,"nodes":[{"k":1,"x":-1,"i":-1,"re":"a(b"}]}`:                      "without ')'",
		`{"v":3,"nodes":[{"k":0,"x":-1,"i":-1,"re":"a"}]}`:                        "a pattern on a node not a string",
		`{"v":3,"nodes":[{"k":3,"x":-1,"i":-1,"b":true,"lo":"x"}]}`:               `a bound "x" is not a number`,
		`{"v":3,"nodes":[{"k":2,"x":-1,"i":-1,"b":true,"mul":"3"}]}`:              "not a positive integer of an integer",
		`[1,2]`: "spec",
	} {
		if _, err := FromSpec([]byte(spec)); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("FromSpec(%s) = %v, want an error saying %q", spec, err, says)
		}
	}
}
