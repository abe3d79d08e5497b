// Both official SDKs against a pool whose agent runs the bundled model
// (models/stories260K.gguf) on the embedded engine: the text is the model's,
// not a script's. Greedy decoding (temperature 0) must reproduce llama.cpp's
// reference continuation (tests/data/stories260K.greedy.json) through the
// OpenAI SDK, and a stream must equal the non-streamed answer in both SDKs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { Pool } from './pool.mjs';

const greedy = JSON.parse(readFileSync(join(process.env.GPUPOOL_SOURCE_DIR, 'tests/data/stories260K.greedy.json'), 'utf8'));
let pool, anthropic, openai;

before(async () => {
  pool = await new Pool().startBundled({ model: 'stories' });
  anthropic = new Anthropic({ baseURL: pool.baseURL, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 60000 });
  openai = new OpenAI({ baseURL: `${pool.baseURL}/v1`, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 60000 });
});

after(async () => { if (pool) await pool.stop(); });

test('OpenAI SDK: greedy completion equals llama.cpp reference text', async () => {
  for (const c of greedy.cases.slice(0, 2)) {
    const r = await openai.completions.create({ model: 'stories', prompt: c.prompt, max_tokens: c.n_generated, temperature: 0 });
    assert.equal(r.choices[0].text, c.generated_text, c.prompt);
    assert.equal(r.usage.completion_tokens, c.n_generated);
    assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
  }
});

test('OpenAI SDK: streamed chat equals the non-streamed chat', async () => {
  const req = { model: 'stories', temperature: 0, max_tokens: 24, messages: [{ role: 'user', content: 'Tell me about a cat' }] };
  const whole = await openai.chat.completions.create(req);
  let text = '';
  for await (const chunk of await openai.chat.completions.create({ ...req, stream: true }))
    text += chunk.choices[0]?.delta?.content ?? '';
  assert.ok(whole.choices[0].message.content.length > 0);
  assert.equal(text, whole.choices[0].message.content);
});

test('Anthropic SDK: create, max_tokens stop, stream finalMessage() equal', async () => {
  const req = { model: 'stories', max_tokens: 16, temperature: 0, messages: [{ role: 'user', content: 'Once upon a time' }] };
  const m = await anthropic.messages.create(req);
  assert.equal(m.type, 'message');
  assert.equal(m.content[0].type, 'text');
  assert.ok(m.content[0].text.length > 0);
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 16);
  assert.ok(m.usage.input_tokens > 0);
  const final = await anthropic.messages.stream(req).finalMessage();
  assert.equal(final.content[0].text, m.content[0].text);
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 16);
});

test('Anthropic SDK: count_tokens is the model tokenizer count', async () => {
  const short = await anthropic.messages.countTokens({ model: 'stories', messages: [{ role: 'user', content: 'Hi' }] });
  const long = await anthropic.messages.countTokens({ model: 'stories', messages: [{ role: 'user', content: 'Hi there, tell me a long story about a little girl and her dog' }] });
  assert.ok(short.input_tokens > 0);
  assert.ok(long.input_tokens > short.input_tokens + 5);
});
