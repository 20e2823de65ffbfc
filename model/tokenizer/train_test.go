package tokenizer

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var (
	byteLevelOnce sync.Once
	byteLevelTrn  *Tokenizer
	byteLevelErr  error
)

// trainedByteLevel returns a byte-level tokenizer trained on
// BuiltinCorpus, shared by tests.
func trainedByteLevel(t testing.TB) *Tokenizer {
	t.Helper()
	byteLevelOnce.Do(func() { byteLevelTrn, byteLevelErr = TrainByteLevelBPE(BuiltinCorpus, 1024) })
	if byteLevelErr != nil {
		t.Fatal(byteLevelErr)
	}
	return byteLevelTrn
}

// writtenFiles returns the two files WriteFiles writes for tok.
func writtenFiles(t *testing.T, tok *Tokenizer) (tokenizerJSON, configJSON []byte) {
	t.Helper()
	dir := t.TempDir()
	if err := tok.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestByteLevelTrainingIsDeterministic(t *testing.T) {
	a, err := TrainByteLevelBPE(BuiltinCorpus, 1024)
	if err != nil {
		t.Fatal(err)
	}
	b, err := TrainByteLevelBPE(BuiltinCorpus, 1024)
	if err != nil {
		t.Fatal(err)
	}
	aJSON, aCfg := writtenFiles(t, a)
	bJSON, bCfg := writtenFiles(t, b)
	if !bytes.Equal(aJSON, bJSON) || !bytes.Equal(aCfg, bCfg) {
		t.Fatal("two trainings write different files")
	}
	if !bytes.Equal(aJSON, a.source) {
		t.Fatal("WriteFiles did not write the trained tokenizer.json")
	}
}

func TestByteLevelTrainingReachesVocabSize(t *testing.T) {
	for _, n := range []int{259, 260, 300, 1024} {
		tok, err := TrainByteLevelBPE(BuiltinCorpus, n)
		if err != nil {
			t.Fatal(err)
		}
		if tok.VocabSize() != n {
			t.Errorf("TrainByteLevelBPE(BuiltinCorpus, %d): VocabSize %d", n, tok.VocabSize())
		}
	}
	if tok, err := TrainByteLevelBPE("", 1000); err != nil || tok.VocabSize() != 259 {
		t.Errorf("empty corpus: VocabSize %d, error %v; want the 259 base tokens", tok.VocabSize(), err)
	}
	for _, c := range []struct {
		name, corpus string
		size         int
	}{
		{"vocab size below the base", "x", 258},
		{"invalid UTF-8", "a\xffb", 1000},
	} {
		if _, err := TrainByteLevelBPE(c.corpus, c.size); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}

// A corpus stops giving tokens only when no pair of symbols in its words
// occurs twice; training to the size reached gives the same tokenizer.
func TestByteLevelTrainingStopsOnlyWhenPairsRunOut(t *testing.T) {
	const asked = 100000
	tr, err := newByteLevelTrainer(BuiltinCorpus)
	if err != nil {
		t.Fatal(err)
	}
	tr.learn(asked - len(byteLevelSpecials))
	reached := len(tr.tokens) + len(byteLevelSpecials)
	if reached >= asked || reached < 1500 {
		t.Fatalf("reached %d tokens asking for %d", reached, asked)
	}
	for k, n := range tr.counts {
		if n >= 2 && !tr.banned[tr.tokens[k>>32]+tr.tokens[uint32(k)]] {
			t.Errorf("pair %q %q occurs %d times but was not merged", tr.tokens[k>>32], tr.tokens[uint32(k)], n)
		}
	}
	big, err := TrainByteLevelBPE(BuiltinCorpus, asked)
	if err != nil {
		t.Fatal(err)
	}
	exact, err := TrainByteLevelBPE(BuiltinCorpus, reached)
	if err != nil {
		t.Fatal(err)
	}
	if big.VocabSize() != reached || !bytes.Equal(big.source, exact.source) {
		t.Errorf("VocabSize %d, want %d, and the same file as training to %d", big.VocabSize(), reached, reached)
	}
	t.Logf("BuiltinCorpus runs out of pairs at %d tokens", reached)
}

func TestByteLevelTrainedIDsFollowQwen(t *testing.T) {
	tok := trainedByteLevel(t)
	// Qwen2's and Qwen3's vocabularies start like this.
	for id, want := range map[int]string{0: "!", 1: `"`, 93: "~", 94: "¡", 105: "¬", 106: "®", 187: "ÿ", 188: "Ā", 220: "Ġ", 198: "Ċ", 255: "Ń"} {
		if got := tok.TokenString(id); got != want {
			t.Errorf("TokenString(%d) = %q, want %q", id, got, want)
		}
	}
	for b := 0; b < 256; b++ {
		if id, ok := tok.TokenID(byteToStr[b]); !ok || id >= 256 {
			t.Errorf("byte %#02x: token %q has id %d, %v", b, byteToStr[b], id, ok)
		}
	}
	n := tok.VocabSize()
	for i, name := range byteLevelSpecials {
		if id, ok := tok.TokenID(name); !ok || id != n-3+i || !tok.IsSpecial(id) {
			t.Errorf("%s: id %d %v special %v, want special id %d", name, id, ok, tok.IsSpecial(id), n-3+i)
		}
	}
	if tok.BOS() != -1 || !slices.Equal(tok.EOS(), []int{n - 1, n - 3}) {
		t.Errorf("BOS %d EOS %v, want -1 [%d %d]", tok.BOS(), tok.EOS(), n-1, n-3)
	}
	if plain, special := tok.Encode("hi", false), tok.Encode("hi", true); !slices.Equal(plain, special) {
		t.Errorf("Encode(addSpecial) = %v, plain %v: Qwen adds nothing", special, plain)
	}
	if n, size := len(tok.Encode(BuiltinCorpus, false)), len(BuiltinCorpus); n > size/2 {
		t.Errorf("corpus of %d bytes encodes to %d tokens: merges are not learned", size, n)
	}
}

func TestByteLevelMergesStayInsideWords(t *testing.T) {
	tok := trainedByteLevel(t)
	var words []string
	tok.segment(BuiltinCorpus, func(int) {}, func(w string) { words = append(words, w) })
	all := strings.Join(words, "\x00") // no word holds U+0000: it maps to Ā
	for id := 256; id < tok.VocabSize()-len(byteLevelSpecials); id++ {
		if s := tok.TokenString(id); !strings.Contains(all, s) || strings.Contains(s, "\x00") {
			t.Errorf("token %d %q is not part of one pre-tokenized word", id, s)
		}
	}
}

// byteLevelRoundTripInputs covers every byte value that valid UTF-8 can
// hold, plus scripts, emoji, code, white space runs and text NFC changes.
func byteLevelRoundTripInputs() []string {
	var every strings.Builder
	for r := rune(0); r < 0x80; r++ {
		every.WriteRune(r)
	}
	for r := rune(0x80); r < 0xC0; r++ { // continuation bytes 0x80-0xBF after 0xC2
		every.WriteRune(r)
	}
	var lead [256]bool // the first rune of every lead byte 0xC2-0xF4
	var buf [utf8.UTFMax]byte
	for r := rune(0x80); r <= utf8.MaxRune; r++ {
		if n := utf8.EncodeRune(buf[:], r); utf8.ValidRune(r) && !lead[buf[0]] {
			lead[buf[0]] = true
			every.Write(buf[:n])
		}
	}
	in := []string{
		every.String(),
		"😀👍🏽👨‍👩‍👧 🇫🇷",
		"中文分词测试，日本語のテキスト、한국어 텍스트",
		"func main() {\n\tfmt.Println(\"hi\")\n}\r\n",
		"   leading and trailing   \t\t\n\n\n   ",
		"e\u0301 A\u030a \u212b Ω", // NFC composes these
		"it's 'S 'LL we'RE 123456 3.14159",
		"<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|im_end",
		"\x00\x01\x7f\u0085\u00a0\u2028\u3000",
	}
	// Random text of characters the regex treats specially, and of any
	// character Go's Unicode tables (15.0) assign, marks left out: Rust's
	// newer regex tables have more letters (words split differently), and
	// tokenizers' NFC orders some rare marks otherwise than x/text does.
	rng := rand.New(rand.NewSource(7))
	pools := []rune{'a', ' ', '\n', '1', '\'', 'é', '中', '😀', '\t', '.', '\u0301', 'Ω', '\r'}
	for range 100 {
		var b strings.Builder
		for range rng.Intn(30) {
			r := pools[rng.Intn(len(pools))]
			if rng.Intn(4) == 0 {
				r = rune(rng.Intn(utf8.MaxRune + 1))
				for !unicode.In(r, unicode.L, unicode.N, unicode.P, unicode.S, unicode.Z) {
					r = rune(rng.Intn(utf8.MaxRune + 1))
				}
			}
			b.WriteRune(r)
		}
		in = append(in, b.String())
	}
	return append(in, referenceStrings...)
}

func TestByteLevelTrainedRoundTripsNFC(t *testing.T) {
	tok := trainedByteLevel(t)
	for _, s := range byteLevelRoundTripInputs() {
		ids := tok.Encode(s, false)
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("%q: id %d outside the vocabulary", s, id)
			}
		}
		if got, want := tok.Decode(ids, false), norm.NFC.String(s); got != want {
			t.Errorf("decode(encode(%q)) = %q, want %q", s, got, want)
		}
		if got, want := streamAll(tok, ids), tok.Decode(ids, true); got != want {
			t.Errorf("%q: stream %q, Decode %q", s, got, want)
		}
	}
}

func TestByteLevelTrainedFindsAddedTokens(t *testing.T) {
	tok := trainedByteLevel(t)
	id := func(s string) int {
		id, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return id
	}
	start, end, eot := id("<|im_start|>"), id("<|im_end|>"), id("<|endoftext|>")
	text := "<|im_start|>user\nhello<|im_end|>\n<|endoftext|>"
	var want []int
	want = append(want, start)
	want = append(want, tok.Encode("user\nhello", false)...)
	want = append(want, end)
	want = append(want, tok.Encode("\n", false)...)
	want = append(want, eot)
	if got := tok.Encode(text, false); !slices.Equal(got, want) {
		t.Fatalf("Encode(%q) = %v, want %v", text, got, want)
	}
	if got := tok.Decode(want, true); got != "user\nhello\n" {
		t.Errorf("Decode(skipSpecial) = %q", got)
	}
	if got := tok.Decode(want, false); got != text {
		t.Errorf("Decode = %q", got)
	}
	// A broken marker is plain text.
	if got := tok.Encode("<|im_end", false); slices.Contains(got, end) {
		t.Errorf("Encode(%q) = %v holds <|im_end|>", "<|im_end", got)
	}
}

func TestByteLevelWriteFilesRoundTrips(t *testing.T) {
	tok := trainedByteLevel(t)
	tokJSON, cfg := writtenFiles(t, tok)
	for _, want := range []string{`"bos_token": null`, `"eos_token": "<|im_end|>"`, `"pad_token": "<|endoftext|>"`,
		`"add_bos_token": false`, `"add_eos_token": false`, `"model_max_length": 32768`, `"tokenizer_class": "Qwen2Tokenizer"`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("tokenizer_config.json lacks %s:\n%s", want, cfg)
		}
	}
	if strings.Contains(string(cfg), "chat_template") {
		t.Errorf("tokenizer_config.json has a chat template:\n%s", cfg)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"tokenizer.json": tokJSON, "tokenizer_config.json": cfg} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	back, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if back.BOS() != tok.BOS() || !slices.Equal(back.EOS(), tok.EOS()[:1]) || back.ModelMaxLength() != trainedModelMaxLength {
		t.Errorf("loaded: BOS %d EOS %v max %d", back.BOS(), back.EOS(), back.ModelMaxLength())
	}
	for _, s := range referenceStrings {
		if a, b := tok.Encode(s, true), back.Encode(s, true); !slices.Equal(a, b) {
			t.Fatalf("%q: %v before writing, %v after", s, a, b)
		}
	}
	againJSON, againCfg := writtenFiles(t, back)
	if !bytes.Equal(againJSON, tokJSON) || !bytes.Equal(againCfg, cfg) {
		t.Errorf("LoadDir then WriteFiles changes the files:\n%s", againCfg)
	}
}
