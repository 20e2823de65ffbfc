package chat

import (
	"embed"
	"slices"
	"strings"
)

// The chat templates of the model families odmoe generates test models
// of, verbatim from the models' tokenizer_config.json (sources in
// templates/README.md).
//
//go:embed templates/*.jinja
var builtinFiles embed.FS

// Builtin returns the chat template called name ("qwen3", "qwen1.5",
// "mixtral-instruct", "tulu"; see BuiltinNames) and whether there is one.
func Builtin(name string) (string, bool) {
	b, err := builtinFiles.ReadFile("templates/" + name + ".jinja")
	if err != nil {
		return "", false
	}
	return string(b), true
}

// BuiltinNames lists the built-in chat templates.
func BuiltinNames() []string {
	entries, _ := builtinFiles.ReadDir("templates")
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".jinja"); ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}
