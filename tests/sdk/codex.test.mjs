// OpenAI's Codex CLI (npm @openai/codex, pinned in package.json) driven
// non-interactively (`codex exec`) against a real pool: its provider points
// at gpupool-server's /v1 with wire_api "responses", and every other
// connection is refused (HTTPS_PROXY / HTTP_PROXY at a closed port, only
// 127.0.0.1 exempt), so the run cannot reach anything but the pool. The
// agent relays to the scripted upstream (deterministic text). Codex's own
// system prompt (thousands of tokens) does not fit the bundled model's 512
// positions, so the bundled model is not used here.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Pool } from './pool.mjs';

const CODEX = join(process.cwd(), 'node_modules', '.bin', 'codex');
let pool, home;

before(async () => {
  pool = await new Pool().start({ model: 'pool-model' });
  home = mkdtempSync(join(tmpdir(), 'gpupool-codex-'));
  writeFileSync(join(home, 'config.toml'), [
    'model = "pool-model"',
    'model_provider = "gpupool"',
    '[model_providers.gpupool]',
    'name = "gpupool"',
    `base_url = "${pool.baseURL}/v1"`,
    'wire_api = "responses"',
    '',
  ].join('\n'));
});

after(async () => {
  if (pool) await pool.stop();
  if (home && !process.env.GPUPOOL_KEEP_TMP) rmSync(home, { recursive: true, force: true });
});

function codexExec(prompt) {
  const env = { ...process.env, CODEX_HOME: home, HOME: home,
    HTTPS_PROXY: 'http://127.0.0.1:9', HTTP_PROXY: 'http://127.0.0.1:9', ALL_PROXY: 'http://127.0.0.1:9',
    NO_PROXY: '127.0.0.1,localhost', no_proxy: '127.0.0.1,localhost' };
  // stdin closed: `codex exec` otherwise waits for more input there.
  return new Promise((resolve) => {
    const p = spawn(CODEX, ['exec', '--skip-git-repo-check', prompt],
      { env, cwd: home, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    const t = setTimeout(() => p.kill('SIGKILL'), 120000);
    p.on('close', (code, signal) => { clearTimeout(t); resolve({ code: code ?? signal, stdout, stderr }); });
  });
}

test('codex exec answers through the pool (Responses API)', async () => {
  const r = await codexExec('Once upon a time');
  assert.equal(r.code, 0, `codex failed:\n${r.stdout}\n${r.stderr}`);
  // The scripted upstream's words for this prompt (tests/integration/upstream.py).
  assert.match(r.stdout, /Once0 upon1 a2 time3/, r.stdout + r.stderr);
  const log = await pool.upstreamLog();
  const last = log[log.length - 1];
  assert.equal(last.path, '/v1/chat/completions');
  // Codex's instructions arrive as system messages, the prompt as the user's.
  assert.equal(last.messages[0].role, 'system');
  assert.equal(last.messages[last.messages.length - 1].role, 'user');
  assert.match(last.messages[last.messages.length - 1].content, /Once upon a time/);
  // Its function tools were relayed; hosted ones were dropped, not refused.
  assert.ok(last.tools.some((t) => t.function && t.function.name), JSON.stringify(last.tools).slice(0, 300));
  const metrics = await (await fetch(`${pool.baseURL}/metrics`)).text();
  // Responses traffic has its own label.
  assert.match(metrics, /gpupool_requests_total\{api="responses",outcome="ok"\} [1-9]/);
});
