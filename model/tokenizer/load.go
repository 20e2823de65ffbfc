package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Load reads a tokenizer.json file. BOS is the first special token of
// the post-processor's template; EOS is the template's trailing token,
// or else the file's special tokens with a usual end-of-text name
// ("</s>", "<|im_end|>", "<|endoftext|>", ...). LoadDir also reads the
// model's configuration files, which are the authority for both.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return t, nil
}

// fileJSON is the top level of tokenizer.json. truncation and padding
// are ignored: Encode never truncates or pads.
type fileJSON struct {
	Version       *string         `json:"version"`
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

// parse builds a Tokenizer from the contents of a tokenizer.json.
func parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	if f.Version != nil && *f.Version != "1.0" {
		return nil, fmt.Errorf("version %q is not supported", *f.Version)
	}
	if isNull(f.Model) {
		return nil, errors.New("model is missing")
	}
	t := &Tokenizer{source: data, bos: -1, pad: -1}
	var err error
	if t.model, err = parseBPE(f.Model); err != nil {
		return nil, err
	}
	if t.normalizer, err = parseNormalizer(f.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer, "pre_tokenizer"); err != nil {
		return nil, err
	}
	if t.decoder, err = parseDecoder(f.Decoder, "decoder"); err != nil {
		return nil, err
	}
	t.setAddedTokens(f.AddedTokens)
	if t.prefixIDs, t.suffixIDs, err = parsePostProcessor(f.PostProcessor, "post_processor", t); err != nil {
		return nil, err
	}
	t.defaultSpecialIDs()
	return t, nil
}

// bpeJSON is tokenizer.json's model object.
type bpeJSON struct {
	Type                    *string         `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 *bool           `json:"fuse_unk"`
	ByteFallback            *bool           `json:"byte_fallback"`
	IgnoreMerges            *bool           `json:"ignore_merges"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

func parseBPE(raw json.RawMessage) (*bpe, error) {
	var c bpeJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if c.Type != nil && *c.Type != "BPE" {
		return nil, fmt.Errorf("model.type %q is not supported", *c.Type)
	}
	if c.Vocab == nil {
		return nil, errors.New("model.vocab is missing")
	}
	if c.Type == nil && isNull(c.Merges) {
		return nil, errors.New("model.type is missing and the model has no merges: only BPE is supported")
	}
	if c.Dropout != nil && *c.Dropout != 0 {
		return nil, fmt.Errorf("model.dropout %v is not supported (it makes encoding random)", *c.Dropout)
	}
	m := &bpe{
		vocab:        c.Vocab,
		unkID:        -1,
		fuseUnk:      c.FuseUnk != nil && *c.FuseUnk,
		byteFallback: c.ByteFallback != nil && *c.ByteFallback,
		ignoreMerges: c.IgnoreMerges != nil && *c.IgnoreMerges,
	}
	if c.ContinuingSubwordPrefix != nil {
		m.prefix = *c.ContinuingSubwordPrefix
	}
	if c.EndOfWordSuffix != nil {
		m.suffix = *c.EndOfWordSuffix
	}
	for tok, id := range c.Vocab {
		if id < 0 || id >= 1<<31 {
			return nil, fmt.Errorf("model.vocab[%q] = %d: ids must be in [0, 2^31)", tok, id)
		}
		m.maxCover = max(m.maxCover, len(tok))
	}
	if c.UnkToken != nil {
		id, ok := c.Vocab[*c.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in model.vocab", *c.UnkToken)
		}
		m.unkID = id
		if m.fuseUnk && !m.byteFallback {
			m.maxCover = 0 // one <unk> covers a run of unknown characters of any length
		}
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
		if id, ok := c.Vocab[byteTokenName(byte(b))]; ok {
			m.byteIDs[b] = id
		}
	}
	pairs, err := parseMerges(c.Merges)
	if err != nil {
		return nil, err
	}
	m.merges = make(map[uint64]mergeRule, len(pairs))
	for rank, p := range pairs {
		a, ok := c.Vocab[p[0]]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: token %q is not in model.vocab", rank, p[0])
		}
		b, ok := c.Vocab[p[1]]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: token %q is not in model.vocab", rank, p[1])
		}
		// The right token loses continuing_subword_prefix's length.
		if len(p[1]) < len(m.prefix) {
			return nil, fmt.Errorf("model.merges[%d]: token %q is shorter than continuing_subword_prefix %q", rank, p[1], m.prefix)
		}
		merged := p[0] + p[1][len(m.prefix):]
		id, ok := c.Vocab[merged]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: merged token %q is not in model.vocab", rank, merged)
		}
		// A later duplicate overrides an earlier one, as in tokenizers.
		m.merges[pairKey(a, b)] = mergeRule{rank: int32(rank), id: int32(id)}
	}
	return m, nil
}

// parseMerges reads model.merges in either form: "a b" strings (split on
// the single space, "#version" lines skipped) or ["a", "b"] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var legacy []string
	if err := json.Unmarshal(raw, &legacy); err == nil {
		out := make([][2]string, 0, len(legacy))
		for i, line := range legacy {
			if strings.HasPrefix(line, "#version") {
				continue
			}
			a, b, ok := strings.Cut(line, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("model.merges[%d] %q: want two tokens separated by one space", i, line)
			}
			out = append(out, [2]string{a, b})
		}
		return out, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, errors.New(`model.merges: want a list of "a b" strings or of ["a", "b"] pairs`)
	}
	out := make([][2]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("model.merges[%d]: want a pair, got %d strings", i, len(p))
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

// setAddedTokens registers added_tokens the way tokenizers'
// AddedVocabulary::add_tokens does: a token already in the vocabulary
// keeps its id, a new one gets the next free id after the vocabulary.
func (t *Tokenizer) setAddedTokens(list []addedToken) {
	m := t.model
	maxID := -1
	for _, id := range m.vocab {
		maxID = max(maxID, id)
	}
	byID := make(map[int]addedToken)
	var order []int
	contentID := make(map[string]int)
	nextID := len(m.vocab)
	for _, a := range list {
		if a.Content == "" {
			continue
		}
		id, ok := contentID[a.Content]
		if !ok {
			id, ok = m.vocab[a.Content]
		}
		if !ok {
			id = nextID
			nextID++
		}
		contentID[a.Content] = id
		if _, seen := byID[id]; !seen {
			order = append(order, id)
		}
		byID[id] = a
		maxID = max(maxID, id)
	}

	t.tokens = make([]string, maxID+1)
	t.present = make([]bool, maxID+1)
	for tok, id := range m.vocab {
		t.tokens[id] = tok
		t.present[id] = true
	}
	t.special = make(map[string]bool)
	var raw, normed []matchToken
	for _, id := range order {
		a := byID[id]
		pattern := a.Content
		if a.Normalized && t.normalizer != nil {
			pattern = t.normalizer.normalize(pattern)
		}
		t.tokens[id] = pattern
		t.present[id] = true
		if a.Special {
			t.special[a.Content] = true
		}
		if pattern == "" {
			continue
		}
		mt := matchToken{pattern: pattern, id: id, tok: a}
		if a.Normalized {
			normed = append(normed, mt)
		} else {
			raw = append(raw, mt)
		}
	}
	t.rawAdded = newAddedMatcher(raw)
	t.normAdded = newAddedMatcher(normed)
}

// parsePostProcessor returns the ids that add_special_tokens puts before
// and after a single sequence.
func parsePostProcessor(raw json.RawMessage, path string, t *Tokenizer) (prefix, suffix []int, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	var c struct {
		Type          string                     `json:"type"`
		Processors    []json.RawMessage          `json:"processors"`
		Single        []map[string]templateEntry `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int `json:"ids"`
		} `json:"special_tokens"`
		Sep *[2]json.RawMessage `json:"sep"`
		Cls *[2]json.RawMessage `json:"cls"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil, nil
	case "Sequence":
		for i, r := range c.Processors {
			p, s, err := parsePostProcessor(r, fmt.Sprintf("%s.processors[%d]", path, i), t)
			if err != nil {
				return nil, nil, err
			}
			prefix = append(p, prefix...)
			suffix = append(suffix, s...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		seen := false
		for i, entry := range c.Single {
			for kind, e := range entry {
				switch kind {
				case "Sequence":
					if e.ID != "A" || seen {
						return nil, nil, fmt.Errorf("%s.single[%d]: sequence %q is not supported (want one A)", path, i, e.ID)
					}
					seen = true
				case "SpecialToken":
					st, ok := c.SpecialTokens[e.ID]
					if !ok {
						return nil, nil, fmt.Errorf("%s.single[%d]: special token %q is not in special_tokens", path, i, e.ID)
					}
					if seen {
						suffix = append(suffix, st.IDs...)
					} else {
						prefix = append(prefix, st.IDs...)
					}
				default:
					return nil, nil, fmt.Errorf("%s.single[%d]: %q is not supported", path, i, kind)
				}
			}
		}
		if !seen {
			return nil, nil, fmt.Errorf("%s.single: the template has no sequence A", path)
		}
		return prefix, suffix, nil
	case "RobertaProcessing", "BertProcessing":
		if c.Cls == nil || c.Sep == nil {
			return nil, nil, fmt.Errorf("%s: cls and sep are required", path)
		}
		var cls, sep int
		if err := json.Unmarshal(c.Cls[1], &cls); err != nil {
			return nil, nil, fmt.Errorf("%s.cls: %w", path, err)
		}
		if err := json.Unmarshal(c.Sep[1], &sep); err != nil {
			return nil, nil, fmt.Errorf("%s.sep: %w", path, err)
		}
		return []int{cls}, []int{sep}, nil
	}
	return nil, nil, fmt.Errorf("%s.type %q is not supported", path, c.Type)
}

type templateEntry struct {
	ID string `json:"id"`
}

// endNames are special tokens that usually end generation, in the order
// EOS lists them when no configuration file says otherwise.
var endNames = []string{"</s>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<eos>", "<end_of_turn>"}

// defaultSpecialIDs sets BOS and EOS from the file alone.
func (t *Tokenizer) defaultSpecialIDs() {
	t.bos = -1
	if len(t.prefixIDs) > 0 {
		t.bos = t.prefixIDs[0]
	}
	t.eos = nil
	if len(t.suffixIDs) > 0 {
		t.eos = []int{t.suffixIDs[len(t.suffixIDs)-1]}
		return
	}
	for _, name := range endNames {
		if id, ok := t.TokenID(name); ok && t.special[name] {
			t.eos = append(t.eos, id)
		}
	}
}
