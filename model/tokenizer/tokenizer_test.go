package tokenizer

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// tinySentencePiece builds a Mixtral-shaped tokenizer whose vocabulary is
// the three specials, the 256 byte tokens and extra, with merges.
func tinySentencePiece(t testing.TB, extra []string, merges [][2]string, edit func(string) string) *Tokenizer {
	t.Helper()
	tokens := []string{"<unk>", "<s>", "</s>"}
	for b := 0; b < 256; b++ {
		tokens = append(tokens, byteTokenName(byte(b)))
	}
	tokens = append(tokens, extra...)
	data, err := sentencePieceJSON(tokens, merges)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		data = []byte(edit(string(data)))
	}
	tok, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// byteLevelJSON is a Qwen-shaped tokenizer.json: the 256 byte-level
// runes, a few merges, NFC, the Qwen2 split regex and an added special.
func byteLevelJSON() []byte {
	var vocab []string
	for b := 0; b < 256; b++ {
		vocab = append(vocab, jsonString(byteToStr[b])+": "+strconv.Itoa(b))
	}
	extra := []string{"Ġt", "he", "Ġthe", "ä¸", "ä¸Ń", "Ġä¸Ń"}
	for i, s := range extra {
		vocab = append(vocab, jsonString(s)+": "+strconv.Itoa(256+i))
	}
	return []byte(`{"version": "1.0", "added_tokens": [
  {"id": 262, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 263, "content": "<think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}],
 "normalizer": {"type": "NFC"},
 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
   {"type": "Split", "pattern": {"Regex": ` + jsonString(patternQwen2) + `}, "behavior": "Isolated", "invert": false},
   {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
 "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
 "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
 "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "", "end_of_word_suffix": "",
   "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
   "vocab": {` + strings.Join(vocab, ", ") + `},
   "merges": [["Ġ", "t"], ["h", "e"], ["Ġt", "he"], ["ä", "¸"], ["ä¸", "Ń"], ["Ġ", "ä¸Ń"]]}}`)
}

var (
	trainedOnce sync.Once
	trainedTok  *Tokenizer
	trainedErr  error
)

// trained returns a tokenizer trained on BuiltinCorpus, shared by tests.
func trained(t testing.TB) *Tokenizer {
	t.Helper()
	trainedOnce.Do(func() { trainedTok, trainedErr = TrainSentencePieceBPE(BuiltinCorpus, 1500) })
	if trainedErr != nil {
		t.Fatal(trainedErr)
	}
	return trainedTok
}

func byteLevelTok(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := parse(byteLevelJSON())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestByteFallbackEncodesCharactersNotInVocab(t *testing.T) {
	tok := tinySentencePiece(t, []string{"▁", "a", "b", "▁a"}, [][2]string{{"▁", "a"}}, nil)
	id := func(s string) int {
		id, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return id
	}
	got := tok.Encode("a€b", false)
	want := []int{id("▁a"), id("<0xE2>"), id("<0x82>"), id("<0xAC>"), id("b")}
	if !slices.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	if s := tok.Decode(got, false); s != "a€b" {
		t.Fatalf("Decode = %q", s)
	}
	// An invalid run of byte tokens decodes to one U+FFFD per byte.
	if s := tok.Decode([]int{id("<0xE2>"), id("<0x82>"), id("b")}, false); s != "\uFFFD\uFFFDb" {
		t.Fatalf("Decode(invalid bytes) = %q", s)
	}
}

func TestUnknownCharactersFuseWithoutByteFallback(t *testing.T) {
	tok := tinySentencePiece(t, []string{"▁", "a"}, nil, func(s string) string {
		return strings.Replace(s, `"byte_fallback": true`, `"byte_fallback": false`, 1)
	})
	got := tok.Encode("a€€a", false)
	a, _ := tok.TokenID("a")
	sp, _ := tok.TokenID("▁")
	if want := []int{sp, a, 0, a}; !slices.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
}

func TestMergesApplyInRankOrder(t *testing.T) {
	extra := []string{"▁", "a", "b", "c", "ab", "bc"}
	cases := []struct {
		name   string
		merges [][2]string
		want   []string
	}{
		{"b c first", [][2]string{{"b", "c"}, {"a", "b"}}, []string{"▁", "a", "bc"}},
		{"a b first", [][2]string{{"a", "b"}, {"b", "c"}}, []string{"▁", "ab", "c"}},
	}
	for _, c := range cases {
		tok := tinySentencePiece(t, extra, c.merges, nil)
		var got []string
		for _, id := range tok.Encode("abc", false) {
			got = append(got, tok.TokenString(id))
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
	// Equal ranks: the leftmost pair merges first.
	tok := tinySentencePiece(t, []string{"▁", "a", "aa"}, [][2]string{{"a", "a"}}, nil)
	var got []string
	for _, id := range tok.Encode("aaa", false) {
		got = append(got, tok.TokenString(id))
	}
	if want := []string{"▁", "aa", "a"}; !slices.Equal(got, want) {
		t.Errorf("aaa: got %q, want %q", got, want)
	}
}

func TestMergesLoadInBothJSONForms(t *testing.T) {
	extra := []string{"▁", "a", "b", "▁a", "▁ab"}
	merges := [][2]string{{"▁", "a"}, {"▁a", "b"}}
	strs := tinySentencePiece(t, extra, merges, nil)
	pairs := tinySentencePiece(t, extra, merges, func(s string) string {
		s = strings.Replace(s, `"▁ a"`, `["▁", "a"]`, 1)
		return strings.Replace(s, `"▁a b"`, `["▁a", "b"]`, 1)
	})
	for _, s := range []string{"ab", "a b ab", "ba"} {
		if a, b := strs.Encode(s, false), pairs.Encode(s, false); !slices.Equal(a, b) {
			t.Errorf("%q: strings form %v, pairs form %v", s, a, b)
		}
	}
}

func TestIgnoreMergesTakesWholeWordsFromVocab(t *testing.T) {
	extra := []string{"▁", "a", "b", "▁ab"}
	off := tinySentencePiece(t, extra, nil, nil)
	on := tinySentencePiece(t, extra, nil, func(s string) string {
		return strings.Replace(s, `"ignore_merges": false`, `"ignore_merges": true`, 1)
	})
	if got := off.Encode("ab", false); len(got) != 3 {
		t.Errorf("ignore_merges false: %v, want 3 ids", got)
	}
	id, _ := on.TokenID("▁ab")
	if got := on.Encode("ab", false); !slices.Equal(got, []int{id}) {
		t.Errorf("ignore_merges true: %v, want [%d]", got, id)
	}
}

func TestAddedTokensSplitTheInput(t *testing.T) {
	tok := byteLevelTok(t)
	got := tok.Encode("the<|endoftext|><think> the", false)
	if !slices.Contains(got, 262) || !slices.Contains(got, 263) {
		t.Fatalf("Encode = %v: added tokens not matched", got)
	}
	if s := tok.Decode(got, true); s != "the<think> the" {
		t.Errorf("Decode(skipSpecial) = %q", s)
	}
	if s := tok.Decode(got, false); s != "the<|endoftext|><think> the" {
		t.Errorf("Decode = %q", s)
	}
}

func TestByteLevelRoundTripsNFC(t *testing.T) {
	tok := byteLevelTok(t)
	for _, s := range referenceStrings {
		if got, want := tok.Decode(tok.Encode(s, false), false), norm.NFC.String(s); got != want {
			t.Errorf("decode(encode(%q)) = %q, want %q", s, got, want)
		}
	}
}

func TestSentencePieceRoundTrips(t *testing.T) {
	tok := trained(t)
	for _, s := range append(referenceStrings, BuiltinCorpus) {
		if strings.Contains(s, "<s>") || strings.Contains(s, "</s>") || strings.Contains(s, "<unk>") {
			continue
		}
		if got, want := tok.Decode(tok.Encode(s, true), true), strings.ReplaceAll(s, "▁", " "); got != want {
			t.Errorf("decode(encode(%q)) = %q", s, got)
		}
	}
}

func TestEncodeAddsBOSFromTemplate(t *testing.T) {
	tok := trained(t)
	if tok.BOS() != 1 || !slices.Equal(tok.EOS(), []int{2}) {
		t.Fatalf("BOS %d EOS %v, want 1 [2]", tok.BOS(), tok.EOS())
	}
	plain, special := tok.Encode("hi", false), tok.Encode("hi", true)
	if !slices.Equal(special, append([]int{1}, plain...)) {
		t.Fatalf("Encode(addSpecial) = %v, plain %v", special, plain)
	}
	q := byteLevelTok(t)
	if q.BOS() != -1 || !slices.Equal(q.EOS(), []int{262}) {
		t.Fatalf("byte-level: BOS %d EOS %v, want -1 [262]", q.BOS(), q.EOS())
	}
	if a, b := q.Encode("hi", false), q.Encode("hi", true); !slices.Equal(a, b) {
		t.Fatalf("byte-level Encode(addSpecial) = %v, plain %v", b, a)
	}
}

// TestEncodeAtMostIsEncodeUpToItsLimit: for every limit around a text's
// true token count (with and without the template's special tokens, on a
// SentencePiece and a byte-level tokenizer), EncodeAtMost gives Encode's
// ids when they fit and reports false when they do not, having encoded
// about limit tokens only.
func TestEncodeAtMostIsEncodeUpToItsLimit(t *testing.T) {
	for name, tok := range map[string]*Tokenizer{"sentencepiece": trained(t), "byte-level": byteLevelTok(t)} {
		for _, s := range append(referenceStrings, BuiltinCorpus[:2000]) {
			for _, special := range []bool{false, true} {
				want := tok.Encode(s, special)
				for limit := max(0, len(want)-3); limit <= len(want)+2; limit++ {
					got, ok := tok.EncodeAtMost(s, special, limit)
					switch {
					case ok != (len(want) <= limit):
						t.Fatalf("%s: %d tokens against a limit of %d: ok %v", name, len(want), limit, ok)
					case ok && !slices.Equal(got, want):
						t.Fatalf("%s: EncodeAtMost(%q, %v, %d) = %v, Encode %v", name, s, special, limit, got, want)
					case !ok && len(got) > limit+64:
						t.Fatalf("%s: %d ids encoded against a limit of %d", name, len(got), limit)
					}
				}
			}
		}
	}
	// one word far too long for the limit is refused by its length,
	// before it is merged (the trained tokenizer has no pre-tokenizer)
	long := strings.Repeat("abcdefghij", 100_000)
	if ids, ok := trained(t).EncodeAtMost(long, false, 1000); ok || len(ids) != 0 {
		t.Fatalf("a 1 MB word against 1,000 tokens: ok %v, %d ids", ok, len(ids))
	}
	// but a run of unknown characters, fused into one <unk>, may cover
	// any length: no bound from its bytes
	fused := tinySentencePiece(t, []string{"▁", "a"}, nil, func(s string) string {
		return strings.Replace(s, `"byte_fallback": true`, `"byte_fallback": false`, 1)
	})
	text := "a" + strings.Repeat("€", 1000) + "a"
	if got, ok := fused.EncodeAtMost(text, false, 4); !ok || !slices.Equal(got, fused.Encode(text, false)) {
		t.Fatalf("1,000 unknown characters fused into one token: EncodeAtMost = %v, %v; Encode %v", got, ok, fused.Encode(text, false))
	}
}

// streamAll feeds ids to a new stream decoder and flushes it.
func streamAll(tok *Tokenizer, ids []int) string {
	d := tok.NewStreamDecoder()
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(d.Next(id))
	}
	b.WriteString(d.Flush())
	return b.String()
}

func TestStreamDecoderEqualsDecodeForEveryPrefix(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, tok := range []*Tokenizer{trained(t), byteLevelTok(t), trainedByteLevel(t)} {
		var seqs [][]int
		for _, s := range referenceStrings {
			seqs = append(seqs, tok.Encode(s, true))
		}
		// Random ids, with runs of byte tokens that are not valid UTF-8,
		// special tokens and ids outside the vocabulary.
		for range 200 {
			n := rng.Intn(12)
			ids := make([]int, n)
			for i := range ids {
				ids[i] = rng.Intn(tok.VocabSize()+2) - 1
				if rng.Intn(3) == 0 {
					ids[i] = 3 + 0x80 + rng.Intn(0x80) // a byte token in the SentencePiece family
				}
			}
			seqs = append(seqs, ids)
		}
		for _, ids := range seqs {
			for k := 0; k <= len(ids); k++ {
				if got, want := streamAll(tok, ids[:k]), tok.Decode(ids[:k], true); got != want {
					t.Fatalf("ids %v: stream %q, Decode %q", ids[:k], got, want)
				}
			}
		}
	}
}

func TestStreamDecoderEmitsCompleteText(t *testing.T) {
	tok := trained(t)
	ids := tok.Encode("Hello world, 世界!", false)
	d := tok.NewStreamDecoder()
	var b strings.Builder
	for _, id := range ids {
		chunk := d.Next(id)
		if !utf8.ValidString(chunk) || strings.Contains(chunk, "\uFFFD") {
			t.Fatalf("chunk %q is not complete text", chunk)
		}
		b.WriteString(chunk)
	}
	if rest := d.Flush(); b.String()+rest != "Hello world, 世界!" {
		t.Fatalf("streamed %q + %q", b.String(), rest)
	}
	if !strings.HasPrefix(b.String(), "Hello world") {
		t.Fatalf("stream held back too much: %q", b.String())
	}
}

func TestLossyUTF8MatchesRust(t *testing.T) {
	// Rust's String::from_utf8_lossy: one U+FFFD per maximal subpart.
	cases := []struct{ in, want string }{
		{"\xE2\x82", "\uFFFD"},
		{"\xE2\x82a", "\uFFFDa"},
		{"\xF0\x9F\x98", "\uFFFD"},
		{"\x80\x80", "\uFFFD\uFFFD"},
		{"\xED\xA0\x80", "\uFFFD\uFFFD\uFFFD"},
		{"\xC0\xAF", "\uFFFD\uFFFD"},
		{"\xF4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"a\xF0\x9F\x98\x80b", "a😀b"},
		{"\xE0\xA0", "\uFFFD"},
		{"\xE0\x80", "\uFFFD\uFFFD"},
	}
	for _, c := range cases {
		if got := string(appendLossy(nil, []byte(c.in))); got != c.want {
			t.Errorf("%q: got %q, want %q", c.in, got, c.want)
		}
	}
}

func TestTrainingIsDeterministic(t *testing.T) {
	a, err := TrainSentencePieceBPE(BuiltinCorpus, 1200)
	if err != nil {
		t.Fatal(err)
	}
	b, err := TrainSentencePieceBPE(BuiltinCorpus, 1200)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.source, b.source) {
		t.Fatal("two trainings differ")
	}
	if a.VocabSize() != 1200 {
		t.Fatalf("VocabSize = %d, want 1200", a.VocabSize())
	}
	for id, want := range map[int]string{0: "<unk>", 1: "<s>", 2: "</s>", 3: "<0x00>", 258: "<0xFF>", 259: "▁"} {
		if got := a.TokenString(id); got != want {
			t.Errorf("TokenString(%d) = %q, want %q", id, got, want)
		}
	}
	if n, runes := len(a.Encode(BuiltinCorpus, false)), utf8.RuneCountInString(BuiltinCorpus); n > runes*4/5 {
		t.Errorf("corpus of %d characters encodes to %d tokens: merges are not learned", runes, n)
	}
	if _, err := TrainSentencePieceBPE("x", 100); err == nil {
		t.Error("vocab size below the base tokens accepted")
	}
}

func TestWriteFilesRoundTrips(t *testing.T) {
	tok := trained(t)
	tok.SetModelMaxLength(4096)
	defer tok.SetModelMaxLength(trainedModelMaxLength)
	dir := t.TempDir()
	if err := tok.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	back, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if back.BOS() != 1 || !slices.Equal(back.EOS(), []int{2}) || back.ModelMaxLength() != 4096 {
		t.Fatalf("BOS %d EOS %v max %d", back.BOS(), back.EOS(), back.ModelMaxLength())
	}
	for _, s := range referenceStrings {
		if a, b := tok.Encode(s, true), back.Encode(s, true); !slices.Equal(a, b) {
			t.Fatalf("%q: %v before writing, %v after", s, a, b)
		}
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"add_bos_token": true`, `"add_eos_token": false`, `"bos_token": "<s>"`, `"eos_token": "</s>"`, `"model_max_length": 4096`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("tokenizer_config.json lacks %s:\n%s", want, cfg)
		}
	}
}

func TestLoadDirReadsConfigs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tokenizer.json", string(byteLevelJSON()))
	write("tokenizer_config.json", `{"add_bos_token": false, "bos_token": null, "eos_token": {"content": "<think>", "special": false}, "model_max_length": 1e30}`)
	write("generation_config.json", `{"bos_token_id": 262, "eos_token_id": [263, 262]}`)
	tok, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.BOS() != -1 || !slices.Equal(tok.EOS(), []int{263, 262}) || tok.ModelMaxLength() != 0 {
		t.Fatalf("BOS %d EOS %v max %d, want -1 [263 262] 0", tok.BOS(), tok.EOS(), tok.ModelMaxLength())
	}
	write("tokenizer_config.json", `{"add_bos_token": true, "add_eos_token": true, "bos_token": "<|endoftext|>", "eos_token": "<think>"}`)
	if tok, err = LoadDir(dir); err != nil {
		t.Fatal(err)
	}
	got := tok.Encode("the", true)
	if got[0] != 262 || got[len(got)-1] != 263 {
		t.Fatalf("Encode(addSpecial) = %v, want 262 first and 263 last", got)
	}
	write("tokenizer_config.json", `{"bos_token": "<nope>"}`)
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), `bos_token "<nope>" is not in the vocabulary`) {
		t.Fatalf("LoadDir with unknown bos_token: %v", err)
	}
}

func TestBadFilesGiveClearErrors(t *testing.T) {
	good := string(byteLevelJSON())
	cases := []struct {
		name, from, to, want string
	}{
		{"unigram", `"type": "BPE"`, `"type": "Unigram"`, `model.type "Unigram" is not supported`},
		{"normalizer", `{"type": "NFC"}`, `{"type": "Sequence", "normalizers": [{"type": "Lowercase"}]}`, `normalizer.normalizers[0].type "Lowercase" is not supported`},
		{"regex", `"Regex": "(?i:`, `"Regex": "(?x:`, `pre_tokenizer.pretokenizers[0].pattern.Regex "(?x:`},
		{"decoder", `"decoder": {"type": "ByteLevel"`, `"decoder": {"type": "WordPiece"`, `decoder.type "WordPiece" is not supported`},
		{"post processor", `"post_processor": {"type": "ByteLevel"`, `"post_processor": {"type": "Bogus"`, `post_processor.type "Bogus" is not supported`},
		{"merge token", `["h", "e"]`, `["h", "zz"]`, `model.merges[1]: token "zz" is not in model.vocab`},
		{"merge shape", `["h", "e"]`, `["h", "e", "x"]`, `model.merges[1]: want a pair, got 3 strings`},
		{"version", `"version": "1.0"`, `"version": "2.0"`, `version "2.0" is not supported`},
		{"dropout", `"dropout": null`, `"dropout": 0.1`, `model.dropout 0.1 is not supported`},
		{"json", `{"version"`, `{{"version"`, `not a tokenizer.json`},
	}
	for _, c := range cases {
		bad := strings.Replace(good, c.from, c.to, 1)
		if bad == good {
			t.Fatalf("%s: %q not found", c.name, c.from)
		}
		_, err := parse([]byte(bad))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want %q", c.name, err, c.want)
		}
	}
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, []byte(strings.Replace(good, `"type": "BPE"`, `"type": "Unigram"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), "tokenizer: ") || !strings.Contains(err.Error(), path) {
		t.Errorf("Load: %v, want an error naming the file", err)
	}
	if _, err := parseMerges([]byte(`["a b c"]`)); err == nil || !strings.Contains(err.Error(), `model.merges[0] "a b c": want two tokens separated by one space`) {
		t.Errorf("merges: %v", err)
	}
}

func FuzzEncodeDecodeRoundTrip(f *testing.F) {
	for _, s := range referenceStrings {
		f.Add(s)
	}
	for _, s := range strings.Split(BuiltinCorpus, "\n\n") {
		f.Add(s)
	}
	sp := trained(f)
	byteLevels := map[string]*Tokenizer{"byte-level": byteLevelTok(f), "trained byte-level": trainedByteLevel(f)}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		if !strings.Contains(s, "<s>") && !strings.Contains(s, "</s>") && !strings.Contains(s, "<unk>") {
			ids := sp.Encode(s, false)
			if got, want := sp.Decode(ids, false), strings.ReplaceAll(s, "▁", " "); got != want {
				t.Fatalf("SentencePiece: decode(encode(%q)) = %q", s, got)
			}
			if got := streamAll(sp, ids); got != sp.Decode(ids, true) {
				t.Fatalf("SentencePiece: stream of %q = %q", s, got)
			}
		}
		for name, bl := range byteLevels {
			ids := bl.Encode(s, false)
			if got, want := bl.Decode(ids, false), norm.NFC.String(s); got != want {
				t.Fatalf("%s: decode(encode(%q)) = %q, want %q", name, s, got, want)
			}
		}
	})
}

// TestTokenBytesAreWhatEachTokenAddsToAText: after a first token, the
// decoded text grows by exactly the ids' TokenBytes (where they make
// valid UTF-8), for every family of decoder; special tokens add nothing.
func TestTokenBytesAreWhatEachTokenAddsToAText(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	for name, tok := range map[string]*Tokenizer{"sentencepiece": trained(t), "byte-level": byteLevelTok(t), "byte-level trained": trainedByteLevel(t)} {
		anchor := -1
		for id := range tok.VocabSize() {
			if s := tok.Decode([]int{id}, true); s != "" && s[0] != ' ' && utf8.ValidString(s) && !tok.IsSpecial(id) {
				anchor = id
				break
			}
		}
		checked := 0
		for range 3000 {
			ids := []int{anchor}
			var want []byte
			for range 1 + rng.Intn(6) {
				id := rng.Intn(tok.VocabSize())
				ids = append(ids, id)
				want = append(want, tok.TokenBytes(id)...)
				if tok.IsSpecial(id) && tok.TokenBytes(id) != nil {
					t.Fatalf("%s: special token %d has bytes %q", name, id, tok.TokenBytes(id))
				}
			}
			if !utf8.Valid(want) {
				continue
			}
			checked++
			if got := tok.Decode(ids, true); got != tok.Decode(ids[:1], true)+string(want) {
				t.Fatalf("%s: ids %v decode to %q, want the first token then %q", name, ids, got, want)
			}
		}
		if checked < 500 {
			t.Fatalf("%s: only %d valid sequences checked", name, checked)
		}
	}
}
