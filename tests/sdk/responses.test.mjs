// The official `openai` SDK's Responses API (client.responses.create and
// .stream) against real gpupool pools: one whose agent runs the bundled
// model on the embedded engine (greedy text must equal the chat API's for
// the same conversation) and one whose agent relays to the scripted
// upstream, which calls a function tool when it is offered.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Pool } from './pool.mjs';

let bundled, scripted, gguf, relay;

before(async () => {
  bundled = await new Pool().startBundled({ model: 'stories' });
  scripted = await new Pool().start({ model: 'pool-model', upstreamArgs: ['--tool-call', 'list_dir'] });
  gguf = new OpenAI({ baseURL: `${bundled.baseURL}/v1`, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 60000 });
  relay = new OpenAI({ baseURL: `${scripted.baseURL}/v1`, apiKey: 'unused-auth-is-off', maxRetries: 0, timeout: 20000 });
});

after(async () => {
  if (bundled) await bundled.stop();
  if (scripted) await scripted.stop();
});

const INSTR = 'You tell short stories.';
const ASK = 'Tell me about a cat';

test('responses.create: the greedy text equals the chat API answer', async () => {
  const r = await gguf.responses.create({ model: 'stories', instructions: INSTR, input: ASK,
    temperature: 0, max_output_tokens: 24, store: false });
  const chat = await gguf.chat.completions.create({ model: 'stories', temperature: 0, max_tokens: 24,
    messages: [{ role: 'system', content: INSTR }, { role: 'user', content: ASK }] });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, 'stories');
  assert.ok(r.output_text.length > 0);
  assert.equal(r.output_text, chat.choices[0].message.content);
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].role, 'assistant');
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(r.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  // 24 tokens without an end: the response says why it stopped.
  if (chat.choices[0].finish_reason === 'length') {
    assert.equal(r.status, 'incomplete');
    assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  } else {
    assert.equal(r.status, 'completed');
  }
  assert.equal(r.store, false);
  assert.equal(r.instructions, INSTR);
});

test('responses streamed: typed events in order, text equals the whole answer', async () => {
  const req = { model: 'stories', instructions: INSTR, temperature: 0, max_output_tokens: 24,
    input: [{ role: 'user', content: [{ type: 'input_text', text: ASK }] }] };
  const whole = await gguf.responses.create(req);
  const types = [];
  let text = '', last = null, seq = -1;
  for await (const ev of await gguf.responses.create({ ...req, stream: true })) {
    types.push(ev.type);
    assert.equal(ev.sequence_number, seq + 1);
    seq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') last = ev.response;
  }
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress',
    'response.output_item.added', 'response.content_part.added']);
  assert.ok(types.includes('response.output_text.done'));
  assert.ok(types.indexOf('response.output_item.done') > types.lastIndexOf('response.output_text.delta'));
  assert.equal(text, whole.output_text);
  assert.equal(last.output[0].content[0].text, whole.output_text);
  assert.equal(last.usage.output_tokens, whole.usage.output_tokens);

  // The SDK's stream helper assembles the same response.
  const helper = gguf.responses.stream(req);
  let deltas = '';
  helper.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const fin = await helper.finalResponse();
  // (The helper's final response has no output_text convenience field for a
  // request without a parseable format; the text is in its output.)
  assert.equal(fin.output[0].content[0].text, whole.output_text);
  assert.equal(deltas, whole.output_text);
});

const LIST_DIR = { type: 'function', name: 'list_dir', description: 'List a directory',
  parameters: { type: 'object', properties: { path: { type: 'string' } } } };
const TOOL_ARGS = { path: '/tmp/dir0', depth: 1, note: 'say "hi" caf\u00e9' };

test('function tools: a call, streamed in pieces, and the next turn with its output', async () => {
  const req = { model: 'pool-model', tools: [LIST_DIR], tool_choice: 'auto', input: 'look around' };
  const r = await relay.responses.create(req);
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'list_dir');
  assert.match(calls[0].id, /^fc_/);
  assert.equal(typeof calls[0].call_id, 'string');
  assert.deepEqual(JSON.parse(calls[0].arguments), TOOL_ARGS);
  assert.equal(r.tools[0].name, 'list_dir');

  let args = '', pieces = 0, done = null;
  for await (const ev of await relay.responses.create({ ...req, stream: true })) {
    if (ev.type === 'response.function_call_arguments.delta') { args += ev.delta; pieces++; }
    if (ev.type === 'response.function_call_arguments.done') done = ev.arguments;
  }
  assert.ok(pieces > 1, `pieces: ${pieces}`);
  assert.deepEqual(JSON.parse(args), TOOL_ARGS);
  assert.equal(done, args);
  const fin = await relay.responses.stream(req).finalResponse();
  assert.deepEqual(JSON.parse(fin.output.find((o) => o.type === 'function_call').arguments), TOOL_ARGS);

  // Second turn: the call and its output go back as input items; the
  // upstream sees an assistant tool call and a tool message, and answers.
  const next = await relay.responses.create({ model: 'pool-model', tools: [LIST_DIR], input: [
    { role: 'user', content: 'look around' },
    { type: 'function_call', call_id: calls[0].call_id, name: 'list_dir', arguments: calls[0].arguments },
    { type: 'function_call_output', call_id: calls[0].call_id, output: 'a.txt b.txt' }] });
  assert.ok(next.output_text.length > 0);
  const log = await scripted.upstreamLog();
  const msgs = log[log.length - 1].messages;
  assert.equal(msgs[1].role, 'assistant');
  assert.equal(msgs[1].tool_calls[0].id, calls[0].call_id);
  assert.deepEqual(msgs[2], { role: 'tool', tool_call_id: calls[0].call_id, content: 'a.txt b.txt' });
});

test('hosted tools are dropped with a warning, functions kept', async () => {
  const r = await relay.responses.create({ model: 'pool-model', input: 'look around',
    tools: [{ type: 'web_search' }, LIST_DIR] });
  assert.equal(r.output.find((o) => o.type === 'function_call').name, 'list_dir');
  assert.ok(r.x_pool_meta.warnings.some((w) => /web_search/.test(w)), JSON.stringify(r.x_pool_meta));
});

test('errors raise the SDK error classes', async () => {
  await assert.rejects(relay.responses.create({ model: 'no-such-model', input: 'x' }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(relay.responses.create({ model: 'pool-model', input: 'x', previous_response_id: 'resp_1' }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'previous_response_not_found'
      && e.param === 'previous_response_id');
  await assert.rejects(relay.responses.create({ model: 'pool-model', input: 'x', tools: [LIST_DIR],
    tool_choice: { type: 'function', name: 'nope' } }),
    (e) => e instanceof OpenAI.BadRequestError && /tool_choice/.test(e.message));
  await assert.rejects(relay.responses.create({ model: 'pool-model', input: 'x', temperature: 9, stream: true }),
    (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
});
