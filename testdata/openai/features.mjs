#!/usr/bin/env node
// The official OpenAI client (the `openai` npm package) on what odmoe
// serves beyond plain text, for the Go test
// TestOfficialClientGetsToolCallsStructuredOutputAndLogprobs
// (api_openai_test.go). The server must serve a model whose chat
// template writes Hermes tool calls (qwen3-moe-tiny).
//
// Usage: node features.mjs BASE_URL MODEL SCHEMAS_JSON [KEYWORD_SCHEMAS_JSON]
//
// It runs, and prints as one JSON object on stdout:
//   - tools:    a chat completion with two tools and tool_choice
//               "required": the message's tool_calls and finish reason
//   - streamed: client.chat.completions.stream with a named tool choice,
//               the client's own accumulation of the deltas
//               (finalChatCompletion)
//   - roundtrip: the conversation sent back with the call and a tool
//               result: the finish reason of the answer
//   - parsed:   client.chat.completions.parse with each strict
//               json_schema of SCHEMAS_JSON ([{prompt, name, schema}]),
//               each its own prompt: the client's parsed object, the
//               answer's text and finish reason
//   - logprobs: a chat completion with logprobs and top_logprobs 2
//   - keywords: parsed's, for KEYWORD_SCHEMAS_JSON (string lengths,
//               patterns, formats, number bounds), and a forced call of
//               a tool whose parameters carry maxLength (bounded)
// Any failure exits 1.
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const [baseURL, model, schemasFile, keywordsFile] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY ?? 'none', maxRetries: 0, timeout: 120_000 });
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'weather in a city',
    parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Rome'] }, days: { type: 'integer' } },
      required: ['city'], additionalProperties: false } } },
  { type: 'function', function: { name: 'search',
    parameters: { type: 'object', properties: { q: { enum: ['a', 'b'] } }, required: ['q'], additionalProperties: false } } },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const out = {};

// one call (parallel_tool_calls false): its grammar ends the answer after it, where a random model's parallel calls may run to max_tokens
const forced = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 300, seed: 1 });
out.tools = { tool_calls: forced.choices[0].message.tool_calls, content: forced.choices[0].message.content,
  finish_reason: forced.choices[0].finish_reason };

const stream = client.chat.completions.stream({ model, messages, tools, max_tokens: 300, seed: 2,
  tool_choice: { type: 'function', function: { name: 'get_weather' } } });
const final = await stream.finalChatCompletion();
out.streamed = { tool_calls: final.choices[0].message.tool_calls, finish_reason: final.choices[0].finish_reason };

const call = forced.choices[0].message.tool_calls[0];
const back = await client.chat.completions.create({ model, max_tokens: 4, tools, messages: [...messages,
  { role: 'assistant', content: null, tool_calls: [call] },
  { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' }] });
out.roundtrip = { finish_reason: back.choices[0].finish_reason };

async function parseEach(file) {
  const answers = [];
  for (const [i, s] of JSON.parse(readFileSync(file, 'utf8')).entries()) {
    // a random model closes a string only when it happens to draw a quote: room for long ones
    const req = { model, max_tokens: 2000, seed: i, messages: [{ role: 'user', content: s.prompt }],
      response_format: { type: 'json_schema', json_schema: { name: s.name, strict: true, schema: s.schema } } };
    try {
      const c = (await client.chat.completions.parse(req)).choices[0];
      answers.push({ name: s.name, parsed: c.message.parsed, content: c.message.content, finish_reason: c.finish_reason });
    } catch (err) {
      // the test says what was wrong, with the answer the client refused
      const c = (await client.chat.completions.create(req)).choices[0];
      answers.push({ name: s.name, error: String(err), content: c.message.content, finish_reason: c.finish_reason });
    }
  }
  return answers;
}
out.parsed = await parseEach(schemasFile);

if (keywordsFile) {
  const bounded = { type: 'function', function: { name: 'set_unit',
    parameters: { type: 'object', properties: { unit: { type: 'string', maxLength: 4 }, note: { type: 'string', maxLength: 12 } },
      required: ['unit', 'note'], additionalProperties: false } } };
  const call = await client.chat.completions.create({ model, messages, tools: [bounded], tool_choice: 'required',
    parallel_tool_calls: false, max_tokens: 300, seed: 3 });
  out.keywords = { parsed: await parseEach(keywordsFile),
    bounded: { tool_calls: call.choices[0].message.tool_calls, finish_reason: call.choices[0].finish_reason } };
}

const lp = await client.chat.completions.create({ model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2 });
out.logprobs = { content: lp.choices[0].logprobs.content, completion_tokens: lp.usage.completion_tokens };

process.stdout.write(JSON.stringify(out) + '\n');
