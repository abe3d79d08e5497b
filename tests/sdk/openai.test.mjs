// The official `openai` npm SDK against a real gpupool-server + gpupool-agent
// (openai backend relaying to the scripted upstream in tests/integration).
// Checks the wire format the SDK parses and that errors raise the SDK's own
// error classes (which it chooses from the HTTP status alone).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Pool, waitFor } from './pool.mjs';

let pool, client;

before(async () => {
  pool = await new Pool().start({ model: 'pool-model', upstreamArgs: ['--tool-call', 'list_dir'] });
  client = new OpenAI({ baseURL: `${pool.baseURL}/v1`, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 20000 });
});

after(async () => { if (pool) await pool.stop(); });

test('models.list returns the served model in both SDK shapes', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert.ok(ids.includes('pool-model'), `models: ${ids}`);
  const m = page.data.find((x) => x.id === 'pool-model');
  assert.equal(m.object, 'model');
  assert.equal(typeof m.created, 'number');
  assert.equal(typeof m.owned_by, 'string');
  // Fields the Anthropic SDK's models.list reads, served by the same object.
  assert.equal(m.type, 'model');
  assert.equal(typeof m.display_name, 'string');
  assert.equal(typeof m.created_at, 'string');
  const raw = await (await fetch(`${pool.baseURL}/v1/models`)).json();
  assert.equal(raw.object, 'list');
  assert.equal(raw.has_more, false);
  assert.equal(raw.first_id, raw.data[0].id);
  assert.equal(raw.last_id, raw.data[raw.data.length - 1].id);
});

test('chat completion, not streamed', async () => {
  const r = await client.chat.completions.create({
    model: 'pool-model', max_tokens: 8, messages: [{ role: 'user', content: 'Say hello' }],
  });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(typeof r.created, 'number');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens >= 0);
  assert.ok(r.usage.completion_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('chat completion, streamed, equals the non-streamed text', async () => {
  const req = { model: 'pool-model', max_tokens: 8, messages: [{ role: 'user', content: 'Count for me' }] };
  const whole = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '', first = true, finish = null, usage = null, ids = new Set();
  for await (const chunk of stream) {
    ids.add(chunk.id);
    assert.equal(chunk.object, 'chat.completion.chunk');
    assert.ok(Array.isArray(chunk.choices));
    if (chunk.choices.length === 0) { usage = chunk.usage; continue; }
    const d = chunk.choices[0].delta;
    if (first) { assert.equal(d.role, 'assistant'); first = false; }
    if (d.content) text += d.content;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(ids.size, 1, 'every chunk carries the same id');
  assert.equal(text, whole.choices[0].message.content);
  assert.ok(['stop', 'length'].includes(finish));
  assert.ok(usage && usage.completion_tokens > 0, 'final usage chunk');
});

test('text completion, streamed and not', async () => {
  const r = await client.completions.create({ model: 'pool-model', prompt: 'Once upon a time', max_tokens: 6 });
  assert.equal(r.object, 'text_completion');
  assert.ok(r.choices[0].text.length > 0);
  const stream = await client.completions.create({ model: 'pool-model', prompt: 'Once upon a time', max_tokens: 6, stream: true });
  let text = '';
  for await (const c of stream) text += c.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

test('errors raise the SDK error classes', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(
    client.chat.completions.create({ model: 'pool-model', max_tokens: 4, temperature: 7, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: 'pool-model', max_tokens: 4, messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && /messages/.test(e.message));
});

test('a bad key is an AuthenticationError once keys exist', async () => {
  const keyed = new Pool();
  try {
    // Auth turns on as soon as any key exists.
    const db = `${keyed.dir}/pool.db`;
    const clientKey = keyed.createKey(db, 'client');
    const agentKey = keyed.createKey(db, 'agent');
    await keyed.start({ db, model: 'keyed-model', agentToken: agentKey, clientKey });
    const bad = new OpenAI({ baseURL: `${keyed.baseURL}/v1`, apiKey: 'gpk_wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
    await assert.rejects(
      bad.chat.completions.create({ model: 'keyed-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof OpenAI.AuthenticationError);
    const good = new OpenAI({ baseURL: `${keyed.baseURL}/v1`, apiKey: clientKey, maxRetries: 0 });
    const r = await good.chat.completions.create({ model: 'keyed-model', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] });
    assert.ok(r.choices[0].message.content.length > 0);
  } finally {
    await keyed.stop();
  }
});

test('a full queue is a RateLimitError with Retry-After', async () => {
  const busy = new Pool();
  try {
    // One slot and a queue of one. The upstream holds every request before
    // its first token until the test releases it, so the order does not
    // depend on timing: the first request runs (held), of the three sent
    // next one waits in the queue and two are refused with 429.
    await busy.start({ model: 'busy-model', slots: 1, serverArgs: ['--max_queue', '1'], upstreamArgs: ['--first-delay-ms', '600000', '--tokens', '6'] });
    const c = new OpenAI({ baseURL: `${busy.baseURL}/v1`, apiKey: 'x', maxRetries: 0, timeout: 120000 });
    const settled = [];
    const req = () => {
      const p = c.chat.completions.create({ model: 'busy-model', max_tokens: 6, messages: [{ role: 'user', content: 'slow one' }] })
        // settle at once so that an early 429 is not an unhandled rejection
        .then((value) => ({ status: 'fulfilled', value }), (reason) => ({ status: 'rejected', reason }));
      p.then((r) => settled.push(r));
      return p;
    };
    const all = [req()];
    await waitFor('the first request at the upstream', async () => (await busy.upstreamLog()).length === 1, 60000);
    for (let i = 0; i < 3; i++) all.push(req());
    await waitFor('two requests refused', async () => settled.length === 2, 60000);
    await busy.upstreamConfig({ first_delay_ms: 0 });
    const res = await Promise.all(all);
    const ok = res.filter((r) => r.status === 'fulfilled');
    const refused = res.filter((r) => r.status === 'rejected');
    assert.equal(ok.length, 2, `served ${ok.length}`);
    assert.equal(refused.length, 2, `refused ${refused.length}`);
    for (const r of refused) {
      assert.ok(r.reason instanceof OpenAI.RateLimitError, `got ${r.reason}`);
      assert.equal(r.reason.status, 429);
      assert.ok(Number(r.reason.headers.get('retry-after')) > 0);
    }
    for (const r of ok) assert.ok(r.value.choices[0].message.content.length > 0);
  } finally {
    await busy.stop();
  }
});

// Tool calls pass through: the scripted upstream calls list_dir when it is
// offered (upstream.py --tool-call), streamed in argument pieces.
const LIST_DIR = { type: 'function', function: { name: 'list_dir', description: 'List a directory',
  parameters: { type: 'object', properties: { path: { type: 'string' } } } } };
const TOOL_ARGS = { path: '/tmp/dir0', depth: 1, note: 'say "hi" caf\u00e9' };

test('tool calls: non-streaming message.tool_calls and streamed delta.tool_calls', async () => {
  const req = { model: 'pool-model', tools: [LIST_DIR], messages: [{ role: 'user', content: 'look' }] };
  const c = await client.chat.completions.create(req);
  assert.equal(c.choices[0].finish_reason, 'tool_calls');
  const tc = c.choices[0].message.tool_calls;
  assert.equal(tc.length, 1);
  assert.equal(tc[0].type, 'function');
  assert.equal(tc[0].function.name, 'list_dir');
  assert.deepEqual(JSON.parse(tc[0].function.arguments), TOOL_ARGS);

  const stream = await client.chat.completions.create({ ...req, stream: true });
  let args = '', id = null, name = null, finish = null, pieces = 0;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    for (const d of ch.delta.tool_calls ?? []) {
      assert.equal(d.index, 0);
      if (d.id) id = d.id;
      if (d.function?.name) name = d.function.name;
      args += d.function?.arguments ?? '';
      pieces++;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.ok(pieces > 1, `pieces: ${pieces}`);
  assert.equal(typeof id, 'string');
  assert.equal(name, 'list_dir');
  assert.deepEqual(JSON.parse(args), TOOL_ARGS);
  assert.equal(finish, 'tool_calls');

  // SDK helper: the stream runner assembles the calls too.
  const runner = client.beta?.chat?.completions?.stream
    ? client.beta.chat.completions.stream(req) : null;
  if (runner) {
    const fin = await runner.finalChatCompletion();
    assert.deepEqual(JSON.parse(fin.choices[0].message.tool_calls[0].function.arguments), TOOL_ARGS);
  }
});
