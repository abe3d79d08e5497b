// The agent frameworks people build on, unmodified, against a real pool:
// the Vercel AI SDK (openai provider = Responses API with store on, its
// chat models, openai-compatible and anthropic providers), LangChain.js
// (ChatOpenAI on chat completions and on the Responses API, ChatAnthropic)
// and the OpenAI Agents SDK (Responses and chat-completions modes). The
// pool's agent relays to the scripted upstream, which calls the function
// tool `list_dir` when it is offered and no tool result is in the
// conversation yet, so every tool loop ends after one call.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText, generateObject, streamObject, tool, stepCountIs } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createAnthropic } from '@ai-sdk/anthropic';
import { ChatOpenAI } from '@langchain/openai';
import { ChatAnthropic } from '@langchain/anthropic';
import { HumanMessage, ToolMessage } from '@langchain/core/messages';
import OpenAI from 'openai';
import { Agent, run, tool as agentTool, setDefaultOpenAIClient, setOpenAIAPI,
  setTracingDisabled } from '@openai/agents';
import { z } from 'zod';
import { Pool } from './pool.mjs';

let pool, base;
const MODEL = 'pool-model';
const KEY = 'unused-auth-is-off';

before(async () => {
  pool = await new Pool().start({ model: MODEL, upstreamArgs: ['--tool-call', 'list_dir'] });
  base = pool.baseURL;
  setTracingDisabled(true); // no trace export to the outside world
});

after(async () => {
  if (pool) await pool.stop();
});

// The scripted upstream's arguments for call 0 (upstream.py tool_arguments).
const ARGS = z.object({ path: z.string(), depth: z.number(), note: z.string() });
let listed = 0;
const listDir = tool({
  description: 'List a directory',
  inputSchema: ARGS,
  execute: async ({ path }) => { listed++; return `a.txt b.txt in ${path}`; },
});

async function lastUpstreamRequest() {
  const log = await pool.upstreamLog();
  return log[log.length - 1];
}

// ---- Vercel AI SDK -------------------------------------------------------

const openai = () => createOpenAI({ baseURL: `${base}/v1`, apiKey: KEY });
const aiModels = () => ({
  'openai (responses)': openai()(MODEL),
  'openai (chat)': openai().chat(MODEL),
  'openai-compatible': createOpenAICompatible({ name: 'gpupool', baseURL: `${base}/v1`,
    apiKey: KEY, includeUsage: true, supportsStructuredOutputs: true })(MODEL),
  anthropic: createAnthropic({ baseURL: `${base}/v1`, apiKey: KEY })(MODEL),
});

test('AI SDK: generateText, streamText and usage through every provider', async () => {
  for (const [name, model] of Object.entries(aiModels())) {
    const r = await generateText({ model, prompt: 'alpha beta gamma', maxRetries: 0 });
    assert.ok(r.text.length > 0, name);
    assert.ok(r.usage.inputTokens > 0, `${name}: ${JSON.stringify(r.usage)}`);
    assert.ok(r.usage.outputTokens > 0, `${name}: ${JSON.stringify(r.usage)}`);
    assert.equal(r.finishReason, 'stop', name);
    const s = streamText({ model, prompt: 'alpha beta gamma', maxRetries: 0 });
    let text = '';
    for await (const piece of s.textStream) text += piece;
    assert.equal(text, r.text, name);
    const usage = await s.usage;
    assert.equal(usage.outputTokens, r.usage.outputTokens, name);
  }
});

test('AI SDK: a tool loop runs the tool and answers with its result', async () => {
  for (const [name, model] of Object.entries(aiModels())) {
    const before = listed;
    const r = await generateText({ model, prompt: 'look around', tools: { list_dir: listDir },
      stopWhen: stepCountIs(4), maxRetries: 0 });
    assert.equal(listed, before + 1, name);
    assert.equal(r.steps.length, 2, name);
    assert.equal(r.steps[0].toolCalls[0].toolName, 'list_dir', name);
    assert.equal(r.steps[0].toolCalls[0].input.path, '/tmp/dir0', name);
    assert.ok(r.text.length > 0, name);
    // The second request carried the call and its result.
    const last = await lastUpstreamRequest();
    const toolMsg = last.messages.find((m) => m.role === 'tool');
    assert.ok(toolMsg && /a\.txt b\.txt/.test(JSON.stringify(toolMsg.content)),
      `${name}: ${JSON.stringify(last.messages)}`);
  }
});

test('AI SDK: an aborted stream ends the upstream request', async () => {
  await pool.upstreamConfig({ pace_ms: 50 });
  try {
    const ctl = new AbortController();
    const s = streamText({ model: openai().chat(MODEL), prompt: 'one two three',
      maxOutputTokens: 200, abortSignal: ctl.signal, maxRetries: 0, onError: () => {} });
    // AI SDK 7 ends the text stream quietly on abort (no rejection).
    let got = 0, text = '';
    try {
      for await (const piece of s.textStream) {
        text += piece;
        if (piece && ++got === 2) ctl.abort();
      }
    } catch (e) {
      assert.ok(e.name === 'AbortError' || /abort/i.test(String(e)), String(e));
    }
    assert.ok(got >= 2 && text.split(' ').length < 100, text);
    // The pool cancels the job: the upstream sees its client go.
    const deadline = Date.now() + 10000;
    let outcome;
    while (Date.now() < deadline) {
      outcome = (await lastUpstreamRequest()).outcome;
      if (outcome === 'client_gone') break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(outcome, 'client_gone');
  } finally {
    await pool.upstreamConfig({ pace_ms: 0 });
  }
});

test('AI SDK: multi-turn on the Responses API refers to stored items', async () => {
  // The openai provider's default (store on) sends the earlier assistant
  // turn back as item_reference: the pool resolves it.
  const bodies = [];
  const recording = async (url, init) => {
    if (init && typeof init.body === 'string') bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  };
  const model = createOpenAI({ baseURL: `${base}/v1`, apiKey: KEY, fetch: recording })(MODEL);
  const first = await generateText({ model, prompt: 'alpha beta', maxRetries: 0 });
  const second = await generateText({ model, maxRetries: 0, messages: [
    { role: 'user', content: 'alpha beta' },
    ...first.response.messages,
    { role: 'user', content: 'gamma delta' }] });
  assert.ok(second.text.length > 0);
  assert.ok(bodies[1].input.some((it) => it.type === 'item_reference'), JSON.stringify(bodies[1]));
  const last = await lastUpstreamRequest();
  assert.deepEqual(last.messages.map((m) => m.role), ['user', 'assistant', 'user']);
  assert.equal(last.messages[1].content, first.text);
  // And with previousResponseId.
  const third = await generateText({ model, prompt: 'epsilon', maxRetries: 0,
    providerOptions: { openai: { previousResponseId: second.providerMetadata.openai.responseId } } });
  assert.ok(third.text.length > 0);
  const msgs = (await lastUpstreamRequest()).messages;
  assert.deepEqual(msgs.map((m) => m.role), ['user', 'assistant', 'user', 'assistant', 'user']);
  assert.equal(msgs[3].content, second.text);
});

// The scripted upstream answers a response_format with a JSON value for the
// schema (upstream.py schema_example): strings from the prompt's words,
// integers at their minimum.
const PERSON = z.object({ name: z.string().max(30), age: z.number().int().min(7) });

test('AI SDK: generateObject and streamObject (response_format json_schema)', async () => {
  for (const name of ['openai (responses)', 'openai (chat)', 'openai-compatible']) {
    const model = aiModels()[name];
    const r = await generateObject({ model, schema: PERSON, prompt: 'alpha beta', maxRetries: 0 });
    assert.equal(r.object.age, 7, name);
    assert.equal(typeof r.object.name, 'string', name);
    const last = await lastUpstreamRequest();
    assert.equal(last.response_format.type, 'json_schema', name);
    const s = streamObject({ model, schema: PERSON, prompt: 'alpha beta', maxRetries: 0 });
    let partials = 0;
    for await (const p of s.partialObjectStream) partials += p ? 1 : 0;
    assert.ok(partials > 1, `${name}: ${partials}`);
    assert.deepEqual(await s.object, r.object, name);
  }
});

// ---- LangChain.js --------------------------------------------------------

const lcOpenAI = (extra = {}) => new ChatOpenAI({ model: MODEL, apiKey: KEY, maxRetries: 0,
  configuration: { baseURL: `${base}/v1` }, ...extra });
const lcModels = () => ({
  'ChatOpenAI (chat)': lcOpenAI(),
  'ChatOpenAI (responses)': lcOpenAI({ useResponsesApi: true }),
  ChatAnthropic: new ChatAnthropic({ model: MODEL, apiKey: KEY, maxRetries: 0,
    anthropicApiUrl: base }),
});

test('LangChain: invoke, stream and usage_metadata', async () => {
  for (const [name, m] of Object.entries(lcModels())) {
    const r = await m.invoke('alpha beta gamma');
    assert.ok(typeof r.text === 'string' && r.text.length > 0, name);
    assert.ok(r.usage_metadata.input_tokens > 0, `${name}: ${JSON.stringify(r.usage_metadata)}`);
    assert.ok(r.usage_metadata.output_tokens > 0, `${name}: ${JSON.stringify(r.usage_metadata)}`);
    let text = '', all = null;
    for await (const chunk of await m.stream('alpha beta gamma')) {
      text += chunk.text;
      all = all ? all.concat(chunk) : chunk;
    }
    assert.equal(text, r.text, name);
    // Issue 26 item 4: a stream's usage is the call's. ChatAnthropic takes
    // input_tokens from message_start only, which an openai-backend agent
    // now fills by counting the prompt before the first token.
    assert.equal(all.usage_metadata.input_tokens, r.usage_metadata.input_tokens,
      `${name}: ${JSON.stringify(all.usage_metadata)}`);
  }
});

test('LangChain: bindTools, a tool call and the answer to its result', async () => {
  const schema = { name: 'list_dir', description: 'List a directory', schema: ARGS };
  for (const [name, m] of Object.entries(lcModels())) {
    const bound = m.bindTools([schema]);
    const ask = new HumanMessage('look around');
    const r = await bound.invoke([ask]);
    assert.equal(r.tool_calls.length, 1, name);
    assert.equal(r.tool_calls[0].name, 'list_dir', name);
    assert.equal(r.tool_calls[0].args.path, '/tmp/dir0', name);
    const answer = await bound.invoke([ask, r, new ToolMessage({ tool_call_id: r.tool_calls[0].id,
      content: 'a.txt b.txt' })]);
    assert.ok(answer.text.length > 0, name);
    assert.equal(answer.tool_calls.length, 0, name);
  }
});

test('LangChain: withStructuredOutput (json_schema by default)', async () => {
  for (const name of ['ChatOpenAI (chat)', 'ChatOpenAI (responses)']) {
    const m = lcModels()[name].withStructuredOutput(PERSON, { name: 'person' });
    const r = await m.invoke('alpha beta');
    assert.equal(r.age, 7, name);
    assert.equal(typeof r.name, 'string', name);
  }
});

// ---- OpenAI Agents SDK ---------------------------------------------------

test('Agents SDK: a run with a tool, on the Responses API and on chat completions', async () => {
  setDefaultOpenAIClient(new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 }));
  for (const api of ['responses', 'chat_completions']) {
    setOpenAIAPI(api);
    let calls = 0;
    const listTool = agentTool({ name: 'list_dir', description: 'List a directory',
      parameters: ARGS, execute: async ({ path }) => { calls++; return `a.txt b.txt in ${path}`; } });
    const agent = new Agent({ name: 'lister', instructions: 'You list directories.',
      model: MODEL, tools: [listTool] });
    const r = await run(agent, 'look around');
    assert.equal(calls, 1, api);
    assert.ok(typeof r.finalOutput === 'string' && r.finalOutput.length > 0, api);
    const last = await lastUpstreamRequest();
    assert.equal(last.messages[0].role, 'system', api);
    assert.ok(last.messages.some((m) => m.role === 'tool'), `${api}: ${JSON.stringify(last.messages)}`);
    // A streamed run gives the same final output.
    const s = await run(agent, 'look around', { stream: true });
    let text = '';
    for await (const ev of s.toTextStream()) text += ev;
    await s.completed;
    assert.equal(s.finalOutput, r.finalOutput, api);
    assert.equal(text, r.finalOutput, api);
    // outputType: the final output is parsed and validated by the SDK.
    const typed = new Agent({ name: 'typed', instructions: 'Describe a person.', model: MODEL,
      outputType: PERSON });
    const t = await run(typed, 'alpha beta');
    assert.equal(t.finalOutput.age, 7, api);
  }
});
