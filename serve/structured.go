package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"

	"github.com/odmoe/odmoe/grammar"
)

// constraints builds the grammar constraints of structured output and
// forced tool calls over the server's vocabulary, indexed once, and keeps
// the compiled grammars of recent schemas, and masks of their states.
type constraints struct {
	once  sync.Once
	vocab *grammar.Vocabulary
	masks *grammar.MaskCache
	kept  *grammar.Grammars
}

func (s *Server) vocabulary() *grammar.Vocabulary {
	s.grammars.once.Do(func() {
		tok := s.cfg.Tokenizer
		s.grammars.vocab = grammar.NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.EOS())
		s.grammars.masks = grammar.NewMaskCache(grammar.MaskCacheBytes)
		s.grammars.kept = grammar.NewGrammars(grammar.GrammarCacheBytes)
	})
	return s.grammars.vocab
}

// answerGrammar is a grammar the answer must follow: key names its
// source (the compiled grammar is kept under it), root builds it, param
// is the request field it comes from.
type answerGrammar struct {
	param, key string
	root       func() (*grammar.Node, error)
}

// constrain puts j's sampler under a's grammar.
func (s *Server) constrain(j *job, a *answerGrammar) error {
	v := s.vocabulary()
	cs, ok := s.grammars.kept.Get(a.key)
	if !ok {
		n, err := a.root()
		if err != nil {
			return badRequest(a.param, "%s: %v", a.param, err)
		}
		g, err := grammar.New(n)
		if err != nil {
			return badRequest(a.param, "%s: %v", a.param, err)
		}
		cs = grammar.For(g, v, s.grammars.masks)
		s.grammars.kept.Put(a.key, cs)
	}
	c, err := cs.New()
	if err != nil {
		return badRequest(a.param, "%s: %v", a.param, err)
	}
	j.sampler.WithConstraint(c)
	return nil
}

// responseFormat reads response_format: text (nil), json_object (any
// JSON object) or json_schema (what the schema accepts).
func responseFormat(raw json.RawMessage) (*answerGrammar, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &rf); err != nil {
		return nil, badRequest("response_format", "response_format: %v", err)
	}
	switch rf.Type {
	case "text":
		return nil, nil
	case "json_object":
		return &answerGrammar{param: "response_format", key: "json_object", root: func() (*grammar.Node, error) { return grammar.AnyObject(), nil }}, nil
	case "json_schema":
		if rf.JSONSchema == nil || len(rf.JSONSchema.Schema) == 0 {
			return nil, badRequest("response_format", "response_format json_schema needs json_schema.schema")
		}
		if !schemaName.MatchString(rf.JSONSchema.Name) {
			return nil, badRequest("response_format", "response_format json_schema needs json_schema.name: a-z, A-Z, 0-9, _ and -, up to 64 (as OpenAI requires), got %q", rf.JSONSchema.Name)
		}
		key, err := compactKey("schema", rf.JSONSchema.Schema)
		if err != nil {
			return nil, badRequest("response_format", "response_format json_schema.schema: %v", err)
		}
		return &answerGrammar{param: "response_format", key: key, root: func() (*grammar.Node, error) {
			n, err := grammar.FromSchema(rf.JSONSchema.Schema)
			if err != nil {
				return nil, fmt.Errorf("json_schema.schema: %w", err)
			}
			return n, nil
		}}, nil
	}
	return nil, badRequest("response_format", "response_format type %q is not one of text, json_object, json_schema", rf.Type)
}

// schemaName is what OpenAI takes as a json_schema's name.
var schemaName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func compactKey(kind string, raw json.RawMessage) (string, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", err
	}
	return kind + ":" + b.String(), nil
}

// tool is one entry of tools.
type tool struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// toolSyntax is how a chat template writes a tool call: Hermes' (Qwen2.5,
// Qwen3) <tool_call>{"name": ..., "arguments": ...}</tool_call>. A
// template that renders a call otherwise (or not at all) has none, and
// a request that would need one is refused.
type toolSyntax struct {
	open, close string
}

var hermes = &toolSyntax{open: "<tool_call>", close: "</tool_call>"}

// detectToolSyntax renders a conversation with a tool call through t
// and reads the call back in the syntax it may have written: with the call's arguments as OpenAI
// sends them (a JSON string; Qwen3's template writes it as is) and as an
// object (Qwen2.5's writes it through tojson).
func detectToolSyntax(t ChatTemplate) *toolSyntax {
	if t == nil {
		return nil
	}
	for _, args := range []string{`"{\"x\": 1}"`, `{"x": 1}`} {
		call := json.RawMessage(`{"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "probe_fn", "arguments": ` + args + `}}]}`)
		text, err := t.Render(map[string]any{"messages": []any{json.RawMessage(`{"role": "user", "content": "hi"}`), call},
			"add_generation_prompt": false, "tools": json.RawMessage(`[{"type": "function", "function": {"name": "probe_fn", "parameters": {"type": "object"}}}]`)})
		if err != nil {
			continue
		}
		f := &toolFilter{syntax: hermes}
		_, calls := f.Push(text)
		if len(calls) == 1 && calls[0].Function.Name == "probe_fn" && calls[0].Function.Arguments == `{"x":1}` {
			return hermes
		}
	}
	return nil
}

// toolPlan is what a request's tools ask: whether the template sees
// them, the syntax to read calls in (nil: none), and the grammar that
// forces calls (required, or a named function), in the template's own
// syntax.
type toolPlan struct {
	render bool
	parse  *toolSyntax
	force  *answerGrammar
}

// toolChoice reads tools, tool_choice and parallel_tool_calls.
func (s *Server) toolChoice(req *chatRequest) (plan toolPlan, err error) {
	var tools []tool
	if len(req.Tools) > 0 && string(req.Tools) != "null" {
		if err := json.Unmarshal(req.Tools, &tools); err != nil {
			return plan, badRequest("tools", "tools must be an array of {\"type\": \"function\", \"function\": {...}}: %v", err)
		}
		for i, t := range tools {
			if t.Type != "function" || t.Function.Name == "" {
				return plan, badRequest(fmt.Sprintf("tools[%d]", i), "tools[%d]: a function tool with a name is required", i)
			}
		}
	}
	choice := "auto"
	var named string
	if raw := bytes.TrimSpace(req.ToolChoice); len(raw) > 0 && string(raw) != "null" {
		var c struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		switch {
		case json.Unmarshal(raw, &choice) == nil:
		case json.Unmarshal(raw, &c) == nil && c.Type == "function" && c.Function.Name != "":
			choice, named = "named", c.Function.Name
		default:
			return plan, badRequest("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")
		}
	}
	switch choice {
	case "none", "auto", "required", "named":
	default:
		return plan, badRequest("tool_choice", "tool_choice %q is not one of none, auto, required", choice)
	}
	if len(tools) == 0 {
		if choice == "required" || choice == "named" {
			return plan, badRequest("tool_choice", "tool_choice %s needs tools", choice)
		}
		return plan, nil
	}
	if choice == "none" {
		return plan, nil // the model does not see the tools, as it may not call them
	}
	if s.tools == nil {
		return plan, badRequest("tools", "the chat template of model %q writes no tool calls that odmoe can read (it reads Hermes' <tool_call> syntax, as Qwen2.5 and Qwen3 write it)", s.cfg.Model)
	}
	plan.render, plan.parse = true, s.tools
	if choice == "auto" {
		return plan, nil
	}
	var calls []*grammar.Node
	compiler := grammar.NewCompiler(grammar.DefaultLimits) // the tools share the limits
	for i, t := range tools {
		if choice == "named" && t.Function.Name != named {
			continue
		}
		n, err := s.toolCallGrammar(compiler, t)
		if err != nil {
			return plan, badRequest(fmt.Sprintf("tools[%d].function.parameters", i), "tools[%d].function.parameters: %v", i, err)
		}
		calls = append(calls, n)
	}
	if len(calls) == 0 {
		return plan, badRequest("tool_choice", "tool_choice names the function %q, which is not among the tools", named)
	}
	parallel := choice == "required" && (req.ParallelToolCalls == nil || *req.ParallelToolCalls)
	key, _ := compactKey(fmt.Sprintf("tools %s %q %v", choice, named, parallel), req.Tools)
	plan.force = &answerGrammar{param: "tool_choice", key: key, root: func() (*grammar.Node, error) {
		one := grammar.OneOf(calls...)
		if parallel {
			return grammar.OneOrMore(one, "\n"), nil
		}
		return one, nil
	}}
	return plan, nil
}

// toolCallGrammar is one call of t in the template's syntax, its
// arguments what t's parameters schema accepts.
func (s *Server) toolCallGrammar(compiler *grammar.Compiler, t tool) (*grammar.Node, error) {
	args := grammar.AnyObject()
	if p := bytes.TrimSpace(t.Function.Parameters); len(p) > 0 && string(p) != "null" {
		var err error
		if args, err = compiler.Schema(p); err != nil {
			return nil, err
		}
	}
	name, _ := json.Marshal(t.Function.Name)
	return grammar.Seq(
		grammar.Literal(s.tools.open+"\n{\"name\": "+string(name)+", \"arguments\": "),
		args,
		grammar.Literal("}\n"+s.tools.close),
	), nil
}
