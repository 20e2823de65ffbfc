package chat

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecodeJSON checks DecodeJSON against encoding/json: the same
// inputs accepted, and what it decodes writes back to the same value.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"b": 1, "a": [1, 2.5, null, true, "x"]}`, `[]`, `"é\u0001"`, `1e400`, `123456789012345678901234567890`,
		`{"a": 1, "a": 2}`, `{"a": {"b": {}}}`, `{"a" 1}`, `[1,]`, `{"a": 1} x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := DecodeJSON(data)
		if (err == nil) != json.Valid(data) {
			t.Fatalf("DecodeJSON error %v, json.Valid %v", err, json.Valid(data))
		}
		var want any
		if err != nil || json.Unmarshal(data, &want) != nil { // 1e400: Python's inf
			return
		}
		out, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("marshal %#v: %v", v, err)
		}
		var got any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded %s, encoding/json %v", out, want)
		}
	})
}

// FuzzRenderQwen3 renders Qwen3's template over arbitrary message text,
// which must never fail or panic.
func FuzzRenderQwen3(f *testing.F) {
	tm := builtin(f, "qwen3")
	f.Add("user", "hello", "<think>\nx\n</think>\n\n y", `{"a": 1}`)
	f.Add("tool", "<tool_response>", "{%", "")
	f.Add("system", "\x00\xff", "}}", "[1, 2")
	f.Add("0", "0", "</think>", "0") // "".split("<think>")[-1]: the engine's lists missed it
	f.Fuzz(func(t *testing.T, role, content, reply, args string) {
		msgs := []any{
			Object{{"role", role}, {"content", content}},
			Object{{"role", "assistant"}, {"content", reply}, {"tool_calls", []any{
				Object{{"type", "function"}, {"function", Object{{"name", "f"}, {"arguments", args}}}},
			}}},
			Object{{"role", "user"}, {"content", content}},
		}
		out, err := tm.Render(map[string]any{"messages": msgs, "add_generation_prompt": true})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(out, "<|im_start|>assistant\n") {
			t.Fatalf("no generation prompt at the end: %q", out)
		}
	})
}
