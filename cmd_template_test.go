package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/model/chat"
)

// qwen3Config writes a tokenizer_config.json with Qwen3's chat template
// and special tokens.
func qwen3Config(t *testing.T) string {
	t.Helper()
	src, ok := chat.Builtin("qwen3")
	if !ok {
		t.Fatal("no built-in qwen3 template")
	}
	cfg, err := json.Marshal(map[string]any{"chat_template": src, "bos_token": nil, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokenizer_config.json")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runInProcess runs an odmoe command line in this process.
func runInProcess(stdin string, args ...string) (stdout, stderr string, code int) {
	var so, se strings.Builder
	code = dispatch(context.Background(), args, strings.NewReader(stdin), &so, &se)
	return so.String(), se.String(), code
}

func TestTemplateJSONLRendersQwen3Conversations(t *testing.T) {
	config := qwen3Config(t)
	in := `{"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello"}], "add_generation_prompt": true}

{"messages": [{"role": "user", "content": "Weather?"}], "add_generation_prompt": true, "enable_thinking": false, "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}}]}
`
	so, se, code := runInProcess(in, "template", "-config", config, "-jsonl")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, se)
	}
	want := []string{
		"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
		"<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
			`{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}}` +
			"\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" +
			"<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
	}
	lines := strings.Split(strings.TrimSuffix(so, "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines out for %d conversations:\n%s", len(lines), len(want), so)
	}
	for i, l := range lines {
		var got string
		if err := json.Unmarshal([]byte(l), &got); err != nil {
			t.Fatalf("line %d is not a JSON string: %v", i+1, err)
		}
		if got != want[i] {
			t.Errorf("conversation %d:\n got %q\nwant %q", i+1, got, want[i])
		}
		if strings.Contains(l, `\u003c`) {
			t.Errorf("line %d escapes < as HTML: %s", i+1, l)
		}
	}

	// without -jsonl: one object in, the prompt out as it is
	so, se, code = runInProcess(strings.SplitN(in, "\n", 2)[0], "template", "-config", config)
	if code != 0 || so != want[0] {
		t.Errorf("raw: exit %d, %q (%s); want %q", code, so, se, want[0])
	}
}

func TestTemplateNamesTheLineThatFails(t *testing.T) {
	config := qwen3Config(t)
	model := t.TempDir()
	src, _ := chat.Builtin("mixtral-instruct")
	cfg, _ := json.Marshal(map[string]any{"chat_template": src, "bos_token": "<s>", "eos_token": "</s>"})
	if err := os.WriteFile(filepath.Join(model, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	const ok = `{"messages": [{"role": "user", "content": "hi"}]}`
	cases := []struct {
		args      []string
		stdin     string
		code      int
		wantInErr string
	}{
		{[]string{"-config", config, "-jsonl"}, ok + "\n" + ok + "\n[1]\n", 1, `stdin line 3: want a JSON object`},
		{[]string{"-config", config, "-jsonl"}, ok + "\n{\"messages\": \n", 1, "stdin line 2:"},
		{[]string{"-model", model, "-jsonl"}, ok + "\n" + `{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}` + "\n", 1,
			"stdin line 2: After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
		{[]string{"-model", t.TempDir()}, ok, 1, "tokenizer_config.json"},
		{[]string{"-config", config, "-name", "tool_use"}, ok, 1, `no chat template named "tool_use"`},
		{nil, ok, 2, "-config or -model is required"},
		{[]string{"-config", config, "-model", model}, ok, 2, "not both"},
	}
	for _, c := range cases {
		so, se, code := runInProcess(c.stdin, append([]string{"template"}, c.args...)...)
		if code != c.code || !strings.Contains(se, c.wantInErr) {
			t.Errorf("template %v: exit %d, stderr %q; want exit %d saying %q", c.args, code, se, c.code, c.wantInErr)
		}
		if c.code != 0 && strings.Count(so, "\n") > 2 {
			t.Errorf("template %v: printed past the failing line: %q", c.args, so)
		}
	}
}
