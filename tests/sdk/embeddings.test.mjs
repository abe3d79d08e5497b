// The official OpenAI SDK's embeddings.create against a pool whose agent
// runs the bundled model (models/stories260K.gguf) on the embedded engine
// (issue 26 item 2): a string, an array of strings, token ids, base64
// (the SDK's default encoding, decoded by the SDK) and float; unit-length
// vectors of the model's n_embd (64); same input, same vector; usage; an
// OpenAI-shaped 400 naming the parameter.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Pool } from './pool.mjs';

let pool, openai;

before(async () => {
  pool = await new Pool().startBundled({ model: 'stories' });
  openai = new OpenAI({ baseURL: `${pool.baseURL}/v1`, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 60000 });
});

after(async () => { if (pool) await pool.stop(); });

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const close = (a, b, eps = 1e-5) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < eps);

test('OpenAI SDK: embeddings.create with a string (SDK default: base64, decoded)', async () => {
  const r = await openai.embeddings.create({ model: 'stories', input: 'Once upon a time' });
  assert.equal(r.object, 'list');
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].object, 'embedding');
  assert.equal(r.data[0].index, 0);
  assert.equal(r.data[0].embedding.length, 64);
  assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-4);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
});

test('OpenAI SDK: an array of strings, float and base64 agree, same input same vector', async () => {
  const input = ['The cat sat', 'Once upon a time', 'The cat sat'];
  const f = await openai.embeddings.create({ model: 'stories', input, encoding_format: 'float' });
  const b = await openai.embeddings.create({ model: 'stories', input, encoding_format: 'base64' });
  assert.deepEqual(f.data.map((d) => d.index), [0, 1, 2]);
  assert.ok(close(f.data[0].embedding, f.data[2].embedding));
  assert.ok(!close(f.data[0].embedding, f.data[1].embedding, 1e-3));
  // base64 as the client asked: the raw string (little-endian float32)
  const raw = Buffer.from(b.data[1].embedding, 'base64');
  const dec = Array.from(new Float32Array(raw.buffer, raw.byteOffset, raw.length / 4));
  assert.ok(close(dec, f.data[1].embedding, 1e-6));
});

test('OpenAI SDK: token ids and arrays of token ids', async () => {
  const one = await openai.embeddings.create({ model: 'stories', input: [1, 400, 30, 9] });
  const two = await openai.embeddings.create({ model: 'stories', input: [[1, 400, 30, 9], [1, 50]] });
  assert.equal(one.usage.prompt_tokens, 4);
  assert.equal(two.data.length, 2);
  assert.ok(close(one.data[0].embedding, two.data[0].embedding));
});

test('OpenAI SDK: a bad parameter is a 400 naming it', async () => {
  await assert.rejects(
    openai.embeddings.create({ model: 'stories', input: 'x', encoding_format: 'int8' }),
    (e) => e.status === 400 && e.param === 'encoding_format');
  await assert.rejects(openai.embeddings.create({ model: 'stories', input: [] }),
    (e) => e.status === 400 && e.param === 'input');
  const ok = await openai.embeddings.create({ model: 'stories', input: 'x', dimensions: 64 });
  assert.equal(ok.data[0].embedding.length, 64);
  await assert.rejects(openai.embeddings.create({ model: 'stories', input: 'x', dimensions: 32 }),
    (e) => e.status === 400 && /dimensions/.test(e.message));
});

// An openai-backend agent passing embeddings through to its upstream
// (upstream.py --embeddings-dim 16): the SDK's default base64 decodes to
// the upstream's own vectors (embedding_vector() there), usage passes on.
const upstreamVector = (text, dim) => {
  let seed = text.length;
  for (let i = 0; i < text.length; i++) seed += (i + 1) * text.charCodeAt(i);
  return Array.from({ length: dim }, (_, k) => ((seed * (k + 1) * 7919) % 2001) / 1000 - 1);
};

test('OpenAI SDK: embeddings passed through an openai-backend agent', async () => {
  const relay = await new Pool().start({ model: 'relayed', upstreamArgs: ['--embeddings-dim', '16'] });
  try {
    const client = new OpenAI({ baseURL: `${relay.baseURL}/v1`, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 60000 });
    const input = ['The cat sat', 'Once upon a time'];
    const r = await client.embeddings.create({ model: 'relayed', input });
    assert.deepEqual(r.data.map((d) => d.index), [0, 1]);
    r.data.forEach((d, i) => assert.ok(close(d.embedding, upstreamVector(input[i], 16))));
    assert.equal(r.usage.prompt_tokens, 7);
    const sent = (await relay.upstreamLog()).filter((e) => e.path === '/v1/embeddings');
    assert.equal(sent.length, 1);
    assert.deepEqual(sent[0].body, { model: 'scripted-upstream', input, encoding_format: 'float' });
  } finally {
    await relay.stop();
  }
});
