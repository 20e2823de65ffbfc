package chat

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// Template is a parsed chat template with the special tokens of its
// tokenizer. Render is safe for concurrent use.
type Template struct {
	file   string // where it was read, for errors
	name   string // "default", or its name in the file's list
	source string
	tokens map[string]any
	tmpl   *exec.Template
	now    func() time.Time // strftime_now's clock

	set     *set // the model's other templates, for Select
	toolUse *set // set: switch to "tool_use" when tools are given
}

// RaiseError is a template's own refusal of a conversation, through
// raise_exception(message). Error returns the message verbatim.
type RaiseError struct{ Message string }

func (e *RaiseError) Error() string { return e.Message }

// Parse parses source as a chat template. file and name say where it
// came from in errors; specialTokens (bos_token, eos_token, ... as
// strings) are passed to every render, as tokenizer_config.json's are.
func Parse(file, name, source string, specialTokens map[string]any) (*Template, error) {
	return parse(file, name, source, maps.Clone(specialTokens))
}

// parse compiles source the way transformers' _compile_jinja_template
// configures Jinja2: trim_blocks and lstrip_blocks, a single trailing
// newline dropped, loop controls, tojson as json.dumps, and the globals
// raise_exception and strftime_now.
func parse(file, name, source string, tokens map[string]any) (*Template, error) {
	t := &Template{file: file, name: name, source: source, tokens: tokens, now: time.Now}
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = false // lstripBlocks does it, as Jinja2 does
	cfg.KeepTrailingNewline = false
	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	ctx.Set("range", pyRange)
	ctx.Set("strftime_now", func(_ *exec.Evaluator, a *exec.VarArgs) (any, error) {
		if len(a.Args) != 1 || !a.Args[0].IsString() {
			return nil, errors.New("strftime_now(format) takes one string")
		}
		return strftime(t.now(), a.Args[0].String()), nil
	})
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := filters.Replace("tojson", tojsonFilter); err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	env := &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           pythonMethods(),
	}
	tmpl, err := compile(name, source, cfg, env)
	if err != nil {
		return nil, fmt.Errorf("chat: %s: parsing %s: %w", file, t.what(), err)
	}
	t.tmpl = tmpl
	return t, nil
}

// compile parses source, turning an engine panic into an error.
func compile(name, source string, cfg *config.Config, env *exec.Environment) (tmpl *exec.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the template engine failed: %v", r)
		}
	}()
	tmpl, err = exec.NewTemplate(name, cfg, sourceLoader{name, lstripBlocks(source)}, env)
	if err != nil {
		if u := errors.Unwrap(err); u != nil {
			err = u // the engine's wrapping repeats the whole source
		}
		return nil, err
	}
	return tmpl, nil
}

// what names the template in messages.
func (t *Template) what() string {
	if t.name == defaultName {
		return "chat template"
	}
	return fmt.Sprintf("chat template %q", t.name)
}

// Name returns the template's name: "default", or its name in
// tokenizer_config.json's list of templates.
func (t *Template) Name() string { return t.name }

// Names lists the model's templates, in the file's order.
func (t *Template) Names() []string {
	if t.set == nil {
		return []string{t.name}
	}
	return append([]string(nil), t.set.names...)
}

// Select returns the model's template called name (e.g. "tool_use").
func (t *Template) Select(name string) (*Template, error) {
	if t.set == nil {
		if name == t.name {
			return t, nil
		}
		return nil, fmt.Errorf("chat: %s has no chat template named %q", t.file, name)
	}
	return t.set.template(name)
}

// Source returns the template's text.
func (t *Template) Source() string { return t.source }

// Render renders a conversation as transformers' apply_chat_template
// (tokenize=False) does: vars holds "messages", "add_generation_prompt"
// (false when absent), "tools" and "documents" (None when absent) and
// any other template variables (e.g. "enable_thinking"), which override
// the special tokens. Values may be Object, json.RawMessage (decoded with
// its key order), or plain Go values from encoding/json (map keys then
// come sorted). A template loaded with a "tool_use" alternative uses it
// when tools are given, as transformers does.
//
// A raise_exception in the template gives a *RaiseError with its message.
func (t *Template) Render(vars map[string]any) (string, error) {
	data := make(map[string]any, len(vars)+len(t.tokens)+4)
	for k, v := range vars {
		ev, err := engineValue(v)
		if err != nil {
			return "", fmt.Errorf("chat: template variable %q: %w", k, err)
		}
		data[k] = ev
	}
	if t.toolUse != nil && data["tools"] != nil {
		alt, err := t.toolUse.template(toolUseName)
		if err != nil {
			return "", err
		}
		t = alt
	}
	for k, v := range t.tokens {
		if _, ok := data[k]; !ok {
			data[k] = v
		}
	}
	for _, k := range []string{"tools", "documents"} {
		if _, ok := data[k]; !ok {
			data[k] = nil
		}
	}
	if _, ok := data["add_generation_prompt"]; !ok {
		data["add_generation_prompt"] = false
	}
	var raised *RaiseError
	data["raise_exception"] = func(_ *exec.Evaluator, a *exec.VarArgs) (any, error) {
		msg := ""
		if len(a.Args) > 0 {
			msg = a.Args[0].String()
		}
		if raised == nil {
			raised = &RaiseError{Message: msg}
		}
		return nil, raised
	}
	out, err := t.execute(data)
	if raised != nil { // even where the engine swallowed it: Python would not
		return "", raised
	}
	if err != nil {
		return "", fmt.Errorf("chat: %s: rendering %s: %w", t.file, t.what(), err)
	}
	return out, nil
}

// execute runs the template, turning an engine panic into an error.
func (t *Template) execute(data map[string]any) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the template engine failed: %v", r)
		}
	}()
	return t.tmpl.ExecuteToString(exec.NewContext(data))
}

// sourceLoader holds one template and refuses to read any other file
// ({% include %}, {% import %}): a model's template stays in its model.
type sourceLoader struct{ name, source string }

func (l sourceLoader) Read(path string) (io.Reader, error) {
	if path != l.name {
		return nil, fmt.Errorf("a chat template cannot read %q", path)
	}
	return bytes.NewReader([]byte(l.source)), nil
}

func (l sourceLoader) Resolve(path string) (string, error) {
	if path != l.name {
		return "", fmt.Errorf("a chat template cannot read %q", path)
	}
	return path, nil
}

func (l sourceLoader) Inherit(string) (loaders.Loader, error) { return l, nil }

// maxRange is the sandbox's limit on range() (Jinja2's MAX_RANGE).
const maxRange = 100000

// pyRange is Python's range as Jinja2's sandbox allows it: a list of at
// most maxRange numbers (the engine's own spawns a goroutine).
func pyRange(_ *exec.Evaluator, a *exec.VarArgs) (any, error) {
	var start, stop, step = 0, 0, 1
	for _, v := range a.Args {
		if !v.IsInteger() {
			return nil, errors.New("range() takes integers")
		}
	}
	switch len(a.Args) {
	case 1:
		stop = a.Args[0].Integer()
	case 2:
		start, stop = a.Args[0].Integer(), a.Args[1].Integer()
	case 3:
		start, stop, step = a.Args[0].Integer(), a.Args[1].Integer(), a.Args[2].Integer()
	default:
		return nil, errors.New("range() takes 1 to 3 integers")
	}
	if step == 0 {
		return nil, errors.New("range() step must not be zero")
	}
	n := 0
	if step > 0 && stop > start {
		n = (stop - start + step - 1) / step
	} else if step < 0 && start > stop {
		n = (start - stop - step - 1) / -step
	}
	if n > maxRange {
		return nil, fmt.Errorf("range too big: the sandbox allows at most %d numbers", maxRange)
	}
	out := make([]any, n)
	for i := range out {
		out[i] = start + i*step
	}
	return out, nil
}

// tojsonFilter is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False), arguments in that order.
func tojsonFilter(_ *exec.Evaluator, in *exec.Value, a *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	arg := func(pos int, name string) *exec.Value {
		if v, ok := a.KwArgs[name]; ok {
			return v
		}
		if pos < len(a.Args) {
			return a.Args[pos]
		}
		return nil
	}
	var opt dumpOptions
	if v := arg(0, "ensure_ascii"); v != nil {
		opt.ensureASCII = v.IsTrue()
	}
	if v := arg(1, "indent"); v != nil && !v.IsNil() {
		opt.hasIndent = true
		if v.IsString() {
			opt.indent = v.String()
		} else {
			opt.indent = strings.Repeat(" ", max(v.Integer(), 0))
		}
	}
	if v := arg(2, "separators"); v != nil && !v.IsNil() {
		if !v.IsList() || v.Len() != 2 {
			return exec.AsValue(errors.New("tojson: separators must be (item_separator, key_separator)"))
		}
		opt.explicitSeps = true
		opt.itemSep, opt.keySep = v.Index(0).String(), v.Index(1).String()
	}
	if v := arg(3, "sort_keys"); v != nil {
		opt.sortKeys = v.IsTrue()
	}
	s, err := pyDumps(in, opt)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(s)
}
