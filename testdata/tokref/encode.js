#!/usr/bin/env node
// Reference encoder for the Go tests in model/tokenizer.
//
// Usage: node encode.js TOKENIZER_JSON INPUT_JSONL
//
// INPUT_JSONL holds one JSON string per line. For each line this prints
// one JSON object:
//   {"ids": [...], "words": [...], "with_special": [...], "decoded": "...", "decoded_skip": "..."}
// where ids is the encoding without special tokens, words the index of
// the pre-tokenized word each of those ids comes from, with_special the
// encoding with them (the post-processor's template), and decoded /
// decoded_skip are decode(ids_with_special, skipSpecialTokens=false/true).
//
// It uses Hugging Face's tokenizers library (Rust, node bindings); the
// module is found next to this script or through NODE_PATH.
'use strict';

const fs = require('node:fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [tokenizerPath, inputPath] = process.argv.slice(2);
  if (!tokenizerPath || !inputPath) {
    process.stderr.write('usage: node encode.js TOKENIZER_JSON INPUT_JSONL\n');
    process.exit(2);
  }
  const tok = Tokenizer.fromFile(tokenizerPath);
  const lines = fs.readFileSync(inputPath, 'utf8').split('\n').filter((l) => l.length > 0);
  const out = [];
  for (const line of lines) {
    const text = JSON.parse(line);
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const special = await tok.encode(text, null, { addSpecialTokens: true });
    const ws = special.getIds();
    out.push(JSON.stringify({
      ids: plain.getIds(),
      words: plain.getWordIds(),
      with_special: ws,
      decoded: await tok.decode(ws, false),
      decoded_skip: await tok.decode(ws, true),
    }));
  }
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
  process.exit(1);
});
