"""The hand-off of a job to another server through PostgreSQL
(docs/scaling.md "3e. Hand-off of a job to another server").

Real PostgreSQL (pg.py, Debian's binaries, in the test's temporary
directory), two real servers on it, a real agent on the scripted upstream
polling B only. A request to A (no agent there) is offered in the database,
claimed by B, run on B's agent and relayed back to A's client: OpenAI and
Anthropic, streaming and not, the whole and exact text, one request-log row
per request (A's), no hand-off row left; embeddings (an alias) too. B killed -9 mid-stream: A's client
gets AGENT_LOST (it had output); B killed -9 before any output: the job is
offered again and C (started after the kill) runs it whole (attempt 2). The client leaving A: B's agent stops (the
upstream sees its client go). A stale claimer (its attempt taken in the
database mid-stream): its writes are refused, it cancels on its agent, A's
client gets AGENT_LOST. No claim before A's queue timeout (B's one slot
busy): the client gets QUEUE_TIMEOUT, the offer is cancelled. Two claimers
(B and C) and 20 offers at once: each job runs once. On the code before, A
answered 404 MODEL_NOT_FOUND.

A job waiting in A's own queue (issue 28; A and B each with an agent): it
is offered too and runs on B while A's agent is busy; 40 jobs racing A's
agent (which withdraws an offer before it runs it) and B's claims each run
once; a job asking for a label only A's agent has is never claimed by B.
On the code before, such a job waited in A's queue.

Offers only where a peer has a free agent (migration 0013, servers.free):
with B's one agent busy, a job queued at A writes no handoffs row; once
B's agent frees up it is offered and runs on B, once. A peer that serves
only a job's fallback model claims it and runs it under the fallback.
"""

import json
import os
import signal
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pg  # noqa: E402
from harness import bearer, http_json  # noqa: E402
import test_postgres_store  # noqa: E402
import upstream as upstream_mod  # noqa: E402

CLUSTER = ["--heartbeat_sec", "1", "--lease_sec", "3", "--shared_refresh_sec", "1"]
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]
ANTHROPIC = {"anthropic-version": "2023-06-01"}
# Issue 28: hand-offs are woken by LISTEN/NOTIFY; with this, only
# notifications move them along (the fallback poll runs once an hour).
SLOW_POLL = ["--handoff_poll_ms", "3600000"]


def expected(prompt, n):
    return "".join(upstream_mod.expected_tokens(prompt, n))


class HandoffPgTest(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.libpq = test_postgres_store.server_has_libpq()

    def setUp(self):
        ok, why = pg.available()
        if not ok:
            self.skipTest(why)
        if not self.libpq:
            self.skipTest("gpupool-server was built without libpq")
        super().setUp()
        self.pg = pg.Postgres(self.h.tmp)
        self.addCleanup(self.pg.stop)
        self.pg.createdb("gpupool")
        self.uri = self.pg.uri("gpupool")
        self.client = self.h.create_key(self.uri, "client", "app")
        self.agent_key = self.h.create_key(self.uri, "agent", "agentB")

    def start_server(self, extra=()):
        return self.h.start_server(FAST + CLUSTER + ["--state_dir", self.h.tmp] + list(extra),
                                   db=self.uri, key=self.client)

    def two_servers(self, upstream_args, slots=2, extra_a=(), extra_b=()):
        """A (no agent) and B (the agent); A knows that B serves m1."""
        up = self.h.start_upstream(upstream_args)
        a, b = self.start_server(extra_a), self.start_server(extra_b)
        self.h.start_agent(types.SimpleNamespace(url=b.url), upstream=up, model="m1",
                           slots=slots, token=self.agent_key)
        b.wait_model("m1")
        harness.wait_until(
            lambda: any("m1" in (e.get("models") or []) for e in a.log_events("handoff_peers")),
            timeout=60, interval=0.1, what="A learns that B serves m1")
        return up, a, b

    def sql(self, q):
        return [line.split("|") for line in self.pg.psql("gpupool", q).splitlines() if line]

    def stream(self, srv, prompt, n, path="/v1/chat/completions", headers=None):
        body = {"model": "m1", "stream": True, "max_tokens": n,
                "messages": [{"role": "user", "content": prompt}]}
        hdr = dict(bearer(self.client))
        hdr.update(headers or {})
        s = harness.SSEStream("POST", srv.url + path, body, headers=hdr, timeout=180)
        self.addCleanup(s.close)
        self.assertEqual(s.status, 200)
        return s

    @staticmethod
    def openai_text(events):
        return "".join((ch.get("delta") or {}).get("content") or ""
                       for d in harness.sse_data_json(events) for ch in d.get("choices") or [])

    def read_until_done(self, s, events):
        while True:
            ev = s.next_event(timeout=90)
            if ev is None:
                return events
            events.append(ev)
            if ev.get("data") == "[DONE]":
                return events

    def test_reply_through_the_other_server(self):
        up, a, b = self.two_servers(["--tokens", "40", "--pace-ms", "5"])
        # A lists the model its peer serves: behind a balancer every
        # server's /v1/models is the same.
        st, _, ms = http_json("GET", a.url + "/v1/models", None,
                              headers=bearer(self.client), timeout=30)
        self.assertEqual(st, 200, ms)
        self.assertEqual([m["id"] for m in ms["data"]], ["m1"], ms)
        self.assertEqual((ms["first_id"], ms["last_id"]), ("m1", "m1"))
        # OpenAI, not streaming.
        st, _, r = http_json("POST", a.url + "/v1/chat/completions",
                             {"model": "m1", "max_tokens": 12,
                              "messages": [{"role": "user", "content": "alpha beta"}]},
                             headers=bearer(self.client), timeout=120)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["message"]["content"], expected("alpha beta", 12))
        self.assertEqual(r["usage"]["completion_tokens"], 12)
        # OpenAI, streaming.
        evs = self.read_until_done(self.stream(a, "gamma delta", 30), [])
        self.assertEqual(evs[-1]["data"], "[DONE]")
        self.assertEqual(self.openai_text(evs), expected("gamma delta", 30))
        # Anthropic, not streaming.
        hdr = dict(bearer(self.client))
        hdr.update(ANTHROPIC)
        st, _, r = http_json("POST", a.url + "/v1/messages",
                             {"model": "m1", "max_tokens": 9,
                              "messages": [{"role": "user", "content": "eps zeta"}]},
                             headers=hdr, timeout=120)
        self.assertEqual(st, 200, r)
        self.assertEqual("".join(c.get("text", "") for c in r["content"]),
                         expected("eps zeta", 9))
        self.assertEqual(r["usage"]["output_tokens"], 9)
        # Anthropic, streaming.
        s = self.stream(a, "eta theta", 25, path="/v1/messages", headers=ANTHROPIC)
        evs = s.events()
        names = [e.get("event") for e in evs]
        self.assertNotIn("error", names)
        self.assertEqual(names[-1], "message_stop")
        datas = [json.loads(e["data"]) for e in evs]
        self.assertEqual("".join(d["delta"]["text"] for d in datas
                                 if d.get("type") == "content_block_delta"),
                         expected("eta theta", 25))
        # Each ran on B's agent once, was A's in the request log, and left
        # no hand-off row.
        self.assertEqual(len(b.log_events("job_handoff_running")), 4)
        self.assertEqual(len(a.log_events("job_handoff_offered")), 4)
        harness.wait_until(lambda: self.sql("SELECT count(*) FROM handoffs") == [["0"]],
                           timeout=30, what="the hand-off rows deleted")
        rows = self.sql("SELECT status, owner_server FROM jobs ORDER BY created_at")
        self.assertEqual(len(rows), 4, rows)
        a_id = a.log_events("server_announced")[0]["server_id"]
        self.assertEqual({tuple(r) for r in rows}, {("done", a_id)})
        gens = [r for r in up.log_entries() if r["path"].endswith("/chat/completions")]
        self.assertEqual([r["outcome"] for r in gens], ["complete"] * 4)

    def test_embeddings_through_the_other_server(self):
        up = self.h.start_upstream(["--embeddings-dim", "8"])
        a, b = self.start_server(), self.start_server()
        self.h.start_agent(types.SimpleNamespace(url=b.url), upstream=up, model="up-emb",
                           alias="emb", slots=2, token=self.agent_key)
        b.wait_model("emb")
        harness.wait_until(
            lambda: any("emb" in (e.get("models") or []) for e in a.log_events("handoff_peers")),
            timeout=60, interval=0.1, what="A learns that B serves emb")
        texts = ["The cat sat", "Once upon a time"]
        st, _, out = http_json("POST", a.url + "/v1/embeddings", {"model": "emb", "input": texts},
                               headers=bearer(self.client), timeout=120)
        self.assertEqual(st, 200, out)
        for d, t in zip(out["data"], texts):
            want = upstream_mod.embedding_vector(t, 8)
            self.assertEqual(len(d["embedding"]), len(want))
            for x, y in zip(d["embedding"], want):
                self.assertAlmostEqual(x, y, places=5)

    def test_claimer_killed_mid_stream(self):
        up, a, b = self.two_servers(["--tokens", "400", "--pace-ms", "50"])
        s = self.stream(a, "kappa lambda", 400)
        events = [s.next_event(timeout=60) for _ in range(3)]
        self.assertTrue(all(events))
        b.kill9()
        self.read_until_done(s, events)
        body = json.dumps([e.get("data") for e in events])
        self.assertIn("agent_lost", body.lower())
        self.assertNotEqual(events[-1].get("data"), "[DONE]")
        harness.wait_until(lambda: self.sql("SELECT status, error_code FROM jobs")
                           == [["failed", "AGENT_LOST"]], timeout=30, what="A's row failed")
        self.assertTrue(a.log_events("handoff_server_lost"))

    def test_claimer_killed_before_output_reoffered(self):
        # B's upstream holds the first token; B is killed -9 with the job
        # claimed. Once B's lease has ended the sweep gives the row back,
        # A offers the job again (its client saw nothing) and C, started
        # with an agent of its own after the kill, claims it (attempt 2):
        # the client gets the whole reply. A and C poll once an hour (issue
        # 28): the sweep's notification tells A that B is gone and C that
        # the row waits again.
        key_c = self.h.create_key(self.uri, "agent", "agentC")
        up, a, b = self.two_servers(["--tokens", "40", "--first-delay-ms", "600000"],
                                    extra_a=SLOW_POLL)
        get = harness.in_thread(http_json, "POST", a.url + "/v1/chat/completions",
                                {"model": "m1", "max_tokens": 10,
                                 "messages": [{"role": "user", "content": "tau upsilon"}]},
                                headers=bearer(self.client), timeout=170)
        harness.wait_until(lambda: b.log_events("job_handoff_running"), timeout=60,
                           interval=0.1, what="B claimed the job")
        harness.wait_until(lambda: up.log_entries(), timeout=60, interval=0.1,
                           what="B's agent asked its upstream")
        b.kill9()
        up2 = self.h.start_upstream(["--tokens", "40"])
        c = self.start_server(SLOW_POLL)
        self.h.start_agent(types.SimpleNamespace(url=c.url), upstream=up2, model="m1",
                           slots=2, token=key_c)
        st, _, r = get(timeout=180)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["message"]["content"], expected("tau upsilon", 10))
        self.assertEqual(len(c.log_events("job_handoff_running")), 1)
        self.assertTrue(any(e.get("mode") == "handoff" for e in a.log_events("job_failover")))
        self.assertEqual(self.sql("SELECT status, attempts FROM jobs"), [["done", "2"]])

    def test_client_leaving_cancels_on_the_claimer(self):
        up, a, b = self.two_servers(["--tokens", "400", "--pace-ms", "50"])
        s = self.stream(a, "mu nu", 400)
        for _ in range(3):
            self.assertIsNotNone(s.next_event(timeout=60))
        s.close()
        harness.wait_until(
            lambda: [r["outcome"] for r in up.log_entries()] == ["client_gone"],
            timeout=60, interval=0.1, what="B's agent stopped the upstream request")
        # B stopped it: its ownership check or its next (refused) batch.
        self.assertTrue(b.log_events("handoff_lost"))
        harness.wait_until(lambda: self.sql("SELECT state FROM handoffs") == [["cancelled"]],
                           timeout=30, what="the hand-off row cancelled")

    def test_stale_claimer_is_refused(self):
        up, a, b = self.two_servers(["--tokens", "400", "--pace-ms", "50"])
        s = self.stream(a, "xi omicron", 400)
        events = [s.next_event(timeout=60) for _ in range(3)]
        self.assertTrue(all(events))
        # Another server took the row (as after B's lease lapsed): B's next
        # batch is refused, B cancels on its agent; A follows the new
        # attempt, and its client, which had output, gets AGENT_LOST.
        self.pg.psql("gpupool", "UPDATE handoffs SET attempt = attempt + 1, "
                     "claimed_by = 'srv_other'")
        self.read_until_done(s, events)
        self.assertIn("agent_lost", json.dumps([e.get("data") for e in events]).lower())
        harness.wait_until(
            lambda: [r["outcome"] for r in up.log_entries()] == ["client_gone"],
            timeout=60, interval=0.1, what="B's agent stopped the upstream request")
        self.assertTrue(b.log_events("handoff_lost"))

    def test_no_claim_before_the_deadline(self):
        # B's one slot is busy with a long stream of its own: A's offer is
        # not claimed before A's queue timeout; A's client gets the queue
        # timeout's error as without a hand-off, and the offer is cancelled
        # (never claimed later).
        up, a, b = self.two_servers(["--tokens", "400", "--pace-ms", "50"], slots=1,
                                    extra_a=["--queue_timeout_sec", "2"])
        s = self.stream(b, "pi rho", 400)
        self.assertIsNotNone(s.next_event(timeout=60))
        st, _, r = http_json("POST", a.url + "/v1/chat/completions",
                             {"model": "m1", "max_tokens": 5,
                              "messages": [{"role": "user", "content": "sigma"}]},
                             headers=bearer(self.client), timeout=120)
        self.assertEqual(st, 503, r)
        self.assertIn("queue_timeout", json.dumps(r).lower())
        harness.wait_until(lambda: self.sql("SELECT state FROM handoffs") == [["cancelled"]],
                           timeout=30, what="the offer cancelled")
        self.assertEqual(b.log_events("job_handoff_running"), [])

    def test_issue28_woken_by_notifications(self):
        # Issue 28: the claim, the follow and the claimer's stop are woken
        # by LISTEN/NOTIFY. With the slow poll at an hour on both servers
        # only notifications can move a hand-off along (on the code before,
        # which polled every 100 ms, handoff_poll_ms did not exist and the
        # servers refused to start). After PostgreSQL restarts, the
        # listeners connect again and hand-offs go on.
        slow = SLOW_POLL + ["--queue_timeout_sec", "10"]
        up, a, b = self.two_servers(["--tokens", "400", "--pace-ms", "20"],
                                    extra_a=slow, extra_b=slow)
        evs = self.read_until_done(self.stream(a, "iota kappa", 12), [])
        self.assertEqual(evs[-1]["data"], "[DONE]")
        self.assertEqual(self.openai_text(evs), expected("iota kappa", 12))
        # The client leaving A reaches B's agent.
        s = self.stream(a, "mu nu", 400)
        for _ in range(3):
            self.assertIsNotNone(s.next_event(timeout=60))
        s.close()
        harness.wait_until(
            lambda: [r["outcome"] for r in up.log_entries()][-1:] == ["client_gone"],
            timeout=60, interval=0.1, what="B's agent stopped the upstream request")
        # PostgreSQL restarts: every session ends, the listeners' too.
        self.pg.restart()
        for srv in (a, b):
            harness.wait_until(lambda: srv.log_events("store_listen_back"), timeout=60,
                               interval=0.1, what="the listener back after the restart")

        def handed_off():
            # The first statement on a connection that PostgreSQL cut
            # fails (store_pg.c): an offer or a claim may be lost that way,
            # and the request then times out in the queue (10 s).
            st, _, r = http_json("POST", a.url + "/v1/chat/completions",
                                 {"model": "m1", "max_tokens": 6,
                                  "messages": [{"role": "user", "content": "rho sigma"}]},
                                 headers=bearer(self.client), timeout=60)
            return st == 200 and r["choices"][0]["message"]["content"] == \
                expected("rho sigma", 6)
        harness.wait_until(handed_off, timeout=120, interval=0.5,
                           what="a hand-off after PostgreSQL restarted")

    def test_issue28_one_listen_connection(self):
        # Issue 28: a server holds two PostgreSQL connections, the DB
        # thread's and one listener for both the hand-off's and the native
        # tasks' channels (the code before had a listener each: three).
        # The server's sessions are told apart by their application_name.
        app = "gp_issue28_conns"
        uri = self.uri + ("&" if "?" in self.uri else "?") + "application_name=" + app
        srv = self.h.start_server(FAST + CLUSTER + ["--state_dir", self.h.tmp], db=uri,
                                  key=self.client)

        def sessions():
            return [r[0] for r in self.sql("SELECT query FROM pg_stat_activity "
                                           "WHERE application_name = '%s'" % app)]
        channels = ("gps_handoff_offer", "gps_handoff_job", "gps_task_job", "gps_task_cancel")
        harness.wait_until(
            lambda: all(any("LISTEN %s;" % c in q for q in sessions()) for c in channels),
            timeout=60, interval=0.1, what="the server listens to its four channels")
        self.assertEqual(len(sessions()), 2, sessions())
        # A SIGHUP's key reload does not keep its connection either.
        srv.signal(signal.SIGHUP)
        harness.wait_until(lambda: srv.log_events("keys_reloaded"), timeout=30, interval=0.1,
                           what="the keys reloaded")
        self.assertEqual(len(sessions()), 2, sessions())

    def test_two_claimers_run_each_job_once(self):
        # Two servers with agents, B and C, claim 20 jobs offered by A at
        # once: each runs once (SKIP LOCKED: disjoint claims), every reply
        # is whole.
        key_c = self.h.create_key(self.uri, "agent", "agentC")
        up = self.h.start_upstream(["--tokens", "40", "--pace-ms", "20"])
        a, b, c = self.start_server(), self.start_server(), self.start_server()
        for srv, key in ((b, self.agent_key), (c, key_c)):
            self.h.start_agent(types.SimpleNamespace(url=srv.url), upstream=up, model="m1",
                               slots=4, token=key)
            srv.wait_model("m1")
        harness.wait_until(
            lambda: any("m1" in (e.get("models") or []) for e in a.log_events("handoff_peers")),
            timeout=60, interval=0.1, what="A learns that m1 is served")
        prompts = ["job%d word" % i for i in range(20)]
        gets = [harness.in_thread(http_json, "POST", a.url + "/v1/chat/completions",
                                  {"model": "m1", "max_tokens": 6,
                                   "messages": [{"role": "user", "content": p}]},
                                  headers=bearer(self.client), timeout=150)
                for p in prompts]
        for p, get in zip(prompts, gets):
            st, _, r = get(timeout=180)
            self.assertEqual(st, 200, r)
            self.assertEqual(r["choices"][0]["message"]["content"], expected(p, 6))
        gens = [r for r in up.log_entries() if r["path"].endswith("/chat/completions")]
        self.assertEqual(sorted(r["messages"][-1]["content"] for r in gens), sorted(prompts))
        nb, nc = (len(srv.log_events("job_handoff_running")) for srv in (b, c))
        sys.stderr.write("\n20 offers: %d run on B, %d on C\n" % (nb, nc))
        self.assertEqual(nb + nc, 20)

    # ---- a job waiting in the offering server's own queue (issue 28, 3e) ----

    def agents_on_both(self, up_a, up_b, extra_a=(), labels_a=None):
        """A and B, each with an agent of one slot serving m1 (A's on up_a,
        labelled labels_a; B's on up_b), each knowing the other serves it."""
        key_a = self.h.create_key(self.uri, "agent", "agentA")
        a, b = self.start_server(extra_a), self.start_server()
        self.h.start_agent(types.SimpleNamespace(url=a.url), upstream=up_a, model="m1",
                           slots=1, token=key_a,
                           args=["--labels", labels_a] if labels_a else [])
        self.h.start_agent(types.SimpleNamespace(url=b.url), upstream=up_b, model="m1",
                           slots=1, token=self.agent_key)
        for srv in (a, b):
            harness.wait_until(lambda: srv.parked() >= 1, timeout=60, interval=0.1,
                               what="the agent parked on its server")
            harness.wait_until(
                lambda: any("m1" in (e.get("models") or [])
                            for e in srv.log_events("handoff_peers")),
                timeout=60, interval=0.1, what="each server learns that the other serves m1")
        return a, b

    def chat(self, srv, prompt, n, **extra):
        body = {"model": "m1", "max_tokens": n,
                "messages": [{"role": "user", "content": prompt}]}
        body.update(extra)
        return http_json("POST", srv.url + "/v1/chat/completions", body,
                         headers=bearer(self.client), timeout=170)

    @staticmethod
    def prompts_seen(up):
        return [r["messages"][-1]["content"] for r in up.log_entries()
                if r["path"].endswith("/chat/completions")]

    def test_queued_job_runs_on_the_peer(self):
        # A's only agent is busy with a long stream; B's is free. A second
        # request sent to A waits in A's queue, is offered meanwhile, and B
        # runs it: the client gets the whole reply from B's upstream long
        # before A's agent is free. On the code before, a job was offered
        # only when no agent of A served the model: it waited in A's queue
        # until its queue timeout (503 QUEUE_TIMEOUT).
        up_a = self.h.start_upstream(["--tokens", "400", "--pace-ms", "100"])
        up_b = self.h.start_upstream(["--tokens", "40"])
        a, b = self.agents_on_both(up_a, up_b, extra_a=["--queue_timeout_sec", "15"])
        s = self.stream(a, "long one", 400)
        self.assertIsNotNone(s.next_event(timeout=60))
        st, _, r = self.chat(a, "second one", 8)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["message"]["content"], expected("second one", 8))
        self.assertEqual(self.prompts_seen(up_b), ["second one"])
        self.assertEqual(len(b.log_events("job_handoff_running")), 1)
        self.assertEqual([e.get("queued_here") for e in a.log_events("job_handoff_offered")],
                         [True])
        self.assertEqual(a.log_events("job_handoff_withdrawn"), [])
        s.close()

    def test_queued_jobs_race_run_each_once(self):
        # Both servers' one agent serve m1; 40 requests sent to A at once
        # wait in A's queue, offered. B claims one whenever its agent is
        # free while A's agent frees up every ~100 ms and withdraws the
        # next offer first: whichever comes first runs the job, the other
        # never. Each prompt reaches an upstream exactly once, every reply
        # is whole, no hand-off row is left.
        up_a = self.h.start_upstream(["--tokens", "8", "--pace-ms", "10"])
        up_b = self.h.start_upstream(["--tokens", "8", "--pace-ms", "10"])
        a, b = self.agents_on_both(up_a, up_b, extra_a=["--queue_timeout_sec", "120"])
        prompts = ["race%d word" % i for i in range(40)]
        gets = [harness.in_thread(self.chat, a, p, 6) for p in prompts]
        for p, get in zip(prompts, gets):
            st, _, r = get(timeout=180)
            self.assertEqual(st, 200, r)
            self.assertEqual(r["choices"][0]["message"]["content"], expected(p, 6))
        on_a, on_b = self.prompts_seen(up_a), self.prompts_seen(up_b)
        self.assertEqual(sorted(on_a + on_b), sorted(prompts))
        withdrawn = len(a.log_events("job_handoff_withdrawn"))
        late = len(a.log_events("job_handoff_withdraw_late"))
        sys.stderr.write("\n40 jobs sent to A: %d run on A (%d offers withdrawn first), %d "
                         "on B (%d withdraws came too late)\n"
                         % (len(on_a), withdrawn, len(on_b), late))
        self.assertGreaterEqual(len(on_b), 1)
        self.assertEqual(len(b.log_events("job_handoff_running")), len(on_b))
        harness.wait_until(lambda: self.sql("SELECT count(*) FROM handoffs") == [["0"]],
                           timeout=30, what="no hand-off row left")
        self.assertEqual(self.sql("SELECT status, count(*) FROM jobs GROUP BY status"),
                         [["done", "40"]])

    def test_queued_offer_keeps_its_labels(self):
        # A's agent is labelled gpu=a100 and busy; B's has no label. A job
        # that asks for gpu=a100 is never run by B (its agent does not meet
        # the constraint): since migration 0013 it is not even offered (B's
        # free agents, as B writes them, lack the label; before, it was
        # offered and B left it unclaimed). It runs on A's agent once that
        # is free. A job without the label, sent after it, is offered and
        # claimed by B meanwhile. On the code before the constraints (the
        # offer carried the wire object only), B ran the first.
        up_a = self.h.start_upstream(["--tokens", "400", "--pace-ms", "50"])
        up_b = self.h.start_upstream(["--tokens", "40"])
        a, b = self.agents_on_both(up_a, up_b, extra_a=["--queue_timeout_sec", "120"],
                                   labels_a="gpu=a100")
        s = self.stream(a, "long one", 400)
        self.assertIsNotNone(s.next_event(timeout=60))
        labelled = harness.in_thread(self.chat, a, "needs a100", 5,
                                     x_pool_options={"labels": {"gpu": "a100"}})
        harness.wait_until(lambda: len(a.log_events("job_handoff_held")) == 1,
                           timeout=60, interval=0.1, what="the labelled job held, not offered")
        st, _, r = self.chat(a, "any gpu", 5)
        self.assertEqual(st, 200, r)
        self.assertEqual(self.prompts_seen(up_b), ["any gpu"])
        self.assertEqual(len(a.log_events("job_handoff_offered")), 1)
        s.close()  # A's agent frees up: the labelled job runs there
        st, _, r = labelled(timeout=180)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["message"]["content"], expected("needs a100", 5))
        self.assertIn("needs a100", self.prompts_seen(up_a))
        self.assertEqual(self.prompts_seen(up_b), ["any gpu"])
        self.assertEqual(len(b.log_events("job_handoff_running")), 1)
        self.assertEqual(len(a.log_events("job_handoff_offered")), 1)
        self.assertEqual(a.log_events("job_handoff_withdrawn"), [])

    def test_issue28_queued_not_offered_while_peers_busy(self):
        # Both servers' one agent is busy. A job queued at A is not written
        # to handoffs (no peer could claim it: migration 0013's free slots
        # say so) and A logs it held. When B's agent frees up (its client
        # leaves), B publishes its free slot and notifies; A offers the
        # still-queued job and B runs it, exactly once, while A's agent is
        # still busy. On the code before, the job was offered at once (a
        # handoffs row per queued job, busy peer or not): no
        # job_handoff_held, a row in the table.
        up_a = self.h.start_upstream(["--tokens", "400", "--pace-ms", "100"])
        up_b = self.h.start_upstream(["--tokens", "400", "--pace-ms", "100"])
        a, b = self.agents_on_both(up_a, up_b, extra_a=["--queue_timeout_sec", "120",
                                                        "--log_level", "debug"])

        def peer_slots():
            evs = a.log_events("handoff_peers_free")
            return evs[-1].get("slots") if evs else None
        harness.wait_until(lambda: peer_slots() == 1, timeout=60, interval=0.1,
                           what="A reads B's free slot")
        s_a = self.stream(a, "long on a", 400)
        self.assertIsNotNone(s_a.next_event(timeout=60))
        s_b = self.stream(b, "long on b", 400)
        self.assertIsNotNone(s_b.next_event(timeout=60))
        # B's busy agent reaches A (its free slots written, notified, read).
        harness.wait_until(lambda: peer_slots() == 0, timeout=60, interval=0.1,
                           what="A reads that B has no free slot")
        get = harness.in_thread(self.chat, a, "wait for b", 6)
        harness.wait_until(lambda: a.log_events("job_handoff_held"), timeout=60,
                           interval=0.1, what="the queued job held at A")
        self.assertEqual(a.log_events("job_handoff_offered"), [])
        self.assertEqual(self.sql("SELECT count(*) FROM handoffs"), [["0"]])
        s_b.close()  # B's agent frees up: the job goes there
        st, _, r = get(timeout=180)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["message"]["content"], expected("wait for b", 6))
        on_a, on_b = self.prompts_seen(up_a), self.prompts_seen(up_b)
        self.assertEqual(on_a.count("wait for b") + on_b.count("wait for b"), 1)
        self.assertIn("wait for b", on_b)
        self.assertEqual([e.get("queued_here") for e in a.log_events("job_handoff_offered")],
                         [True])
        self.assertEqual(len(b.log_events("job_handoff_running")), 1)
        self.assertEqual(a.log_events("job_handoff_withdrawn"), [])
        s_a.close()

    def test_issue28_fallback_only_peer_runs_the_job(self):
        # A's agent serves m1 and is busy; B's serves only m2. A job for m1
        # with fallback_models [m2] waits in A's queue, is offered (B has a
        # free agent for its fallback), and B claims it and runs it under
        # m2. On the code before, A never offered it (no peer served m1)
        # and B never claimed such an offer (it matched the model only):
        # it waited in A's queue until its queue timeout (503).
        up_a = self.h.start_upstream(["--tokens", "400", "--pace-ms", "100"])
        up_b = self.h.start_upstream(["--tokens", "40"])
        key_a = self.h.create_key(self.uri, "agent", "agentA")
        a, b = self.start_server(["--queue_timeout_sec", "15"]), self.start_server()
        self.h.start_agent(types.SimpleNamespace(url=a.url), upstream=up_a, model="m1",
                           slots=1, token=key_a)
        self.h.start_agent(types.SimpleNamespace(url=b.url), upstream=up_b, model="m2",
                           slots=1, token=self.agent_key)
        for srv, model in ((a, "m2"), (b, "m1")):
            harness.wait_until(lambda: srv.parked() >= 1, timeout=60, interval=0.1,
                               what="the agent parked on its server")
            harness.wait_until(
                lambda: any(model in (e.get("models") or [])
                            for e in srv.log_events("handoff_peers")),
                timeout=60, interval=0.1, what="each server learns what the other serves")
        s = self.stream(a, "long one", 400)
        self.assertIsNotNone(s.next_event(timeout=60))
        st, _, r = self.chat(a, "falls back", 7, x_pool_options={"fallback_models": ["m2"]})
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["message"]["content"], expected("falls back", 7))
        self.assertEqual(self.prompts_seen(up_b), ["falls back"])
        self.assertNotIn("falls back", self.prompts_seen(up_a))
        self.assertEqual(len(b.log_events("job_handoff_running")), 1)
        s.close()

    def test_queued_job_back_home_after_claimer_lost(self):
        # A job queued at A (its agent busy) is claimed by B, whose upstream
        # holds the first token; B is killed -9. Once B's lease has ended
        # the job is offered again and, A's agent serving m1, queued at A
        # too: A's agent, free by then, withdraws the offer and runs it
        # (attempt 2); the client gets the whole reply. Offered only, it
        # would wait for a claim no live server makes.
        up_a = self.h.start_upstream(["--tokens", "400", "--pace-ms", "50"])
        up_b = self.h.start_upstream(["--tokens", "40", "--first-delay-ms", "600000"])
        a, b = self.agents_on_both(up_a, up_b, extra_a=["--queue_timeout_sec", "120"])
        s = self.stream(a, "long one", 400)
        self.assertIsNotNone(s.next_event(timeout=60))
        get = harness.in_thread(self.chat, a, "come home", 6)
        harness.wait_until(lambda: b.log_events("job_handoff_running"), timeout=60,
                           interval=0.1, what="B claimed the job")
        harness.wait_until(lambda: up_b.log_entries(), timeout=60, interval=0.1,
                           what="B's agent asked its upstream")
        b.kill9()
        s.close()  # A's agent frees up
        st, _, r = get(timeout=180)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["message"]["content"], expected("come home", 6))
        self.assertIn("come home", self.prompts_seen(up_a))
        self.assertEqual(len(a.log_events("job_handoff_withdrawn")), 1)
        self.assertTrue(any(e.get("mode") == "handoff" for e in a.log_events("job_failover")))
        rows = self.sql("SELECT status, attempts FROM jobs ORDER BY created_at")
        self.assertEqual(rows[-1], ["done", "2"])


if __name__ == "__main__":
    harness.main()
