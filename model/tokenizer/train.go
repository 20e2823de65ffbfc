package tokenizer

import (
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// BuiltinCorpus is a small English, code and multilingual text for
// TrainSentencePieceBPE and TrainByteLevelBPE, so test models need no
// download.
//
//go:embed corpus.txt
var BuiltinCorpus string

const (
	spaceMarker = "▁"
	// trainedModelMaxLength is the model_max_length WriteFiles records for
	// trained tokenizers unless SetModelMaxLength says otherwise.
	trainedModelMaxLength = 32768
	baseVocab             = 3 + 256 + 1 // specials, bytes, "▁"
)

// TrainSentencePieceBPE trains a SentencePiece-style BPE tokenizer with
// byte fallback, shaped like Mixtral's: ids 0-2 are <unk>, <s>, </s>,
// then the 256 "<0xXX>" byte tokens, then "▁" and the corpus' characters
// (most frequent first, as many as fit), then merges learned greedily:
// each step merges the most frequent pair of neighbouring symbols (ties:
// the pair whose strings sort first) until the vocabulary has vocabSize
// entries or no pair occurs twice. Words are split before each run of
// "▁" and around line breaks, so merges never cross words. The result is
// deterministic.
func TrainSentencePieceBPE(corpus string, vocabSize int) (*Tokenizer, error) {
	if vocabSize < baseVocab {
		return nil, fmt.Errorf("tokenizer: vocab size %d is below the %d base tokens", vocabSize, baseVocab)
	}
	if !utf8.ValidString(corpus) {
		return nil, errors.New("tokenizer: training corpus is not valid UTF-8")
	}
	tr := newSentencePieceTrainer(corpus, vocabSize)
	tr.learn(vocabSize)
	data, err := sentencePieceJSON(tr.tokens, tr.merges)
	if err != nil {
		return nil, err
	}
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: trained tokenizer does not load: %w", err)
	}
	t.modelMaxLength = trainedModelMaxLength
	return t, nil
}

// byteLevelSpecials are the added tokens of TrainByteLevelBPE, numbered
// after the BPE vocabulary as in Qwen2's and Qwen3's files.
var byteLevelSpecials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// TrainByteLevelBPE trains a byte-level BPE tokenizer shaped like
// Qwen2's and Qwen3's: NFC, the Qwen2 split regex and the ByteLevel
// pre-tokenizer and decoder, ids 0-255 the byte-level runes (GPT-2's
// alphabet, in code point order as Qwen numbers them), then the merges'
// results, then the added tokens <|endoftext|>, <|im_start|> and
// <|im_end|>. Its tokenizer_config.json (WriteFiles) names no BOS,
// <|im_end|> as EOS and <|endoftext|> as padding, as Qwen's does.
//
// vocabSize counts the BPE vocabulary and the three added tokens. Merges
// are learned as in TrainSentencePieceBPE, over the words the Qwen2
// regex splits the corpus into, so merges never cross them; a corpus too
// small to give vocabSize tokens (no pair left that occurs twice) gives
// fewer. The result is deterministic.
func TrainByteLevelBPE(corpus string, vocabSize int) (*Tokenizer, error) {
	if base := 256 + len(byteLevelSpecials); vocabSize < base {
		return nil, fmt.Errorf("tokenizer: vocab size %d is below the %d base tokens", vocabSize, base)
	}
	if !utf8.ValidString(corpus) {
		return nil, errors.New("tokenizer: training corpus is not valid UTF-8")
	}
	tr, err := newByteLevelTrainer(corpus)
	if err != nil {
		return nil, err
	}
	tr.learn(vocabSize - len(byteLevelSpecials))
	data, err := byteLevelBPEJSON(tr.tokens, tr.merges, byteLevelSpecials)
	if err != nil {
		return nil, err
	}
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: trained tokenizer does not load: %w", err)
	}
	t.modelMaxLength = trainedModelMaxLength
	if id, ok := t.TokenID("<|endoftext|>"); ok {
		t.pad = id
	}
	t.class = "Qwen2Tokenizer"
	return t, nil
}

// newByteLevelTrainer starts TrainByteLevelBPE's training: the 256
// byte-level runes and the corpus' words as the untrained tokenizer
// splits them, which is exactly how encoding will split text.
func newByteLevelTrainer(corpus string) (*trainer, error) {
	tr := newTrainer()
	for _, s := range byteLevelAlphabet() {
		tr.add(s, true)
	}
	for _, s := range byteLevelSpecials {
		tr.banned[s] = true
	}
	data, err := byteLevelBPEJSON(tr.tokens, nil, byteLevelSpecials)
	if err != nil {
		return nil, err
	}
	empty, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: untrained tokenizer does not load: %w", err)
	}
	wordFreq := make(map[string]int)
	empty.segment(corpus, func(int) {}, func(w string) { wordFreq[w]++ })
	tr.setWords(wordFreq)
	return tr, nil
}

// byteLevelAlphabet returns the 256 byte-level runes in code point
// order, the order of ids 0-255 in Qwen's and GPT-2's vocabularies.
func byteLevelAlphabet() []string {
	runes := byteToRune
	slices.Sort(runes[:])
	out := make([]string, len(runes))
	for i, r := range runes {
		out[i] = string(r)
	}
	return out
}

// trainer holds the state of BPE training.
type trainer struct {
	tokens  []string
	ids     map[string]int
	banned  map[string]bool // merge results that would shadow a special or byte token
	words   [][]int32       // symbol ids per distinct word; -1 breaks pairs
	freq    []int
	counts  map[uint64]int
	where   map[uint64][]int32
	merges  [][2]string
	heap    minHeap[pairEntry] // by count, then by the pair's strings
	visited []int              // word -> last merge step that rewrote it
}

func newTrainer() *trainer {
	return &trainer{ids: make(map[string]int), banned: make(map[string]bool)}
}

// add appends s to the vocabulary; base tokens are banned as merge
// results so that no merge shadows them.
func (tr *trainer) add(s string, base bool) {
	tr.ids[s] = len(tr.tokens)
	tr.tokens = append(tr.tokens, s)
	if base {
		tr.banned[s] = true
	}
}

// newSentencePieceTrainer starts TrainSentencePieceBPE's training: the
// specials, byte tokens, "▁" and the corpus' characters, and its words.
func newSentencePieceTrainer(corpus string, vocabSize int) *trainer {
	tr := newTrainer()
	for _, s := range []string{"<unk>", "<s>", "</s>"} {
		tr.add(s, true)
	}
	for b := 0; b < 256; b++ {
		tr.add(byteTokenName(byte(b)), true)
	}
	tr.add(spaceMarker, false)

	text := ""
	if corpus != "" {
		text = spaceMarker + strings.ReplaceAll(corpus, " ", spaceMarker)
	}
	runeFreq := make(map[rune]int)
	for _, r := range text {
		runeFreq[r]++
	}
	chars := make([]rune, 0, len(runeFreq))
	for r := range runeFreq {
		if _, ok := tr.ids[string(r)]; !ok {
			chars = append(chars, r)
		}
	}
	sort.Slice(chars, func(i, j int) bool {
		if runeFreq[chars[i]] != runeFreq[chars[j]] {
			return runeFreq[chars[i]] > runeFreq[chars[j]]
		}
		return chars[i] < chars[j]
	})
	for _, r := range chars {
		if len(tr.tokens) >= vocabSize {
			break
		}
		tr.add(string(r), false)
	}

	wordFreq := make(map[string]int)
	splitWords(text, func(w string) { wordFreq[w]++ })
	tr.setWords(wordFreq)
	return tr
}

// setWords loads the training words with their frequencies: each word's
// characters are its first symbols (a character not in the vocabulary
// breaks the pairs around it).
func (tr *trainer) setWords(wordFreq map[string]int) {
	words := make([]string, 0, len(wordFreq))
	for w := range wordFreq {
		words = append(words, w)
	}
	sort.Strings(words)
	tr.counts = make(map[uint64]int)
	tr.where = make(map[uint64][]int32)
	for i, w := range words {
		syms := make([]int32, 0, len(w))
		for _, r := range w {
			id, ok := tr.ids[string(r)]
			if !ok {
				id = -1
			}
			syms = append(syms, int32(id))
		}
		tr.words = append(tr.words, syms)
		tr.freq = append(tr.freq, wordFreq[w])
		tr.addPairs(i, +1)
	}
	tr.visited = make([]int, len(tr.words))
	for k, n := range tr.counts {
		tr.heap.push(tr.entry(k, n))
	}
}

// splitWords calls f for each training word of the normalized text: a
// run of "▁" with the characters up to the next "▁" or line break, or a
// run of line breaks.
func splitWords(text string, f func(string)) {
	isBreak := func(r rune) bool { return r == '\n' || r == '\r' }
	for i := 0; i < len(text); {
		start := i
		r, _ := utf8.DecodeRuneInString(text[i:])
		if isBreak(r) {
			for i < len(text) {
				r, n := utf8.DecodeRuneInString(text[i:])
				if !isBreak(r) {
					break
				}
				i += n
			}
			f(text[start:i])
			continue
		}
		for strings.HasPrefix(text[i:], spaceMarker) {
			i += len(spaceMarker)
		}
		for i < len(text) {
			r, n := utf8.DecodeRuneInString(text[i:])
			if isBreak(r) || strings.HasPrefix(text[i:], spaceMarker) {
				break
			}
			i += n
		}
		f(text[start:i])
	}
}

// addPairs adds (sign +1) or removes (-1) the pairs of word w to the
// counts, pushing the changed counts onto the heap when removing is done.
func (tr *trainer) addPairs(w int, sign int) {
	syms := tr.words[w]
	for i := 0; i+1 < len(syms); i++ {
		if syms[i] < 0 || syms[i+1] < 0 {
			continue
		}
		k := pairKey(int(syms[i]), int(syms[i+1]))
		tr.counts[k] += sign * tr.freq[w]
		if sign > 0 {
			tr.where[k] = append(tr.where[k], int32(w))
		}
	}
}

func (tr *trainer) entry(k uint64, n int) pairEntry {
	return pairEntry{count: n, a: tr.tokens[k>>32], b: tr.tokens[uint32(k)], key: k}
}

// learn merges pairs until the vocabulary is full or no pair occurs
// twice.
func (tr *trainer) learn(vocabSize int) {
	for step := 1; len(tr.tokens) < vocabSize && len(tr.heap) > 0; {
		top := tr.heap.pop()
		if tr.counts[top.key] != top.count {
			continue // stale
		}
		if top.count < 2 {
			break
		}
		merged := top.a + top.b
		if tr.banned[merged] {
			continue // the pair stays unmerged for good
		}
		id, ok := tr.ids[merged]
		if !ok {
			id = len(tr.tokens)
			tr.ids[merged] = id
			tr.tokens = append(tr.tokens, merged)
		}
		tr.merges = append(tr.merges, [2]string{top.a, top.b})
		a, b := int32(top.key>>32), int32(uint32(top.key))
		touched := make(map[uint64]bool)
		for _, w := range tr.where[top.key] {
			if tr.visited[w] == step {
				continue
			}
			tr.visited[w] = step
			tr.rewrite(int(w), a, b, int32(id), touched)
		}
		delete(tr.where, top.key)
		keys := make([]uint64, 0, len(touched))
		for k := range touched {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
		for _, k := range keys {
			if n := tr.counts[k]; n > 0 {
				tr.heap.push(tr.entry(k, n))
			}
		}
		step++
	}
}

// rewrite replaces the pairs (a, b) of word w by c, left to right.
func (tr *trainer) rewrite(w int, a, b, c int32, touched map[uint64]bool) {
	syms := tr.words[w]
	found := false
	for i := 0; i+1 < len(syms); i++ {
		if syms[i] == a && syms[i+1] == b {
			found = true
			break
		}
	}
	if !found {
		return
	}
	mark := func() {
		for i := 0; i+1 < len(syms); i++ {
			if syms[i] >= 0 && syms[i+1] >= 0 {
				touched[pairKey(int(syms[i]), int(syms[i+1]))] = true
			}
		}
	}
	mark()
	tr.addPairs(w, -1)
	out := syms[:0:0]
	for i := 0; i < len(syms); i++ {
		if i+1 < len(syms) && syms[i] == a && syms[i+1] == b {
			out = append(out, c)
			i++
			continue
		}
		out = append(out, syms[i])
	}
	tr.words[w] = out
	syms = out
	tr.addPairs(w, +1)
	mark()
}

// pairEntry is a candidate merge with its count when pushed.
type pairEntry struct {
	count int
	a, b  string
	key   uint64
}

//lint:ignore U1000 used through minHeap's type constraint
func (x pairEntry) less(y pairEntry) bool {
	if x.count != y.count {
		return x.count > y.count
	}
	if x.a != y.a {
		return x.a < y.a
	}
	return x.b < y.b
}
