// Package chat renders a conversation into prompt text with the model's
// own Hugging Face chat template, as transformers' apply_chat_template
// (tokenize=False) does: the Jinja template of tokenizer_config.json (or
// chat_template.jinja), rendered with messages, tools, documents,
// add_generation_prompt, the tokenizer's special tokens and any extra
// variables (enable_thinking, ...). The template writes the special
// tokens (BOS, <|im_start|>, ...) itself; its text is then tokenized
// without adding any.
//
// It owns reading chat templates (Load, LoadConfig), rendering them
// (Template.Render, safe for concurrent use) and the verbatim templates
// of the families odmoe generates test models of (Builtin: Qwen3,
// Qwen1.5, Mixtral-8x7B-Instruct, OLMoE's Tulu; templates/README.md
// names their sources). It does not own tokenizing, the OpenAI API
// (package serve calls Render) or parsing the model's reply (tool
// calls, <think> blocks).
//
// Rendering uses github.com/nikolalohinski/gonja/v2 configured the way
// transformers configures Jinja2 (trim_blocks, lstrip_blocks, no
// trailing newline kept, loop controls), with transformers' additions
// and Python's behaviour where the engine's differs:
//
//   - tojson is Python's json.dumps(x, ensure_ascii=False, indent=None,
//     separators=None, sort_keys=False): ", " and ": " separators, keys
//     in insertion order, non-ASCII text as is, floats as Python's repr
//     (1.0, 1e-05, 1e+16), integers of any size exactly.
//   - raise_exception(msg) ends the render with a *RaiseError whose
//     Error() is msg verbatim; strftime_now(fmt) formats the local time
//     as C's strftime.
//   - Objects keep the order the client wrote their keys in (Object,
//     json.RawMessage); dict.items(), keys(), values() and get() read it.
//     A map[string]any has none, and is walked with sorted keys.
//   - JSON numbers are Python's: 3 is an int, 3.0 a float. A float64
//     from encoding/json that holds a whole number is taken for an int.
//   - str.strip(), lstrip(), rstrip() and split() without arguments work
//     on whitespace; split and rsplit honour maxsplit; replace(a, b)
//     replaces every a; lists from the input and from split() index from
//     the end as Python's ("x".split("<think>")[-1] is "x"); range() is
//     a list of at most 100000 numbers, as in Jinja2's sandbox.
//   - {% include %}, {% import %} and {% extends %} cannot read files.
//
// # Where it differs from Python's Jinja2
//
//   - None prints as "" (Python: "None"), concatenates as "" and is never
//     "in" anything, where Python raises TypeError (content: null with
//     '+' or 'in'); a variable or key holding null is not "defined".
//   - Integer ** gives a float (2**3 is 8.0), // rounds towards zero for
//     negative operands, and indexing a string (s[0]) counts bytes, not
//     characters (slices count characters as Python does); s[-len(s)],
//     and l[-len(l)] for a list the template built itself, give None.
//   - dict(a=1, b=2) does not keep its keyword order.
//
// Hugging Face's JavaScript renderer, @huggingface/jinja, which the tests
// compare with, differs from Python too: its str.lstrip(chars) and
// rstrip(chars) ignore chars and strip all whitespace, so Qwen3's
// content.lstrip('\n') also drops the leading spaces of a reply (Python
// and this package keep them), and it writes a whole float from JSON
// (1.0) as 1 in tojson and prints booleans as true and false. The tests
// avoid those cases in the comparison and pin Python's results apart.
package chat
