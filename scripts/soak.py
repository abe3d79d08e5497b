#!/usr/bin/env python3
"""Soak test: a server and a few gguf agents on models/stories260K.gguf under a
steady mixed load for a bounded time, agents killed -9 and restarted at
random, slow and vanishing clients mixed in. Run by scripts/soak.sh (which
builds first); never in CI. Standard library only; reuses
tests/integration/harness.py for processes (every PID it starts is killed
at exit, whatever happens).

Every request is greedy (temperature 0), so its text is known: the expected
text of each (dialect, prompt) is taken once at start from an uninterrupted
request, and the "Once upon a time" completion is also checked against
tests/data/stories260K.greedy.json. A finished request whose text differs
is a mismatch, classified by whether the request failed over (attempts > 1
in x_pool_meta / x-pool-attempts, or a native failover/second started
event). Lost and duplicated text is measured in words (difflib on
whitespace-separated words): the client cannot tokenize.

Prints one table at the end; exits 1 when the server crashed (or left a
sanitizer report), 0 otherwise.
"""

import argparse
import codecs
import collections
import difflib
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True  # keep the source tree clean (harness import)
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4, help="concurrent client threads")
    ap.add_argument("--max-tokens", type=int, default=300,
                    help="per request; long enough that kills land mid-generation")
    ap.add_argument("--kill-every", type=float, nargs=2, default=(5.0, 20.0),
                    metavar=("MIN", "MAX"), help="seconds between agent kills (uniform)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep-tmp", action="store_true", help="keep logs and the DB")
    ap.add_argument("--server-arg", action="append", default=[], metavar="FLAG=VALUE",
                    help="extra server flag, e.g. --server-arg=--heap_trim_bytes=0 (repeatable)")
    a = ap.parse_args()
    if not (0 < a.minutes <= 24 * 60):
        ap.error("--minutes must be in (0, 1440]")
    if not (1 <= a.agents <= 8 and 1 <= a.slots <= 8 and 1 <= a.clients <= 64):
        ap.error("--agents 1..8, --slots 1..8, --clients 1..64")
    return a


ARGS = parse_args()
os.environ["GPUPOOL_BUILD_DIR"] = ARGS.build_dir
if ARGS.keep_tmp:
    os.environ["GPUPOOL_KEEP_TMP"] = "1"
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402

MODEL = os.path.join(ROOT, "models", "stories260K.gguf")
GREEDY = os.path.join(ROOT, "tests", "data", "stories260K.greedy.json")
ALIAS = "tiny"
REQ_TIMEOUT = 120.0          # any one request, end to end (seconds)
PROMPTS = ["Once upon a time", "Lily and Ben went to the park", "The little dog",
           "One day, a girl named Sue"]
KINDS = ["oa_completion", "oa_chat", "anthropic", "native"]


# ---------------------------------------------------------------------------
# Requests. Each returns a Result; none raises for a server-side problem.
# ---------------------------------------------------------------------------

class Result:
    def __init__(self, kind, prompt, stream, mode):
        self.kind, self.prompt, self.stream, self.mode = kind, prompt, stream, mode
        self.text = ""
        self.ok = False          # a complete reply (end / finish_reason) arrived
        self.failure = None      # "HTTP 503 NO_AGENT", "stream error AGENT_LOST", ...
        self.vanished = False    # we hung up on purpose
        self.attempts = 1
        self.failover = False


class Chaos:
    """Agents killed -9 and restarted. Most kills land mid-generation: when
    a kill is due, the next client that sees a stream start (the x-pool-agent
    header leaves with the first token; native: the started event) kills
    that agent at once -- the tiny model finishes a reply in ~0.1 s, so a
    kill at a random time would almost never hit a running job. When no
    stream starts within 10 s the kill goes to a random agent instead."""

    def __init__(self):
        self.lock = threading.Lock()
        self.want = threading.Event()
        self.killed = threading.Event()
        self.agents = []        # harness.Agent per index
        self.ids = []           # agent_id per index (kept across restarts: same state dir)
        self.victim = None
        self.counts = collections.Counter()

    def first_token(self, agent_id):
        if not agent_id or not self.want.is_set():
            return
        with self.lock:
            if not self.want.is_set() or agent_id not in self.ids:
                return
            i = self.ids.index(agent_id)
            self.agents[i].kill9()
            self.victim = i
            self.want.clear()
            self.counts["agent kill -9 mid-stream"] += 1
            self.killed.set()

    def kill_random(self, i):
        with self.lock:
            if not self.want.is_set():
                return  # a client got there first
            self.agents[i].kill9()
            self.victim = i
            self.want.clear()
            self.counts["agent kill -9 at random"] += 1
            self.killed.set()


CHAOS = Chaos()


class Stream:
    """A streaming reply read in pieces (small and slow for slow clients),
    UTF-8 decoded incrementally, parsed as SSE."""

    def __init__(self, resp, slow):
        self.resp = resp
        self.slow = slow
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.parser = harness.SSEParser()
        self.pending = []
        self.eof = False
        self.nbytes = 0

    def next_event(self):
        while not self.pending:
            if self.eof:
                return None
            if self.slow:
                time.sleep(random.uniform(0.01, 0.1))
                chunk = self.resp.read1(random.randint(1, 256))
            else:
                chunk = self.resp.read1(65536)
            if not chunk:
                self.eof = True
                self.pending.extend(self.parser.feed(self.dec.decode(b"", final=True)))
                self.pending.extend(self.parser.flush())
                break
            self.nbytes += len(chunk)
            self.pending.extend(self.parser.feed(self.dec.decode(chunk)))
        return self.pending.pop(0) if self.pending else None


def open_request(url, path, body, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=REQ_TIMEOUT)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request("POST" if body is not None else "GET", path,
                 body=json.dumps(body).encode() if body is not None else None, headers=h)
    return conn, conn.getresponse()


def hang_up(conn):
    try:
        if conn.sock is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


def error_code(body):
    try:
        d = json.loads(body)
    except (ValueError, TypeError):
        return "?"
    e = d.get("error") if isinstance(d, dict) else None
    if isinstance(e, dict):
        return str(e.get("code") or e.get("type") or "?")
    return "?"


def http_failure(status, raw):
    return "HTTP %d %s" % (status, error_code(raw))


def run_openai(url, r, max_tokens):
    chat = r.kind == "oa_chat"
    body = {"model": ALIAS, "max_tokens": max_tokens, "temperature": 0, "stream": r.stream}
    if chat:
        body["messages"] = [{"role": "user", "content": r.prompt}]
    else:
        body["prompt"] = r.prompt
    conn, resp = open_request(url, "/v1/chat/completions" if chat else "/v1/completions", body)
    try:
        if resp.status != 200:
            r.failure = http_failure(resp.status, resp.read())
            return
        if not r.stream:
            d = json.loads(resp.read())
            c = d["choices"][0]
            r.text = (c["message"].get("content") or "") if chat else c["text"]
            r.attempts = int(resp.getheader("x-pool-attempts") or
                             d.get("x_pool_meta", {}).get("attempts", 1))
            r.ok = c.get("finish_reason") is not None
            return
        CHAOS.first_token(resp.getheader("x-pool-agent"))
        s = Stream(resp, r.mode == "slow")
        parts = []
        while True:
            ev = s.next_event()
            if ev is None:
                break
            if ev["data"] == "[DONE]":
                break
            d = json.loads(ev["data"])
            if "error" in d:
                r.failure = "stream error %s" % error_code(ev["data"])
                break
            for c in d.get("choices") or []:
                parts.append((c.get("delta") or {}).get("content") or "" if chat else c.get("text") or "")
                if c.get("finish_reason"):
                    r.ok = True
            meta = d.get("x_pool_meta")
            if isinstance(meta, dict):
                r.attempts = max(r.attempts, int(meta.get("attempts", 1)))
            if r.mode == "vanish" and s.nbytes > 0 and random.random() < 0.3:
                r.vanished = True
                return
        r.text = "".join(parts)
        if not r.ok and not r.failure:
            r.failure = "stream ended early"
    finally:
        hang_up(conn)


def run_anthropic(url, r, max_tokens):
    body = {"model": ALIAS, "max_tokens": max_tokens, "temperature": 0, "stream": r.stream,
            "messages": [{"role": "user", "content": r.prompt}]}
    conn, resp = open_request(url, "/v1/messages", body)
    try:
        if resp.status != 200:
            r.failure = http_failure(resp.status, resp.read())
            return
        if not r.stream:
            d = json.loads(resp.read())
            r.text = "".join(b.get("text", "") for b in d.get("content", []) if b.get("type") == "text")
            r.attempts = int(resp.getheader("x-pool-attempts") or 1)
            r.ok = d.get("stop_reason") is not None
            return
        CHAOS.first_token(resp.getheader("x-pool-agent"))
        s = Stream(resp, r.mode == "slow")
        parts = []
        while True:
            ev = s.next_event()
            if ev is None:
                break
            d = json.loads(ev["data"]) if ev["data"] else {}
            t = ev["event"] or d.get("type")
            if t == "content_block_delta":
                parts.append((d.get("delta") or {}).get("text") or "")
            elif t == "message_delta":
                meta = d.get("x_pool_meta")
                if isinstance(meta, dict):
                    r.attempts = max(r.attempts, int(meta.get("attempts", 1)))
            elif t == "message_stop":
                r.ok = True
                break
            elif t == "error":
                r.failure = "stream error %s" % error_code(ev["data"])
                break
            if r.mode == "vanish" and s.nbytes > 0 and random.random() < 0.3:
                r.vanished = True
                return
        r.text = "".join(parts)
        if not r.ok and not r.failure:
            r.failure = "stream ended early"
    finally:
        hang_up(conn)


def run_native(url, r, max_tokens):
    """POST /v2/tasks, then read its events. A vanishing client here hangs up
    and comes back with Last-Event-ID (what the native API is for): the text
    must still come out whole, once."""
    body = {"model": ALIAS, "max_tokens": max_tokens, "temperature": 0, "prompt": r.prompt}
    conn, resp = open_request(url, "/v2/tasks", body)
    try:
        raw = resp.read()
        if resp.status != 202:
            r.failure = http_failure(resp.status, raw)
            return
        job_id = json.loads(raw)["job_id"]
    finally:
        hang_up(conn)
    parts, last_id, started, end_text = [], 0, 0, None
    reconnects = 0
    deadline = time.monotonic() + REQ_TIMEOUT
    while time.monotonic() < deadline and reconnects <= 5:
        conn, resp = open_request(url, "/v2/tasks/%s/events" % job_id, None,
                                  {"Last-Event-ID": str(last_id)})
        try:
            if resp.status != 200:
                r.failure = http_failure(resp.status, resp.read())
                return
            s = Stream(resp, r.mode == "slow")
            hung_up = False
            while True:
                ev = s.next_event()
                if ev is None:
                    break
                if ev["id"]:
                    last_id = int(ev["id"])
                d = json.loads(ev["data"]) if ev["data"] else {}
                t = ev["event"]
                if t == "token":
                    parts.append(d.get("text", ""))
                elif t == "started":
                    CHAOS.first_token(d.get("agent_id"))
                    started += 1
                    r.attempts = max(r.attempts, int(d.get("attempt", 1)))
                elif t == "failover":
                    r.failover = True
                elif t == "end":
                    end_text = d.get("text", "")
                    r.ok = True
                    break
                elif t == "error":
                    r.failure = "task error %s" % d.get("code", "?")
                    break
                if r.mode == "vanish" and reconnects < 2 and random.random() < 0.2:
                    hung_up = True
                    break
        finally:
            hang_up(conn)
        if r.ok or r.failure:
            break
        reconnects += 1
        if not hung_up:
            time.sleep(0.2)  # the stream ended without a terminal event: ask again
    r.text = "".join(parts)
    if r.ok and end_text is not None and end_text != r.text:
        # the end event's whole text and the token events must agree
        r.text = "%s\x00[end.text differs: %r]" % (r.text, end_text)
    if started > 1:
        r.failover = True
    if not r.ok and not r.failure:
        r.failure = "no terminal event"


RUNNERS = {"oa_completion": run_openai, "oa_chat": run_openai, "anthropic": run_anthropic,
           "native": run_native}


def one_request(url, kind, prompt, stream, mode, max_tokens):
    r = Result(kind, prompt, stream, mode)
    try:
        RUNNERS[kind](url, r, max_tokens)
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
        if not r.vanished:
            r.failure = "client exception %s" % type(e).__name__
    if r.attempts > 1:
        r.failover = True
    return r


# ---------------------------------------------------------------------------
# Processes, sampling, chaos
# ---------------------------------------------------------------------------

def proc_sample(pid):
    rss = None
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])  # kB
        fds = len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None, None
    return rss, fds


MEM_GAUGES = [("process_resident_bytes", "rss"), ("heap_inuse_bytes", "heap used"),
              ("heap_free_bytes", "heap free"), ("db_memory_bytes", "sqlite"),
              ("jobs_in_memory", "jobs"), ("tasks_in_memory", "tasks"),
              ("task_events_in_memory", "task events"), ("agents", "agents")]


def mem_sample(url):
    """The server's memory gauges from /metrics (memstat.h): {name: value}
    (a family's series summed), {} when unreachable. Tells a retention (heap
    in use grows, with the object counts) from allocator behaviour (heap
    free grows, in use flat)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=10)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", "replace")
        conn.close()
    except (OSError, http.client.HTTPException):
        return {}
    out = {}
    want = {"gpupool_" + n: n for n, _ in MEM_GAUGES}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in want:
            try:
                out[want[name]] = out.get(want[name], 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


def fmt_mem(d):
    parts = []
    for n, label in MEM_GAUGES:
        v = d.get(n)
        if v is None:
            parts.append("%s ?" % label)
        elif n.endswith("_bytes"):
            parts.append("%s %.1f MB" % (label, v / 1e6))
        else:
            parts.append("%s %d" % (label, v))
    return "  ".join(parts)


def word_diff(expected, got):
    """(lost, duplicated) words of got against expected."""
    a, b = expected.split(), got.split()
    lost = dup = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            lost += i2 - i1
        if op in ("insert", "replace"):
            dup += j2 - j1
    return lost, dup


def main():
    rnd = random.Random(ARGS.seed)
    random.seed(ARGS.seed)
    for b in (harness.SERVER_BIN, harness.AGENT_BIN):
        if not os.access(b, os.X_OK):
            print("soak: %s is missing (scripts/soak.sh builds it)" % b, file=sys.stderr)
            return 2
    h = harness.Harness(prefix="gpupool-soak-")
    stop = threading.Event()
    lock = threading.Lock()
    results = []
    samples = []            # (t, rss kB, fds)
    mem = []                # (t, {gauge: value}) each minute (mem_sample)

    def on_signal(signum, frame):
        raise SystemExit(130)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    code = 0
    try:
        # Agents lost fast: a heartbeat a second, dead after 3 s of silence.
        srv = h.start_server(["--poll_interval_sec", "1", "--agent_timeout_sec", "3",
                              "--stall_timeout_sec", "10", "--max_attempts", "5"] +
                             [x for a in ARGS.server_arg for x in a.split("=", 1)])
        print("soak: server pid %d on %s, tmp %s" % (srv.pid, srv.url, h.tmp), flush=True)
        samples.append((0.0,) + proc_sample(srv.pid))

        agents = CHAOS.agents

        def start_agent(i, state_dir=None):
            return h.start_agent(srv, upstream=None, slots=ARGS.slots, alias=ALIAS,
                                 name="agent%d" % i if state_dir is None else None,
                                 state_dir=state_dir,
                                 args=["--model", MODEL, "--threads", "1", "--log-level", "info"])
        for i in range(ARGS.agents):
            agents.append(start_agent(i))
        CHAOS.ids = [a.agent_id() for a in agents]
        srv.wait_model(ALIAS, timeout=60)

        # Expected texts: one uninterrupted non-streaming request per
        # (dialect, prompt), and the reference continuation from llama.cpp.
        with open(GREEDY) as f:
            case = json.load(f)["cases"][0]
        st, _, body = harness.http_json("POST", srv.url + "/v1/completions",
                                        {"model": ALIAS, "prompt": case["prompt"], "temperature": 0,
                                         "max_tokens": case["n_generated"]}, timeout=REQ_TIMEOUT)
        ref_ok = st == 200 and body["choices"][0]["text"] == case["generated_text"]
        print("soak: reference continuation (tests/data/stories260K.greedy.json): %s" %
              ("matches" if ref_ok else "DIFFERS (%s)" % st), flush=True)
        expected = {}
        for kind in KINDS:
            for p in PROMPTS:
                r = one_request(srv.url, kind, p, False, "normal", ARGS.max_tokens)
                if not r.ok:
                    print("soak: cannot take the expected text of %s %r: %s" % (kind, p, r.failure),
                          file=sys.stderr)
                    return 1
                expected[(kind, p)] = r.text
        lens = sorted(len(t.split()) for t in expected.values())
        print("soak: %d expected texts, %d..%d words" % (len(expected), lens[0], lens[-1]),
              flush=True)
        samples.append((0.0,) + proc_sample(srv.pid))
        mem.append((0.0, mem_sample(srv.url)))
        t0 = time.monotonic()
        end_at = t0 + ARGS.minutes * 60

        def client(idx):
            crnd = random.Random(rnd.random())
            while not stop.is_set() and time.monotonic() < end_at:
                kind = crnd.choice(KINDS)
                stream = kind == "native" or crnd.random() < 0.7
                x = crnd.random()
                mode = "slow" if x < 0.1 else "vanish" if x < 0.2 else "normal"
                if not stream:
                    mode = "normal"
                r = one_request(srv.url, kind, crnd.choice(PROMPTS), stream, mode, ARGS.max_tokens)
                with lock:
                    results.append(r)

        def chaos():
            while not stop.is_set():
                if stop.wait(rnd.uniform(*ARGS.kill_every)) or time.monotonic() >= end_at:
                    return
                CHAOS.killed.clear()
                CHAOS.want.set()
                if not CHAOS.killed.wait(10.0):
                    CHAOS.kill_random(rnd.randrange(len(CHAOS.agents)))
                CHAOS.killed.wait(1.0)
                if stop.wait(rnd.uniform(0.5, 4.0)):
                    return
                with CHAOS.lock:
                    i = CHAOS.victim
                    if i is not None:
                        CHAOS.agents[i] = start_agent(i, state_dir=CHAOS.agents[i].state_dir)
                        CHAOS.victim = None
                        CHAOS.counts["agent restart"] += 1

        def sampler():
            next_min = 60.0
            while not stop.wait(5.0):
                t = time.monotonic() - t0
                rss, fds = proc_sample(srv.pid)
                if rss is None:
                    return
                with lock:
                    samples.append((t, rss, fds))
                    n = len(results)
                if t >= next_min:
                    ms = mem_sample(srv.url)
                    with lock:
                        mem.append((t, ms))
                    print("soak: %4.0f s  server rss %6d kB  fds %4d  requests %d  %s" %
                          (t, rss, fds, n, fmt_mem(ms)), flush=True)
                    next_min += 60.0

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(ARGS.clients)]
        threads += [threading.Thread(target=chaos, daemon=True),
                    threading.Thread(target=sampler, daemon=True)]
        for t in threads:
            t.start()
        while time.monotonic() < end_at and srv.alive():
            time.sleep(1.0)
        # Let the requests in flight finish (bounded), then stop.
        for t in threads[:ARGS.clients]:
            t.join(timeout=max(1.0, end_at + REQ_TIMEOUT + 10 - time.monotonic()))
        stop.set()
        for t in threads[ARGS.clients:]:
            t.join(timeout=10)
        # settle: the server frees finished jobs after a while; sample at the end
        time.sleep(2.0)
        end_sample = proc_sample(srv.pid)
        end_mem = mem_sample(srv.url)
        server_alive = srv.alive()
        if end_sample[0] is not None:
            samples.append((time.monotonic() - t0,) + end_sample)
        elapsed = time.monotonic() - t0

        # ----------------------------------------------------------- the table
        with lock:
            res = list(results)
        fail = collections.Counter(r.failure for r in res if r.failure and not r.vanished)
        vanished = sum(1 for r in res if r.vanished)
        done = [r for r in res if r.ok and not r.failure and not r.vanished]
        mism = {"after failover": [], "without failover": []}
        lost = {"after failover": 0, "without failover": 0}
        dup = {"after failover": 0, "without failover": 0}
        for r in done:
            exp = expected[(r.kind, r.prompt)]
            if r.text != exp:
                cls = "after failover" if r.failover else "without failover"
                mism[cls].append(r)
                lw, dw = word_diff(exp, r.text)
                lost[cls] += lw
                dup[cls] += dw
        by_kind = collections.Counter((r.kind, "stream" if r.stream else "plain") for r in res)
        failovers = sum(1 for r in done if r.failover)
        rows = [("duration", "%.1f min" % (elapsed / 60)),
                ("agents / slots / clients", "%d / %d / %d" % (ARGS.agents, ARGS.slots, ARGS.clients)),
                ("agent kills -9 mid-stream / at random",
                 "%d / %d" % (CHAOS.counts["agent kill -9 mid-stream"],
                              CHAOS.counts["agent kill -9 at random"])),
                ("agent restarts", str(CHAOS.counts["agent restart"])),
                ("reference continuation", "matches" if ref_ok else "DIFFERS"),
                ("requests", str(len(res))),
                ("  by dialect", ", ".join("%s %s %d" % (k, s, n)
                                           for (k, s), n in sorted(by_kind.items()))),
                ("  slow clients", str(sum(1 for r in res if r.mode == "slow"))),
                ("  vanished on purpose", str(vanished)),
                ("successes (complete reply)", str(len(done))),
                ("  of which failed over", str(failovers))]
        rows.append(("failures", str(sum(fail.values()))))
        for k, n in sorted(fail.items(), key=lambda kv: -kv[1]):
            rows.append(("  " + k, str(n)))
        for cls in ("without failover", "after failover"):
            rows.append(("text mismatches " + cls, str(len(mism[cls]))))
            rows.append(("  lost / duplicated words", "%d / %d" % (lost[cls], dup[cls])))
        rs = [s for s in samples if s[1] is not None]
        # Warm-up: finished tasks stay in memory task_hot_sec (5 min by
        # default), so RSS can only settle after that; shorter runs take
        # their midpoint.
        warmup = min(360.0, elapsed / 2)
        warm = [s for s in rs if s[0] >= warmup]
        after_warm = warm[0] if warm else rs[-1]
        peak = max(rs, key=lambda s: s[1])
        rows += [("warm-up (RSS settles after)", "%.0f s" % warmup),
                 ("server RSS start / after warm-up / peak / end (kB)",
                  "%d / %d / %d / %d" % (rs[0][1], after_warm[1], peak[1], rs[-1][1])),
                 ("server RSS end vs after warm-up",
                  "%+.1f %%" % (100.0 * (rs[-1][1] - after_warm[1]) / after_warm[1])),
                 ("server fds start / end", "%d / %d" % (rs[0][2], rs[-1][2])),
                 ("server", "alive" if server_alive else "DIED (exit %s)" % srv.p.returncode)]
        w = max(len(k) for k, _ in rows)
        print()
        print("%-*s  %s" % (w, "soak", "result"))
        print("-" * (w + 40))
        for k, v in rows:
            print("%-*s  %s" % (w, k, v))
        # Memory per minute: RSS beside the heap (in use / free) and the
        # objects the server holds, to tell a retention from the allocator.
        mem.append((elapsed, end_mem))
        print()
        print("%7s  %s" % ("t", "server memory (/metrics)"))
        for t, d in mem:
            print("%5.0f s  %s" % (t, fmt_mem(d)))
        for cls in ("without failover", "after failover"):
            for r in mism[cls][:3]:
                print("\nmismatch %s: %s %s %s attempts=%d\n  expected %r\n  got      %r" %
                      (cls, r.kind, "stream" if r.stream else "plain", r.mode, r.attempts,
                       expected[(r.kind, r.prompt)], r.text))
        reports = h.sanitizer_reports()
        for name, txt in reports:
            if name.startswith("server"):
                print("\nsanitizer report in %s:\n%s" % (name, txt[:2000]))
        if not server_alive or any(n.startswith("server") for n, _ in reports):
            code = 1
    finally:
        stop.set()
        h.cleanup()
        if ARGS.keep_tmp:
            print("soak: logs kept in %s" % h.tmp)
    return code


if __name__ == "__main__":
    sys.exit(main())
