package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// sentencePieceJSON writes a tokenizer.json in the shape of Mixtral's:
// the three specials as added tokens, Prepend/Replace normalizer, BPE
// with byte fallback, a BOS template and the SentencePiece decoder.
func sentencePieceJSON(tokens []string, merges [][2]string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
`)
	for i, s := range []string{"<unk>", "<s>", "</s>"} {
		sep := ","
		if i == 2 {
			sep = ""
		}
		fmt.Fprintf(&b, `    {
      "id": %d,
      "content": %s,
      "single_word": false,
      "lstrip": false,
      "rstrip": false,
      "normalized": false,
      "special": true
    }%s
`, i, jsonString(s), sep)
	}
	b.WriteString(`  ],
  "normalizer": {
    "type": "Sequence",
    "normalizers": [
      {
        "type": "Prepend",
        "prepend": "▁"
      },
      {
        "type": "Replace",
        "pattern": {
          "String": " "
        },
        "content": "▁"
      }
    ]
  },
  "pre_tokenizer": null,
  "post_processor": {
    "type": "TemplateProcessing",
    "single": [
      {
        "SpecialToken": {
          "id": "<s>",
          "type_id": 0
        }
      },
      {
        "Sequence": {
          "id": "A",
          "type_id": 0
        }
      }
    ],
    "pair": [
      {
        "SpecialToken": {
          "id": "<s>",
          "type_id": 0
        }
      },
      {
        "Sequence": {
          "id": "A",
          "type_id": 0
        }
      },
      {
        "SpecialToken": {
          "id": "<s>",
          "type_id": 1
        }
      },
      {
        "Sequence": {
          "id": "B",
          "type_id": 1
        }
      }
    ],
    "special_tokens": {
      "<s>": {
        "id": "<s>",
        "ids": [
          1
        ],
        "tokens": [
          "<s>"
        ]
      }
    }
  },
  "decoder": {
    "type": "Sequence",
    "decoders": [
      {
        "type": "Replace",
        "pattern": {
          "String": "▁"
        },
        "content": " "
      },
      {
        "type": "ByteFallback"
      },
      {
        "type": "Fuse"
      },
      {
        "type": "Strip",
        "content": " ",
        "start": 1,
        "stop": 0
      }
    ]
  },
  "model": {
    "type": "BPE",
    "dropout": null,
    "unk_token": "<unk>",
    "continuing_subword_prefix": null,
    "end_of_word_suffix": null,
    "fuse_unk": true,
    "byte_fallback": true,
    "ignore_merges": false,
    "vocab": {
`)
	writeVocab(&b, tokens)
	b.WriteString("    },\n    \"merges\": [\n")
	// "a b" strings as in Mixtral's file; pairs if a token has a space.
	pairs := false
	for _, m := range merges {
		if strings.Contains(m[0], " ") || strings.Contains(m[1], " ") {
			pairs = true
		}
	}
	for i, m := range merges {
		sep := ","
		if i == len(merges)-1 {
			sep = ""
		}
		if pairs {
			fmt.Fprintf(&b, "      [%s, %s]%s\n", jsonString(m[0]), jsonString(m[1]), sep)
		} else {
			fmt.Fprintf(&b, "      %s%s\n", jsonString(m[0]+" "+m[1]), sep)
		}
	}
	b.WriteString("    ]\n  }\n}\n")
	if !json.Valid(b.Bytes()) {
		return nil, fmt.Errorf("tokenizer: internal error: generated tokenizer.json is not valid JSON")
	}
	return b.Bytes(), nil
}

// byteLevelBPEJSON writes a tokenizer.json in the shape of Qwen3's: the
// specials as added tokens after the vocabulary, NFC, the Qwen2 regex
// split and ByteLevel, BPE without byte fallback, merges as pairs.
func byteLevelBPEJSON(tokens []string, merges [][2]string, specials []string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
`)
	for i, s := range specials {
		sep := ","
		if i == len(specials)-1 {
			sep = ""
		}
		fmt.Fprintf(&b, `    {
      "id": %d,
      "content": %s,
      "single_word": false,
      "lstrip": false,
      "rstrip": false,
      "normalized": false,
      "special": true
    }%s
`, len(tokens)+i, jsonString(s), sep)
	}
	b.WriteString(`  ],
  "normalizer": {
    "type": "NFC"
  },
  "pre_tokenizer": {
    "type": "Sequence",
    "pretokenizers": [
      {
        "type": "Split",
        "pattern": {
          "Regex": ` + jsonString(patternQwen2) + `
        },
        "behavior": "Isolated",
        "invert": false
      },
      {
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": false,
        "use_regex": false
      }
    ]
  },
  "post_processor": {
    "type": "ByteLevel",
    "add_prefix_space": false,
    "trim_offsets": false,
    "use_regex": false
  },
  "decoder": {
    "type": "ByteLevel",
    "add_prefix_space": false,
    "trim_offsets": false,
    "use_regex": false
  },
  "model": {
    "type": "BPE",
    "dropout": null,
    "unk_token": null,
    "continuing_subword_prefix": "",
    "end_of_word_suffix": "",
    "fuse_unk": false,
    "byte_fallback": false,
    "ignore_merges": false,
    "vocab": {
`)
	writeVocab(&b, tokens)
	b.WriteString("    },\n    \"merges\": [")
	for i, m := range merges {
		sep := ","
		if i == len(merges)-1 {
			sep = ""
		}
		fmt.Fprintf(&b, "\n      [\n        %s,\n        %s\n      ]%s", jsonString(m[0]), jsonString(m[1]), sep)
	}
	if len(merges) > 0 {
		b.WriteString("\n    ")
	}
	b.WriteString("]\n  }\n}\n")
	if !json.Valid(b.Bytes()) {
		return nil, fmt.Errorf("tokenizer: internal error: generated tokenizer.json is not valid JSON")
	}
	return b.Bytes(), nil
}

// WriteFiles writes tokenizer.json (the file the tokenizer was loaded
// from, or the trained one) and a tokenizer_config.json with bos_token,
// eos_token, pad_token, add_bos_token, add_eos_token, tokenizer_class
// and model_max_length into dir,
// which must exist. Hugging Face's tokenizers and transformers load the
// pair.
func (t *Tokenizer) WriteFiles(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), t.source, 0o644); err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	cfg, err := t.configJSON()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	return nil
}

// configJSON is the tokenizer_config.json that WriteFiles writes.
func (t *Tokenizer) configJSON() ([]byte, error) {
	tokenOrNull := func(id int) any {
		if id < 0 {
			return nil
		}
		return t.TokenString(id)
	}
	eos := -1
	if len(t.eos) > 0 {
		eos = t.eos[0]
	}
	cfg := map[string]any{
		"add_bos_token":                len(t.prefixIDs) > 0 && t.prefixIDs[0] == t.bos,
		"add_eos_token":                eos >= 0 && len(t.suffixIDs) > 0 && t.suffixIDs[len(t.suffixIDs)-1] == eos,
		"bos_token":                    tokenOrNull(t.bos),
		"eos_token":                    tokenOrNull(eos),
		"clean_up_tokenization_spaces": false,
		"tokenizer_class":              "PreTrainedTokenizerFast",
	}
	if t.model.byteFallback {
		cfg["tokenizer_class"] = "LlamaTokenizer"
		cfg["legacy"] = true
		cfg["spaces_between_special_tokens"] = false
		cfg["pad_token"] = nil
	}
	if t.class != "" {
		cfg["tokenizer_class"] = t.class
	}
	if t.pad >= 0 {
		cfg["pad_token"] = t.TokenString(t.pad)
	}
	if t.model.unkID >= 0 {
		cfg["unk_token"] = t.TokenString(t.model.unkID)
	}
	if t.modelMaxLength > 0 {
		cfg["model_max_length"] = t.modelMaxLength
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(cfg); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer_config.json: %w", err)
	}
	return b.Bytes(), nil
}

// SetModelMaxLength sets the model_max_length that WriteFiles records
// (the model's context length in tokens).
func (t *Tokenizer) SetModelMaxLength(tokens int) { t.modelMaxLength = tokens }

// ModelMaxLength returns tokenizer_config.json's model_max_length, or 0
// if it is unknown or not a usable number.
func (t *Tokenizer) ModelMaxLength() int { return t.modelMaxLength }

// jsonString returns s as a JSON string without HTML escaping.
// writeVocab writes a tokenizer.json vocabulary's entries, "token": id,
// one per line in id order.
func writeVocab(b *bytes.Buffer, tokens []string) {
	for id, tok := range tokens {
		sep := ","
		if id == len(tokens)-1 {
			sep = ""
		}
		fmt.Fprintf(b, "      %s: %d%s\n", jsonString(tok), id, sep)
	}
}

func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
