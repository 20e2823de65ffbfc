package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// LoadDir loads a model directory: tokenizer.json, then
// tokenizer_config.json and generation_config.json if present.
//
// tokenizer_config.json's bos_token and eos_token name BOS and the first
// EOS (a null bos_token means none); its add_bos_token and add_eos_token,
// where present, decide what Encode's addSpecial adds, as transformers'
// Llama tokenizers do. generation_config.json's eos_token_id adds more
// EOS ids, and its bos_token_id is used only when tokenizer_config.json
// does not mention bos_token. pad_token and tokenizer_class are kept for
// WriteFiles.
func LoadDir(dir string) (*Tokenizer, error) {
	t, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	var cfg tokenizerConfig
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	cfgFound, err := readJSON(cfgPath, &cfg)
	if err != nil {
		return nil, err
	}
	var gen generationConfig
	genPath := filepath.Join(dir, "generation_config.json")
	if _, err := readJSON(genPath, &gen); err != nil {
		return nil, err
	}
	if !cfgFound && gen.BOS == nil && gen.EOS == nil {
		return t, nil
	}
	if err := t.applyConfig(cfg, gen, cfgPath, genPath); err != nil {
		return nil, err
	}
	return t, nil
}

// tokenizerConfig holds the fields of tokenizer_config.json we use.
// bos_token and eos_token are strings or AddedToken objects.
type tokenizerConfig struct {
	BOS            json.RawMessage `json:"bos_token"`
	EOS            json.RawMessage `json:"eos_token"`
	PAD            json.RawMessage `json:"pad_token"`
	Class          *string         `json:"tokenizer_class"`
	AddBOS         *bool           `json:"add_bos_token"`
	AddEOS         *bool           `json:"add_eos_token"`
	ModelMaxLength *float64        `json:"model_max_length"`
}

// generationConfig holds the fields of generation_config.json we use;
// eos_token_id is a number or a list.
type generationConfig struct {
	BOS json.RawMessage `json:"bos_token_id"`
	EOS json.RawMessage `json:"eos_token_id"`
}

// readJSON decodes path into v; a missing file is not an error.
func readJSON(path string, v any) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("tokenizer: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return true, nil
}

func (t *Tokenizer) applyConfig(cfg tokenizerConfig, gen generationConfig, cfgPath, genPath string) error {
	bosName, bosSet, err := tokenName(cfg.BOS)
	if err != nil {
		return fmt.Errorf("tokenizer: %s: bos_token: %w", cfgPath, err)
	}
	eosName, eosSet, err := tokenName(cfg.EOS)
	if err != nil {
		return fmt.Errorf("tokenizer: %s: eos_token: %w", cfgPath, err)
	}
	genBOS, err := idList(gen.BOS)
	if err != nil {
		return fmt.Errorf("tokenizer: %s: bos_token_id: %w", genPath, err)
	}
	genEOS, err := idList(gen.EOS)
	if err != nil {
		return fmt.Errorf("tokenizer: %s: eos_token_id: %w", genPath, err)
	}

	switch {
	case bosSet && bosName == "":
		t.bos = -1
	case bosSet:
		id, ok := t.TokenID(bosName)
		if !ok {
			return fmt.Errorf("tokenizer: %s: bos_token %q is not in the vocabulary", cfgPath, bosName)
		}
		t.bos = id
	case len(genBOS) > 0:
		t.bos = genBOS[0]
	}

	var eos []int
	if eosSet && eosName != "" {
		id, ok := t.TokenID(eosName)
		if !ok {
			return fmt.Errorf("tokenizer: %s: eos_token %q is not in the vocabulary", cfgPath, eosName)
		}
		eos = append(eos, id)
	}
	for _, id := range genEOS {
		if !slices.Contains(eos, id) {
			eos = append(eos, id)
		}
	}
	if eosSet || len(genEOS) > 0 {
		t.eos = eos
	}
	for _, id := range append([]int{t.bos}, t.eos...) {
		if id >= t.VocabSize() {
			return fmt.Errorf("tokenizer: special token id %d is outside the vocabulary of %d", id, t.VocabSize())
		}
	}

	if cfg.AddBOS != nil {
		t.prefixIDs = nil
		if *cfg.AddBOS && t.bos >= 0 {
			t.prefixIDs = []int{t.bos}
		}
	}
	if cfg.AddEOS != nil {
		t.suffixIDs = nil
		if *cfg.AddEOS && len(t.eos) > 0 {
			t.suffixIDs = []int{t.eos[0]}
		}
	}
	// An unknown pad_token is no error: nothing here encodes with it.
	if padName, _, err := tokenName(cfg.PAD); err == nil && padName != "" {
		if id, ok := t.TokenID(padName); ok {
			t.pad = id
		}
	}
	if cfg.Class != nil {
		t.class = *cfg.Class
	}
	if m := cfg.ModelMaxLength; m != nil && *m > 0 && *m <= math.MaxInt32 {
		t.modelMaxLength = int(*m)
	}
	return nil
}

// tokenName reads a token given as a string, an object with "content",
// or null. set reports whether the value was present at all; null gives
// set with an empty name.
func tokenName(raw json.RawMessage) (name string, set bool, err error) {
	if len(raw) == 0 {
		return "", false, nil
	}
	if isNull(raw) {
		return "", true, nil
	}
	if err := json.Unmarshal(raw, &name); err == nil {
		return name, true, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", false, fmt.Errorf("want a string or an object with content, got %s", raw)
	}
	return *obj.Content, true, nil
}

// idList reads a token id given as a number, a list of numbers or null.
func idList(raw json.RawMessage) ([]int, error) {
	if isNull(raw) {
		return nil, nil
	}
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		if one < 0 {
			return nil, fmt.Errorf("id %d is negative", one)
		}
		return []int{one}, nil
	}
	var many []int
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("want a number or a list of numbers, got %s", raw)
	}
	for _, id := range many {
		if id < 0 {
			return nil, fmt.Errorf("id %d is negative", id)
		}
	}
	return many, nil
}
