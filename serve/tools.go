package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

// toolFilter splits generated text into content and tool calls in a
// template's syntax. Text arrives in pieces and a call's tags may span
// them, so it holds back what could still begin a call, a call until it
// closes, and whitespace until something follows it (the newlines
// between calls are not content). A call whose JSON does not read as
// {"name": ..., "arguments": {...}} stays content, tags and all.
type toolFilter struct {
	syntax *toolSyntax
	held   string
	inCall bool
	calls  int
}

// Push feeds a piece and returns the content now safe to emit and the
// calls that closed.
func (f *toolFilter) Push(piece string) (content string, calls []toolCall) {
	text := f.held + piece
	var out strings.Builder
	for {
		if f.inCall {
			// the call ends at the first closing tag after a body that is
			// not JSON cut short: one inside the arguments' strings (a
			// value holding "</tool_call>") is passed over
			end, from := -1, 0
			for {
				i := strings.Index(text[from:], f.syntax.close)
				if i < 0 {
					break
				}
				if !cutShort(text[:from+i]) {
					end = from + i
					break
				}
				from += i + len(f.syntax.close)
			}
			if end < 0 {
				f.held = text
				return out.String(), calls
			}
			body := text[:end]
			text, f.inCall = text[end+len(f.syntax.close):], false
			if call, ok := f.parse(body); ok {
				calls = append(calls, call)
				continue
			}
			out.WriteString(f.syntax.open + body + f.syntax.close)
			continue
		}
		if start := strings.Index(text, f.syntax.open); start >= 0 {
			out.WriteString(strings.TrimRight(text[:start], " \t\n\r")) // whitespace before a call is not content
			text, f.inCall = text[start+len(f.syntax.open):], true
			continue
		}
		keep := 0 // the longest tail that could begin the opening tag
		for n := min(len(f.syntax.open)-1, len(text)); n > 0; n-- {
			if strings.HasSuffix(text, f.syntax.open[:n]) {
				keep = n
				break
			}
		}
		emit := text[:len(text)-keep]
		trimmed := strings.TrimRight(emit, " \t\n\r")
		out.WriteString(trimmed)
		f.held = emit[len(trimmed):] + text[len(text)-keep:]
		return out.String(), calls
	}
}

// Flush returns what is held at the end: an unclosed call is content,
// whitespace after the last call is not.
func (f *toolFilter) Flush() string {
	held := f.held
	f.held = ""
	if f.inCall {
		f.inCall = false
		return f.syntax.open + held
	}
	if f.calls > 0 && strings.TrimSpace(held) == "" {
		return ""
	}
	return held
}

// cutShort reports whether body is JSON that ends too soon: what comes
// next may still complete it.
func cutShort(body string) bool {
	body = strings.TrimSpace(body)
	var v json.RawMessage
	var se *json.SyntaxError
	err := json.Unmarshal([]byte(body), &v)
	return errors.As(err, &se) && se.Offset >= int64(len(body)) && strings.HasPrefix(body, "{")
}

// parse reads a call's body, numbering it.
func (f *toolFilter) parse(body string) (toolCall, bool) {
	var c struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	var args bytes.Buffer
	if json.Unmarshal([]byte(strings.TrimSpace(body)), &c) != nil || c.Name == "" || json.Compact(&args, c.Arguments) != nil || !bytes.HasPrefix(args.Bytes(), []byte("{")) {
		return toolCall{}, false
	}
	index := f.calls
	f.calls++
	call := toolCall{Index: &index, ID: "call_" + randomID(), Type: "function"}
	call.Function.Name, call.Function.Arguments = c.Name, args.String()
	return call, true
}
