"""conf/haproxy.cfg in front of two gpupool-servers (issue 28 item 5's
front): Debian's haproxy runs the shipped file, with its bind and server
lines replaced by loopback ones and the system-wide lines (user, chroot,
syslog, stats socket) dropped; each server (home mode, its own SQLite file)
has its own agent on one scripted upstream.

- a streamed chat through the balancer arrives token by token: with the
  upstream stalled after two tokens, those two reach the client (a buffering
  proxy would hold them back until the end);
- health checks on /health see both servers up;
- kill -9 of one server: the next requests through the balancer all succeed
  (a connection refused is retried on the other server before the health
  check has noticed), streamed and not.

Skipped with a message where haproxy is not installed
(scripts/install-deps.sh installs it).
"""

import os
import re
import shutil
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request  # noqa: E402
import upstream as upstream_mod  # noqa: E402

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CONF = os.path.join(harness.SOURCE_DIR, "conf", "haproxy.cfg")
SYSTEM_LINES = re.compile(r"^\s*(user|group|chroot|log /dev/log|stats socket)\b")


def expected(prompt, n):
    return "".join(upstream_mod.expected_tokens(prompt, n))


def local_config(port, servers):
    """conf/haproxy.cfg for this test: bound to 127.0.0.1:port, the given
    servers, nothing that needs root or syslog. Everything else as shipped."""
    out = []
    with open(CONF) as f:
        for line in f:
            s = line.strip()
            if SYSTEM_LINES.match(line):
                continue
            if s.startswith("bind "):
                out.append("    bind 127.0.0.1:%d\n" % port)
            elif s.startswith("server "):
                if servers:
                    for i, srv in enumerate(servers):
                        out.append("    server s%d 127.0.0.1:%d check\n" % (i + 1, srv.port))
                    servers = None
            else:
                out.append(line)
    return "".join(out)


@unittest.skipUnless(os.access(HAPROXY, os.X_OK), "haproxy is not installed "
                     "(apt-get install haproxy, or scripts/install-deps.sh)")
class HAProxyTest(harness.TestCase):
    def start_haproxy(self, servers):
        port = harness.free_port()
        cfg = self.h.path("haproxy.cfg")
        with open(cfg, "w") as f:
            f.write(local_config(port, servers))
        hp = harness.Proc("haproxy", [HAPROXY, "-db", "-f", cfg],
                          self.h.path("haproxy.log"), env=self.h.env())
        self.h.procs.append(hp)
        hp.url = "http://127.0.0.1:%d" % port

        def up():
            if not hp.alive():
                raise AssertionError("haproxy exited: %s" % hp.log_text())
            st, _, _ = http_request("GET", hp.url + "/health", timeout=2)
            return st == 200
        harness.wait_until(up, timeout=20, what="haproxy answering /health")
        return hp

    def test_streams_unbuffered_and_survives_a_server_kill(self):
        up = self.h.start_upstream(["--tokens", "6"])
        s1 = self.h.start_server()
        s2 = self.h.start_server()
        for s in (s1, s2):
            self.h.start_agent(s, upstream=up, model="m1", slots=4)
            s.wait_model("m1")
        hp = self.start_haproxy([s1, s2])

        text, meta = harness.chat_stream(self, hp.url, {
            "model": "m1", "stream": True, "max_tokens": 6,
            "messages": [{"role": "user", "content": "through the balancer"}]})
        self.assertEqual(text, expected("through the balancer", 6))
        self.assertTrue(meta)

        # Unbuffered: the upstream sends two tokens and stalls; both must
        # reach the client through HAProxy while the stream is still open.
        up.control(mode="stall", after=2)
        s = harness.SSEStream("POST", hp.url + "/v1/chat/completions",
                              {"model": "m1", "stream": True, "max_tokens": 6,
                               "messages": [{"role": "user", "content": "held back?"}]},
                              timeout=60)
        try:
            self.assertEqual(s.status, 200)
            self.assertEqual(s.headers.get("content-type", "").split(";")[0],
                             "text/event-stream")
            got = ""
            want = expected("held back?", 2)
            while got != want:
                e = s.next_event(timeout=30)  # socket.timeout: held back
                self.assertIsNotNone(e, "stream ended early")
                self.assertNotEqual(e["data"], "[DONE]")
                for c in harness.sse_data_json([e])[0].get("choices") or []:
                    got += (c.get("delta") or {}).get("content") or ""
                self.assertTrue(want.startswith(got), (got, want))
        finally:
            s.close()
            up.control(mode="normal")

        s1.kill9()
        for i in range(8):
            prompt = "after the kill %d" % i
            st, _, body = http_json("POST", hp.url + "/v1/completions",
                                    {"model": "m1", "prompt": prompt, "max_tokens": 6},
                                    timeout=60)
            self.assertEqual(st, 200, body)
            self.assertEqual(body["choices"][0]["text"], expected(prompt, 6))
            text, _ = harness.chat_stream(self, hp.url, {
                "model": "m1", "stream": True, "max_tokens": 6,
                "messages": [{"role": "user", "content": prompt}]})
            self.assertEqual(text, expected(prompt, 6))
        self.assertTrue(hp.alive())
        hp.signal(signal.SIGTERM)


if __name__ == "__main__":
    harness.main()
