// Starts a real pool for the SDK tests: gpupool-server on 127.0.0.1 with an
// ephemeral port, a scripted OpenAI-compatible upstream (tests/integration/
// upstream.py) and one gpupool-agent relaying to it. Everything started is
// killed by PID in stop(), also when a test fails.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, existsSync, rmSync, openSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const BUILD = process.env.GPUPOOL_BUILD_DIR;
const SRC = process.env.GPUPOOL_SOURCE_DIR;
if (!BUILD || !SRC) throw new Error('GPUPOOL_BUILD_DIR and GPUPOOL_SOURCE_DIR must be set (run through ctest)');

export const bin = (name) => {
  for (const p of [join(BUILD, 'src/server', name), join(BUILD, 'src/agent', name), join(BUILD, 'src/run', name)])
    if (existsSync(p)) return p;
  throw new Error(`binary ${name} not built under ${BUILD}`);
};

export async function waitFor(what, fn, timeoutMs = 20000) {
  const end = Date.now() + timeoutMs;
  let last;
  while (Date.now() < end) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) { last = e; }
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}${last ? ': ' + last.message : ''}`);
}

export class Pool {
  constructor() {
    this.dir = mkdtempSync(join(tmpdir(), 'gpupool-sdk-'));
    this.procs = [];
  }

  spawn(name, cmd, args, env = {}) {
    const log = openSync(join(this.dir, `${name}.log`), 'a');
    const p = spawn(cmd, args, { stdio: ['ignore', log, log], env: { ...process.env, ...env } });
    this.procs.push(p);
    return p;
  }

  readPort(file) {
    return waitFor(`port file ${file}`, () => {
      if (!existsSync(file)) return null;
      const s = readFileSync(file, 'utf8').trim();
      return s ? Number(s) : null;
    });
  }

  async start({ serverArgs = [], upstreamArgs = [], model = 'scripted', db = null, agentToken = null, clientKey = null, slots = 4 } = {}) {
    const upPortFile = join(this.dir, 'upstream.port');
    this.spawn('upstream', 'python3', [join(SRC, 'tests/integration/upstream.py'), '--port', '0', '--port-file', upPortFile, ...upstreamArgs]);
    const upPort = await this.readPort(upPortFile);
    this.upstreamPort = upPort;

    const portFile = join(this.dir, 'server.port');
    this.spawn('server', bin('gpupool-server'), ['--listen', '127.0.0.1:0', '--port-file', portFile, '--db', db || join(this.dir, 'pool.db'), ...serverArgs]);
    this.port = await this.readPort(portFile);
    this.baseURL = `http://127.0.0.1:${this.port}`;

    this.agent = this.spawn('agent', bin('gpupool-agent'), ['--server', this.baseURL, '--state-dir', join(this.dir, 'agent'),
      '--upstream', `http://127.0.0.1:${upPort}`, '--upstream-model', 'scripted-upstream', '--alias', model, '--slots', String(slots), ...(agentToken ? ['--token', agentToken] : [])]);
    this.model = model;
    await waitFor('the agent to register its model', async () => {
      const r = await fetch(`${this.baseURL}/v1/models`, clientKey ? { headers: { Authorization: `Bearer ${clientKey}` } } : {});
      const j = await r.json();
      return j.data && j.data.some((m) => m.id === model);
    });
    return this;
  }

  // Server + one agent on the bundled model (gguf backend, the embedded
  // engine) instead of the scripted upstream; `model` is its alias.
  // file: a model file under the build tree (BUILD/...) instead of the
  // bundled stories260K (e.g. the generated tests/data/arch encoders).
  async startBundled({ model = 'stories', slots = 2, file = null } = {}) {
    const portFile = join(this.dir, 'server.port');
    this.spawn('server', bin('gpupool-server'), ['--listen', '127.0.0.1:0', '--port-file', portFile, '--db', join(this.dir, 'pool.db')]);
    this.port = await this.readPort(portFile);
    this.baseURL = `http://127.0.0.1:${this.port}`;
    this.agent = this.spawn('agent', bin('gpupool-agent'), ['--server', this.baseURL, '--state-dir', join(this.dir, 'agent'),
      '--model', file ? join(BUILD, file) : join(SRC, 'models/stories260K.gguf'), '--alias', model, '--slots', String(slots), '--threads', '1']);
    this.model = model;
    await waitFor('the gguf agent to register its model', async () => {
      const r = await fetch(`${this.baseURL}/v1/models`);
      const j = await r.json();
      return j.data && j.data.some((m) => m.id === model);
    }, 60000);
    return this;
  }

  // The scripted upstream's request log (its /_control/log).
  async upstreamLog() {
    const r = await fetch(`http://127.0.0.1:${this.upstreamPort}/_control/log`);
    return (await r.json()).requests;
  }

  // Change the scripted upstream's settings at run time; a first_delay_ms
  // change applies to requests already held (tests release them with it).
  async upstreamConfig(settings) {
    const r = await fetch(`http://127.0.0.1:${this.upstreamPort}/_control/config`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(settings) });
    if (r.status !== 200) throw new Error(`upstream config: HTTP ${r.status}`);
  }

  // Create a key with `gpupool-server keys create`; returns the key text.
  createKey(db, role) {
    const out = execFileSync(bin('gpupool-server'), ['keys', 'create', '--role', role, '--db', db], { encoding: 'utf8' });
    const m = out.match(/gpk_[A-Za-z0-9_-]+/);
    if (!m) throw new Error(`keys create printed no key: ${out}`);
    return m[0];
  }

  async stop() {
    for (const p of this.procs.reverse()) {
      if (p.exitCode === null && p.signalCode === null) {
        p.kill('SIGTERM');
        const done = new Promise((res) => p.once('exit', res));
        const t = setTimeout(() => p.kill('SIGKILL'), 5000);
        await done;
        clearTimeout(t);
      }
    }
    if (!process.env.GPUPOOL_KEEP_TMP) rmSync(this.dir, { recursive: true, force: true });
  }
}
