// The real Claude Code CLI (`@anthropic-ai/claude-code`, pinned in
// package.json; the last release that ships cli.js and runs on node 20)
// pointed at a gpupool-server with ANTHROPIC_BASE_URL and a client key, as a
// user would: `claude -p "Say hello"` must print an answer and exit 0.
//
// The agent relays to the scripted upstream (tests/integration/upstream.py),
// not to the bundled stories260K.gguf: Claude Code's default request carries
// ~100 KB of system prompt and tool definitions (tens of thousands of
// tokens), which a 512-token model cannot hold (the server answers 400
// "prompt is too long", which Claude Code prints as an error). The scripted
// upstream has no context limit and answers deterministically: token i is
// " " + word_i + i over the words of the last message, so the printed text
// proves the answer came through the pool.
//
// Everything runs offline: telemetry, error reporting, auto-update and other
// non-essential traffic are disabled and HOME is a fresh temp dir, so the only
// host Claude Code talks to is the pool on 127.0.0.1.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { createRequire } from 'node:module';
import { Pool } from './pool.mjs';

// The model name Claude Code 2.1.112 asks for when no --model is given; the
// agent registers under it so the default invocation works unchanged.
const DEFAULT_MODEL = 'claude-sonnet-4-6';

const require = createRequire(import.meta.url);
const CLI = join(dirname(require.resolve('@anthropic-ai/claude-code/package.json')), 'cli.js');

let pool, clientKey;

before(async () => {
  pool = new Pool();
  const db = join(pool.dir, 'pool.db');
  // Keys exist before the server starts, so auth is on (a key-less loopback
  // server runs without auth, which would prove nothing about the key).
  clientKey = pool.createKey(db, 'client');
  const agentKey = pool.createKey(db, 'agent');
  await pool.start({ model: DEFAULT_MODEL, db, agentToken: agentKey, clientKey, upstreamArgs: ['--tokens', '6'] });
});

after(async () => { if (pool) await pool.stop(); });

// Runs `node cli.js ...args` with a hard timeout; resolves {code, stdout, stderr}.
function claude(args, { apiKey = clientKey, timeoutMs = 90000 } = {}) {
  const home = join(pool.dir, `home-${Math.random().toString(36).slice(2)}`);
  mkdirSync(home, { recursive: true });
  const env = {
    PATH: process.env.PATH,
    HOME: home,
    ANTHROPIC_BASE_URL: pool.baseURL,
    ANTHROPIC_API_KEY: apiKey,
    // Whatever auxiliary model Claude Code picks must be one the pool serves.
    ANTHROPIC_SMALL_FAST_MODEL: DEFAULT_MODEL,
    ANTHROPIC_DEFAULT_HAIKU_MODEL: DEFAULT_MODEL,
    DISABLE_TELEMETRY: '1',
    DISABLE_ERROR_REPORTING: '1',
    DISABLE_AUTOUPDATER: '1',
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    CI: '1',
  };
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [CLI, ...args], { env, cwd: home, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    const t = setTimeout(() => { p.kill('SIGKILL'); reject(new Error(`claude timed out; stdout=${stdout} stderr=${stderr}`)); }, timeoutMs);
    p.on('error', (e) => { clearTimeout(t); reject(e); });
    p.on('exit', (code, signal) => { clearTimeout(t); resolve({ code, signal, stdout, stderr }); });
  });
}

async function upstreamLog() {
  const r = await fetch(`http://127.0.0.1:${pool.upstreamPort}/_control/log`);
  return (await r.json()).requests;
}

test('claude -p with the default model prints the pool\'s answer and exits 0', async () => {
  const before = (await upstreamLog()).length;
  const r = await claude(['-p', 'Say hello']);
  assert.equal(r.code, 0, `claude failed: stdout=${r.stdout} stderr=${r.stderr}`);
  const text = r.stdout.trim();
  assert.ok(text.length > 0, 'claude printed nothing');
  // The scripted upstream's token shape: " <word>0 <word>1 ... <word>5".
  assert.match(text, /^\S+0 \S+1 \S+2 \S+3 \S+4 \S+5$/, `unexpected answer: ${text}`);
  const log = (await upstreamLog()).slice(before);
  assert.ok(log.length >= 1, 'the request never reached the upstream');
  // The last message Claude Code sent ends with the user's prompt.
  const last = log[log.length - 1];
  assert.equal(last.outcome, 'complete');
  assert.match(JSON.stringify(last.messages), /Say hello/);
});

test('claude -p --model with an explicit pool model name works too', async () => {
  const r = await claude(['-p', '--model', DEFAULT_MODEL, '--output-format', 'json', 'Count apples']);
  assert.equal(r.code, 0, `claude failed: stdout=${r.stdout} stderr=${r.stderr}`);
  const j = JSON.parse(r.stdout);
  assert.equal(j.type, 'result');
  assert.equal(j.is_error, false);
  assert.match(j.result.trim(), /^\S+0 \S+1 \S+2 \S+3 \S+4 \S+5$/);
});

test('a wrong key is refused at once and Claude Code reports it (exit code != 0)', async () => {
  // The 401 carries `x-should-retry: false`; without it Claude Code retries
  // with backoff for minutes and this would time out.
  const r = await claude(['-p', 'Say hello'], { apiKey: 'gpk_not_a_real_key', timeoutMs: 30000 });
  assert.notEqual(r.code, 0);
  assert.match(r.stdout + r.stderr, /401|invalid|api key|authentication/i);
});
