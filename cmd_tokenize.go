package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/odmoe/odmoe/model/tokenizer"
)

func runTokenize(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("tokenize", stderr)
	file := fs.String("tokenizer", "", "tokenizer.json to use")
	dir := fs.String("model", "", "model directory (its tokenizer.json and tokenizer_config.json)")
	jsonl := fs.Bool("jsonl", false, "each stdin line is a JSON string; print one JSON array of ids per line")
	special := fs.Bool("special", false, "add special tokens (BOS) as the model's tokenizer config says")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var tok *tokenizer.Tokenizer
	var err error
	switch {
	case *file != "" && *dir != "":
		return usagef("give -tokenizer or -model, not both")
	case *file != "":
		tok, err = tokenizer.Load(*file)
	case *dir != "":
		tok, err = tokenizer.LoadDir(*dir)
	default:
		return usagef("-tokenizer or -model is required")
	}
	if err != nil {
		return err
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	if !*jsonl {
		text, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		return writeIDs(w, tok.Encode(string(text), *special))
	}
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		var s string
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return fmt.Errorf("stdin line %d is not a JSON string: %w", line, err)
		}
		if err := writeIDs(w, tok.Encode(s, *special)); err != nil {
			return err
		}
	}
	return sc.Err()
}

func writeIDs(w io.Writer, ids []int) error {
	if ids == nil {
		ids = []int{}
	}
	b, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
