package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// ErrNoTemplate says that a model has no chat template: its prompts
// must be written out whole (the completions API, not chat).
var ErrNoTemplate = errors.New("chat: the model has no chat template")

// specialTokenNames are the special tokens transformers passes to every
// render (its special_tokens_map), each only when the tokenizer has it.
var specialTokenNames = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// Load reads the chat template of the Hugging Face model in modelDir as
// transformers does: chat_template.jinja (with any named templates in
// additional_chat_templates/) if there is one, else tokenizer_config.json's
// chat_template; the special tokens come from tokenizer_config.json. It
// returns an error wrapping ErrNoTemplate when there is none.
func Load(modelDir string) (*Template, error) {
	cfgPath := filepath.Join(modelDir, "tokenizer_config.json")
	jinjaPath := filepath.Join(modelDir, "chat_template.jinja")
	src, err := os.ReadFile(jinjaPath)
	if errors.Is(err, fs.ErrNotExist) {
		return LoadConfig(cfgPath)
	}
	if err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	cfg, err := readConfig(cfgPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	s := &set{file: jinjaPath, tokens: cfg.tokens(), sources: map[string]string{defaultName: string(src)}, names: []string{defaultName}}
	extra := filepath.Join(modelDir, "additional_chat_templates")
	entries, err := os.ReadDir(extra)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("chat: %w", err)
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".jinja")
		if !ok || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(extra, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("chat: %w", err)
		}
		s.sources[name] = string(b)
		s.names = append(s.names, name)
	}
	return s.defaultTemplate()
}

// LoadConfig reads the chat template of a tokenizer_config.json:
// chat_template as a string, or a list of {"name", "template"} of which
// "default" is used (the others stay available through Select), and the
// special tokens (bos_token, eos_token, ... as strings or AddedToken
// objects; null means none). It returns an error wrapping ErrNoTemplate
// when the file has no chat_template.
func LoadConfig(path string) (*Template, error) {
	cfg, err := readConfig(path)
	if err != nil {
		return nil, err
	}
	s := &set{file: path, tokens: cfg.tokens(), sources: map[string]string{}}
	raw := cfg.ChatTemplate
	var one string
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	var byName map[string]string
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, fmt.Errorf("%w (%s has no chat_template)", ErrNoTemplate, path)
	case json.Unmarshal(raw, &one) == nil:
		s.sources[defaultName] = one
		s.names = []string{defaultName}
	case json.Unmarshal(raw, &list) == nil:
		for _, e := range list {
			if _, dup := s.sources[e.Name]; !dup {
				s.names = append(s.names, e.Name)
			}
			s.sources[e.Name] = e.Template
		}
	case json.Unmarshal(raw, &byName) == nil:
		for name, src := range byName {
			s.names = append(s.names, name)
			s.sources[name] = src
		}
		slices.Sort(s.names)
	default:
		return nil, fmt.Errorf("chat: %s: chat_template is neither a string nor a list of {name, template}", path)
	}
	if len(s.names) == 0 {
		return nil, fmt.Errorf("%w (%s has an empty chat_template list)", ErrNoTemplate, path)
	}
	return s.defaultTemplate()
}

// tokenizerConfig is what we read of tokenizer_config.json.
type tokenizerConfig struct {
	ChatTemplate json.RawMessage            `json:"chat_template"`
	Additional   []json.RawMessage          `json:"additional_special_tokens"`
	Special      map[string]json.RawMessage `json:"-"`
}

func readConfig(path string) (*tokenizerConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	var cfg tokenizerConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("chat: %s: %w", path, err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(data, &all); err != nil {
		return nil, fmt.Errorf("chat: %s: %w", path, err)
	}
	cfg.Special = map[string]json.RawMessage{}
	for _, name := range specialTokenNames {
		if v, ok := all[name]; ok {
			cfg.Special[name] = v
		}
	}
	return &cfg, nil
}

// tokens returns the special tokens a render gets, as transformers'
// special_tokens_map: those that are set, as their text.
func (c *tokenizerConfig) tokens() map[string]any {
	out := map[string]any{}
	if c == nil {
		return out
	}
	for name, raw := range c.Special {
		if s := tokenText(raw); s != "" {
			out[name] = s
		}
	}
	var extra []any
	for _, raw := range c.Additional {
		if s := tokenText(raw); s != "" {
			extra = append(extra, s)
		}
	}
	if len(extra) > 0 {
		out["additional_special_tokens"] = extra
	}
	return out
}

// tokenText reads a token written as a string or as an AddedToken
// object {"content": ...}; null and anything else give "".
func tokenText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var added struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &added) == nil {
		return added.Content
	}
	return ""
}

const (
	defaultName = "default"
	toolUseName = "tool_use"
)

// set is the templates of one model, by name, parsed when first used.
type set struct {
	file    string
	tokens  map[string]any
	names   []string // in the file's order
	sources map[string]string

	mu     sync.Mutex
	parsed map[string]*Template
}

// defaultTemplate is the template a render uses unless told otherwise,
// as transformers picks it: the only one, or the one named "default".
func (s *set) defaultTemplate() (*Template, error) {
	name := defaultName
	if _, ok := s.sources[name]; !ok {
		if len(s.names) != 1 {
			return nil, fmt.Errorf("chat: %s: chat_template has no template named %q (has %s)", s.file, defaultName, strings.Join(s.names, ", "))
		}
		name = s.names[0]
	}
	t, err := s.template(name)
	if err != nil {
		return nil, err
	}
	if _, ok := s.sources[toolUseName]; ok && name != toolUseName {
		auto := *t
		auto.toolUse = s
		return &auto, nil
	}
	return t, nil
}

// template returns the template called name, parsing it once.
func (s *set) template(name string) (*Template, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.parsed[name]; ok {
		return t, nil
	}
	src, ok := s.sources[name]
	if !ok {
		return nil, fmt.Errorf("chat: %s has no chat template named %q (has %s)", s.file, name, strings.Join(s.names, ", "))
	}
	t, err := parse(s.file, name, src, s.tokens)
	if err != nil {
		return nil, err
	}
	t.set = s
	if s.parsed == nil {
		s.parsed = map[string]*Template{}
	}
	s.parsed[name] = t
	return t, nil
}
