package tokenizer

import "strings"

// StreamDecoder turns ids into text one id at a time, for printing
// generated text as it comes. Special tokens are skipped. The text of
// all Next calls followed by Flush equals Decode(ids, true) of the ids
// fed: Next holds text back while it may still change (an incomplete
// UTF-8 sequence of byte tokens, a run of "<0xXX>" tokens that a later
// byte could invalidate), and it keeps the last chunk's ids as context
// so that the first token's leading-space strip happens only once.
//
// It follows tokenizers' DecodeStream. A StreamDecoder is not safe for
// concurrent use.
type StreamDecoder struct {
	t *Tokenizer
	// ids are the ids since the chunk before the last one; prefix is the
	// decoding of ids[:prefixIndex], already returned.
	ids         []int
	prefix      string
	prefixIndex int
	holdBytes   bool
}

// NewStreamDecoder returns a decoder for a new text.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t, holdBytes: t.decoder != nil && hasByteFallback(t.decoder)}
}

// Next feeds one id and returns the text that is now complete, possibly
// "".
func (d *StreamDecoder) Next(id int) string {
	d.ids = append(d.ids, id)
	if d.holdBytes && d.inByteRun() {
		return ""
	}
	s := d.t.Decode(d.ids, true)
	if len(s) <= len(d.prefix) || strings.HasSuffix(s, "\uFFFD") || !strings.HasPrefix(s, d.prefix) {
		return ""
	}
	out := s[len(d.prefix):]
	next := len(d.ids) - d.prefixIndex
	d.ids = append(d.ids[:0], d.ids[d.prefixIndex:]...)
	d.prefix = d.t.Decode(d.ids, true)
	d.prefixIndex = next
	return out
}

// Flush returns the text held back and resets the decoder; ids fed
// after it start a new text.
func (d *StreamDecoder) Flush() string {
	s := d.t.Decode(d.ids, true)
	out := ""
	if len(s) > len(d.prefix) && strings.HasPrefix(s, d.prefix) {
		out = s[len(d.prefix):]
	}
	d.ids, d.prefix, d.prefixIndex = d.ids[:0], "", 0
	return out
}

// inByteRun reports whether the last decodable id is a byte-fallback
// token, whose run a following byte token could still turn into U+FFFDs.
func (d *StreamDecoder) inByteRun() bool {
	for i := len(d.ids) - 1; i >= 0; i-- {
		if tok, ok := d.t.decodable(d.ids[i], true); ok {
			_, isByte := byteTokenValue(tok)
			return isByte
		}
	}
	return false
}
