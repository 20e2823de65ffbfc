package chat

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// RenderJSON renders the conversation of one JSON object, its keys the
// template's variables in the order written ({"messages": [...],
// "add_generation_prompt": true, "tools": [...], ...}).
func (t *Template) RenderJSON(data []byte) (string, error) {
	v, err := DecodeJSON(data)
	if err != nil {
		return "", err
	}
	obj, ok := v.(Object)
	if !ok {
		return "", errors.New(`want a JSON object {"messages": [...], ...}`)
	}
	vars := make(map[string]any, len(obj))
	for _, m := range obj {
		vars[m.Key] = m.Value
	}
	return t.Render(vars)
}

// RenderJSONLines renders each line of r, one JSON object as RenderJSON
// reads it (blank lines skipped), and writes each prompt to w as a JSON
// string a line; an error names the line.
func (t *Template) RenderJSONLines(r io.Reader, w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		text, err := t.RenderJSON(sc.Bytes())
		if err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		if err := enc.Encode(text); err != nil {
			return err
		}
	}
	return sc.Err()
}
