#!/usr/bin/env node
// The official OpenAI client (the `openai` npm package) against odmoe's
// OpenAI-compatible API, for the Go test TestOpenAIAPIOnASwarmOfProcesses
// (api_openai_test.go).
//
// Usage: node client.mjs BASE_URL MODEL PROMPT MAX_TOKENS
//
// BASE_URL is the API's root (http://127.0.0.1:8080/v1). With greedy
// decoding (temperature 0) it runs, one after the other:
//   - models.list(), models.retrieve(MODEL) and models.retrieve of a
//     model it does not serve
//   - a streaming chat completion of one user message PROMPT, with
//     stream_options.include_usage: the deltas joined, their count, the
//     role, the finish reason and the usage chunk
//   - the same chat completion, not streamed
//   - a completion of PROMPT, not streamed, and streamed
// and prints one JSON object on stdout:
//   {"models": [...], "model": M, "missing_model": M, "chat_stream": R, "chat": R,
//    "completion": R, "completion_stream": R}
// where M is {"id", "object"} or the refusal below, and
// R is {"text", "finish_reason", "usage", ...} or, when the server
// refused the call, {"error": {"status", "message"}}: the test says what
// it expected. Any other failure exits 1.
import OpenAI from 'openai';

const [baseURL, model, prompt, maxTokensArg] = process.argv.slice(2);
if (!baseURL || !model || prompt === undefined || !maxTokensArg) {
  process.stderr.write('usage: node client.mjs BASE_URL MODEL PROMPT MAX_TOKENS\n');
  process.exit(2);
}
const maxTokens = Number(maxTokensArg);
// the key: OPENAI_API_KEY, as the client reads it anywhere ('none' for a
// server without one)
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY ?? 'none', maxRetries: 0, timeout: 120_000 });

// refused turns the server's refusal (an HTTP error status) into a
// result; anything else is the client's or the connection's failure.
async function refused(call) {
  try {
    return await call();
  } catch (err) {
    if (err instanceof OpenAI.APIError && err.status !== undefined) {
      return { error: { status: err.status, message: err.message } };
    }
    throw err;
  }
}

const messages = [{ role: 'user', content: prompt }];
const out = {};

const models = await client.models.list();
out.models = [];
for await (const m of models) {
  out.models.push({ id: m.id, object: m.object, owned_by: m.owned_by });
}
out.model = await refused(async () => {
  const m = await client.models.retrieve(model);
  return { id: m.id, object: m.object };
});
out.missing_model = await refused(async () => {
  const m = await client.models.retrieve('no-such-model');
  return { id: m.id, object: m.object };
});

out.chat_stream = await refused(async () => {
  const stream = await client.chat.completions.create({
    model, messages, temperature: 0, max_tokens: maxTokens, stream: true,
    stream_options: { include_usage: true },
  });
  const r = { text: '', deltas: 0, role: null, finish_reason: null, usage: null, chunks_after_usage: 0 };
  for await (const chunk of stream) {
    if (r.usage) r.chunks_after_usage++;
    if (chunk.usage) r.usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta?.role) r.role = c.delta.role;
      if (c.delta?.content) {
        r.text += c.delta.content;
        r.deltas++;
      }
      if (c.finish_reason) r.finish_reason = c.finish_reason;
    }
  }
  return r;
});

out.chat = await refused(async () => {
  const resp = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: maxTokens });
  const c = resp.choices[0];
  return { text: c.message.content, role: c.message.role, finish_reason: c.finish_reason, usage: resp.usage, object: resp.object };
});

out.completion = await refused(async () => {
  const resp = await client.completions.create({ model, prompt, temperature: 0, max_tokens: maxTokens });
  const c = resp.choices[0];
  return { text: c.text, finish_reason: c.finish_reason, usage: resp.usage, object: resp.object };
});

out.completion_stream = await refused(async () => {
  const stream = await client.completions.create({
    model, prompt, temperature: 0, max_tokens: maxTokens, stream: true,
    stream_options: { include_usage: true },
  });
  const r = { text: '', deltas: 0, finish_reason: null, usage: null };
  for await (const chunk of stream) {
    if (chunk.usage) r.usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.text) {
        r.text += c.text;
        r.deltas++;
      }
      if (c.finish_reason) r.finish_reason = c.finish_reason;
    }
  }
  return r;
});

process.stdout.write(JSON.stringify(out) + '\n');
