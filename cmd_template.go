package main

import (
	"bufio"
	"context"
	"fmt"
	"io"

	"github.com/odmoe/odmoe/model/chat"
)

// runTemplate renders conversations as transformers'
// apply_chat_template(..., tokenize=False) does: for looking at the
// prompts a model's chat template makes.
func runTemplate(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("template", stderr)
	config := fs.String("config", "", "tokenizer_config.json whose chat_template to render")
	dir := fs.String("model", "", "model directory (chat_template.jinja, else tokenizer_config.json's chat_template)")
	name := fs.String("name", "", `a named template of the model's list (e.g. "tool_use"); default: transformers' choice`)
	jsonl := fs.Bool("jsonl", false, `stdin holds one JSON object a line, {"messages": [...], "add_generation_prompt": true, ...} (every key a template variable: tools, enable_thinking, ...); print each prompt as a JSON string a line. Without it: one object, the prompt printed raw`)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var tmpl *chat.Template
	var err error
	switch {
	case *config != "" && *dir != "":
		return usagef("give -config or -model, not both")
	case *config != "":
		tmpl, err = chat.LoadConfig(*config)
	case *dir != "":
		tmpl, err = chat.Load(*dir)
	default:
		return usagef("-config or -model is required")
	}
	if err != nil {
		return err
	}
	if *name != "" {
		if tmpl, err = tmpl.Select(*name); err != nil {
			return err
		}
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	if *jsonl {
		if err := tmpl.RenderJSONLines(stdin, w); err != nil {
			return fmt.Errorf("stdin %w", err)
		}
		return nil
	}
	data, err := io.ReadAll(stdin)
	if err != nil {
		return err
	}
	text, err := tmpl.RenderJSON(data)
	if err != nil {
		return fmt.Errorf("stdin: %w", err)
	}
	_, err = io.WriteString(w, text)
	return err
}
