"""HTTPS listener and agent certificate verification.

A throwaway CA and certificates are made with the `openssl` command in a temp
dir (once per run): CA "good" signs the server certificate (SAN DNS:localhost,
IP:127.0.0.1) and an "other host" certificate (SAN DNS:other.example only);
CA "rogue" is unrelated. Everything runs on 127.0.0.1.

Covered: both listeners serving the same routes; an agent over HTTPS with
--ca-file serving a chat completion end to end to an HTTPS client; a wrong
CA and a wrong host name refused by the agent (tls_error in its log, never
registered); --insecure refused without its confirmation, warned about with
it; a TLS 1.1 client refused (with a control showing the client can speak
TLS 1.1); bad/mismatched certificate and key stop start-up naming the key;
HTTPS-only servers (--listen none) write their port to --port-file; a
non-loopback listener turns auth on; the peer-close watch of a parked
long-poll notices a TLS client that leaves (close_notify alert or bare FIN).
"""

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

_PKI = {}


def _openssl(*args, cwd):
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError("openssl %s failed: %s" % (" ".join(args), r.stderr))


def _make_ca(d, name):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", name + ".key", "-out", name + ".crt", "-days", "2",
             "-subj", "/CN=gpupool test %s CA" % name,
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _make_leaf(d, name, ca, san):
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=%s\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n" % san)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
    _openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
             "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", ext, cwd=d)


def pki():
    """Paths of the test PKI, made on first use (temp dir removed at exit)."""
    if not _PKI:
        if not shutil.which("openssl"):
            raise unittest.SkipTest("openssl command not found")
        d = tempfile.mkdtemp(prefix="gpupool-tls-")
        import atexit
        atexit.register(shutil.rmtree, d, True)
        _make_ca(d, "good")
        _make_ca(d, "rogue")
        _make_leaf(d, "server", "good", "DNS:localhost,IP:127.0.0.1")
        _make_leaf(d, "otherhost", "good", "DNS:other.example")
        for n in ("good", "rogue", "server", "otherhost"):
            _PKI[n + "_crt"] = os.path.join(d, n + ".crt")
            _PKI[n + "_key"] = os.path.join(d, n + ".key")
        _PKI["dir"] = d
    return _PKI


class _Target:
    """What harness.Agent needs of a server: its url."""

    def __init__(self, url):
        self.url = url


def https_request(port, method, path, body=None, headers=None, cafile=None, host="127.0.0.1",
                  timeout=30, ctx=None):
    if ctx is None:
        ctx = ssl.create_default_context(cafile=cafile or pki()["good_crt"])
    c = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
        r = c.getresponse()
        data = r.read()
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = data
        return r.status, {k.lower(): v for k, v in r.getheaders()}, parsed
    finally:
        c.close()


def metric(srv, name):
    st, _, raw = harness.http_request("GET", srv.url + "/metrics", timeout=5)
    for line in raw.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


class TLS(harness.TestCase):

    def tls_server(self, cert="server", extra=(), files=None):
        p = pki()
        crt, key = files or (p[cert + "_crt"], p[cert + "_key"])
        port_file = self.h.path("tls%s.port" % uuid.uuid4().hex[:6])
        srv = self.h.start_server(["--listen_tls", "127.0.0.1:0", "--tls_cert", crt,
                                   "--tls_key", key,
                                   "--tls-port-file", port_file] + list(extra))
        srv.tls_port = harness.read_port_file(port_file, srv.p)
        return srv

    def run_agent_cli(self, args, timeout=30):
        return subprocess.run([harness.AGENT_BIN] + args, capture_output=True, text=True,
                              timeout=timeout, env=self.h.env())

    def assert_refused(self, ag, srv):
        """The agent logs a TLS error and never registers."""
        harness.wait_until(lambda: ag.log_events("tls_error"), timeout=20,
                           what="tls_error in the agent log")
        self.assertTrue(ag.alive())
        self.assertEqual(ag.log_events("registered"), [])
        st, _, body = harness.http_json("GET", srv.url + "/v1/models", timeout=5)
        self.assertEqual((st, body.get("data")), (200, []))
        return ag.log_events("tls_error")[0]["msg"]

    # ------------------------------------------------------------------
    def test_agent_over_https_serves_end_to_end(self):
        p = pki()
        up = self.h.start_upstream(["--tokens", "3"])
        srv = self.tls_server()
        ag = self.h.start_agent(_Target("https://127.0.0.1:%d" % srv.tls_port), upstream=up,
                                model="m1", args=["--ca-file", p["good_crt"]])
        harness.wait_until(lambda: ag.log_events("registered"), timeout=20,
                           what="agent registered over HTTPS")
        # The same routes on both listeners.
        srv.wait_model("m1")
        st, _, models = https_request(srv.tls_port, "GET", "/v1/models")
        self.assertEqual(st, 200, models)
        self.assertEqual([m["id"] for m in models["data"]], ["m1"])
        st, hdr, body = https_request(srv.tls_port, "POST", "/v1/chat/completions", CHAT)
        self.assertEqual(st, 200, body)
        self.assertTrue(body["choices"][0]["message"]["content"])
        self.assertIn("x-correlation-id", hdr)
        # Streaming (chunked SSE) over TLS, to the last event.
        ctx = ssl.create_default_context(cafile=p["good_crt"])
        c = http.client.HTTPSConnection("127.0.0.1", srv.tls_port, timeout=30, context=ctx)
        c.request("POST", "/v1/chat/completions", body=json.dumps(dict(CHAT, stream=True)),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertIn("text/event-stream", r.getheader("Content-Type"))
        events = harness.parse_sse(r.read().decode())
        c.close()
        datas = [e.get("data") for e in events]
        self.assertEqual(datas[-1], "[DONE]", datas)
        text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or ""
                       for d in datas[:-1] if json.loads(d).get("choices"))
        self.assertEqual(text, body["choices"][0]["message"]["content"])
        # Host-name verification on the client side: "localhost" is in the SAN too.
        st, _, _ = https_request(srv.tls_port, "GET", "/health", host="localhost")
        self.assertEqual(st, 200)
        # Plain HTTP still works next to it.
        st, _, body = harness.http_json("POST", srv.url + "/v1/chat/completions", CHAT)
        self.assertEqual(st, 200, body)
        self.assertEqual(ag.log_events("tls_error"), [])
        ev = srv.log_events("listening_tls")
        self.assertEqual(len(ev), 1)
        self.assertEqual(ev[0]["port"], srv.tls_port)

    def test_wrong_ca_is_refused(self):
        p = pki()
        up = self.h.start_upstream([])
        srv = self.tls_server()
        ag = self.h.start_agent(_Target("https://127.0.0.1:%d" % srv.tls_port), upstream=up,
                                args=["--ca-file", p["rogue_crt"]])
        msg = self.assert_refused(ag, srv)
        self.assertRegex(msg, r"(?i)certificate|verif")
        # The Python client agrees: the rogue CA does not verify the server.
        with self.assertRaises(ssl.SSLCertVerificationError):
            https_request(srv.tls_port, "GET", "/health", cafile=p["rogue_crt"])

    def test_wrong_host_name_is_refused(self):
        p = pki()
        up = self.h.start_upstream([])
        srv = self.tls_server(cert="otherhost")  # valid chain, SAN other.example only
        ag = self.h.start_agent(_Target("https://127.0.0.1:%d" % srv.tls_port), upstream=up,
                                args=["--ca-file", p["good_crt"]])
        msg = self.assert_refused(ag, srv)
        self.assertRegex(msg, r"(?i)name|host|subject")
        # Control: the chain itself verifies when the name check is off.
        ctx = ssl.create_default_context(cafile=p["good_crt"])
        ctx.check_hostname = False
        st, _, _ = https_request(srv.tls_port, "GET", "/health", ctx=ctx)
        self.assertEqual(st, 200)

    def test_no_ca_file_uses_system_store_and_refuses(self):
        up = self.h.start_upstream([])
        srv = self.tls_server()
        ag = self.h.start_agent(_Target("https://127.0.0.1:%d" % srv.tls_port), upstream=up)
        self.assert_refused(ag, srv)

    def test_insecure_needs_confirmation(self):
        p = pki()
        r = self.run_agent_cli(["--server", "https://127.0.0.1:1", "--state-dir",
                                self.h.path("st"), "--upstream", "http://127.0.0.1:1",
                                "--upstream-model", "m", "--insecure"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--i-understand-insecure", r.stderr)
        # With the confirmation it runs, unverified, and says so loudly.
        up = self.h.start_upstream([])
        srv = self.tls_server()
        ag = self.h.start_agent(_Target("https://127.0.0.1:%d" % srv.tls_port), upstream=up,
                                args=["--insecure", "--i-understand-insecure"])
        harness.wait_until(lambda: ag.log_events("registered"), timeout=20,
                           what="insecure agent registered")
        warn = ag.log_events("tls_insecure")
        self.assertEqual(len(warn), 1)
        self.assertEqual(warn[0]["level"], "warn")
        self.assertIn("INSECURE", warn[0]["msg"])
        del p

    def setUp(self):
        super().setUp()
        # The TLS 1.1 client below is deliberate.
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*TLSv1_1.*")

    def _tls11_ctx(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        ctx.minimum_version = ssl.TLSVersion.TLSv1_1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        return ctx

    def _control_tls11_server(self):
        """A Python TLS server that accepts TLS 1.1: proves the client can."""
        p = pki()
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        sctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        sctx.minimum_version = ssl.TLSVersion.TLSv1_1
        sctx.load_cert_chain(p["server_crt"], p["server_key"])
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        ls.settimeout(10)
        result = {}

        def serve():
            try:
                c, _ = ls.accept()
                c.settimeout(10)
                with sctx.wrap_socket(c, server_side=True) as s:
                    result["version"] = s.version()
            except Exception as e:  # noqa: BLE001
                result["error"] = repr(e)
            finally:
                ls.close()
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        return ls.getsockname()[1], t, result

    def test_tls11_client_is_refused(self):
        srv = self.tls_server()
        port, t, result = self._control_tls11_server()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                with self._tls11_ctx().wrap_socket(raw) as s:
                    self.assertEqual(s.version(), "TLSv1.1")
        except (ssl.SSLError, OSError) as e:
            t.join(10)
            self.skipTest("this OpenSSL cannot speak TLS 1.1 at all (%r)" % (e,))
        t.join(10)
        with socket.create_connection(("127.0.0.1", srv.tls_port), timeout=10) as raw:
            with self.assertRaises(ssl.SSLError):
                with self._tls11_ctx().wrap_socket(raw):
                    pass
        # TLS 1.2 and 1.3 are accepted.
        for v in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            ctx = ssl.create_default_context(cafile=pki()["good_crt"])
            ctx.minimum_version = ctx.maximum_version = v
            with socket.create_connection(("127.0.0.1", srv.tls_port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                    self.assertEqual(s.version(), v.name.replace("v1_", "v1."))

    def test_slow_handshake_is_closed(self):
        """Issue 25: a ClientHello sent a byte at a time held a connection
        forever (every byte renewed the idle timeout). The handshake now
        has header_timeout_sec from the accept."""
        srv = self.tls_server(extra=["--header_timeout_sec", "2"])
        s = socket.create_connection(("127.0.0.1", srv.tls_port), timeout=10)
        self.addCleanup(s.close)
        # A handshake record header announcing 512 bytes, then a dribble.
        s.sendall(b"\x16\x03\x01\x02\x00\x01")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 15 and not closed:
            try:
                s.sendall(b"\x00")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            s.settimeout(0.5)
            try:
                closed = s.recv(4096) == b""
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
        self.assertTrue(closed, "a dribbled handshake kept the connection open for 15 s")
        # A connection whose handshake ended is not closed by that deadline.
        ctx = ssl.create_default_context(cafile=pki()["good_crt"])
        with socket.create_connection(("127.0.0.1", srv.tls_port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as t:
                time.sleep(3)  # past the handshake deadline: a window, not an ordering
                t.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                self.assertTrue(t.recv(4096).startswith(b"HTTP/1.1 200"))

    def test_sighup_reloads_certificate(self):
        p = pki()
        crt, key = self.h.path("live.crt"), self.h.path("live.key")
        shutil.copy(p["otherhost_crt"], crt)
        shutil.copy(p["otherhost_key"], key)
        srv = self.tls_server(files=(crt, key))
        with self.assertRaises(ssl.SSLCertVerificationError):  # SAN other.example only
            https_request(srv.tls_port, "GET", "/health")
        shutil.copy(p["server_crt"], crt)
        shutil.copy(p["server_key"], key)
        srv.signal(signal.SIGHUP)
        harness.wait_until(lambda: srv.log_events("tls_reloaded"), timeout=10,
                           what="tls_reloaded")
        st, _, _ = https_request(srv.tls_port, "GET", "/health")
        self.assertEqual(st, 200)
        # A broken reload keeps serving the previous certificate.
        with open(key, "w") as f:
            f.write("not a key\n")
        srv.signal(signal.SIGHUP)
        ev = harness.wait_until(lambda: srv.log_events("tls_reload_failed"), timeout=10,
                                what="tls_reload_failed")
        self.assertIn("tls_key", ev[0]["msg"])
        st, _, _ = https_request(srv.tls_port, "GET", "/health")
        self.assertEqual(st, 200)
        self.assertTrue(srv.alive())

    def test_silent_or_partial_handshake_is_closed_by_idle_timeout(self):
        srv = self.tls_server(extra=["--idle_timeout_sec", "1"])
        for first in (b"", b"\x16\x03\x01\x00\x10"):  # nothing / half a ClientHello record
            with socket.create_connection(("127.0.0.1", srv.tls_port), timeout=15) as c:
                if first:
                    c.sendall(first)
                self.assertEqual(c.recv(100), b"")  # closed by the server, no reply
        st, _, _ = https_request(srv.tls_port, "GET", "/health")
        self.assertEqual(st, 200)

    def test_bad_cert_or_key_stops_startup(self):
        p = pki()
        cases = [
            (p["server_crt"], p["otherhost_key"], "tls_key"),       # mismatched pair
            (p["server_crt"], self.h.path("missing.key"), "tls_key"),
            (self.h.path("missing.crt"), p["server_key"], "tls_cert"),
            (p["server_key"], p["server_key"], "tls_cert"),          # a key is no certificate
        ]
        for crt, key, word in cases:
            r = subprocess.run([harness.SERVER_BIN, "--listen", "127.0.0.1:0", "--listen_tls",
                                "127.0.0.1:0", "--tls_cert", crt, "--tls_key", key, "--db",
                                self.h.path("bad.db")], capture_output=True, text=True,
                               timeout=30, env=self.h.env())
            self.assertEqual(r.returncode, 2, (crt, key, r.stderr))
            self.assertIn(word, r.stderr.splitlines()[0], r.stderr)
        r = subprocess.run([harness.SERVER_BIN, "--listen", "none", "--db", self.h.path("x.db")],
                           capture_output=True, text=True, timeout=30, env=self.h.env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("listen", r.stderr)
        r = subprocess.run([harness.SERVER_BIN, "--listen_tls", "127.0.0.1:0", "--db",
                            self.h.path("y.db")], capture_output=True, text=True, timeout=30,
                           env=self.h.env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("tls_cert", r.stderr)

    def test_https_only_server_writes_port_file(self):
        p = pki()
        pf = self.h.path("only.port")
        proc = harness.Proc("tlsonly", [harness.SERVER_BIN, "--listen", "none", "--listen_tls",
                                        "127.0.0.1:0", "--tls_cert", p["server_crt"],
                                        "--tls_key", p["server_key"], "--port-file", pf,
                                        "--db", self.h.path("only.db")],
                            self.h.path("tlsonly.log"), env=self.h.env())
        self.h.procs.append(proc)
        port = harness.read_port_file(pf, proc.p)
        st, _, body = https_request(port, "GET", "/health")
        self.assertEqual((st, body["status"]), (200, "ok"))
        self.assertEqual(proc.log_events("listening"), [])
        # That port speaks only TLS: plain HTTP gets no HTTP reply.
        try:
            st, _, _ = harness.http_request("GET", "http://127.0.0.1:%d/health" % port, timeout=5)
        except Exception:  # noqa: BLE001 - a reset or a garbage reply is the point
            st = None
        self.assertNotEqual(st, 200)

    def test_public_listener_turns_auth_on(self):
        # Only the HTTPS listener is public (0.0.0.0, ephemeral port, killed at
        # the end); the test talks to the loopback HTTP one, which must now
        # want a key too, with no key in the database.
        p = pki()
        pf = self.h.path("pub.port")
        srv = self.h.start_server(["--listen_tls", "0.0.0.0:0", "--tls_cert", p["server_crt"],
                                   "--tls_key", p["server_key"], "--tls-port-file", pf])
        st, _, body = harness.http_json("GET", srv.url + "/v1/models", timeout=5)
        self.assertEqual(st, 401, body)
        tls_port = harness.read_port_file(pf, srv.p)
        st, _, body = https_request(tls_port, "GET", "/v1/models")
        self.assertEqual(st, 401, body)
        # Same server with both listeners on loopback and no key: auth off.
        srv2 = self.tls_server()
        st, _, body = https_request(srv2.tls_port, "GET", "/v1/models")
        self.assertEqual(st, 200, body)

    def _park_over_tls(self, srv, close_notify):
        """Register a protocol-level fake agent over HTTPS, park its
        /agents/work long-poll, then leave (with or without close_notify)."""
        aid = str(uuid.uuid4())
        poll = {"agent_id": aid, "name": "tls-fake", "version": "0.0-fake", "platform": "test",
                "gpus": [], "models": [{"id": "m1", "aliases": [], "loaded": True,
                                        "context_length": 512}],
                "slots": {"total": 1, "busy": 0}, "queue_depth": 0,
                "kv_cache_utilization": 0.0, "labels": {}, "status": "online"}
        st, _, body = https_request(srv.tls_port, "POST", "/agents/poll", poll)
        self.assertEqual(st, 200, body)
        ctx = ssl.create_default_context(cafile=pki()["good_crt"])
        raw = socket.create_connection(("127.0.0.1", srv.tls_port), timeout=10)
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        req = json.dumps({"agent_id": aid, "free_slots": 1}).encode()
        s.sendall(b"POST /agents/work HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(req), req))
        harness.wait_until(lambda: metric(srv, "gpupool_agents_parked") == 1, timeout=10,
                           what="agent parked")
        if close_notify:
            s.settimeout(0.5)
            try:
                s.unwrap()  # sends close_notify, then waits for the server's (never comes)
            except (OSError, ssl.SSLError, ValueError):
                pass
            # The socket stays open: only the alert went out, no FIN yet.
            harness.wait_until(lambda: metric(srv, "gpupool_agents_parked") == 0, timeout=30,
                               what="parked long-poll dropped after close_notify")
            s.close()
        else:
            s.close()
            harness.wait_until(lambda: metric(srv, "gpupool_agents_parked") == 0, timeout=30,
                               what="parked long-poll dropped after FIN")

    def test_peer_close_watch_sees_tls_clients_leave(self):
        srv = self.tls_server(extra=["--work_wait_sec", "60"])
        self._park_over_tls(srv, close_notify=True)
        self._park_over_tls(srv, close_notify=False)


if __name__ == "__main__":
    unittest.main()
