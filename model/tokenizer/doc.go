// Package tokenizer encodes text to token ids and decodes them back
// exactly as Hugging Face's tokenizers library does for the BPE
// tokenizer.json files of two families: SentencePiece-style BPE with
// byte fallback (Llama, Mistral, Mixtral) and byte-level BPE (Qwen2,
// Qwen3, and the GPT-2 and Llama 3 regex shapes). It reads
// tokenizer.json and the BOS/EOS settings of tokenizer_config.json and
// generation_config.json, streams decoded text token by token, and trains
// small deterministic tokenizers of both families for test models
// (TrainSentencePieceBPE shaped like Mixtral's, TrainByteLevelBPE like
// Qwen2's and Qwen3's).
//
// It does not own chat templates, truncation or padding; files using
// components it does not implement (Unigram or WordPiece models, other
// pre-tokenizer regexes, ...) are refused with an error naming the field.
//
// Encoding follows tokenizers' pipeline: added tokens are found in the
// raw text first (honouring lstrip, rstrip, single_word and normalized),
// the rest is normalized (Prepend, Replace, NFC/NFD/NFKC/NFKD, Strip),
// pre-tokenized (Metaspace, ByteLevel, Split with the Qwen2, Llama 3 or
// GPT-2 regex implemented by hand, since Go's regexp has no lookahead)
// and encoded word by word with BPE (byte fallback, unknown-token
// fusing, ignore_merges, merges in either JSON form). Decoding runs the
// file's decoder chain (Replace, ByteFallback, Fuse, Strip, Metaspace,
// ByteLevel).
package tokenizer
