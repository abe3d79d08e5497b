"""Hostile and careless HTTP peers against a real gpupool-server (issue 9,
findings 3, 6, 7, 8, 9 and part of 12), over raw sockets to 127.0.0.1.

Every wait is bounded: replies are awaited with socket timeouts, state is
polled through /metrics or the server log with harness.wait_until. The one
fixed window (the fd-exhaustion CPU check) measures work done by the server
in that window, it orders nothing.
"""

import json
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json, http_request, wait_until  # noqa: E402


def connect(srv, timeout=10.0):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    s.settimeout(timeout)
    return s


def read_reply(s, head_only=False):
    """One HTTP reply from s: (status, headers dict lower-cased, body bytes).
    The body is read by Content-Length (a HEAD reply: none)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError("connection closed before a reply head: %r" % buf)
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    hdr = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdr[k.strip().lower()] = v.strip()
    if head_only:
        return status, hdr, rest
    n = int(hdr.get("content-length", "0"))
    while len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, hdr, rest[:n]


def closed_by_peer(s, limit=10.0):
    """True when the peer closes s (EOF or reset) within limit seconds,
    discarding what it sends meanwhile."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if not s.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False
    return False


def raw(srv, data, timeout=10.0):
    """Send data on a fresh connection, return the first reply."""
    with connect(srv, timeout) as s:
        s.sendall(data)
        return read_reply(s)


def metric(srv, name):
    st, _, body = http_request("GET", srv.url + "/metrics", timeout=5)
    assert st == 200, st
    for line in body.decode().splitlines():
        if line.startswith("gpupool_" + name + " "):
            return float(line.split()[1])
    return None


class HostileHttp(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def server_with_key(self, args=()):
        db = self.h.path("hostile.db")
        key = self.h.create_key(db, "client")
        srv = self.h.start_server(list(args), db=db, key=key)
        return srv, key

    # ---- finding 3: decided on the head, before any body byte -----------

    def test_head_refusals_come_before_the_body(self):
        srv, key = self.server_with_key()
        # 5 MB: over max_body_bytes (4 MiB) but under evhttp's own 2x limit,
        # where the old server waited for the whole body before answering.
        big = 5 * 1000 * 1000
        cases = [
            # (request head, expected status, dialect check)
            ("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % big,
             401, "openai"),
            ("POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nx-api-key: wrong\r\nContent-Length: 1000\r\n\r\n",
             401, "anthropic"),
            ("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\n"
             "Content-Length: %d\r\n\r\n" % (key, big), 413, "openai"),
            ("POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nx-api-key: %s\r\n"
             "Content-Length: %d\r\n\r\n" % (key, big), 413, "anthropic"),
            ("POST /nowhere HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n", 404, "native"),
            ("PUT /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\n"
             "Content-Length: 1000\r\n\r\n" % key, 405, "openai"),
        ]
        for head, want, dialect in cases:
            with self.subTest(head=head.split("\r\n")[0], want=want):
                with connect(srv, timeout=5) as s:
                    s.sendall(head.encode())  # and not one body byte
                    st, hdr, body = read_reply(s)
                    self.assertEqual(st, want)
                    self.assertIn("application/json", hdr.get("content-type", ""))
                    j = json.loads(body)
                    if dialect == "anthropic":
                        self.assertEqual(j["type"], "error")
                    elif dialect == "openai":
                        self.assertIn("type", j["error"])
                        self.assertIn("message", j["error"])
                    else:
                        self.assertIn("code", j["error"])
                    # a body is pending: the connection is closed after the reply
                    self.assertEqual(hdr.get("connection"), "close")
                    self.assertTrue(closed_by_peer(s, 5), "connection left open")

    def test_global_cap_on_bodies_in_flight(self):
        srv, key = self.server_with_key(["--max_inflight_body_bytes", "1000000"])
        head = ("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\n"
                "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n")
        body = json.dumps({"model": "nobody-serves-this", "prompt": "x" * 700000}).encode()
        a = connect(srv)
        self.addCleanup(a.close)
        # Bytes are counted as they arrive (issue 25), not as declared.
        a.sendall((head % (key, len(body))).encode() + body[:-10])
        wait_until(lambda: metric(srv, "http_body_bytes_inflight") == len(body) - 10,
                   timeout=10, what="A's body counted in flight")
        st, hdr, j = raw(srv, (head % (key, len(body))).encode())
        self.assertEqual(st, 503)
        self.assertEqual(hdr.get("retry-after"), "1")
        self.assertEqual(json.loads(j)["error"]["type"], "service_unavailable")
        a.sendall(body[-10:])
        st, _, j = read_reply(a)
        self.assertEqual(st, 404, j)  # reached the handler: model_not_found
        wait_until(lambda: metric(srv, "http_body_bytes_inflight") == 0, timeout=10,
                   what="in-flight bytes released")
        st, _, _ = raw(srv, (head % (key, len(body))).encode() + body)
        self.assertEqual(st, 404)

    def test_unread_bodies_cost_no_memory(self):
        """100 connections each send 1 MB of a body the server refused on the
        head: the server must not keep it (the old server buffered it all)."""
        srv, key = self.server_with_key()

        def rss_kb():
            with open("/proc/%d/status" % srv.pid) as f:
                for ln in f:
                    if ln.startswith("VmRSS:"):
                        return int(ln.split()[1])
            return 0
        before = rss_kb()
        socks = []
        chunk = b"x" * 65536
        try:
            for _ in range(100):
                s = connect(srv, timeout=5)
                socks.append(s)
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                          b"Content-Length: 8400000\r\n\r\n")
                s.setblocking(False)
                sent = 0
                while sent < 1 << 20:
                    try:
                        sent += s.send(chunk)
                    except (BlockingIOError, ConnectionResetError, BrokenPipeError):
                        break
            after = rss_kb()
        finally:
            for s in socks:
                s.close()
        # 100 MB offered; what stays is socket buffers in the kernel, not here.
        self.assertLess(after - before, 40 * 1024, "RSS grew by %d kB" % (after - before))

    # ---- finding 7: deadlines for the head and the body -----------------

    def test_slow_head_and_slow_body_are_closed(self):
        srv = self.h.start_server(["--header_timeout_sec", "2", "--body_timeout_sec", "2"])
        slow = connect(srv)
        self.addCleanup(slow.close)
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 20 and not closed:
            try:
                slow.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            closed = closed_by_peer(slow, 0.3)
        self.assertTrue(closed, "a head trickled one byte per 0.3 s was never closed")
        # others are served meanwhile and after
        st, _, _ = http_request("GET", srv.url + "/health", timeout=5)
        self.assertEqual(st, 200)

        body = connect(srv)
        self.addCleanup(body.close)
        body.sendall(b"POST /v2/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 20 and not closed:
            try:
                body.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            closed = closed_by_peer(body, 0.3)
        self.assertTrue(closed, "a body trickled one byte per 0.3 s was never closed")
        st, _, _ = http_request("GET", srv.url + "/health", timeout=5)
        self.assertEqual(st, 200)

    # ---- finding 8: HEAD ------------------------------------------------

    def test_head_is_get_without_body(self):
        srv = self.h.start_server()
        for path in ("/", "/health", "/metrics", "/v1/models", "/v2/tasks/nope",
                     "/dashboard", "/dashboard/app.js", "/dashboard/app.css"):
            with self.subTest(path=path):
                gst, ghdr, gbody = raw(srv, ("GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n" % path).encode())
                with connect(srv) as s:
                    s.sendall(("HEAD %s HTTP/1.1\r\nHost: localhost\r\n\r\n" % path).encode())
                    hst, hhdr, extra = read_reply(s, head_only=True)
                    self.assertEqual(hst, gst)
                    self.assertEqual(hhdr.get("content-type"), ghdr.get("content-type"))
                    self.assertIn("content-length", hhdr)
                    if path not in ("/metrics", "/health"):  # their bodies vary per call
                        self.assertEqual(int(hhdr["content-length"]), len(gbody))
                    self.assertEqual(extra, b"")
                    # keep-alive: the next reply on the same connection is intact
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    st, _, body = read_reply(s)
                    self.assertEqual(st, 200)
                    self.assertEqual(json.loads(body)["status"], "ok")

    def test_every_reply_has_one_date_of_now(self):
        """One Date header on every kind of reply (issue 24: the server adds
        it from a per-second cache where evhttp formatted one per reply):
        RFC 1123 form in GMT, of a second between the request's sending and
        the reply's reading (a stale cache would fall before it), on a JSON
        reply, an error, a 204-less HEAD, HTTP/1.0 and an SSE stream's head."""
        import calendar
        import re
        form = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|"
                          r"Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT$")
        srv = self.h.start_server()
        reqs = (b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"HEAD /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n",
                b"GET /admin/events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        for req in reqs:
            with self.subTest(req=req.split(b"\r\n")[0]), connect(srv) as s:
                t0 = int(time.time())
                s.sendall(req)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = s.recv(65536)
                    self.assertTrue(chunk, "closed before the head: %r" % buf)
                    buf += chunk
                t1 = int(time.time())
                lines = buf.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
                dates = [ln.partition(":")[2].strip() for ln in lines[1:]
                         if ln.partition(":")[0].strip().lower() == "date"]
                self.assertEqual(len(dates), 1, lines)
                self.assertRegex(dates[0], form)
                when = calendar.timegm(time.strptime(dates[0], "%a, %d %b %Y %H:%M:%S GMT"))
                self.assertTrue(t0 <= when <= t1, (t0, dates[0], t1))

    def test_pipelined_requests_all_answered_in_order(self):
        """Requests sent back to back on one connection pass the gate one by
        one: each is answered, in order, bodies and HEAD included."""
        srv = self.h.start_server()
        reqs = (b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
                b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n"
                b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Content-Length: 2\r\n\r\n{}"
                b"HEAD /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
                b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: application/json\r\n\r\n2;a=b\r\n{}\r\n0\r\n\r\n"
                b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        with connect(srv) as s:
            s.sendall(reqs)
            buf, got = b"", []
            for i in range(6):
                while b"\r\n\r\n" not in buf:
                    chunk = s.recv(65536)
                    self.assertTrue(chunk, "closed after %d replies: %r" % (i, got))
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                got.append(int(head.split(b" ")[1]))
                n = 0 if i == 3 else int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(buf) < n:
                    buf += s.recv(65536)
                buf = buf[n:]
            self.assertEqual(got, [200, 404, 400, 200, 400, 200])
            self.assertEqual(buf, b"")

    # ---- finding 9: ambiguous messages ----------------------------------

    def test_ambiguous_messages_are_refused(self):
        srv, key = self.server_with_key(["--max_body_bytes", "4096"])
        auth = "Authorization: Bearer %s\r\n" % key
        post = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
        cases = [
            ("two different Content-Length",
             post + auth + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400),
            ("Content-Length +5", post + auth + "Content-Length: +5\r\n\r\nhello", 400),
            ("Content-Length 5x", post + auth + "Content-Length: 5x\r\n\r\nhello", 400),
            ("Content-Length with a vertical tab",
             post + auth + "Content-Length: \x0b5\r\n\r\nhello", 400),
            ("Content-Length and Transfer-Encoding",
             post + auth + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
            ("two Authorization", post + auth + auth + "Content-Length: 2\r\n\r\n{}", 400),
            ("absolute-form target",
             "POST http://127.0.0.1/v1/completions HTTP/1.1\r\nHost: localhost\r\n" + auth
             + "Content-Length: 2\r\n\r\n{}", 400),
            ("empty segment", "GET //x/admin/keys HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
            ("dot-dot segment", "GET /v1/../admin/keys HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
            ("encoded dot-dot", "GET /v1/%2e%2E/admin/keys HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
            ("dot segment", "GET /./ HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
            ("bad chunk size",
             post + auth + "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400),
            ("chunk data without CRLF",
             post + auth + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n", 400),
            ("chunked body over max_body",
             post + auth + "Transfer-Encoding: chunked\r\n\r\n1000\r\n" + "x" * 4096
             + "\r\n1\r\nx\r\n0\r\n\r\n", 413),
            ("body over twice max_body", post + auth + "Content-Length: 9000000\r\n\r\n", 413),
            ("HEAD with a body", "HEAD /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc", 400),
            ("bare LF lines", "GET /health HTTP/1.1\nHost: x\n\n", 400),
        ]
        for name, req, want in cases:
            with self.subTest(name):
                with connect(srv) as s:
                    s.sendall(req.encode("latin-1"))
                    is_head = req.startswith("HEAD")
                    st, hdr, body = read_reply(s, head_only=is_head)
                    self.assertEqual(st, want, body)
                    self.assertIn("application/json", hdr.get("content-type", ""))
                    if is_head:  # the reply to a HEAD has no body, only its length
                        self.assertGreater(int(hdr["content-length"]), 0)
                    else:
                        self.assertIn("message", json.loads(body)["error"])
                    if want == 413 or "Content-Length" in name or "chunk" in name:
                        self.assertEqual(hdr.get("connection"), "close")
                        self.assertTrue(closed_by_peer(s, 5))

    def test_valid_chunk_extensions_are_accepted(self):
        srv, key = self.server_with_key()
        body = json.dumps({"model": "nobody-serves-this", "prompt": "hi"}).encode()
        req = ("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\n"
               "Transfer-Encoding: chunked\r\n\r\n" % key).encode()
        req += b"%x;name=value\r\n" % 5 + body[:5] + b"\r\n"
        req += b"%x ; q=\"a b\"\r\n" % (len(body) - 5) + body[5:] + b"\r\n"
        req += b"0\r\nX-Trailer: dropped\r\n\r\n"
        st, _, j = raw(srv, req)
        self.assertEqual(st, 404, j)  # the handler read the whole body
        self.assertEqual(json.loads(j)["error"]["code"], "model_not_found")

    def test_connect_gets_501_and_close(self):
        srv = self.h.start_server()
        with connect(srv) as s:
            s.sendall(b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n")
            st, hdr, body = read_reply(s)
            self.assertEqual(st, 501)
            self.assertIn("code", json.loads(body)["error"])
            self.assertTrue(closed_by_peer(s, 5), "CONNECT left the connection open")

    # ---- finding 12 (part): blank credentials are missing ones ----------

    def test_blank_credentials_are_missing(self):
        srv, key = self.server_with_key()
        for hdrs, path in (({"Authorization": ""}, "/v1/models"),
                           ({"Authorization": "   "}, "/v1/models"),
                           ({"x-api-key": ""}, "/v1/messages")):
            with self.subTest(hdrs=hdrs, path=path):
                method = "GET" if path == "/v1/models" else "POST"
                st, _, body = harness.http_json(method, srv.url + path,
                                                {} if method == "POST" else None, headers=hdrs)
                self.assertEqual(st, 401)
                msg = body["error"]["message"]
                self.assertIn("missing", msg)
                if path == "/v1/messages":
                    self.assertEqual(body["type"], "error")
        st, _, _ = harness.http_json("GET", srv.url + "/v1/models", headers=bearer("nope"))
        self.assertEqual(st, 401)

    # ---- finding 6: out of descriptors ----------------------------------

    def test_fd_exhaustion_pauses_accepting(self):
        wrapper = ("import os, resource, sys\n"
                   "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
                   "os.execv(sys.argv[1], sys.argv[1:])\n")
        port_file = self.h.path("fd.port")
        argv = [sys.executable, "-c", wrapper, harness.SERVER_BIN, "--listen", "127.0.0.1:0",
                "--port-file", port_file, "--db", self.h.path("fd.db")]
        p = harness.Proc("fdserver", argv, self.h.path("fdserver.log"), env=self.h.env())
        self.h.procs.append(p)
        port = harness.read_port_file(port_file, p.p)
        url = "http://127.0.0.1:%d" % port
        wait_until(lambda: http_request("GET", url + "/health", timeout=2)[0] == 200,
                   timeout=harness.START_TIMEOUT, what="server up")
        socks = []
        try:
            for _ in range(150):
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2)
                except OSError:
                    break  # backlog full: refused
                socks.append(s)
            wait_until(lambda: p.log_events("accept_failed"), timeout=10,
                       what="the server noticing it is out of descriptors")

            def cpu_s():
                with open("/proc/%d/stat" % p.pid) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            c0 = cpu_s()
            time.sleep(3)  # a measuring window, not an ordering
            used = cpu_s() - c0
            self.assertLess(used, 1.0, "server burnt %.2f s of CPU in 3 s while out of fds" % used)
            lines = len(p.log_text().splitlines())
            self.assertLess(lines, 50, "log grew to %d lines" % lines)
        finally:
            for s in socks:
                s.close()
        wait_until(lambda: http_request("GET", url + "/health", timeout=2)[0] == 200,
                   timeout=20, what="/health answering after the connections closed")
        self.assertTrue(any(e.get("event") == "fd_limit" and e.get("soft") == 64
                            for e in p.log_events()), "fd_limit not logged")


class PreAuthBudget(harness.TestCase):
    """Issue 25, finding 1: peers without a key could fill the pool-wide
    budget of body bytes in flight with declared lengths and one byte each,
    and every POST of agents and clients got 503 for body_timeout_sec."""
    NEEDS = (harness.SERVER_BIN,)

    def test_declared_lengths_reserve_nothing(self):
        db = self.h.path("budget.db")
        key = self.h.create_key(db, "client")
        srv = self.h.start_server([], db=db, key=key)
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        # 16 x 4 MiB declared (the whole 64 MiB), one byte sent each, by a
        # client with a key: only the bytes that arrived count.
        for _ in range(16):
            s = connect(srv)
            socks.append(s)
            s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\n"
                       "Content-Type: application/json\r\nContent-Length: 4194304\r\n\r\n{"
                       % key).encode())
        wait_until(lambda: metric(srv, "http_body_bytes_inflight") >= 16, timeout=10,
                   what="the 16 bytes counted")
        self.assertEqual(metric(srv, "http_body_bytes_inflight"), 16)
        st, _, j = http_json("POST", srv.url + "/v1/completions",
                             {"model": "nobody-serves-this", "prompt": "hi"},
                             headers=bearer(key), timeout=10)
        self.assertEqual(st, 404, j)  # reached the handler: model_not_found

    def test_get_and_enroll_bodies_are_bounded_at_the_head(self):
        srv = self.h.start_server([], db=self.h.path("b.db"),
                                  key=self.h.create_key(self.h.path("b.db"), "client"))
        for path in ("/health", "/metrics", "/dashboard"):
            with self.subTest(path=path):
                with connect(srv, timeout=5) as s:
                    s.sendall(("GET %s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4194304\r\n\r\n{"
                               % path).encode())
                    st, hdr, body = read_reply(s)
                    self.assertEqual(st, 400)
                    self.assertIn("GET request has no body", json.loads(body)["error"]["message"])
                    self.assertTrue(closed_by_peer(s, 5))
        with connect(srv, timeout=5) as s:
            s.sendall(b"POST /agents/enroll HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 4194304\r\n\r\n{")
            st, _, body = read_reply(s)
            self.assertEqual(st, 413)
            self.assertIn("65536", json.loads(body)["error"]["message"])

    def test_peers_without_a_key_get_a_quarter_at_most(self):
        db = self.h.path("share.db")
        key = self.h.create_key(db, "client")
        srv = self.h.start_server(["--max_inflight_body_bytes", "400000"], db=db, key=key)
        head = (b"POST /agents/enroll HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Content-Length: 65000\r\n\r\n")
        first = connect(srv)
        self.addCleanup(first.close)
        first.sendall(head + b" " * 60000)
        wait_until(lambda: metric(srv, "http_body_bytes_inflight") == 60000, timeout=10,
                   what="the first enrollment body counted")
        # A quarter (100000) is all that requests without a key may hold.
        for _ in range(3):
            with connect(srv) as s:
                s.sendall(head + b" " * 60000)
                st, hdr, body = read_reply(s)
                self.assertEqual(st, 503, body)
                self.assertEqual(hdr.get("retry-after"), "1")
        # The rest stays for clients and agents.
        st, _, j = http_json("POST", srv.url + "/v1/completions",
                             {"model": "nobody-serves-this", "prompt": "x" * 250000},
                             headers=bearer(key), timeout=10)
        self.assertEqual(st, 404, j)


    def test_one_peer_holds_a_few_bodies_at_most(self):
        srv = self.h.start_server(["--max_unauth_body_bytes", "10000"])
        head = (b"POST /agents/enroll HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n")
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        # Four bodies of 9000 bytes from 127.0.0.1: 36000 of the 40000 a peer may hold.
        for i in range(4):
            s = connect(srv)
            socks.append(s)
            s.sendall(head + b" " * 9000)
            wait_until(lambda: metric(srv, "http_body_bytes_inflight") == 9000 * (i + 1),
                       timeout=10, what="body %d counted" % i)
        with connect(srv) as s:
            s.sendall(head + b" " * 9000)
            st, hdr, body = read_reply(s)
            self.assertEqual(st, 503, body)
        # A peer with a key is not held back by them.
        st, _, j = http_json("POST", srv.url + "/v1/completions",
                             {"model": "nobody-serves-this", "prompt": "x" * 50000}, timeout=10)
        self.assertEqual(st, 404, j)


class HomeMode(harness.TestCase):
    """Issue 25, finding 2: with auth off (loopback, no key) any web page the
    user visits could create an admin key (cross-site POST, DNS rebinding)."""
    NEEDS = (harness.SERVER_BIN,)

    def req(self, srv, method, path, host=None, origin=None, ctype="application/json",
            body=b'{"role":"admin"}'):
        hdr = "%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, path, host or "127.0.0.1:%d" % srv.port)
        if origin:
            hdr += "Origin: %s\r\n" % origin
        if ctype:
            hdr += "Content-Type: %s\r\n" % ctype
        if body:
            hdr += "Content-Length: %d\r\n" % len(body)
        with connect(srv, timeout=5) as s:
            s.sendall(hdr.encode() + "\r\n".encode() + (body or b""))
            st, _, b = read_reply(s)
            return st, json.loads(b) if b else None

    def test_foreign_pages_cannot_use_the_api(self):
        srv = self.h.start_server([])
        cases = [
            ({"host": "attacker.example", "origin": "http://attacker.example",
              "ctype": "text/plain"}, 403, "HOST_NOT_ALLOWED"),
            ({"host": "attacker.example:%d" % srv.port}, 403, "HOST_NOT_ALLOWED"),
            ({"host": "127.0.0.1.attacker.example"}, 403, "HOST_NOT_ALLOWED"),
            ({"origin": "http://attacker.example"}, 403, "ORIGIN_NOT_ALLOWED"),
            ({"origin": "null"}, 403, "ORIGIN_NOT_ALLOWED"),
            ({"origin": "http://127.0.0.1:1"}, 403, "ORIGIN_NOT_ALLOWED"),
            ({"ctype": "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE"),
            ({"ctype": None}, 415, "UNSUPPORTED_MEDIA_TYPE"),
        ]
        for kw, want, code in cases:
            with self.subTest(**{k: str(v) for k, v in kw.items()}):
                st, j = self.req(srv, "POST", "/admin/keys", **kw)
                self.assertEqual(st, want, j)
                self.assertEqual(j["error"]["code"], code)
        # A rebound name cannot read either.
        st, j = self.req(srv, "GET", "/admin/keys", host="attacker.example", body=None)
        self.assertEqual(st, 403, j)
        # No key was made: auth is still off, the list is empty.
        st, _, j = http_json("GET", srv.url + "/admin/keys")
        self.assertEqual(st, 200, j)
        self.assertEqual(j["keys"], [])
        # The server's own pages (dashboard: same origin, JSON) still work,
        # under each loopback name.
        st, _, _ = http_request("GET", "http://localhost:%d/dashboard" % srv.port)
        self.assertEqual(st, 200)
        st, j = self.req(srv, "POST", "/admin/keys", host="localhost:%d" % srv.port,
                         origin="http://localhost:%d" % srv.port,
                         ctype="application/json; charset=utf-8",
                         body=b'{"role":"client","name":"from the dashboard"}')
        self.assertEqual(st, 201, j)


if __name__ == "__main__":
    harness.main()
