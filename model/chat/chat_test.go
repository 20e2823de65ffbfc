package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// builtin parses a built-in template with the special tokens of the
// family's tokenizer_config.json.
func builtin(t testing.TB, name string) *Template {
	t.Helper()
	src, ok := Builtin(name)
	if !ok {
		t.Fatalf("no built-in template %q", name)
	}
	tm, err := Parse("templates/"+name+".jinja", "default", src, familyTokens[name])
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// familyTokens are the special tokens of the families' real
// tokenizer_config.json files (null ones left out, as transformers does).
var familyTokens = map[string]map[string]any{
	"qwen3":            {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
	"qwen1.5":          {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
	"mixtral-instruct": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
	"tulu":             {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|padding|>"},
}

// jsonVars decodes a JSON object of template variables, keeping order.
func jsonVars(t testing.TB, js string) map[string]any {
	t.Helper()
	v, err := DecodeJSON([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	obj, ok := v.(Object)
	if !ok {
		t.Fatalf("%s is not an object", js)
	}
	vars := map[string]any{}
	for _, m := range obj {
		vars[m.Key] = m.Value
	}
	return vars
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadConfigReadsEveryForm(t *testing.T) {
	const conv = `{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true}`
	cases := []struct {
		name, config string
		want         string
		names        []string
	}{
		{"string, AddedToken objects, null token", `{"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ messages[0].content }}|{{ add_generation_prompt }}",
			"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false}, "eos_token": "</s>", "unk_token": null}`,
			"<s>|</s>|False|hi|True", []string{"default"}},
		{"list with a default", `{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}], "eos_token": "<|im_end|>"}`,
			"D<|im_end|>", []string{"tool_use", "default"}},
		{"list of one", `{"chat_template": [{"name": "rag", "template": "R"}]}`, "R", []string{"rag"}},
		{"additional special tokens", `{"chat_template": "{{ additional_special_tokens|join(',') }}", "additional_special_tokens": ["<a>", {"content": "<b>"}]}`,
			"<a>,<b>", []string{"default"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokenizer_config.json")
			writeFile(t, path, c.config)
			tm, err := LoadConfig(path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tm.Render(jsonVars(t, conv))
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("rendered %q, want %q", got, c.want)
			}
			if names := tm.Names(); fmt.Sprint(names) != fmt.Sprint(c.names) {
				t.Errorf("Names() = %v, want %v", names, c.names)
			}
		})
	}
}

// TestToolUseTemplateServesToolCalls checks transformers' choice among
// named templates: "tool_use" when tools are given, "default" otherwise,
// and Select for any by name.
func TestToolUseTemplateServesToolCalls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokenizer_config.json")
	writeFile(t, path, `{"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T{{ tools|length }}"}]}`)
	tm, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		vars string
		want string
	}{
		{`{"messages": []}`, "D"},
		{`{"messages": [], "tools": null}`, "D"},
		{`{"messages": [], "tools": [{"type": "function"}]}`, "T1"},
	} {
		if got, err := tm.Render(jsonVars(t, c.vars)); err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.vars, got, err, c.want)
		}
	}
	sel, err := tm.Select("tool_use")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := sel.Render(jsonVars(t, `{"messages": [], "tools": []}`)); got != "T0" {
		t.Errorf("Select(tool_use) rendered %q", got)
	}
	if _, err := tm.Select("rag"); err == nil || !strings.Contains(err.Error(), `"rag"`) {
		t.Errorf("Select(rag): %v", err)
	}
}

func TestLoadReportsWhatIsWrong(t *testing.T) {
	cases := []struct {
		name, config string
		noTemplate   bool
		wantInErr    []string
	}{
		{"no chat_template", `{"eos_token": "</s>"}`, true, []string{"tokenizer_config.json has no chat_template"}},
		{"null chat_template", `{"chat_template": null}`, true, nil},
		{"list without default", `{"chat_template": [{"name": "a", "template": "A"}, {"name": "b", "template": "B"}]}`, false, []string{`no template named "default"`, "a, b"}},
		{"parse error", `{"chat_template": "{% for m in messages %}{{ m }}"}`, false, []string{"tokenizer_config.json", "parsing chat template"}},
		{"not JSON", `{"chat_template": `, false, []string{"tokenizer_config.json"}},
		{"a number", `{"chat_template": 3}`, false, []string{"neither a string nor a list"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokenizer_config.json")
			writeFile(t, path, c.config)
			tm, err := LoadConfig(path)
			if err == nil {
				t.Fatalf("loaded %v", tm.Names())
			}
			if errors.Is(err, ErrNoTemplate) != c.noTemplate {
				t.Errorf("errors.Is(%v, ErrNoTemplate) = %v", err, !c.noTemplate)
			}
			for _, w := range c.wantInErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := Load(t.TempDir()); err == nil || errors.Is(err, ErrNoTemplate) {
		t.Errorf("Load of an empty directory: %v (want a missing-file error)", err)
	}
}

// TestLoadPrefersChatTemplateJinja follows transformers: a model's
// chat_template.jinja (and additional_chat_templates/) replace
// tokenizer_config.json's chat_template, whose tokens still count.
func TestLoadPrefersChatTemplateJinja(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tokenizer_config.json"), `{"chat_template": "old", "bos_token": "<s>"}`)
	writeFile(t, filepath.Join(dir, "chat_template.jinja"), "{{ bos_token }}new\n")
	writeFile(t, filepath.Join(dir, "additional_chat_templates", "tool_use.jinja"), "tools")
	tm, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tm.Render(jsonVars(t, `{"messages": []}`)); got != "<s>new" {
		t.Errorf("rendered %q, want %q", got, "<s>new")
	}
	if got, _ := tm.Render(jsonVars(t, `{"messages": [], "tools": []}`)); got != "tools" {
		t.Errorf("with tools rendered %q, want the tool_use template", got)
	}
	if fmt.Sprint(tm.Names()) != "[default tool_use]" {
		t.Errorf("Names() = %v", tm.Names())
	}
}

func TestMixtralRefusesNonAlternatingRoles(t *testing.T) {
	tm := builtin(t, "mixtral-instruct")
	cases := []struct{ messages, want string }{
		{`[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]`,
			"After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
		{`[{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]`,
			"After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
		{`[{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]`,
			"Only user and assistant roles are supported, with the exception of an initial optional system message!"},
	}
	for _, c := range cases {
		_, err := tm.Render(jsonVars(t, `{"messages": `+c.messages+`}`))
		var raised *RaiseError
		if !errors.As(err, &raised) {
			t.Fatalf("%s: got %v, want a *RaiseError", c.messages, err)
		}
		if err.Error() != c.want {
			t.Errorf("%s: error %q, want the template's %q", c.messages, err, c.want)
		}
	}
}

// TestRenderKeepsTheClientsKeyOrder renders a tool schema whose keys
// are not sorted: from json.RawMessage and Object in the client's
// order, from a map[string]any sorted.
func TestRenderKeepsTheClientsKeyOrder(t *testing.T) {
	tm := builtin(t, "qwen3")
	const tools = `[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"zeta": {"type": "integer", "minimum": 3}, "alpha": {"type": "number", "default": 2.0}}, "required": ["zeta"]}}}]`
	const ordered = `{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"zeta": {"type": "integer", "minimum": 3}, "alpha": {"type": "number", "default": 2.0}}, "required": ["zeta"]}}}`
	const sorted = `{"function": {"name": "f", "parameters": {"properties": {"alpha": {"default": 2, "type": "number"}, "zeta": {"minimum": 3, "type": "integer"}}, "required": ["zeta"], "type": "object"}}, "type": "function"}`
	var plain []any
	if err := json.Unmarshal([]byte(tools), &plain); err != nil {
		t.Fatal(err)
	}
	decoded, err := DecodeJSON([]byte(tools))
	if err != nil {
		t.Fatal(err)
	}
	messages := json.RawMessage(`[{"role": "user", "content": "hi"}]`)
	for _, c := range []struct {
		name  string
		tools any
		want  string
	}{
		{"json.RawMessage", json.RawMessage(tools), ordered},
		{"DecodeJSON", decoded, ordered},
		{"encoding/json", plain, sorted},
	} {
		out, err := tm.Render(map[string]any{"messages": messages, "tools": c.tools, "add_generation_prompt": true})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "<tools>\n"+c.want+"\n</tools>") {
			t.Errorf("%s: tools came out as\n%s\nwant %s", c.name, out, c.want)
		}
	}
}

// TestTojsonIsPythonsJSONDumps compares tojson with Python's json.dumps
// (outputs written by Python 3 with transformers' tojson).
func TestTojsonIsPythonsJSONDumps(t *testing.T) {
	const v = `{"b": 1, "a": [1, 2.5, null, true, 1.0, 1e-7, 1e16, 123456789012345678901234567890], "é": "ü\n\t\"\\\u0001 \u2028 😀", "n": {}, "l": []}`
	cases := []struct{ template, want string }{
		{"{{ v|tojson }}", `{"b": 1, "a": [1, 2.5, null, true, 1.0, 1e-07, 1e+16, 123456789012345678901234567890], "é": "ü\n\t\"\\\u0001 ` + "\u2028" + ` 😀", "n": {}, "l": []}`},
		{"{{ v|tojson(indent=2) }}", "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true,\n    1.0,\n    1e-07,\n    1e+16,\n    123456789012345678901234567890\n  ],\n  \"é\": \"ü\\n\\t\\\"\\\\\\u0001 \u2028 😀\",\n  \"n\": {},\n  \"l\": []\n}"},
		{"{{ v|tojson(ensure_ascii=true) }}", `{"b": 1, "a": [1, 2.5, null, true, 1.0, 1e-07, 1e+16, 123456789012345678901234567890], "\u00e9": "\u00fc\n\t\"\\\u0001 \u2028 \ud83d\ude00", "n": {}, "l": []}`},
		{"{{ v|tojson(sort_keys=true, separators=(',', ':')) }}", `{"a":[1,2.5,null,true,1.0,1e-07,1e+16,123456789012345678901234567890],"b":1,"l":[],"n":{},"é":"ü\n\t\"\\\u0001 ` + "\u2028" + ` 😀"}`},
		{"{{ {'k': [1, 'x', none, true], 1: 2}|tojson }}", `{"k": [1, "x", null, true], "1": 2}`},
	}
	for _, c := range cases {
		tm, err := Parse("test", "default", c.template, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tm.Render(map[string]any{"v": json.RawMessage(v)})
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.template, got, c.want)
		}
	}
}

// TestWhitespaceControlIsJinja2s checks trim_blocks and lstrip_blocks
// against Python Jinja2's outputs, including the cases the engine's own
// lstrip gets wrong (a block after another tag on its line).
func TestWhitespaceControlIsJinja2s(t *testing.T) {
	cases := []struct{ template, want string }{
		{"{% for i in range(2) %} {{ i }} {% endfor %}|", " 0  1 |"},
		{"a\n  {% if true %}\n  x\n  {% endif %}\nb", "a\n  x\nb"},
		{"  {# c #}\n  {%+ if true %}y{% endif %}\n\t{% if true %}z{% endif %}", "  yz"},
		{"{{ '{%' }} {% if true %}q{% endif %}\n   {% raw %}  {% if %}\n   {% endraw %}|", "{% q  {% if %}\n|"},
		{"x\r\n  {% if true %}\r\ny{% endif %}\r\n", "x\ny"},
		{"A\n  {% if true %}\n    B\n  {% endif %}\nC {{- ' D ' -}} E\n{%- for i in range(2) %} {{ i }} {% endfor -%}\n\nZ\n", "A\n    B\nC D E 0  1 Z"},
	}
	for _, c := range cases {
		tm, err := Parse("test", "default", c.template, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tm.Render(nil)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%q: got %q, want %q", c.template, got, c.want)
		}
	}
}

// TestPythonStringMethods checks the methods replaced with Python's
// (outputs from Python 3).
func TestPythonStringMethods(t *testing.T) {
	cases := []struct{ template, want string }{
		{"{{ '  a b \t'.strip() }}|{{ '\\n a'.lstrip() }}|{{ 'a \\n'.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\n a'.lstrip('\\n') }}", "a b|a|a|a| a"},
		{"{{ ' a  b c '.split() }}|{{ 'a b c'.split(none, 1) }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ ' a  b c '.rsplit(maxsplit=1) }}",
			"['a', 'b', 'c']|['a', 'b c']|['a', 'b', '', 'c']|['a', 'b c']|['a b', 'c']|[' a  b', 'c']"},
		{"{{ 'a-b-c'.replace('-', '+') }}|{{ 'a-b-c'.replace('-', '+', 1) }}", "a+b+c|a+b-c"},
		{"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys()|list }}|{{ d.get('z') }}|{{ d.get('q', 'dflt') }}|{{ d.values()|list }}", "z=1;a=2;|['z', 'a']|1|dflt|[1, 2]"},
	}
	for _, c := range cases {
		tm, err := Parse("test", "default", c.template, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tm.Render(map[string]any{"d": json.RawMessage(`{"z": 1, "a": 2}`)})
		if err != nil {
			t.Fatalf("%s: %v", c.template, err)
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.template, got, c.want)
		}
	}
}

func TestStrftimeNow(t *testing.T) {
	tm, err := Parse("test", "default", `{{ strftime_now("%d %b %Y") }}|{{ strftime_now("%Y-%m-%d %H:%M:%S %a %A %B %j %I%p %-d %%") }}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	tm.now = func() time.Time { return time.Date(2024, 7, 5, 14, 3, 9, 0, time.UTC) }
	got, err := tm.Render(nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "05 Jul 2024|2024-07-05 14:03:09 Fri Friday July 187 02PM 5 %"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestTemplatesCannotReadFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "secret.txt"), "secret")
	for _, src := range []string{`{% include "secret.txt" %}`, `{% include "` + filepath.Join(dir, "secret.txt") + `" %}`, `{% extends "secret.txt" %}`} {
		tm, err := Parse(filepath.Join(dir, "t.jinja"), "default", src, nil)
		if err == nil {
			var out string
			out, err = tm.Render(nil)
			if strings.Contains(out, "secret") {
				t.Errorf("%s read the file: %q", src, out)
			}
		}
		if err == nil {
			t.Errorf("%s: no error", src)
		}
	}
}

func TestRangeIsBoundedLikeTheSandbox(t *testing.T) {
	tm, err := Parse("test", "default", "{% for i in range(n) %}.{% endfor %}", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tm.Render(map[string]any{"n": 3}); err != nil || got != "..." {
		t.Errorf("range(3): %q, %v", got, err)
	}
	if _, err := tm.Render(map[string]any{"n": 1 << 40}); err == nil || !strings.Contains(err.Error(), "range too big") {
		t.Errorf("range(1<<40): %v", err)
	}
}

// TestRenderIsSafeConcurrently renders from many goroutines (run with
// -race) and checks every result.
func TestRenderIsSafeConcurrently(t *testing.T) {
	tm := builtin(t, "qwen3")
	convs := make([]map[string]any, 4)
	want := make([]string, len(convs))
	for i := range convs {
		convs[i] = jsonVars(t, fmt.Sprintf(`{"messages": [{"role": "system", "content": "s%d"}, {"role": "user", "content": "u%d"},
			{"role": "assistant", "content": "<think>\nr\n</think>\n\nok"}, {"role": "user", "content": "again"}],
			"tools": [{"type": "function", "function": {"name": "f%d", "parameters": {"b": 1, "a": 2}}}],
			"add_generation_prompt": true, "enable_thinking": %v}`, i, i, i, i%2 == 0))
		var err error
		if want[i], err = tm.Render(convs[i]); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for n := range 25 {
				i := (g + n) % len(convs)
				got, err := tm.Render(convs[i])
				if err != nil || got != want[i] {
					errs <- fmt.Errorf("goroutine %d render %d: %v, differs: %v", g, n, err, got != want[i])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestBuiltinTemplates(t *testing.T) {
	names := BuiltinNames()
	if fmt.Sprint(names) != "[mixtral-instruct qwen1.5 qwen3 tulu]" {
		t.Errorf("BuiltinNames() = %v", names)
	}
	for _, n := range names {
		builtin(t, n)
	}
	if _, ok := Builtin("../doc.go"); ok {
		t.Error("Builtin read outside templates/")
	}
}

func BenchmarkRenderQwen3(b *testing.B) {
	tm := builtin(b, "qwen3")
	vars := jsonVars(b, `{"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is the weather in Paris?"},
		{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
		{"role": "tool", "content": "{\"temp\": 21}"}, {"role": "assistant", "content": "<think>\nIt is 21.\n</think>\n\nIt is 21 °C."},
		{"role": "user", "content": "And tomorrow?"}],
		"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
		"add_generation_prompt": true, "enable_thinking": false}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tm.Render(vars); err != nil {
			b.Fatal(err)
		}
	}
}
