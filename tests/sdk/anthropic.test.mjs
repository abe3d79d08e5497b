// The official `@anthropic-ai/sdk` npm SDK against a real gpupool-server +
// gpupool-agent (openai backend relaying to the scripted upstream in
// tests/integration). The upstream's text is deterministic: token i is
// " " + word_i + i over the words of the last message (see upstream.py).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { Pool, waitFor } from './pool.mjs';

let pool, client;

// What the scripted upstream answers for the last user message `text`.
const expected = (text, n) => {
  const words = text.split(/\s+/).filter(Boolean).map((w) => (w.replace(/[^A-Za-z0-9]/g, '').slice(0, 12) || 'w'));
  return Array.from({ length: n }, (_, i) => ` ${words[i % words.length]}${i}`).join('');
};

before(async () => {
  pool = await new Pool().start({ model: 'claude-pool', upstreamArgs: ['--tokens', '8', '--tool-call', 'list_dir'] });
  client = new Anthropic({ baseURL: pool.baseURL, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 20000 });
});

after(async () => { if (pool) await pool.stop(); });

test('messages.create returns a message the SDK parses', async () => {
  const m = await client.messages.create({
    model: 'claude-pool', max_tokens: 64,
    system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'alpha beta gamma' }],
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, 'claude-pool');
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.content[0].text, expected('alpha beta gamma', 8));
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.output_tokens, 8);
  assert.ok(m.usage.input_tokens >= 0);
  assert.equal(typeof m.x_pool_meta.agent_id, 'string');
});

test('max_tokens stop', async () => {
  const m = await client.messages.create({
    model: 'claude-pool', max_tokens: 3, messages: [{ role: 'user', content: 'one two' }],
  });
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.content[0].text, expected('one two', 3));
  assert.equal(m.usage.output_tokens, 3);
});

test('stop sequences are matched and reported', async () => {
  // The reply is " red0 blue1 red2 blue3 ..."; stop at "blue3".
  const m = await client.messages.create({
    model: 'claude-pool', max_tokens: 64, stop_sequences: ['nomatch', 'blue3'],
    messages: [{ role: 'user', content: 'red blue' }],
  });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, 'blue3');
  assert.equal(m.content[0].text, ' red0 blue1 red2 ');
});

test('stream with finalMessage() equals the non-streamed message', async () => {
  const req = { model: 'claude-pool', max_tokens: 64, messages: [{ role: 'user', content: 'stream me please' }] };
  const whole = await client.messages.create(req);
  const stream = client.messages.stream(req);
  const types = [];
  let deltas = '', startUsage = null;
  stream.on('streamEvent', (e) => {
    types.push(e.type);
    // A copy: the SDK's final message is this object, updated by message_delta.
    if (e.type === 'message_start') startUsage = { ...e.message.usage };
  });
  stream.on('text', (t) => { deltas += t; });
  const fin = await stream.finalMessage();
  assert.equal(fin.content[0].text, whole.content[0].text);
  assert.equal(deltas, whole.content[0].text);
  assert.equal(fin.stop_reason, 'end_turn');
  assert.equal(fin.usage.output_tokens, 8);
  // Issue 26 item 4: message_start has the prompt's size already (the
  // openai-backend agent counts it with the upstream's /tokenize first).
  assert.ok(whole.usage.input_tokens > 0);
  assert.equal(startUsage.input_tokens, whole.usage.input_tokens);
  assert.equal(types[0], 'message_start');
  assert.equal(types[1], 'content_block_start');
  assert.equal(types.at(-3), 'content_block_stop');
  assert.equal(types.at(-2), 'message_delta');
  assert.equal(types.at(-1), 'message_stop');
});

test('streamed stop sequence spanning two tokens', async () => {
  // The reply is " ab0 cd1 ab2 cd3 ...": "1 ab" spans the tokens " cd1" and " ab2".
  const s = client.messages.stream({
    model: 'claude-pool', max_tokens: 64, stop_sequences: ['1 ab'],
    messages: [{ role: 'user', content: 'ab cd' }],
  });
  let deltas = '';
  s.on('text', (t) => { deltas += t; });
  const fin = await s.finalMessage();
  assert.equal(fin.stop_reason, 'stop_sequence');
  assert.equal(fin.stop_sequence, '1 ab');
  assert.equal(fin.content[0].text, ' ab0 cd');
  assert.equal(deltas, ' ab0 cd');
});

test('count_tokens', async () => {
  const r = await client.messages.countTokens({
    model: 'claude-pool', messages: [{ role: 'user', content: 'one two three four' }],
  });
  assert.equal(typeof r.input_tokens, 'number');
  assert.ok(r.input_tokens >= 4, `input_tokens ${r.input_tokens}`);
});

test('errors raise the SDK error classes', async () => {
  await assert.rejects(
    client.messages.create({ model: 'no-such-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.NotFoundError && e.status === 404 && e.error?.error?.type === 'not_found_error');
  await assert.rejects(
    client.messages.create({ model: 'claude-pool', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.BadRequestError && /max_tokens/.test(e.message));
  await assert.rejects(
    client.messages.create({ model: 'claude-pool', max_tokens: 4, temperature: 1.5, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.BadRequestError && /temperature/.test(e.message));
  await assert.rejects(
    client.messages.create({
      model: 'claude-pool', max_tokens: 4,
      messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }],
    }),
    (e) => e instanceof Anthropic.BadRequestError && /image/.test(e.message) && e.error?.error?.type === 'invalid_request_error');
  // A streaming request that fails before any byte is a plain HTTP error.
  await assert.rejects(
    (async () => { const s = client.messages.stream({ model: 'no-such-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }); await s.finalMessage(); })(),
    (e) => e instanceof Anthropic.NotFoundError);
});

test('a bad key is an AuthenticationError; x-api-key and Bearer both work', async () => {
  const keyed = new Pool();
  try {
    const db = `${keyed.dir}/pool.db`;
    const clientKey = keyed.createKey(db, 'client');
    const agentKey = keyed.createKey(db, 'agent');
    await keyed.start({ db, model: 'keyed-model', agentToken: agentKey, clientKey });
    const bad = new Anthropic({ baseURL: keyed.baseURL, apiKey: 'gpk_wrong', maxRetries: 0 });
    await assert.rejects(
      bad.messages.create({ model: 'keyed-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 && e.error?.error?.type === 'authentication_error');
    // A valid key of the wrong role (agent) is a PermissionDeniedError.
    const agentKeyed = new Anthropic({ baseURL: keyed.baseURL, apiKey: agentKey, maxRetries: 0 });
    await assert.rejects(
      agentKeyed.messages.create({ model: 'keyed-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof Anthropic.PermissionDeniedError && e.status === 403 && e.error?.error?.type === 'permission_error');
    const good = new Anthropic({ baseURL: keyed.baseURL, apiKey: clientKey, maxRetries: 0 });
    const m = await good.messages.create({ model: 'keyed-model', max_tokens: 4, messages: [{ role: 'user', content: 'hi there' }] });
    assert.ok(m.content[0].text.length > 0);
    // Claude Code style: x-api-key and anthropic-version 2023-06-01.
    const r = await fetch(`${keyed.baseURL}/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': clientKey, 'anthropic-version': '2023-06-01', 'anthropic-beta': 'a-1,b-2', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'keyed-model', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] }),
    });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('request-id') || '', /^req_/);
  } finally {
    await keyed.stop();
  }
});

test('a full queue is a RateLimitError', async () => {
  const busy = new Pool();
  try {
    // As in openai.test.mjs: the upstream holds requests until released,
    // so exactly one runs, one waits and two are refused, whatever the load.
    await busy.start({ model: 'busy-model', slots: 1, serverArgs: ['--max_queue', '1'], upstreamArgs: ['--first-delay-ms', '600000', '--tokens', '6'] });
    const c = new Anthropic({ baseURL: busy.baseURL, apiKey: 'x', maxRetries: 0, timeout: 120000 });
    const settled = [];
    const req = () => {
      const p = c.messages.create({ model: 'busy-model', max_tokens: 6, messages: [{ role: 'user', content: 'slow one' }] })
        .then((value) => ({ ok: true, value }), (reason) => ({ ok: false, reason }));
      p.then((r) => settled.push(r));
      return p;
    };
    const all = [req()];
    await waitFor('the first request at the upstream', async () => (await busy.upstreamLog()).length === 1, 60000);
    for (let i = 0; i < 3; i++) all.push(req());
    await waitFor('two requests refused', async () => settled.length === 2, 60000);
    await busy.upstreamConfig({ first_delay_ms: 0 });
    const res = await Promise.all(all);
    const refused = res.filter((r) => !r.ok);
    assert.equal(refused.length, 2, `refused ${refused.length}`);
    for (const r of refused) {
      assert.ok(r.reason instanceof Anthropic.RateLimitError, `got ${r.reason}`);
      assert.equal(r.reason.error?.error?.type, 'rate_limit_error');
    }
    const served = res.filter((x) => x.ok);
    assert.equal(served.length, 2);
    for (const r of served) assert.ok(r.value.content[0].text.length > 0);
  } finally {
    await busy.stop();
  }
});

test('a known model without a live agent is an overloaded_error (503)', async () => {
  const gone = new Pool();
  try {
    await gone.start({ model: 'gone-model' });
    const exited = new Promise((res) => gone.agent.once('exit', res));
    gone.agent.kill('SIGTERM');   // drains and deregisters: the model has no live agent
    await exited;
    const c = new Anthropic({ baseURL: gone.baseURL, apiKey: 'x', maxRetries: 0 });
    await assert.rejects(
      c.messages.create({ model: 'gone-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof Anthropic.InternalServerError && e.status === 503 &&
        e.error?.error?.type === 'overloaded_error' && Number(e.headers?.['retry-after'] ?? e.headers?.get?.('retry-after')) > 0);
  } finally {
    await gone.stop();
  }
});

// Tool use: the scripted upstream calls list_dir (offered in `tools`) with
// {"path":"/tmp/dir0","depth":1,"note":"say \"hi\" café"}, streamed in
// argument pieces of 7 characters (upstream.py --tool-call).
const LIST_DIR = {
  name: 'list_dir', description: 'List a directory',
  input_schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
};
const TOOL_ARGS = { path: '/tmp/dir0', depth: 1, note: 'say "hi" caf\u00e9' };

test('tool use: stream finalMessage() has a tool_use block with parsed input', async () => {
  const req = { model: 'claude-pool', max_tokens: 64, tools: [LIST_DIR],
                messages: [{ role: 'user', content: 'what is in tmp' }] };
  const stream = client.messages.stream(req);
  const jsonPieces = [];
  stream.on('inputJson', (partial) => { jsonPieces.push(partial); });
  const fin = await stream.finalMessage();
  assert.equal(fin.stop_reason, 'tool_use');
  assert.equal(fin.content.length, 1);
  const tu = fin.content[0];
  assert.equal(tu.type, 'tool_use');
  assert.equal(tu.name, 'list_dir');
  assert.match(tu.id, /^toolu_/);
  assert.deepEqual(tu.input, TOOL_ARGS);
  assert.ok(jsonPieces.length > 1, `input_json_delta pieces: ${jsonPieces.length}`);

  // The same without streaming, then the tool_result round trip.
  const whole = await client.messages.create(req);
  assert.equal(whole.stop_reason, 'tool_use');
  assert.deepEqual(whole.content[0].input, TOOL_ARGS);
  const next = await client.messages.create({
    ...req,
    messages: [...req.messages, { role: 'assistant', content: whole.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: whole.content[0].id, content: 'aa bb' }] }],
  });
  assert.equal(next.stop_reason, 'end_turn');
  assert.equal(next.content[0].text, expected('aa bb', 8));
});
