package chat

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/builtins/methods"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// The engine's str and dict methods, with those that differ from Python
// replaced: strip, lstrip and rstrip without an argument (or None) strip
// whitespace, split and rsplit follow Python (the engine's ignore maxsplit), replace
// with two arguments replaces every occurrence, and a dict's keys,
// values, items and get read the dict itself, in insertion order (the
// engine hands methods an unordered copy).
var (
	strMethodNames = strings.Fields(`capitalize capwords casefold center count encode endswith expandtabs
		find format format_map isalnum isalpha isascii isdecimal isdigit islower isnumeric isprintable
		isspace istitle isupper join ljust lower lstrip partition removeprefix removesuffix replace rfind
		rjust rpartition rsplit rstrip split splitlines startswith strip swapcase title upper zfill`)
	dictMethodNames = strings.Fields(`keys values items get pop setdefault update copy clear`)
)

// pythonMethods returns the engine's method sets with the fixes above.
func pythonMethods() exec.Methods {
	str := map[string]exec.Method[string]{}
	for _, n := range strMethodNames {
		if m, ok := methods.All.Str.Get(n); ok {
			str[n] = m
		}
	}
	dict := map[string]exec.Method[map[string]any]{}
	for _, n := range dictMethodNames {
		if m, ok := methods.All.Dict.Get(n); ok {
			dict[n] = m
		}
	}
	str["strip"] = noArgument(str["strip"], func(s string) any { return strings.TrimFunc(s, isPySpace) })
	str["lstrip"] = noArgument(str["lstrip"], func(s string) any { return strings.TrimLeftFunc(s, isPySpace) })
	str["rstrip"] = noArgument(str["rstrip"], func(s string) any { return strings.TrimRightFunc(s, isPySpace) })
	str["split"] = splitMethod(false)
	str["rsplit"] = splitMethod(true)
	replace := str["replace"]
	str["replace"] = func(self string, sv *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) == 2 && len(a.KwArgs) == 0 && a.Args[0].IsString() && a.Args[1].IsString() {
			return strings.ReplaceAll(self, a.Args[0].String(), a.Args[1].String()), nil
		}
		return replace(self, sv, a)
	}
	dict["keys"] = dictWalk(func(k, _ *exec.Value) any { return k.Interface() })
	dict["values"] = dictWalk(func(_, v *exec.Value) any { return v })
	dict["items"] = dictWalk(func(k, v *exec.Value) any { return exec.ValuesList{k, v} })
	get := dict["get"]
	dict["get"] = func(self map[string]any, sv *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) < 1 || len(a.Args) > 2 || len(a.KwArgs) > 0 {
			return get(self, sv, a)
		}
		// not the *exec.Value itself: it has an Error method, and would
		// pass for an error
		if v, ok := sv.GetItem(a.Args[0].Interface()); ok {
			return v.Interface(), nil
		}
		if len(a.Args) == 2 {
			return a.Args[1].Interface(), nil
		}
		return nil, nil
	}
	m := methods.All
	m.Str = exec.NewMethodSet(str)
	m.Dict = exec.NewMethodSet(dict)
	return m
}

// splitMethod is Python's str.split (or rsplit): split(sep=None,
// maxsplit=-1), on runs of whitespace when sep is None.
func splitMethod(fromRight bool) exec.Method[string] {
	return func(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		var sep *exec.Value
		maxSplit := -1
		if len(a.Args) > 2 {
			return nil, exec.ErrInvalidCall(errors.New("takes at most 2 arguments"))
		}
		if len(a.Args) > 0 {
			sep = a.Args[0]
		}
		if len(a.Args) > 1 {
			maxSplit = a.Args[1].Integer()
		}
		for k, v := range a.KwArgs {
			switch k {
			case "sep":
				sep = v
			case "maxsplit":
				maxSplit = v.Integer()
			default:
				return nil, exec.ErrInvalidCall(fmt.Errorf("unexpected keyword argument %q", k))
			}
		}
		var parts []string
		if sep == nil || sep.IsNil() {
			parts = splitSpace(self, maxSplit, fromRight)
		} else {
			if sep.String() == "" {
				return nil, exec.ErrInvalidCall(errors.New("empty separator"))
			}
			parts = splitSep(self, sep.String(), maxSplit, fromRight)
		}
		out := make(pyList, len(parts))
		for i, p := range parts {
			out[i] = p
		}
		return out, nil
	}
}

func splitSep(s, sep string, maxSplit int, fromRight bool) []string {
	if maxSplit < 0 || !fromRight {
		if maxSplit < 0 {
			return strings.Split(s, sep)
		}
		return strings.SplitN(s, sep, maxSplit+1)
	}
	var rev []string
	for range maxSplit {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
	}
	rev = append(rev, s)
	slices.Reverse(rev)
	return rev
}

// splitSpace splits on runs of whitespace, dropping empty fields; after
// maxSplit splits the rest is one field, with its inner whitespace kept.
func splitSpace(s string, maxSplit int, fromRight bool) []string {
	fields := strings.FieldsFunc(s, isPySpace)
	if maxSplit < 0 || len(fields) <= maxSplit+1 {
		return fields
	}
	if !fromRight {
		var out []string
		rest := strings.TrimLeftFunc(s, isPySpace)
		for range maxSplit {
			i := strings.IndexFunc(rest, isPySpace)
			out = append(out, rest[:i])
			rest = strings.TrimLeftFunc(rest[i:], isPySpace)
		}
		return append(out, rest)
	}
	var rev []string
	rest := strings.TrimRightFunc(s, isPySpace)
	for range maxSplit {
		i := strings.LastIndexFunc(rest, isPySpace)
		_, size := utf8.DecodeRuneInString(rest[i:])
		rev = append(rev, rest[i+size:])
		rest = strings.TrimRightFunc(rest[:i], isPySpace)
	}
	rev = append(rev, rest)
	slices.Reverse(rev)
	return rev
}

// noArgument calls f for a call without arguments (or with None), orig
// otherwise.
func noArgument(orig exec.Method[string], f func(string) any) exec.Method[string] {
	return func(self string, sv *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.KwArgs) == 0 && (len(a.Args) == 0 || len(a.Args) == 1 && a.Args[0].IsNil()) {
			return f(self), nil
		}
		return orig(self, sv, a)
	}
}

// dictWalk makes a method listing a dict's entries in its own order.
func dictWalk(entry func(k, v *exec.Value) any) exec.Method[map[string]any] {
	return func(_ map[string]any, sv *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) > 0 || len(a.KwArgs) > 0 {
			return nil, exec.ErrInvalidCall(errors.New("takes no arguments"))
		}
		out := []any{}
		sv.Iterate(func(_, _ int, k, v *exec.Value) bool {
			out = append(out, entry(k, v))
			return true
		}, func() {})
		return out, nil
	}
}

// isPySpace is Python's str.isspace for one character: Unicode
// whitespace and the separators U+001C to U+001F.
func isPySpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}
