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
	// forced: the answer is calls alone, so what is held at the end
	// that could begin one (its opening tag cut short) is not content
	forced bool
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
		keep := begun(text, f.syntax.open) // what could still begin a call
		emit := text[:len(text)-keep]
		trimmed := strings.TrimRight(emit, " \t\n\r")
		out.WriteString(trimmed)
		f.held = emit[len(trimmed):] + text[len(text)-keep:]
		return out.String(), calls
	}
}

// Flush returns what is held at the end. A call cut short (the answer
// ended at its token limit inside it) whose JSON reads so far is a call
// when its name is whole, with the arguments as far as they came (as
// OpenAI gives a call cut by max_tokens), and nothing when it is not: a
// call's tags never reach the content. One whose text is not JSON is
// content, as a whole call's is. Whitespace after the last call is not
// content, nor, when the calls are forced, an opening tag cut short.
func (f *toolFilter) Flush() (content string, calls []toolCall) {
	held := f.held
	f.held = ""
	if f.inCall {
		f.inCall = false
		whole := held[:len(held)-begun(held, f.syntax.close)]
		if call, ok := f.parse(whole); ok { // all but its closing tag
			return "", []toolCall{call}
		}
		body := strings.TrimSpace(held)
		if body != "" && !cutShort(body) {
			return f.syntax.open + held, nil
		}
		if name, args, ok := unfinishedCall(body); ok {
			return "", []toolCall{f.number(name, args)}
		}
		return "", nil
	}
	if f.calls > 0 && strings.TrimSpace(held) == "" || f.forced && strings.HasPrefix(f.syntax.open, strings.TrimSpace(held)) {
		return "", nil
	}
	return held, nil
}

// unfinishedCall reads the name and the arguments so far (their text as
// generated) out of body, a call's JSON cut short; ok is false when the
// name is not whole yet.
func unfinishedCall(body string) (name, args string, ok bool) {
	dec := json.NewDecoder(strings.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", "", false
	}
	for {
		key, err := dec.Token()
		if err != nil {
			return name, "", ok
		}
		switch key {
		case "name":
			t, err := dec.Token()
			if err != nil {
				return "", "", false
			}
			name, ok = t.(string)
		case "arguments":
			rest := strings.TrimLeft(body[dec.InputOffset():], " \t\n\r")
			return name, strings.TrimLeft(strings.TrimPrefix(rest, ":"), " \t\n\r"), ok
		default:
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return name, "", ok
			}
		}
	}
}

// begun is the length of the longest tail of text that begins tag (and
// is not all of it): a tag cut short at the end of the text so far.
func begun(text, tag string) int {
	for n := min(len(tag)-1, len(text)); n > 0; n-- {
		if strings.HasSuffix(text, tag[:n]) {
			return n
		}
	}
	return 0
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
	return f.number(c.Name, args.String()), true
}

// number makes the filter's next call.
func (f *toolFilter) number(name, args string) toolCall {
	index := f.calls
	f.calls++
	call := toolCall{Index: &index, ID: "call_" + randomID(), Type: "function"}
	call.Function.Name, call.Function.Arguments = name, args
	return call
}
