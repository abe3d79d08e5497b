"""Liveness of busy agents (docs/protocol.md "Liveness"), with real processes:
gpupool-server and two gpupool-agents (openai backend) over
continuation-aware scripted upstreams (upstream_continue.py).

- a one-slot agent busy with a stream keeps a free_slots 0 long-poll parked;
  kill -9 closes it and the job's attempt ends within the disconnect grace:
  the stream continues on the other agent although stall_timeout_sec and
  agent_timeout_sec are 120 s (only the new mechanism can act in time);
- an agent restarted with the same state dir (a new instance) ends the old
  process's attempts as soon as it polls, even with a disconnect grace that
  never runs out;
- a long prefill (the upstream's first token comes after 2x the stall
  timeout, long-polls answered 204 meanwhile) does not fail over: the
  agent's polls list the job, which restarts the stall timer;
- an agent that stops (SIGSTOP: connections open, nothing sent) loses its
  job when its answered long-poll is not renewed within the grace, or, when
  the stall timeout is shorter than work_wait_sec, by the stall timer.

Each kill -9 test prints the time from the kill to the next token the
client reads (the failover latency), for the figures in the report.
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import upstream as upstream_mod  # noqa: E402
from test_e2e_failover import ContUpstream  # noqa: E402

N = 12
SLOW = ["--poll_interval_sec", "1", "--work_wait_sec", "5", "--agent_timeout_sec", "120",
        "--stall_timeout_sec", "120"]


def expected(prompt, n=N):
    return "".join(upstream_mod.expected_tokens(prompt, n))


class LivenessTest(harness.TestCase):

    def pool(self, server_args, a_args=("--pace-ms", "250"), b_args=("--pace-ms", "5")):
        self.srv = self.h.start_server(list(server_args))
        self.ua = self.start_cont(["--tokens", str(N)] + list(a_args))
        self.ub = self.start_cont(["--tokens", str(N)] + list(b_args))
        self.aa = self.h.start_agent(self.srv, upstream=self.ua, model="m1")
        self.ab = self.h.start_agent(self.srv, upstream=self.ub, model="m1")
        self.srv.wait_model("m1")
        self.ida, self.idb = self.aa.agent_id(), self.ab.agent_id()
        harness.wait_until(lambda: self.parked() >= 2, timeout=20, what="both agents parked")

    def start_cont(self, args):
        u = ContUpstream(self.h, self.h._name("upstream"), args)
        self.h.procs.append(u)
        return u

    def gauge(self, name):
        _, _, raw = harness.http_request("GET", self.srv.url + "/metrics", timeout=5)
        for line in raw.decode().splitlines():
            if line.startswith("gpupool_%s " % name):
                return float(line.split()[-1])
        return 0

    def parked(self):
        return self.gauge("agents_parked")

    def stream(self, prompt, max_tokens=40):
        return harness.SSEStream("POST", self.srv.url + "/v1/completions",
                                 {"model": "m1", "stream": True, "prompt": prompt,
                                  "max_tokens": max_tokens,
                                  "stream_options": {"include_usage": True},
                                  "x_pool_options": {"prefer_agent": self.ida}}, timeout=60)

    def texts(self, s, n):
        got = []
        while len(got) < n:
            e = s.next_event(timeout=20)
            self.assertIsNotNone(e)
            d = json.loads(e["data"])
            got += [c["text"] for c in d.get("choices") or [] if c.get("text")]
        return got

    def busy_on_a(self, prompt):
        """A stream served by agent A, 3 tokens read, and A's liveness
        long-poll parked again (both agents parked: B idle, A busy)."""
        s = self.stream(prompt)
        self.assertEqual(s.status, 200)
        got = self.texts(s, 3)
        self.assertEqual(s.headers.get("x-pool-agent"), self.ida)
        harness.wait_until(lambda: self.gauge("agents_liveness_parked") == 1, timeout=20,
                           what="busy agent A parked its liveness long-poll")
        self.assertEqual(self.parked(), 1)  # B only: A asks for no work
        return s, got

    def finish(self, s, got, prompt):
        """Read the rest; the whole text is one uninterrupted sequence and the
        last chunk's x_pool_meta says two attempts, the second on B."""
        events = s.events()
        s.close()
        datas = harness.sse_data_json(events)
        self.assertFalse([d for d in datas if "error" in d], datas)
        text = "".join(got) + "".join(c.get("text") or "" for d in datas
                                      for c in d.get("choices") or [])
        self.assertEqual(text, expected(prompt))
        last = [d for d in datas if any(c.get("finish_reason") for c in d.get("choices") or [])]
        self.assertEqual(last[0]["x_pool_meta"]["attempts"], 2)
        self.assertEqual(last[0]["x_pool_meta"]["agent_id"], self.idb)

    def failovers(self):
        return [(e.get("reason"), e.get("mode")) for e in self.srv.log_events("job_failover")]

    def test_kill9_busy_agent_fails_over_at_once(self):
        self.pool(SLOW)
        prompt = "the keeper of the light ::"
        s, got = self.busy_on_a(prompt)
        t0 = time.monotonic()
        self.aa.kill9()
        # Bounded well below stall_timeout_sec and agent_timeout_sec (120).
        nxt = self.texts(s, 1)
        dt = time.monotonic() - t0
        sys.stderr.write("\nfailover_latency_kill9_to_next_token_ms %.0f\n" % (dt * 1000))
        self.finish(s, got + nxt, prompt)
        self.assertEqual(self.failovers(), [("agent_disconnected", "continue")])
        self.assertEqual(len(self.srv.log_events("agent_disconnected")), 1)
        _, _, raw = harness.http_request("GET", self.srv.url + "/metrics", timeout=5)
        self.assertIn('gpupool_failovers_total{mode="continue"} 1', raw.decode())

    def test_kill9_over_tls(self):
        # Agent A talks HTTPS (the server watches the TLS session for the
        # peer's end). Long-polls come back 204 every second while A is
        # busy: answered long-polls are not watched, so they end nothing.
        from test_tls import pki, _Target
        p = pki()
        port_file = self.h.path("tls.port")
        self.srv = self.h.start_server(
            ["--poll_interval_sec", "1", "--work_wait_sec", "1", "--agent_timeout_sec", "120",
             "--stall_timeout_sec", "120", "--listen_tls", "127.0.0.1:0", "--tls_cert",
             p["server_crt"], "--tls_key", p["server_key"], "--tls-port-file", port_file])
        tls_port = harness.read_port_file(port_file, self.srv.p)
        self.ua = self.start_cont(["--tokens", str(N), "--pace-ms", "250"])
        self.ub = self.start_cont(["--tokens", str(N), "--pace-ms", "5"])
        self.aa = self.h.start_agent(_Target("https://127.0.0.1:%d" % tls_port), upstream=self.ua,
                                     model="m1", args=["--ca-file", p["good_crt"]])
        self.ab = self.h.start_agent(self.srv, upstream=self.ub, model="m1")
        self.srv.wait_model("m1")
        self.ida, self.idb = self.aa.agent_id(), self.ab.agent_id()
        harness.wait_until(lambda: self.parked() >= 2, timeout=20, what="both agents parked")
        prompt = "a secret channel ::"
        s = self.stream(prompt)
        self.assertEqual(s.status, 200)
        got = self.texts(s, 6)   # 1.5 s at 250 ms a token: over a work_wait of A's
        self.assertEqual(s.headers.get("x-pool-agent"), self.ida)
        harness.wait_until(lambda: self.gauge("agents_liveness_parked") == 1, timeout=20,
                           what="A's liveness long-poll parked over TLS")
        self.assertEqual(self.srv.log_events("agent_disconnected"), [])
        self.aa.kill9()
        self.finish(s, got, prompt)
        self.assertEqual(self.failovers(), [("agent_disconnected", "continue")])

    def test_restarted_agent_ends_old_attempts(self):
        # A grace that never runs out within the test: only the new
        # instance's first request can end the old attempt.
        self.pool(SLOW + ["--agent_disconnect_grace_ms", "600000"])
        prompt = "a second life for the agent ::"
        s, got = self.busy_on_a(prompt)
        self.aa.kill9()
        self.h.start_agent(self.srv, upstream=self.ua, model="m1", name="agent_a_again",
                           state_dir=self.aa.state_dir)
        self.finish(s, got, prompt)
        self.assertEqual(self.failovers(), [("agent_restarted", "continue")])
        ev = self.srv.log_events("agent_restarted")
        self.assertEqual([(e.get("agent_id"), e.get("jobs")) for e in ev], [(self.ida, 1)])
        self.assertEqual(self.srv.log_events("agent_disconnected"), [])

    def test_long_prefill_does_not_fail_over(self):
        # First token after 2x stall_timeout_sec; long-polls come back 204
        # every second meanwhile. The agent's polls list the job.
        self.pool(["--poll_interval_sec", "1", "--work_wait_sec", "1",
                   "--stall_timeout_sec", "3"],
                  a_args=("--first-delay-ms", "6000", "--pace-ms", "5"))
        prompt = "think before you speak ::"
        s = self.stream(prompt)
        self.assertEqual(s.status, 200)
        events = s.events()
        s.close()
        datas = harness.sse_data_json(events)
        self.assertFalse([d for d in datas if "error" in d], datas)
        text = "".join(c.get("text") or "" for d in datas for c in d.get("choices") or [])
        self.assertEqual(text, expected(prompt))
        last = [d for d in datas if any(c.get("finish_reason") for c in d.get("choices") or [])]
        self.assertEqual(last[0]["x_pool_meta"]["attempts"], 1)
        self.assertEqual(last[0]["x_pool_meta"]["agent_id"], self.ida)
        self.assertEqual(self.failovers(), [])
        # The upstream really held the first token that long (the test
        # exercised a prefill longer than the stall timeout).
        # Its handler records "ended" after its last write, which the client
        # may have read (through the pool) first: wait for that record.
        def ended():
            rec = [r for r in self.ua.log_entries() if r.get("path", "").endswith("completions")]
            return rec if len(rec) == 1 and rec[0].get("ended") is not None else None
        rec = harness.wait_until(ended, timeout=30, what="the upstream's record of the request")
        self.assertGreaterEqual(rec[0]["ended"] - rec[0]["started"], 6.0)

    def test_stopped_agent_does_not_renew_its_long_poll(self):
        # SIGSTOP keeps A's connections open, so no close is seen; but the
        # server answers A's liveness long-poll (204 at work_wait_sec 1) and
        # no new one comes within the grace: A's job moves on.
        self.pool(["--poll_interval_sec", "1", "--work_wait_sec", "1",
                   "--agent_timeout_sec", "120", "--stall_timeout_sec", "120"])
        prompt = "a long pause ::"
        s, got = self.busy_on_a(prompt)
        self.aa.signal(signal.SIGSTOP)
        try:
            self.finish(s, got, prompt)
        finally:
            self.aa.signal(signal.SIGCONT)
        self.assertEqual(self.failovers(), [("agent_disconnected", "continue")])

    def test_silent_agent_still_stalls(self):
        # SIGSTOP: the process holds its connections but says nothing (no
        # poll, no upload): the stall timer is what catches it.
        self.pool(["--poll_interval_sec", "1", "--work_wait_sec", "5",
                   "--agent_timeout_sec", "120", "--stall_timeout_sec", "2"])
        prompt = "frozen in time ::"
        s, got = self.busy_on_a(prompt)
        self.aa.signal(signal.SIGSTOP)
        try:
            self.finish(s, got, prompt)
        finally:
            self.aa.signal(signal.SIGCONT)
        self.assertEqual(self.failovers(), [("stalled", "continue")])


def gguf_agent_built():
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    r = subprocess.run([harness.AGENT_BIN, "--model", "/nonexistent/x.gguf", "--state-dir",
                        "/nonexistent/state"], capture_output=True, text=True, timeout=30, env=env)
    return "not built" not in r.stderr


GGUF_RANDOM = os.path.join(harness.BUILD_DIR, "bench", "gguf-random")


def sanitizer_build():
    try:
        with open(os.path.join(harness.BUILD_DIR, "CMakeCache.txt")) as f:
            return "GPUPOOL_SANITIZE:BOOL=ON" in f.read()
    except OSError:
        return False
STALL = 6


class GgufPrefillTest(harness.TestCase):
    """A gguf prefill longer than stall_timeout_sec, with polls 45 s apart
    (poll_interval_sec 60) so that only the backend's progress events can
    keep the job alive: it completes on its first attempt."""

    def test_long_prefill_sends_progress(self):
        if not os.access(GGUF_RANDOM, os.X_OK) or not gguf_agent_built():
            self.skipTest("gguf-random or the agent's gguf backend not built")
        if sanitizer_build():
            # One 256-token prefill step of this model takes longer than the
            # stall timeout in a sanitizer build: progress between steps
            # cannot be frequent enough there (polls would be, see
            # test_long_prefill_does_not_fail_over).
            self.skipTest("sanitizer build: one prefill step outlasts the stall timeout")
        import subprocess
        model = self.h.path("slow.gguf")
        r = subprocess.run([GGUF_RANDOM, "--shape", "custom", "--n-embd", "256", "--n-layer",
                            "4", "--n-head", "4", "--n-head-kv", "4", "--n-ff", "768",
                            "--n-vocab", "512", "--n-ctx", "4096", "--type", "q8_0", "-o", model],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        srv = self.h.start_server(["--poll_interval_sec", "60", "--work_wait_sec", "60",
                                   "--agent_timeout_sec", "120",
                                   "--stall_timeout_sec", str(STALL)])
        self.h.start_agent(srv, upstream=None, alias="slow",
                           args=["--model", model, "--threads", "1", "--ctx", "3400"])
        srv.wait_model("slow")
        # ~3000 prompt tokens (random vocabulary: mostly byte tokens): 12
        # prefill steps, each well under the stall timeout, together over it.
        prompt = " ".join("w%d" % i for i in range(450))
        st, _, t = harness.http_json("POST", srv.url + "/v2/tasks",
                                     {"model": "slow", "prompt": prompt, "max_tokens": 2,
                                      "temperature": 0}, timeout=30)
        self.assertEqual(st, 202, t)
        st, _, data = harness.http_request("GET", srv.url + "/v2/tasks/%s/events" % t["job_id"],
                                           timeout=300)
        self.assertEqual(st, 200)
        types = [e["event"] for e in harness.parse_sse(data)]
        self.assertEqual(types[-1], "end", types)
        self.assertNotIn("failover", types)
        self.assertNotIn("progress", types)  # not forwarded to clients
        st, _, status = harness.http_json("GET", srv.url + "/v2/tasks/" + t["job_id"])
        self.assertEqual(status["status"], "done", status)
        self.assertEqual(status["attempts"], 1, status)
        self.assertGreaterEqual(status["usage"]["prompt_tokens"], 2500)
        self.assertEqual(srv.log_events("job_failover"), [])
        if status["timings"].get("ttft_ms", 0) <= STALL * 1000:
            self.skipTest("prefill took %s ms here: too fast to outlast the stall timeout"
                          % status["timings"].get("ttft_ms"))


if __name__ == "__main__":
    harness.main()
