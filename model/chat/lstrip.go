package chat

import "strings"

// lstripBlocks applies Jinja2's newline normalisation and lstrip_blocks
// to a template's source: "\r\n" and "\r" become "\n", and the spaces
// and tabs before a block or comment tag ({% or {#, not {%+ or {#+)
// are removed when nothing else stands between the start of its line
// and the tag. The engine's own lstrip also strips them after another
// tag on the same line ("{{ x }} {% endfor %}"), which Jinja2 does not.
func lstripBlocks(src string) string {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	b := make([]byte, 0, len(src))
	lineStart := true // only spaces and tabs since the last newline (or the start)
	wsFrom := 0       // where in b those spaces and tabs begin
	for i := 0; i < len(src); {
		c := src[i]
		if c == '{' && i+1 < len(src) && (src[i+1] == '%' || src[i+1] == '#' || src[i+1] == '{') {
			open := src[i+1]
			if open != '{' && lineStart && !(i+2 < len(src) && src[i+2] == '+') {
				b = b[:wsFrom]
			}
			end := tagEnd(src, i, open)
			tag := src[i:end]
			b = append(b, tag...)
			i = end
			lineStart = false
			if open == '%' && isRawTag(tag) {
				j := rawEnd(src, i)
				raw := src[i:j]
				b = append(b, raw...)
				i = j
				// {% endraw %} is stripped as any block tag
				if k := strings.LastIndexByte(raw, '\n'); k >= 0 {
					tail := raw[k+1:]
					lineStart = strings.Trim(tail, " \t") == ""
					wsFrom = len(b) - len(tail)
				}
			}
			continue
		}
		b = append(b, c)
		i++
		switch {
		case c == '\n':
			lineStart, wsFrom = true, len(b)
		case c == ' ' || c == '\t':
		default:
			lineStart = false
		}
	}
	return string(b)
}

// tagEnd returns the index just past the tag opening at src[i:] with
// "{%", "{#" or "{{" (open is '%', '#' or '{'), skipping quoted strings
// inside blocks and expressions; an unclosed tag runs to the end.
func tagEnd(src string, i int, open byte) int {
	closeTag := map[byte]string{'%': "%}", '#': "#}", '{': "}}"}[open]
	j := i + 2
	if open == '#' {
		if k := strings.Index(src[j:], closeTag); k >= 0 {
			return j + k + 2
		}
		return len(src)
	}
	for j < len(src) {
		switch c := src[j]; {
		case c == '\'' || c == '"':
			j++
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			j++
		case strings.HasPrefix(src[j:], closeTag):
			return j + 2
		default:
			j++
		}
	}
	return len(src)
}

// isRawTag says whether a block tag is {% raw %} (with any whitespace
// control).
func isRawTag(tag string) bool {
	inner := strings.TrimSuffix(strings.TrimPrefix(tag, "{%"), "%}")
	inner = strings.Trim(inner, "-+")
	return strings.TrimSpace(inner) == "raw"
}

// rawEnd returns where the {% endraw %} after src[i:] begins (or the end).
func rawEnd(src string, i int) int {
	for j := i; j < len(src); j++ {
		if !strings.HasPrefix(src[j:], "{%") {
			continue
		}
		rest := strings.TrimLeft(src[j+2:], "-+")
		if strings.HasPrefix(strings.TrimLeft(rest, " \t\n"), "endraw") {
			return j
		}
	}
	return len(src)
}
