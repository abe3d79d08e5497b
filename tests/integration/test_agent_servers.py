"""One agent, several servers (issue 28 item 3, the agent's side): real
gpupool-servers (home mode: auth off, each its own SQLite file), one
gpupool-agent started with --server URL1,URL2 and a scripted upstream.

- the agent serves through the first server; kill -9 of it: the agent moves
  to the second (a server_switch log line naming from, to and the reason),
  and requests through the second work; it stays there (sticky) after the
  first comes back; kill -9 of the second: it moves back to the first;
- a job in flight when its server dies keeps uploading to that server only
  (never to the server the agent moved to), and is dropped when the
  restarted server refuses it, as with a single server today;
- a server that answers 503 (Retry-After), fails TLS or hangs (SIGSTOP: the
  poll times out) is left the same way, with a job of its own running (its batched
  upload left behind with it);
- a bad list is refused at start-up (exit 2, the item named).

Each move is awaited on the agent's log event, never on a sleep.
"""

import http.server
import os
import signal
import socket
import sys
import threading
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json  # noqa: E402
import upstream as upstream_mod  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]


def expected(prompt, n):
    return "".join(upstream_mod.expected_tokens(prompt, n))


def servers(*srvs):
    """What harness.Agent takes as its server: an object with .url, here
    the comma list."""
    return types.SimpleNamespace(url=",".join(s.url for s in srvs))


class Busy(http.server.BaseHTTPRequestHandler):
    """A server that is there but will not work: 503 with Retry-After."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error":{"code":"OVERLOADED","message":"busy"}}'
        self.send_response(503)
        self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class AgentServersTest(harness.TestCase):
    def switches(self, agent):
        return agent.log_events("server_switch")

    def wait_switch(self, agent, frm, to, n):
        """Wait for the n-th server_switch of agent; it must go frm -> to."""
        harness.wait_until(lambda: len(self.switches(agent)) >= n, timeout=90,
                           what="server_switch %s -> %s" % (frm, to))
        sw = self.switches(agent)[n - 1]
        self.assertEqual((sw.get("from"), sw.get("to")), (frm, to), sw)
        self.assertTrue(sw.get("reason"), sw)
        return sw

    def complete(self, srv, prompt, aid):
        st, _, body = http_json("POST", srv.url + "/v1/completions",
                                {"model": "m1", "prompt": prompt, "max_tokens": 3}, timeout=60)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], expected(prompt, 3))
        self.assertEqual(body["x_pool_meta"]["agent_id"], aid)

    def test_moves_on_failure_and_back(self):
        up = self.h.start_upstream(["--tokens", "3"])
        s1 = self.h.start_server(FAST)
        s2 = self.h.start_server(FAST)
        a = self.h.start_agent(servers(s1, s2), upstream=up, model="m1", slots=2)
        aid = a.agent_id()
        s1.wait_model("m1")
        self.complete(s1, "through one", aid)
        reg = a.log_events("registered")
        self.assertEqual([e.get("server") for e in reg], [s1.url], reg)
        self.assertEqual(a.log_events("agent_start")[0].get("server"), s1.url)
        self.assertEqual(s2.models(), [])

        s1.kill9()
        sw = self.wait_switch(a, s1.url, s2.url, 1)
        s2.wait_model("m1", timeout=60)
        self.complete(s2, "through two", aid)
        self.assertEqual(a.log_events("registered")[-1].get("server"), s2.url)
        sys.stderr.write("\nmove 1: %s\n" % sw.get("reason"))

        # The first server back (same port, same database): the agent stays
        # with the one that works; it is not pulled back.
        s1b = self.h.start_server(FAST, db=s1.db, port=s1.port)
        self.assertEqual(s1b.url, s1.url)
        self.complete(s2, "still two", aid)
        self.assertEqual(len(self.switches(a)), 1)

        s2.kill9()
        self.wait_switch(a, s2.url, s1.url, 2)
        s1b.wait_model("m1", timeout=60)
        self.complete(s1b, "one again", aid)
        self.assertTrue(a.alive())

    def test_job_in_flight_stays_with_its_server(self):
        up = self.h.start_upstream(["--tokens", "400", "--pace-ms", "50"])
        s1 = self.h.start_server(FAST)
        s2 = self.h.start_server(FAST)
        a = self.h.start_agent(servers(s1, s2), upstream=up, model="m1", slots=2)
        aid = a.agent_id()
        s1.wait_model("m1")
        stream = harness.SSEStream("POST", s1.url + "/v1/chat/completions",
                                   {"model": "m1", "stream": True,
                                    "messages": [{"role": "user", "content": "long"}]},
                                   timeout=60)
        try:
            self.assertEqual(stream.status, 200)
            self.assertIsNotNone(stream.next_event(timeout=30))
        finally:
            stream.close()
        job = a.log_events("job_start")[0]["job_id"]
        s1.kill9()
        self.wait_switch(a, s1.url, s2.url, 1)
        # The job's events keep going to the server that assigned it.
        harness.wait_until(
            lambda: any(e.get("job_id") == job for e in a.log_events("upload_retry")),
            timeout=30, what="an upload retry of the orphaned job")
        # The other slot serves through the second server meanwhile.
        up.control(pace_ms=0)
        s2.wait_model("m1", timeout=60)
        self.complete(s2, "while orphaned", aid)
        # The first server back refuses the job of its previous process: the
        # agent drops it (as with one server), having sent it nowhere else.
        s1b = self.h.start_server(FAST, db=s1.db, port=s1.port)
        harness.wait_until(
            lambda: any(e.get("job_id") == job for e in a.log_events("job_dropped")),
            timeout=60, what="the orphaned job dropped")
        mine = [e for e in a.log_events() if e.get("job_id") == job and
                e.get("event") in ("upload_retry", "job_dropped")]
        self.assertTrue(mine)
        self.assertEqual({e.get("server") for e in mine}, {s1b.url}, mine)
        self.assertEqual(len(self.switches(a)), 1)
        self.assertTrue(a.alive())

    def test_503_moves_on(self):
        busy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
        threading.Thread(target=busy.serve_forever, daemon=True).start()
        self.addCleanup(busy.server_close)
        self.addCleanup(busy.shutdown)
        fake = types.SimpleNamespace(url="http://127.0.0.1:%d" % busy.server_address[1])
        up = self.h.start_upstream(["--tokens", "3"])
        s2 = self.h.start_server(FAST)
        a = self.h.start_agent(servers(fake, s2), upstream=up, model="m1")
        sw = self.wait_switch(a, fake.url, s2.url, 1)
        self.assertIn("HTTP 503", sw["reason"])
        s2.wait_model("m1", timeout=60)
        self.complete(s2, "past the busy one", a.agent_id())

    def test_tls_failure_moves_on(self):
        # https:// to a port that answers in plain HTTP at once: the
        # handshake fails (a wrong port or certificate is the same failure
        # to the agent).
        plain = socket.socket()
        plain.bind(("127.0.0.1", 0))
        plain.listen(16)
        self.addCleanup(plain.close)

        def answer():
            while True:
                try:
                    c, _ = plain.accept()
                except OSError:
                    return
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                c.close()
        threading.Thread(target=answer, daemon=True).start()
        s2 = self.h.start_server(FAST)
        up = self.h.start_upstream(["--tokens", "3"])
        bad = types.SimpleNamespace(url="https://127.0.0.1:%d" % plain.getsockname()[1])
        a = self.h.start_agent(servers(bad, s2), upstream=up, model="m1")
        sw = self.wait_switch(a, bad.url, s2.url, 1)
        self.assertIn("SSL", sw["reason"])
        self.assertTrue(a.log_events("tls_error"))
        s2.wait_model("m1", timeout=60)
        self.complete(s2, "past the TLS failure", a.agent_id())

    def test_hung_server_times_out(self):
        up = self.h.start_upstream(["--tokens", "400", "--pace-ms", "20"])
        s1 = self.h.start_server(FAST)
        s2 = self.h.start_server(FAST)
        a = self.h.start_agent(servers(s1, s2), upstream=up, model="m1", slots=2,
                               args=["--request-timeout-sec", "2"])
        aid = a.agent_id()
        s1.wait_model("m1")
        stream = harness.SSEStream("POST", s1.url + "/v1/chat/completions",
                                   {"model": "m1", "stream": True,
                                    "messages": [{"role": "user", "content": "long"}]},
                                   timeout=60)
        try:
            self.assertEqual(stream.status, 200)
            self.assertIsNotNone(stream.next_event(timeout=30))
            s1.signal(signal.SIGSTOP)
            try:
                sw = self.wait_switch(a, s1.url, s2.url, 1)
                self.assertIn("Timeout", sw["reason"])
                up.control(pace_ms=0)
                s2.wait_model("m1", timeout=60)
                self.complete(s2, "past the hung one", aid)
            finally:
                s1.signal(signal.SIGCONT)
        finally:
            stream.close()
        self.assertTrue(a.alive())

    def test_bad_lists_refused_at_start(self):
        s1 = self.h.start_server(FAST)
        up = self.h.start_upstream(["--tokens", "3"])
        for spec, needle in [(s1.url + ",", "item 2 of the list is empty"),
                             (s1.url + ",ftp://x", "'ftp://x' must be an http"),
                             (s1.url + "," + s1.url + "/", "listed twice")]:
            a = self.h.start_agent(types.SimpleNamespace(url=spec), upstream=up, model="m1")
            self.assertEqual(a.wait(timeout=30), 2, spec)
            self.assertIn(needle, a.log_text())


if __name__ == "__main__":
    harness.main()
