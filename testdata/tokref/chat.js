#!/usr/bin/env node
// Reference chat-template renderer for the Go tests in model/chat.
//
// Usage: node chat.js INPUT_JSONL
//
// INPUT_JSONL holds one JSON object per line, {"template": "...", "vars":
// {...}}. For each line this prints one JSON object, {"ok": true, "out":
// "..."} or {"ok": false, "error": "..."}: the template rendered with
// Hugging Face's @huggingface/jinja as transformers' apply_chat_template
// calls it (tools and documents null and add_generation_prompt false
// unless given). The module is found next to this script or through
// NODE_PATH.
'use strict';

const fs = require('node:fs');
const { Template } = require('@huggingface/jinja');

const [inputPath] = process.argv.slice(2);
if (!inputPath) {
  process.stderr.write('usage: node chat.js INPUT_JSONL\n');
  process.exit(2);
}
const lines = fs.readFileSync(inputPath, 'utf8').split('\n').filter((l) => l.length > 0);
const out = [];
for (const line of lines) {
  const { template, vars } = JSON.parse(line);
  for (const k of ['tools', 'documents']) {
    if (!(k in vars)) vars[k] = null;
  }
  if (!('add_generation_prompt' in vars)) vars.add_generation_prompt = false;
  try {
    out.push(JSON.stringify({ ok: true, out: new Template(template).render(vars) }));
  } catch (err) {
    out.push(JSON.stringify({ ok: false, error: String(err && err.message ? err.message : err) }));
  }
}
process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
