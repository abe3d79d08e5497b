// The official OpenAI SDK against a pool whose gguf agent serves a BERT
// encoder (the generated tests/data/arch/tiny-random-bert-f16.gguf: bert,
// mean pooling, WordPiece vocabulary; issue 26 item 2): embeddings.create
// gives unit vectors of n_embd (64), one per input, batched inputs equal to
// single ones, and the vectors llama.cpp's llama-embedding computed on the
// same file (tests/data/arch/tiny-random-bert-f16.embd.json); /v1/models
// lists the model; a chat completion for it is an OpenAI-shaped 400
// naming `model` (an encoder generates no text).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { Pool } from './pool.mjs';

const REF = JSON.parse(readFileSync(join(process.env.GPUPOOL_SOURCE_DIR,
  'tests/data/arch/tiny-random-bert-f16.embd.json'), 'utf8'));
let pool, openai;

before(async () => {
  pool = await new Pool().startBundled({ model: 'minibert', file: 'tests/data/arch/tiny-random-bert-f16.gguf' });
  openai = new OpenAI({ baseURL: `${pool.baseURL}/v1`, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 60000 });
});

after(async () => { if (pool) await pool.stop(); });

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const cosine = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0) / (norm(a) * norm(b));

test('OpenAI SDK: /v1/models lists the encoder', async () => {
  const ids = [];
  for await (const m of openai.models.list()) ids.push(m.id);
  assert.ok(ids.includes('minibert'), JSON.stringify(ids));
});

test('OpenAI SDK: embeddings.create on a bert encoder matches llama.cpp', async () => {
  const input = REF.inputs.map((x) => x.text);
  const r = await openai.embeddings.create({ model: 'minibert', input, encoding_format: 'float' });
  assert.deepEqual(r.data.map((d) => d.index), input.map((_, i) => i));
  const tokens = REF.inputs.reduce((s, x) => s + x.ids.length, 0);
  assert.equal(r.usage.prompt_tokens, tokens);   // [CLS] ... [SEP] counted
  r.data.forEach((d, i) => {
    assert.equal(d.embedding.length, 64);
    assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-4);
    assert.ok(cosine(d.embedding, REF.inputs[i].embedding) >= 0.9999, `input ${i}`);
  });
  // the SDK's default (base64, decoded by the SDK): the same vector alone
  const one = await openai.embeddings.create({ model: 'minibert', input: input[1] });
  one.data[0].embedding.forEach((x, k) => assert.ok(Math.abs(x - r.data[1].embedding[k]) < 1e-6));
});

test('OpenAI SDK: a chat completion for an encoder is a 400 naming model', async () => {
  await assert.rejects(
    openai.chat.completions.create({ model: 'minibert', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && e.param === 'model' && /embeddings model/.test(e.message)
      && e.type === 'invalid_request_error');
});
