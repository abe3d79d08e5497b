"""Integration-test harness: start gpupool processes on 127.0.0.1, talk HTTP to
them, and always kill what was started.

Used by every tests/integration/test_*.py (standard library only):

    import harness
    class T(harness.TestCase):
        def test_x(self):
            up = self.h.start_upstream(["--tokens", "5"])
            srv = self.h.start_server()
            ag = self.h.start_agent(srv, upstream=up, model="m1")
            srv.wait_model("m1")
            st, hdr, body = harness.http_json("POST", srv.url + "/v1/completions",
                                              {"model": "m1", "prompt": "hi"})

Every process gets its log captured in the test's temp dir (dumped on test
failure); every PID started is killed (SIGTERM, then SIGKILL after a grace
period) in tearDown and again at interpreter exit (atexit), even when a test
fails or raises. Every wait loop here is bounded in time.

Environment: GPUPOOL_BUILD_DIR (binaries: BUILD/src/server/gpupool-server,
BUILD/src/agent/gpupool-agent) and GPUPOOL_SOURCE_DIR (repo root), both set
by CTest. GPUPOOL_KEEP_TMP=1 keeps the temp dirs for inspection.
"""

import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("GPUPOOL_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD_DIR = os.environ.get("GPUPOOL_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")

SERVER_BIN = os.environ.get("GPUPOOL_SERVER_BIN") or os.path.join(BUILD_DIR, "src", "server", "gpupool-server")
AGENT_BIN = os.environ.get("GPUPOOL_AGENT_BIN") or os.path.join(BUILD_DIR, "src", "agent", "gpupool-agent")
UPSTREAM_PY = os.path.join(HERE, "upstream.py")

# The PostgreSQL variant (CTest's integration.*.pg): GPUPOOL_TEST_PG_FIXTURE
# names the directory pg_fixture.py started one PostgreSQL in; every SQLite
# path a test hands the server becomes a schema of its own there
# (Harness.store_uri). Read once, here: Harness.env() drops GPUPOOL_*.
PG_FIXTURE = os.environ.get("GPUPOOL_TEST_PG_FIXTURE")
_PG_SCHEMAS = {}


def _sql_inline(sql, params):
    """sql with each ? replaced by its value from params as a literal (psql
    -c takes no parameters): integers as they are, None as NULL, text
    quoted the standard way, which both engines read. The ? placeholders
    must not sit inside quoted text (with no params sql goes as it is)."""
    if not params:
        return sql
    parts = sql.split("?")
    if len(parts) != len(params) + 1:
        raise ValueError("%d placeholders, %d params" % (len(parts) - 1, len(params)))
    out = [parts[0]]
    for v, rest in zip(params, parts[1:]):
        if v is None:
            out.append("NULL")
        elif isinstance(v, bool) or not isinstance(v, (int, str)):
            raise TypeError("no literal for %r" % (v,))
        elif isinstance(v, int):
            out.append(str(v))
        else:
            if "\0" in v:
                raise ValueError("NUL in a text value")
            out.append("'" + v.replace("'", "''") + "'")
        out.append(rest)
    return "".join(out)


def _pg_fixture_file(name):
    with open(os.path.join(PG_FIXTURE, name)) as f:
        return f.read().strip()


if PG_FIXTURE and os.path.exists(os.path.join(PG_FIXTURE, "skip")):
    print("SKIP: " + _pg_fixture_file("skip"))
    sys.exit(77)

# Startup bound for any process (seconds). Generous: sanitizer builds are slow
# and the CI machine is shared.
START_TIMEOUT = float(os.environ.get("GPUPOOL_TEST_START_TIMEOUT", "20"))

# ---------------------------------------------------------------------------
# Process bookkeeping: every PID we start, killed at exit whatever happens.
# ---------------------------------------------------------------------------

_ALL_PROCS = []


def _kill_proc(p, grace=3.0):
    """SIGTERM, wait up to grace seconds, then SIGKILL. Idempotent."""
    if p.poll() is not None:
        return p.returncode
    try:
        p.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        return p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        p.kill()
    except ProcessLookupError:
        pass
    try:
        return p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _kill_all_at_exit():
    for p in list(_ALL_PROCS):
        _kill_proc(p, grace=1.0)


atexit.register(_kill_all_at_exit)


def free_port():
    """A port that was free a moment ago (prefer --port-file with port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout=10.0, interval=0.05, what="condition"):
    """Poll pred() until it returns a truthy value (returned) or timeout
    seconds pass (AssertionError naming `what`). Exceptions from pred count
    as 'not yet'; the last one is reported."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - reported below
            last_exc = e
        if time.monotonic() >= deadline:
            msg = "timed out after %.1fs waiting for %s" % (timeout, what)
            if last_exc is not None:
                msg += " (last error: %r)" % (last_exc,)
            raise AssertionError(msg)
        time.sleep(interval)


def read_port_file(path, proc, timeout=START_TIMEOUT):
    def ready():
        if proc.poll() is not None:
            raise AssertionError("process exited with %s before writing %s" % (proc.returncode, path))
        try:
            with open(path) as f:
                txt = f.read().strip()
        except FileNotFoundError:
            return None
        return int(txt) if txt.isdigit() else None
    try:
        return wait_until(ready, timeout=timeout, what="port file " + path)
    except AssertionError as e:
        if proc.poll() is not None:
            raise AssertionError("process exited with %s before writing %s" % (proc.returncode, path)) from e
        raise


# ---------------------------------------------------------------------------
# HTTP helpers (http.client only)
# ---------------------------------------------------------------------------

def _split(url):
    u = urllib.parse.urlsplit(url)
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    return u.hostname, u.port or 80, path


def http_request(method, url, body=None, headers=None, timeout=30.0):
    """One request on a fresh connection. body: bytes, str, or a JSON-able
    object (sent as JSON). Returns (status, headers dict lower-cased, raw bytes)."""
    host, port, path = _split(url)
    h = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        h.setdefault("Content-Type", "application/json")
    if isinstance(body, str):
        body = body.encode()
    if body and not any(k.lower() == "content-type" for k in h):
        # What every client of ours sends; a server with auth off refuses
        # bodies of another type (issue 25).
        h["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def http_json(method, url, body=None, headers=None, timeout=30.0):
    """Like http_request, the body parsed as JSON when it is JSON (else the raw
    bytes, or None when empty)."""
    st, hdr, data = http_request(method, url, body, headers, timeout)
    parsed = None
    if data:
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = data
    return st, hdr, parsed


def in_thread(fn, *a, **kw):
    """Run fn(*a, **kw) in a daemon thread (a request that blocks until the
    test makes an agent act). Returns a getter get(timeout=30) that joins the
    thread (bounded: raises AssertionError when it has not finished) and
    returns fn's result or re-raises its exception."""
    box = {}

    def run():
        try:
            box["v"] = fn(*a, **kw)
        except BaseException as e:  # noqa: BLE001 - re-raised by get()
            box["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()

    def get(timeout=30):
        t.join(timeout)
        if t.is_alive():
            raise AssertionError("request thread did not finish in %ss" % timeout)
        if "e" in box:
            raise box["e"]
        return box["v"]
    return get


def post_json(url, path, body, headers=None, timeout=30):
    """POST body as JSON to url + path: (status, headers, parsed body)."""
    return http_json("POST", url + path, body, headers, timeout)


def bearer(key):
    return {"Authorization": "Bearer " + key} if key else {}


def parse_sse(data):
    """Parse a whole SSE body (bytes or str) into a list of events, each a dict
    {"event": name or None, "data": str, "id": str or None}. CRLF and LF both
    accepted, comments (':') skipped, multi-line data joined with '\\n'."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    p = SSEParser()
    out = p.feed(data)
    out += p.flush()
    return out


class SSEParser:
    """Incremental SSE parser: feed(text) returns the events completed so far."""

    def __init__(self):
        self.buf = ""
        self._reset()

    def _reset(self):
        self.ev = {"event": None, "data": [], "id": None}

    def _line(self, line, out):
        if line == "":
            if self.ev["data"] or self.ev["event"] is not None:
                out.append({"event": self.ev["event"], "data": "\n".join(self.ev["data"]),
                            "id": self.ev["id"]})
            self._reset()
            return
        if line.startswith(":"):
            return
        field, _, val = line.partition(":")
        if val.startswith(" "):
            val = val[1:]
        if field == "data":
            self.ev["data"].append(val)
        elif field == "event":
            self.ev["event"] = val
        elif field == "id":
            self.ev["id"] = val

    def feed(self, text):
        out = []
        self.buf += text
        while True:
            i = self.buf.find("\n")
            if i < 0:
                break
            line = self.buf[:i]
            self.buf = self.buf[i + 1:]
            if line.endswith("\r"):
                line = line[:-1]
            self._line(line, out)
        return out

    def flush(self):
        out = []
        if self.buf:
            self._line(self.buf, out)
            self.buf = ""
        self._line("", out)
        return out


def sse_data_json(events):
    """The JSON payloads of `data:` events, stopping at [DONE] (not included)."""
    out = []
    for e in events:
        if e["data"] == "[DONE]":
            break
        out.append(json.loads(e["data"]))
    return out


def agent_info(server_url, aid, key=None):
    """The agent's row of GET /admin/agents ({} when absent or refused)."""
    st, _, b = http_json("GET", server_url + "/admin/agents", headers=bearer(key))
    if st != 200 or not isinstance(b, dict):
        return {}
    return next((x for x in b.get("agents", []) if x.get("id") == aid), {})


def chat_stream(tc, server_url, body, timeout=120):
    """Stream a chat completion to [DONE]; returns (text, last x_pool_meta).
    tc: the TestCase whose assertions fail the test on an error event."""
    s = SSEStream("POST", server_url + "/v1/chat/completions", body, timeout=timeout)
    tc.assertEqual(s.status, 200)
    text, meta = "", None
    try:
        while True:
            e = s.next_event(timeout=60)
            tc.assertIsNotNone(e, "stream ended without [DONE]")
            if e["data"] == "[DONE]":
                break
            d = json.loads(e["data"])
            tc.assertNotIn("error", d, d)
            for c in d.get("choices") or []:
                text += (c.get("delta") or {}).get("content") or ""
            meta = d.get("x_pool_meta") or meta
    finally:
        s.close()
    return text, meta


class SSEStream:
    """An open streaming request: iterate events as they arrive, close() at any
    time (the client-disconnect tests do that on purpose).

        with SSEStream("POST", url, body) as s:
            self.assertEqual(s.status, 200)
            first = s.next_event(timeout=10)
    """

    def __init__(self, method, url, body=None, headers=None, timeout=30.0):
        host, port, path = _split(url)
        h = dict(headers or {})
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        if isinstance(body, str):
            body = body.encode()
        if body and not any(k.lower() == "content-type" for k in h):
            h["Content-Type"] = "application/json"
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.conn.request(method, path, body=body, headers=h)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}
        self.parser = SSEParser()
        self.pending = []
        self.eof = False

    def body(self):
        """The rest of the body (for non-200 replies)."""
        return self.resp.read()

    def next_event(self, timeout=None):
        """Next event, or None at end of stream. socket.timeout when nothing
        arrives within timeout seconds (default: the connection timeout)."""
        if timeout is not None and self.conn.sock is not None:
            self.conn.sock.settimeout(timeout)
        while not self.pending:
            if self.eof:
                return None
            chunk = self.resp.read1(65536)
            if not chunk:
                self.eof = True
                self.pending.extend(self.parser.flush())
                break
            self.pending.extend(self.parser.feed(chunk.decode("utf-8", "replace")))
        return self.pending.pop(0) if self.pending else None

    def events(self, limit=100000):
        """All remaining events (bounded by limit)."""
        out = []
        while len(out) < limit:
            e = self.next_event()
            if e is None:
                break
            out.append(e)
        return out

    def close(self):
        """Drop the connection abruptly (a client that goes away)."""
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------

class Proc:
    """A started process with its log file."""

    def __init__(self, name, argv, log_path, env=None, cwd=None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log,
                                  stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                  start_new_session=True)
        _ALL_PROCS.append(self.p)
        self.pid = self.p.pid

    def alive(self):
        return self.p.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.pid, sig)

    def kill9(self):
        """SIGKILL and reap (a crash, for fault tests)."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.p.wait(timeout=10)

    def stop(self, grace=3.0):
        """SIGTERM, then SIGKILL after grace seconds. Returns the exit code."""
        rc = _kill_proc(self.p, grace)
        try:
            self.log.close()
        except Exception:
            pass
        return rc

    def wait(self, timeout):
        return self.p.wait(timeout=timeout)

    def log_events(self, event=None):
        """The JSON log lines (gp_log) written so far, optionally only those
        whose "event" is `event`. Non-JSON lines are skipped."""
        out = []
        for line in self.log_text().splitlines():
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if event is None or d.get("event") == event:
                out.append(d)
        return out

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


class Server(Proc):
    """gpupool-server on 127.0.0.1:<ephemeral>."""

    def __init__(self, h, name, args, db, key=None, port=0):
        self.h = h
        self.db = db
        self.key = key
        self.port_file = os.path.join(h.tmp, name + ".port")
        self.extra = list(args)
        try:
            os.unlink(self.port_file)
        except FileNotFoundError:
            pass
        uri = h.store_uri(db)
        if uri != db and not any(a.startswith("--state_dir") for a in self.extra):
            # a URI has no directory: admin.key goes where the tests look
            # for it, next to the path they gave
            self.extra += ["--state_dir", os.path.dirname(os.path.abspath(db))]
        argv = [SERVER_BIN, "--listen", "127.0.0.1:%d" % port, "--port-file", self.port_file,
                "--db", uri] + self.extra
        super().__init__(name, argv, os.path.join(h.tmp, name + ".log"), env=h.env())
        self.port = read_port_file(self.port_file, self.p)
        self.url = "http://127.0.0.1:%d" % self.port
        self.wait_ready()

    def wait_ready(self, timeout=START_TIMEOUT):
        def ok():
            if not self.alive():
                raise AssertionError("server exited with %s" % self.p.returncode)
            st, _, _ = http_request("GET", self.url + "/health", timeout=2)
            return st == 200
        wait_until(ok, timeout=timeout, what="server /health")

    def models(self, key=None):
        st, _, body = http_json("GET", self.url + "/v1/models", headers=bearer(key or self.key), timeout=5)
        if st != 200 or not isinstance(body, dict):
            return []
        return [m.get("id") for m in body.get("data", [])]

    def wait_model(self, model, timeout=START_TIMEOUT, key=None):
        """Wait until GET /v1/models lists model (an agent serving it registered)."""
        wait_until(lambda: model in self.models(key), timeout=timeout, what="model %s listed" % model)

    def metric(self, name):
        """The value of an unlabelled metric in GET /metrics (0 if absent)."""
        _, _, raw = http_request("GET", self.url + "/metrics", timeout=5)
        for line in raw.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0

    def parked(self):
        """gpupool_agents_parked: agents with a long-poll waiting for work
        now. Round robin skips an agent between two polls, so a test that
        expects a spread sends each request when all are parked."""
        return self.metric("gpupool_agents_parked")

    def wait_parked(self, n, timeout=30):
        wait_until(lambda: self.parked() >= n, timeout=timeout, what="%d agents parked" % n)


class Upstream(Proc):
    """tests/integration/upstream.py: the scripted OpenAI-compatible server."""

    def __init__(self, h, name, args):
        self.port_file = os.path.join(h.tmp, name + ".port")
        argv = [sys.executable, UPSTREAM_PY, "--port", "0", "--port-file", self.port_file] + list(args)
        super().__init__(name, argv, os.path.join(h.tmp, name + ".log"), env=h.env())
        self.port = read_port_file(self.port_file, self.p)
        self.url = "http://127.0.0.1:%d" % self.port

    def control(self, **settings):
        """Change behaviour at run time (POST /_control/config)."""
        st, _, body = http_json("POST", self.url + "/_control/config", settings, timeout=5)
        assert st == 200, (st, body)
        return body

    def reset(self):
        st, _, _ = http_json("POST", self.url + "/_control/reset", {}, timeout=5)
        assert st == 200

    def log_entries(self):
        """What the upstream received: a list of request records, see upstream.py."""
        st, _, body = http_json("GET", self.url + "/_control/log", timeout=5)
        assert st == 200, st
        return body["requests"]


class Agent(Proc):
    """gpupool-agent connected to a Server."""

    def __init__(self, h, name, server, args, state_dir, env=None):
        self.state_dir = state_dir
        argv = [AGENT_BIN, "--server", server.url, "--state-dir", state_dir,
                "--name", name] + list(args)
        super().__init__(name, argv, os.path.join(h.tmp, name + ".log"),
                         env=env if env is not None else h.env())

    def agent_id(self, timeout=START_TIMEOUT):
        path = os.path.join(self.state_dir, "agent_id")

        def read():
            with open(path) as f:
                return f.read().strip()
        return wait_until(read, timeout=timeout, what="agent_id file")


class Harness:
    """Owns a temp dir and every process started through it."""

    def __init__(self, prefix="gpupool-it-"):
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.procs = []
        self._n = 0

    def env(self):
        e = dict(os.environ)
        # GPUPOOL_* would override the flags the tests pass (environment wins
        # in gp_config); the harness variables are for this script only.
        for k in list(e):
            if k.startswith("GPUPOOL_"):
                del e[k]
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        return e

    def _name(self, base):
        self._n += 1
        return "%s%d" % (base, self._n)

    def is_pg(self, db):
        """Whether the server at db stores in PostgreSQL (the variant)."""
        return self.store_uri(db) != db

    def query(self, db, sql, params=()):
        """Rows of sql run on the store the server at db used (SQLite file,
        or its schema in the PostgreSQL variant), as tuples; integer columns
        come back as int either way. params: values for the ? in sql."""
        uri = self.store_uri(db)
        if uri == db:
            import sqlite3
            con = sqlite3.connect(db, timeout=10)
            try:
                return con.execute(sql, params).fetchall()
            finally:
                con.close()
        r = self._psql(uri, _sql_inline(sql, params))

        def value(x):
            if x == "":
                return None
            try:
                return int(x)
            except ValueError:
                return x
        return [tuple(value(x) for x in line.split("\t")) for line in r.stdout.splitlines()]

    def execute(self, db, sql, params=()):
        """Run sql (one statement, or with no params several separated by
        ;) on the store of db, as query reads it, and commit: for a test
        that puts into the store what a server could not have written."""
        uri = self.store_uri(db)
        if uri == db:
            import sqlite3
            con = sqlite3.connect(db, timeout=10)
            try:
                if params:
                    con.execute(sql, params)
                else:
                    con.executescript(sql)
                con.commit()
            finally:
                con.close()
            return
        self._psql(uri, _sql_inline(sql, params))

    def _psql(self, uri, sql):
        psql = os.path.join(_pg_fixture_file("bin"), "psql")
        return subprocess.run([psql, "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-d", uri,
                               "-c", sql],
                              check=True, capture_output=True, text=True, timeout=60)

    def store_uri(self, db):
        """What the server's --db gets for db: the path itself, or in the
        PostgreSQL variant a schema of its own for each path (the same path
        again, as a restart passes it, gives the same schema)."""
        if not PG_FIXTURE or "://" in db:
            return db
        if db not in _PG_SCHEMAS:
            name = "it_%d_%d" % (os.getpid(), len(_PG_SCHEMAS) + 1)
            uri = _pg_fixture_file("uri")
            psql = os.path.join(_pg_fixture_file("bin"), "psql")
            subprocess.run([psql, "-At", "-q", "-v", "ON_ERROR_STOP=1", "-d", uri,
                            "-c", 'CREATE SCHEMA "%s"' % name],
                           check=True, capture_output=True, timeout=60)
            _PG_SCHEMAS[db] = uri + "?options=-c%20search_path%3D" + name
        return _PG_SCHEMAS[db]

    def path(self, name):
        return os.path.join(self.tmp, name)

    def start_server(self, args=(), db=None, key=None, name=None, port=0):
        """Start gpupool-server. args: extra flags, e.g. ["--poll_interval_sec", "1"].
        db: SQLite path (default: a fresh file in the temp dir; pass the same
        path again to restart on the same data). port: 0 = ephemeral; pass
        an old server's port to restart it where its agents look for it.
        key: a client key the helpers (models, wait_model) send."""
        name = name or self._name("server")
        db = db or self.path(name + ".db")
        s = Server(self, name, args, db, key, port)
        self.procs.append(s)
        return s

    def create_key(self, db, role, name="test"):
        """`gpupool-server keys create`: a new key of role client|agent|admin
        in db (created when missing). Returns the raw key."""
        r = subprocess.run([SERVER_BIN, "keys", "create", "--role", role, "--db", self.store_uri(db),
                            "--name", name],
                           capture_output=True, text=True, timeout=30, env=self.env())
        assert r.returncode == 0, "keys create failed: %s" % r.stderr
        return r.stdout.strip().splitlines()[-1]

    def start_upstream(self, args=(), name=None):
        name = name or self._name("upstream")
        u = Upstream(self, name, args)
        self.procs.append(u)
        return u

    def start_agent(self, server, upstream=None, model="m1", args=(), name=None,
                    state_dir=None, slots=1, token=None, alias=None, env=None):
        """Start gpupool-agent with the openai backend on upstream (or pass
        backend flags yourself in args with upstream=None). env: the whole
        environment (default: self.env()). slots None: the agent's default."""
        name = name or self._name("agent")
        state_dir = state_dir or self.path(name + ".state")
        argv = ["--log-level", "debug"] + (["--slots", str(slots)] if slots is not None else [])
        if token:
            argv += ["--token", token]
        if upstream is not None:
            argv += ["--upstream", upstream.url, "--upstream-model", model]
        if alias:
            argv += ["--alias", alias]
        a = Agent(self, name, server, argv + list(args), state_dir, env=env)
        self.procs.append(a)
        return a

    def logs(self):
        out = []
        for p in self.procs:
            out.append("===== %s (pid %d) %s\n%s" % (p.name, p.pid, " ".join(p.argv), p.log_text()[-20000:]))
        return "\n".join(out)

    SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                       "WARNING: ThreadSanitizer")

    def sanitizer_reports(self):
        """(process name, excerpt) for every log holding a sanitizer report."""
        out = []
        for p in self.procs:
            txt = p.log_text()
            for m in self.SANITIZER_MARKS:
                i = txt.find(m)
                if i >= 0:
                    out.append((p.name, txt[max(0, i - 200):i + 3000]))
                    break
        return out

    def cleanup(self):
        """Stop every process (SIGTERM, then SIGKILL), remove the temp dir.
        Returns the sanitizer reports found in the logs (see TestCase)."""
        for p in reversed(self.procs):
            p.stop(grace=3.0)
        reports = self.sanitizer_reports()
        if os.environ.get("GPUPOOL_KEEP_TMP") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)
        return reports


def binaries_present(*bins):
    return all(os.access(b, os.X_OK) for b in bins)


class TestCase(unittest.TestCase):
    """unittest.TestCase with self.h (a Harness) set up and torn down per test.
    On failure the captured process logs go to stderr."""

    NEEDS = (SERVER_BIN, AGENT_BIN)

    def setUp(self):
        missing = [b for b in self.NEEDS if not os.access(b, os.X_OK)]
        if missing:
            self.skipTest("not built: " + ", ".join(missing))
        self.h = Harness()
        self._nfail0 = self._nfail()
        self.addCleanup(self._cleanup)

    def _nfail(self):
        outcome = getattr(self, "_outcome", None)
        res = getattr(outcome, "result", None) if outcome is not None else None
        if res is None:
            return 0
        return len(getattr(res, "failures", [])) + len(getattr(res, "errors", []))

    def _cleanup(self):
        outcome = getattr(self, "_outcome", None)
        failed = self._nfail() > self._nfail0 or not getattr(outcome, "success", True)
        if failed or os.environ.get("GPUPOOL_TEST_VERBOSE") == "1":
            sys.stderr.write("\n--- process logs (%s) ---\n%s\n" % (self.id(), self.h.logs()))
        reports = self.h.cleanup()
        if reports:
            # A sanitizer finding in any process fails the test that ran it.
            raise AssertionError("sanitizer report in %s:\n%s" % (reports[0][0], reports[0][1]))


def main():
    unittest.main(verbosity=2)
