"""gpupool-server, agent side and lifecycle: round-robin spread, client
disconnect -> cancel, dropped long-poll -> no routing, failover before the
first token, heartbeat expiry, restart keeps keys and agents, auth (401),
SIGTERM drains streams and exits 0. Fake agents (server_fakes.py) speak the
protocol directly; the server is the real binary with a real SQLite file.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402
from test_server_openai import CHAT, in_thread  # noqa: E402


def metric(srv, line_prefix):
    """Value of the first /metrics sample starting with line_prefix, or None."""
    st, _, raw = harness.http_request("GET", srv.url + "/metrics", timeout=5)
    for line in raw.decode().splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.split()[-1])
    return None


class ServerAgents(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def post(self, path, body, headers=None, timeout=30):
        return harness.http_json("POST", self.srv.url + path, body, headers, timeout)

    def bg_agent(self, **kw):
        a = FakeAgent(self.srv.url, **kw)
        a.start()
        self.addCleanup(a.stop)
        return a

    # ------------------------------------------------------------------
    def test_round_robin_over_three_agents(self):
        self.srv = self.h.start_server(["--scheduler", "round_robin"])
        agents = [self.bg_agent() for _ in range(3)]
        by_id = {a.agent_id: 0 for a in agents}
        for i in range(9):
            harness.wait_until(lambda: metric(self.srv, "gpupool_agents_parked") == 3,
                               timeout=10, what="3 agents parked")
            st, hdr, body = self.post("/v1/chat/completions", CHAT)
            self.assertEqual(st, 200, body)
            self.assertEqual(body["choices"][0]["message"]["content"], "Hello world")
            by_id[hdr["x-pool-agent"]] += 1
        self.assertEqual(sorted(by_id.values()), [3, 3, 3], by_id)

    def test_label_constraint_and_prefer_agent(self):
        self.srv = self.h.start_server()
        eu = self.bg_agent(labels={"region": "eu"}, name="box-eu")
        us = self.bg_agent(labels={"region": "us"}, name="box-us")
        for _ in range(3):
            harness.wait_until(lambda: metric(self.srv, "gpupool_agents_parked") == 2,
                               timeout=10, what="2 agents parked")
            st, hdr, body = self.post("/v1/chat/completions",
                                      dict(CHAT, x_pool_options={"labels": {"region": "us"}}))
            self.assertEqual(st, 200, body)
            self.assertEqual(hdr["x-pool-agent"], us.agent_id)
        for _ in range(3):
            harness.wait_until(lambda: metric(self.srv, "gpupool_agents_parked") == 2,
                               timeout=10, what="2 agents parked")
            st, hdr, body = self.post("/v1/chat/completions",
                                      dict(CHAT, x_pool_options={"prefer_agent": eu.agent_id}))
            self.assertEqual(st, 200, body)
            self.assertEqual(hdr["x-pool-agent"], eu.agent_id)

    def test_client_disconnect_cancels_job(self):
        self.srv = self.h.start_server()
        a = FakeAgent(self.srv.url)
        a.poll()
        c = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=10)
        c.request("POST", "/v1/chat/completions", body=json.dumps(dict(CHAT, stream=True)),
                  headers={"Content-Type": "application/json"})
        st, jobs = a.work(1, timeout=10)
        jid = jobs[0]["job_id"]
        st, body = a.events(jid, [{"type": "started"}, {"type": "token", "text": "A"}])
        self.assertEqual((st, body), (200, {"cancel": False}))
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertTrue(r.fp.readline())        # first chunk arrived
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        t0 = time.monotonic()
        cancelled = False
        # Bounded poll, generous for a loaded ASan build: the server learns
        # of the close from its event loop, not at a fixed time.
        while time.monotonic() - t0 < 30.0:
            st, body = a.events(jid, [{"type": "token", "text": "more"}])
            self.assertEqual(st, 200, body)
            if body["cancel"]:
                cancelled = True
                break
            time.sleep(0.02)
        self.assertTrue(cancelled, "agent not told cancel:true within 30 s")
        # idempotent: later uploads keep getting cancel:true
        st, body = a.events(jid, [{"type": "token", "text": "x"}])
        self.assertEqual((st, body["cancel"]), (200, True))

    def test_dropped_long_poll_gets_no_jobs(self):
        self.srv = self.h.start_server()
        a = FakeAgent(self.srv.url)
        a.poll()
        a.start_work_async(1)
        harness.wait_until(lambda: metric(self.srv, "gpupool_agents_parked") == 1, timeout=10,
                           what="A parked")
        a.drop_work()
        harness.wait_until(lambda: metric(self.srv, 'gpupool_agents{state="suspect"}') == 1,
                           timeout=5, what="A suspect at once")
        b = self.bg_agent()
        for _ in range(3):
            st, hdr, body = self.post("/v1/chat/completions", CHAT)
            self.assertEqual(st, 200, body)
            self.assertEqual(hdr["x-pool-agent"], b.agent_id)

    def test_agent_lost_before_first_token_requeued(self):
        self.srv = self.h.start_server(["--poll_interval_sec", "1", "--agent_timeout_sec", "3",
                                        "--work_wait_sec", "1"])
        a = FakeAgent(self.srv.url)
        a.poll()
        get = in_thread(self.post, "/v1/chat/completions", CHAT)
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(len(jobs), 1)
        a.events(jobs[0]["job_id"], [{"type": "started"}])   # started, no token yet
        # A now goes silent (crashed); B is healthy and takes the requeued job.
        b = self.bg_agent()
        st, hdr, body = get(timeout=30)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["message"]["content"], "Hello world")
        self.assertEqual(body["x_pool_meta"]["agent_id"], b.agent_id)
        self.assertEqual(body["x_pool_meta"]["attempts"], 2)
        self.assertEqual(len(b.jobs_seen), 1)
        self.assertEqual(b.jobs_seen[0]["job_id"], jobs[0]["job_id"])
        self.assertEqual(b.jobs_seen[0]["attempt"], 2)
        # the lost agent's late upload is refused: the job is no longer its
        st, body = a.events(jobs[0]["job_id"], [{"type": "token", "text": "late"}])
        self.assertEqual(st, 409)
        self.assertEqual(body["error"]["code"], "NOT_ASSIGNED")
        self.assertGreaterEqual(metric(self.srv, 'gpupool_failovers_total{mode="requeue"}'), 1)

    def test_heartbeat_expiry(self):
        self.srv = self.h.start_server(["--poll_interval_sec", "1", "--agent_timeout_sec", "3"])
        a = FakeAgent(self.srv.url)
        st, body = a.poll()
        self.assertEqual(body["poll_interval_sec"], 1)
        self.srv.wait_model("m1")
        harness.wait_until(lambda: metric(self.srv, 'gpupool_agents{state="suspect"}') == 1,
                           timeout=10, what="suspect after a missed heartbeat")
        harness.wait_until(lambda: metric(self.srv, 'gpupool_agents{state="dead"}') == 1,
                           timeout=10, what="dead after agent_timeout")
        self.assertNotIn("m1", self.srv.models())
        # a heartbeat revives it
        st, body = a.poll()
        self.assertEqual(body["state"], "healthy")
        self.assertIn("m1", self.srv.models())

    def test_agent_replies_carry_no_client_headers(self):
        """The agents' own routes answer without X-Correlation-Id and
        X-Content-Type-Options (issue 24: the agent reads neither, and each
        header is part of every long-poll's and upload's cost); a client's
        reply, and an error on an agent route, still carry the id."""
        self.srv = self.h.start_server()
        a = FakeAgent(self.srv.url)
        a.poll()
        st, hdr, body = self.post("/agents/poll", a.poll_body())
        self.assertEqual(st, 200, body)
        self.assertNotIn("x-correlation-id", hdr)
        self.assertNotIn("x-content-type-options", hdr)
        self.assertEqual(hdr.get("content-type"), "application/json")
        st, hdr, body = self.post("/agents/events", {"agent_id": a.agent_id, "jobs": [
            {"job_id": "job_nope", "seq": 0, "events": [{"type": "started"}]}]})
        self.assertEqual(st, 200, body)
        self.assertNotIn("x-correlation-id", hdr)
        st, hdr, body = self.post("/agents/work", {"agent_id": "not-a-uuid", "free_slots": 1})
        self.assertEqual(st, 400, body)
        self.assertTrue(body["error"]["correlation_id"])
        st, hdr, _ = harness.http_request("GET", self.srv.url + "/health", timeout=5)
        self.assertEqual(st, 200)
        self.assertTrue(hdr.get("x-correlation-id"))
        self.assertEqual(hdr.get("x-content-type-options"), "nosniff")

    def test_protocol_errors(self):
        self.srv = self.h.start_server()
        a = FakeAgent(self.srv.url)
        st, body = self.post("/agents/work", {"agent_id": a.agent_id, "free_slots": 1})[::2]
        self.assertEqual(st, 409)
        self.assertEqual(body["error"]["code"], "NOT_REGISTERED")
        st, _, body = self.post("/agents/poll", {"agent_id": "not-a-uuid", "models": [],
                                                 "slots": {"total": 1}})
        self.assertEqual(st, 400)
        self.assertEqual(body["error"]["code"], "INVALID_REQUEST")
        a.poll()
        for bad in (-1, 1025, "1"):
            st, _, body = self.post("/agents/work", {"agent_id": a.agent_id, "free_slots": bad})
            self.assertEqual(st, 400)
            self.assertEqual(body["error"]["details"]["param"], "free_slots")
        for field, bad in (("instance", "short"), ("instance", "has space in it"),
                           ("running_jobs", "job_1"), ("running_jobs", [1]),
                           ("delivery_seen", 3)):
            st, _, body = self.post("/agents/work", {"agent_id": a.agent_id, "free_slots": 1,
                                                     field: bad})
            self.assertEqual(st, 400, (field, bad))
            self.assertEqual(body["error"]["details"]["param"], field)
        st, body = a.events("job_nope", [{"type": "started"}])
        self.assertEqual(st, 404)
        self.assertEqual(body["error"]["code"], "JOB_NOT_FOUND")
        # seq handling: retry is idempotent, a gap is 409 with expected_seq
        get = in_thread(self.post, "/v1/completions", {"model": "m1", "prompt": "p"})
        st, jobs = a.work(1, timeout=10)
        jid = jobs[0]["job_id"]
        evs = [{"type": "started"}, {"type": "token", "text": "a"}]
        self.assertEqual(a.events(jid, evs, seq=0)[0], 200)
        self.assertEqual(a.events(jid, evs, seq=0)[0], 200)          # duplicate: ignored
        st, body = a.events(jid, [{"type": "token", "text": "z"}], seq=5)
        self.assertEqual(st, 409)
        self.assertEqual(body["error"]["code"], "SEQ_GAP")
        self.assertEqual(body["error"]["details"]["expected_seq"], 2)
        # partly seen batch: only the new event is applied
        self.assertEqual(a.events(jid, [{"type": "token", "text": "a"},
                                        {"type": "token", "text": "b"}], seq=1)[0], 200)
        self.assertEqual(a.events(jid, [{"type": "end", "finish_reason": "stop"}], seq=3)[0], 200)
        st, hdr, body = get()
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], "ab")
        other = FakeAgent(self.srv.url)
        other.poll()
        st, body = other.events(jid, [{"type": "token", "text": "x"}], seq=4)
        self.assertEqual(st, 409)
        self.assertEqual(body["error"]["code"], "NOT_ASSIGNED")

    def keys_create(self, db, role):
        p = subprocess.run([harness.SERVER_BIN, "keys", "create", "--role", role,
                            "--db", self.h.store_uri(db),
                            "--name", "test-" + role],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        key = p.stdout.strip()
        self.assertTrue(key.startswith("gpk_"), key)
        return key

    def test_auth_and_restart_keeps_keys_and_agents(self):
        db = self.h.path("auth.db")
        ckey = self.keys_create(db, "client")
        akey = self.keys_create(db, "agent")
        self.srv = self.h.start_server(db=db, key=ckey)
        st, _, body = harness.http_json("GET", self.srv.url + "/v1/models")
        self.assertEqual(st, 401)
        self.assertEqual(body["error"]["type"], "authentication_error")
        st, _, _ = harness.http_json("GET", self.srv.url + "/v1/models",
                                     headers=harness.bearer("gpk_" + "0" * 64))
        self.assertEqual(st, 401)
        st, _, _ = harness.http_json("GET", self.srv.url + "/v1/models",
                                     headers=harness.bearer(ckey))
        self.assertEqual(st, 200)
        # agent routes want an agent key
        self.assertEqual(FakeAgent(self.srv.url).poll()[0], 401)
        self.assertEqual(FakeAgent(self.srv.url, key=ckey).poll()[0], 403)
        a = FakeAgent(self.srv.url, key=akey)
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        self.assertGreaterEqual(metric(self.srv, 'gpupool_auth_failures_total{reason="missing"}'), 1)
        # stop (SIGTERM -> exit 0), check the DB, restart on it
        self.srv.signal(signal.SIGTERM)
        self.assertEqual(self.srv.wait(15), 0)
        q = self.h.query
        ids = [r[0] for r in q(db, "SELECT id FROM agents")]
        models = [r[0] for r in q(db, "SELECT model FROM agent_models")]
        # The two made here, and the admin key the server generated at
        # start (auth on, no admin key).
        nkeys = q(db, "SELECT COUNT(*) FROM api_keys WHERE role != 'admin'")[0][0]
        nadmin = q(db, "SELECT COUNT(*) FROM api_keys WHERE role = 'admin'")[0][0]
        hashes = [r[0] for r in q(db, "SELECT hash FROM api_keys")]
        self.assertEqual(ids, [a.agent_id])
        self.assertEqual(models, ["m1"])
        self.assertEqual(nkeys, 2)
        self.assertEqual(nadmin, 1)
        self.assertNotIn(ckey, hashes)                 # only hashes at rest
        srv2 = self.h.start_server(db=db, key=ckey)
        self.srv = srv2
        st, _, _ = harness.http_json("GET", srv2.url + "/v1/models", headers=harness.bearer(ckey))
        self.assertEqual(st, 200)
        st, _, _ = harness.http_json("GET", srv2.url + "/v1/models")
        self.assertEqual(st, 401)
        # m1 is known from the DB but nobody serves it yet: 503, not 404
        st, hdr, body = harness.http_json("POST", srv2.url + "/v1/chat/completions", CHAT,
                                          headers=harness.bearer(ckey))
        self.assertEqual(st, 503, body)
        self.assertIn("retry-after", hdr)

    def test_sigterm_lets_streams_finish(self):
        self.srv = self.h.start_server(["--shutdown_grace_sec", "20"])
        a = FakeAgent(self.srv.url)
        a.poll()

        def client():
            with harness.SSEStream("POST", self.srv.url + "/v1/chat/completions",
                                   dict(CHAT, stream=True)) as s:
                return s.status, s.events()
        get = in_thread(client)
        st, jobs = a.work(1, timeout=10)
        jid = jobs[0]["job_id"]
        a.events(jid, [{"type": "started"}, {"type": "token", "text": "one"}])
        self.srv.signal(signal.SIGTERM)
        harness.wait_until(lambda: harness.http_json("GET", self.srv.url + "/health")[2]
                           .get("shutting_down"), timeout=5, what="shutdown started")
        st, hdr, body = self.post("/v1/chat/completions", CHAT)
        self.assertEqual(st, 503)
        self.assertEqual(body["error"]["code"], "shutting_down")
        self.assertTrue(self.srv.alive())               # still draining the stream
        a.events(jid, [{"type": "token", "text": " two"}])
        a.events(jid, [{"type": "end", "finish_reason": "stop"}])
        st, events = get()
        self.assertEqual(st, 200)
        self.assertEqual(events[-1]["data"], "[DONE]")
        text = "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in harness.sse_data_json(events) if c["choices"])
        self.assertEqual(text, "one two")
        self.assertEqual(self.srv.wait(15), 0)


if __name__ == "__main__":
    harness.main()
