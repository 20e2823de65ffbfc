package tokenizer

import (
	"errors"
	"strings"
	"unicode/utf8"
)

// Tokenizer is a loaded tokenizer. Its methods are safe for concurrent
// use, except SetModelMaxLength.
type Tokenizer struct {
	model      *bpe
	normalizer normalizer   // nil: none
	pre        preTokenizer // nil: the normalized piece is one word
	decoder    decoder      // nil: tokens joined with spaces
	rawAdded   *addedMatcher
	normAdded  *addedMatcher

	tokens  []string // id -> token string (added tokens override the vocab)
	present []bool   // id has a token; the files may leave gaps
	special map[string]bool

	// Ids added around the text when Encode's addSpecial is set.
	prefixIDs, suffixIDs []int
	bos                  int
	eos                  []int
	pad                  int    // tokenizer_config.json's pad_token; -1 if none
	class                string // tokenizer_config.json's tokenizer_class; "" if unknown

	source         []byte // tokenizer.json, for WriteFiles
	modelMaxLength int    // tokenizer_config.json's model_max_length; 0 if unknown
}

// Encode returns the token ids of text. With addSpecial it adds the
// special tokens the tokenizer's template asks for (Llama: BOS first;
// Qwen: none), as tokenizers' add_special_tokens does. Added tokens
// written in the text ("<s>", "<|im_end|>") are encoded as themselves.
// Invalid UTF-8 is first replaced by U+FFFD.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int {
	ids, _ := t.encode(text, addSpecial, nil, 0)
	return ids
}

// EncodeAtMost is Encode for text that may hold more than limit tokens
// (a prompt against a context): it stops encoding once the ids would pass
// limit and then reports false, so that a text far too long costs about
// limit tokens' work and memory, not its whole length's (the rest of the
// text is not looked at, and a word too long to fit is known by its
// length: no token covers more bytes than the vocabulary's longest).
// With true, the ids are Encode's.
func (t *Tokenizer) EncodeAtMost(text string, addSpecial bool, limit int) ([]int, bool) {
	ids, stopped := t.encode(text, addSpecial, nil, max(limit, 0)+1)
	return ids, !stopped && len(ids) <= limit
}

// errStop unwinds encode's segmenting once its ids are past its stop.
var errStop = errors.New("tokenizer: past the limit")

// encode is Encode; if words is not nil, it also records for each id the
// index of the pre-tokenized word it came from (tokenizers' word ids;
// template tokens get -1). With stop > 0 it encodes nothing more once it
// has, or a word would take it to, stop ids, and reports that it stopped.
func (t *Tokenizer) encode(text string, addSpecial bool, words *[]int, stop int) ([]int, bool) {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	n := len(text)/3 + len(t.prefixIDs) + len(t.suffixIDs) + 1
	if stop > 0 {
		n = min(n, stop+len(t.prefixIDs)+len(t.suffixIDs)+1)
	}
	ids := make([]int, 0, n)
	stopped := false
	full := func() bool {
		stopped = stopped || stop > 0 && len(ids) >= stop
		return stopped
	}
	word := 0
	endWord := func(index int) {
		if words == nil {
			return
		}
		for len(*words) < len(ids) {
			*words = append(*words, index)
		}
		if index >= 0 {
			word++
		}
	}
	if addSpecial {
		ids = append(ids, t.prefixIDs...)
		endWord(-1)
	}
	// once stopped, a panic unwinds the segmenting: the rest of the text
	// is not even scanned
	func() {
		defer func() {
			if r := recover(); r != nil && r != errStop {
				panic(r)
			}
		}()
		t.segment(text, func(id int) {
			if full() {
				panic(errStop)
			}
			ids = append(ids, id)
			endWord(word)
		}, func(w string) {
			if full() {
				panic(errStop)
			}
			if stop > 0 && len(ids)+t.model.atLeast(w) >= stop { // too long, by its length alone
				stopped = true
				panic(errStop)
			}
			ids = t.model.tokenize(w, ids)
			endWord(word)
		})
	}()
	if addSpecial {
		ids = append(ids, t.suffixIDs...)
		endWord(-1)
	}
	return ids, full()
}

// segment runs the steps of encoding before the model: it calls added
// for each added token found in text and word for each pre-tokenized
// word of the rest (in byte-level runes for ByteLevel), in order. The
// model encodes each word on its own; training counts them.
func (t *Tokenizer) segment(text string, added func(id int), word func(w string)) {
	t.rawAdded.split(text, func(start, end, id int) {
		if id >= 0 {
			added(id)
			return
		}
		seg := text[start:end]
		if t.normalizer != nil {
			seg = t.normalizer.normalize(seg)
		}
		first := start == 0
		t.normAdded.split(seg, func(s, e, id int) {
			if id >= 0 {
				added(id)
				return
			}
			p := piece{text: seg[s:e], first: first && s == 0}
			if t.pre == nil {
				word(p.text)
				return
			}
			t.pre.preTokenize(p, func(w piece) { word(w.text) })
		})
	})
}

// Decode returns the text of ids. With skipSpecial, special tokens
// (BOS, EOS, "<|im_end|>", ...) are left out. Ids outside the vocabulary
// are ignored, as tokenizers does.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if tok, ok := t.decodable(id, skipSpecial); ok {
			toks = append(toks, tok)
		}
	}
	return t.decodeTokens(toks)
}

// decodable returns the token string of id if Decode would use it.
func (t *Tokenizer) decodable(id int, skipSpecial bool) (string, bool) {
	if id < 0 || id >= len(t.tokens) {
		return "", false
	}
	if !t.present[id] {
		return "", false
	}
	tok := t.tokens[id]
	if skipSpecial && t.special[tok] {
		return "", false
	}
	return tok, true
}

func (t *Tokenizer) decodeTokens(toks []string) string {
	if t.decoder == nil {
		return strings.Join(toks, " ")
	}
	return strings.Join(t.decoder.decodeChain(toks), "")
}

// BOS returns the beginning-of-sequence id, or -1 if there is none.
func (t *Tokenizer) BOS() int { return t.bos }

// EOS returns the ids that end generation; empty if none is known.
func (t *Tokenizer) EOS() []int { return append([]int(nil), t.eos...) }

// VocabSize returns the number of ids: one more than the largest id of
// the vocabulary and the added tokens.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenString returns the vocabulary string of id ("▁the", "Ġthe",
// "<0x0A>", "<s>"), or "" if id is out of range.
func (t *Tokenizer) TokenString(id int) string {
	if id < 0 || id >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// TokenID returns the id of a vocabulary or added-token string.
func (t *Tokenizer) TokenID(token string) (int, bool) {
	if t.rawAdded != nil {
		for _, m := range t.rawAdded.tokens {
			if m.tok.Content == token {
				return m.id, true
			}
		}
	}
	if t.normAdded != nil {
		for _, m := range t.normAdded.tokens {
			if m.tok.Content == token {
				return m.id, true
			}
		}
	}
	id, ok := t.model.vocab[token]
	return id, ok
}

// IsSpecial reports whether id is a special token (skipped by Decode
// with skipSpecial).
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.tokens) && t.special[t.tokens[id]]
}
