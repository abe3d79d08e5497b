#!/usr/bin/env python3
"""gpupool-agent --model URL: download into the cache, resume, verify, register.

A local HTTP server in this process (ModelServer, 127.0.0.1 only, no
internet) serves models/stories260K.gguf with Range support and can be told
to misbehave: drop the connection halfway through the first response, ignore
Range headers, serve another file, or answer 404. Every request it gets is
recorded (path and Range header), so the tests check what the agent asked
for, not how long anything took.

- a plain download: the agent registers the model only after the file is
  complete, answers a real completion, and leaves no .part file;
- a connection dropped mid-file: the agent resumes with `Range: bytes=N-`
  from where it stopped (N > 0) and the sha256 still verifies;
- a server that ignores Range: the agent restarts from zero and succeeds;
- a wrong file with --model-sha256: the agent exits non-zero with a clear
  message, keeps no file and never registers a model;
- a 404: a clear error naming the status, exit non-zero;
- hf:OWNER/REPO/FILE maps to ENDPOINT/OWNER/REPO/resolve/main/FILE (the
  endpoint pointed at the local server), and a second start with the file in
  the cache makes no request at all.
"""

import hashlib
import http.server
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")


class ModelServer:
    """Serves one file's bytes at any path ending in the file name."""

    def __init__(self, data, name):
        self.data = data
        self.name = name
        self.mode = "ok"          # ok | drop_once | no_range | wrong | missing | endless | busy
        self.redirect_to = None   # a URL every request is sent to (302)
        self.requests = []        # (path, range header or None)
        self.lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                # gpupoolctl models deploy asks a source's size (not recorded:
                # the tests count the agents' downloads).
                self.send_response(200 if self.path.endswith("/" + outer.name) else 404)
                self.send_header("Content-Length", str(len(outer.data)))
                self.end_headers()

            def do_GET(self):
                rng = self.headers.get("Range")
                with outer.lock:
                    outer.requests.append((self.path, rng))
                    mode = outer.mode
                    n_req = len(outer.requests)
                if outer.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", outer.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if mode == "endless":
                    # No length, no end: bytes until the client hangs up.
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    try:
                        while True:
                            self.wfile.write(b"x" * 65536)
                    except OSError:
                        return
                if mode == "busy":
                    self.send_response(503)
                    self.send_header("Content-Length", "4")
                    self.end_headers()
                    self.wfile.write(b"busy")
                    return
                if not self.path.endswith("/" + outer.name) or mode == "missing":
                    self.send_response(404)
                    self.send_header("Content-Length", "9")
                    self.end_headers()
                    self.wfile.write(b"not found")
                    return
                body = outer.data
                if mode == "wrong":
                    body = bytes(reversed(body))
                start = 0
                if rng and mode != "no_range":
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(body) - 1,
                                                                          len(body)))
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.send_header("Content-Type", "application/octet-stream")
                if mode == "drop_once" and n_req == 1:
                    # Promise the whole file, send 40 % of it, cut the connection.
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body[start:start + (len(body) - start) * 2 // 5])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.end_headers()
                self.wfile.write(body[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.th = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.th.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class ModelDownloadTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        with open(MODEL, "rb") as f:
            self.data = f.read()
        self.sha = hashlib.sha256(self.data).hexdigest()
        self.ms = ModelServer(self.data, "stories260K.gguf")
        self.addCleanup(self.ms.close)
        self.srv = self.h.start_server([])

    def agent(self, spec, *extra, name=None, state_dir=None):
        return self.h.start_agent(self.srv, args=["--model", spec, "--threads", "1",
                                                  "--alias", "tiny"] + list(extra),
                                  name=name, state_dir=state_dir)

    def cache_files(self, state_dir):
        out = []
        for root, _, files in os.walk(os.path.join(state_dir, "models")):
            out += [os.path.join(root, f) for f in files]
        return out

    def check_serves(self):
        self.srv.wait_model("tiny", timeout=60)
        st, _, b = http_json("POST", self.srv.url + "/v1/completions",
                             {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4},
                             timeout=60)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["usage"]["completion_tokens"], 4)

    def wait_exit(self, a, code=2):
        # 2: no retry can help (the unit's RestartPreventExitStatus=2 keeps
        # systemd from downloading the same wrong bytes again); 1: a later
        # try may (systemd restarts the agent into a resume).
        rc = a.wait(timeout=60)
        self.assertEqual(rc, code, a.log_text()[-3000:])
        return a.log_text()

    def test_download_registers_and_serves(self):
        sd = self.h.path("a.state")
        a = self.agent(self.ms.url + "/models/stories260K.gguf", "--model-sha256",
                       self.sha.upper(), state_dir=sd)
        self.check_serves()
        files = self.cache_files(sd)
        self.assertEqual(len(files), 1, files)
        self.assertTrue(files[0].endswith("/stories260K.gguf"), files)
        with open(files[0], "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), self.sha)
        self.assertEqual(len(self.ms.requests), 1)
        ev = a.log_events("model_downloaded")
        self.assertEqual(len(ev), 1, a.log_text())
        # The digest the agent reports comes from the verified download (no
        # second read of the file at load).
        msg = a.log_events("model_digest")[0]["msg"]
        self.assertEqual(msg.split("sha256 ")[1][:64], self.sha)
        self.assertIn("(cached,", msg)

    def test_dropped_connection_resumes_with_a_range(self):
        self.ms.mode = "drop_once"
        sd = self.h.path("a.state")
        self.agent(self.ms.url + "/m/stories260K.gguf", "--model-sha256", self.sha,
                   state_dir=sd)
        self.check_serves()
        self.assertEqual(len(self.ms.requests), 2, self.ms.requests)
        self.assertIsNone(self.ms.requests[0][1])
        start = int(self.ms.requests[1][1].split("=")[1].split("-")[0])
        self.assertEqual(start, len(self.data) * 2 // 5)
        self.assertEqual([os.path.basename(p) for p in self.cache_files(sd)],
                         ["stories260K.gguf"])

    def test_server_ignoring_ranges_restarts_from_zero(self):
        # A .part file left by an earlier run (half the file), then a server
        # that answers 200 with the whole file to the range request.
        sd = self.h.path("a.state")
        url = self.ms.url + "/m/stories260K.gguf"
        h16 = hashlib.sha256(url.encode()).hexdigest()[:16]
        d = os.path.join(sd, "models", h16)
        os.makedirs(d)
        with open(os.path.join(d, "stories260K.gguf.part"), "wb") as f:
            f.write(self.data[:len(self.data) // 2])
        self.ms.mode = "no_range"
        a = self.agent(url, "--model-sha256", self.sha, state_dir=sd)
        self.check_serves()
        self.assertEqual(len(self.ms.requests), 1)
        self.assertEqual(self.ms.requests[0][1], "bytes=%d-" % (len(self.data) // 2))
        self.assertTrue(a.log_events("model_download_restart"), a.log_text())

    def test_wrong_file_is_refused(self):
        self.ms.mode = "wrong"
        sd = self.h.path("a.state")
        a = self.agent(self.ms.url + "/m/stories260K.gguf", "--model-sha256", self.sha,
                       state_dir=sd)
        log = self.wait_exit(a)
        self.assertIn("sha256 mismatch", log)
        self.assertIn(self.sha, log)
        self.assertEqual(self.cache_files(sd), [])
        st, _, b = http_json("GET", self.srv.url + "/v1/models")
        self.assertEqual(st, 200, b)
        self.assertEqual(b["data"], [])
        st, _, b = http_json("GET", self.srv.url + "/admin/agents")
        self.assertEqual(b.get("agents", []), [], b)

    def test_downloads_are_bounded_in_size(self):
        """Issue 25: an endless URL wrote 2.4 GB in 8 s and the .part was
        kept. Past --model-max-bytes the download is refused and the partial
        file removed, by Content-Length or as the bytes arrive."""
        for mode, limit in (("endless", "3000000"), ("ok", "100000")):
            with self.subTest(mode=mode):
                self.ms.mode = mode
                sd = self.h.path("big-%s.state" % mode)
                a = self.agent(self.ms.url + "/m/stories260K.gguf", "--model-max-bytes", limit,
                               state_dir=sd)
                log = self.wait_exit(a)
                self.assertIn("larger than %s bytes" % limit, log)
                self.assertEqual(self.cache_files(sd), [])

    def test_no_redirect_from_https_to_http(self):
        import ssl
        from test_tls import pki
        p = pki()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(p["server_crt"], p["server_key"])
        tls = ModelServer(self.data, "stories260K.gguf")
        self.addCleanup(tls.close)
        tls.httpd.socket = ctx.wrap_socket(tls.httpd.socket, server_side=True)
        tls.redirect_to = self.ms.url + "/m/stories260K.gguf"
        sd = self.h.path("redir.state")
        a = self.agent("https://127.0.0.1:%d/m/stories260K.gguf" % tls.port, "--ca-file",
                       p["good_crt"], "--model-download-attempts", "1", state_dir=sd)
        log = self.wait_exit(a)
        self.assertIn("from https only to https", log)
        self.assertEqual(self.ms.requests, [])  # the http server never saw a request

    def test_missing_file_fails_clearly(self):
        self.ms.mode = "missing"
        a = self.agent(self.ms.url + "/m/stories260K.gguf")
        log = self.wait_exit(a)
        self.assertIn("answered HTTP 404", log)
        self.assertEqual(len(self.ms.requests), 1)  # a 404 is not retried
        self.assertEqual(self.cache_files(a.state_dir), [])  # no empty .part left

    def test_server_trouble_exits_1_for_a_restart(self):
        self.ms.mode = "busy"
        a = self.agent(self.ms.url + "/m/stories260K.gguf", "--model-download-attempts", "2")
        log = self.wait_exit(a, code=1)
        self.assertIn("answered HTTP 503", log)
        self.assertIn("2 attempts in a row without progress", log)
        self.assertEqual(len(self.ms.requests), 2)

    def test_hf_spec_and_the_cache(self):
        sd = self.h.path("a.state")
        a = self.agent("hf:someone/tiny-stories/stories260K.gguf", "--hf-endpoint",
                       self.ms.url + "/", state_dir=sd)
        self.check_serves()
        self.assertEqual(self.ms.requests,
                         [("/someone/tiny-stories/resolve/main/stories260K.gguf", None)])
        a.stop()
        # A revision, and a second start on the same state dir: the other
        # revision downloads, the cached one makes no request.
        n = len(self.ms.requests)
        b = self.agent("hf:someone/tiny-stories/stories260K.gguf", "--hf-endpoint",
                       self.ms.url, state_dir=sd)
        self.check_serves()
        self.assertEqual(len(self.ms.requests), n)
        self.assertTrue(b.log_events("model_cached"), b.log_text())
        b.stop()
        self.agent("hf:someone/tiny-stories/stories260K.gguf@v2", "--hf-endpoint",
                   self.ms.url, state_dir=sd)
        self.check_serves()
        self.assertEqual(self.ms.requests[-1],
                         ("/someone/tiny-stories/resolve/v2/stories260K.gguf", None))

    def test_refused_credentials_fail_before_the_download(self):
        # auth on, and a token the server does not know: the agent asks
        # POST /agents/check first and never starts the download.
        srv = self.h.start_server(["--auth", "on"])
        sd = self.h.path("a.state")
        a = self.h.start_agent(srv, args=["--model", self.ms.url + "/m/stories260K.gguf",
                                          "--threads", "1", "--token", "gpk_" + "0" * 64],
                               state_dir=sd)
        log = self.wait_exit(a, code=2)
        self.assertTrue(a.log_events("auth_refused"), log[-3000:])
        self.assertIn("not downloading the model", log)
        self.assertEqual(self.ms.requests, [])
        self.assertEqual(self.cache_files(sd), [])

    def test_bad_specs_fail_at_start(self):
        for spec, msg in (("hf:onlyowner", "not hf:OWNER/REPO/PATH"),
                          ("hf:o/r/../x.gguf", "not hf:OWNER/REPO/PATH"),
                          (self.ms.url + "/", "cannot take a file name")):
            a = self.agent(spec)
            self.assertIn(msg, self.wait_exit(a))
        a = self.agent(self.ms.url + "/x.gguf", "--model-sha256", "abc")
        self.assertIn("model-sha256", self.wait_exit(a))
        self.assertEqual(self.ms.requests, [])


if __name__ == "__main__":
    harness.main()
