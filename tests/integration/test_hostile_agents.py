"""gpupool-server against hostile or broken agents (issue 9): scripted fake
agents (server_fakes.py) speaking the real protocol to the real server with
a real SQLite file.

- Finding 1: an agent's numbers are bounded. An end event claiming
  INT64_MAX prompt tokens is refused whole (400 INVALID_EVENT naming the
  field, nothing of the upload applied); a key_usage row holding INT64_MAX
  in the DB does not crash a restarted (sanitized) server, the key's first
  request is handled, and tokens_per_day still refuses.
- Finding 2: an agent_id belongs to the key that first bound it, across a
  restart: another key cannot poll, work, upload events or enroll with it,
  never sees the victim's job and cannot change /v1/models; an agent only
  uploads events for its own jobs.
- Finding 4: what an agent makes the server keep is bounded (per event,
  per job by max_tokens).
- Findings 10/12: names from agents are printable and bounded; enrolling
  with a client key says so.
"""

import json
import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402
from test_server_openai import in_thread  # noqa: E402

INT64_MAX = 9223372036854775807
FAST = ["--poll_interval_sec", "1", "--work_wait_sec", "2"]


def metric(srv, prefix):
    st, _, raw = harness.http_request("GET", srv.url + "/metrics", timeout=5)
    for line in raw.decode().splitlines():
        if line.startswith(prefix + " "):
            return float(line.split()[-1])
    return None


def param(body):
    """The field a native error names (error.details.param)."""
    return (body.get("error", {}).get("details") or {}).get("param")


def key_id_of(h, db, name):
    return h.query(db, "SELECT id FROM api_keys WHERE name = ?", (name,))[0][0]


def create_key(h, db, role, name, *opts):
    import subprocess
    r = subprocess.run([harness.SERVER_BIN, "keys", "create", "--role", role, "--db", h.store_uri(db),
                        "--name", name] + list(opts),
                       capture_output=True, text=True, timeout=30, env=h.env())
    assert r.returncode == 0, "keys create failed: %s" % r.stderr
    return r.stdout.strip().splitlines()[-1]


class HostileAgents(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def complete(self, srv, key=None, max_tokens=16, timeout=30):
        return http_json("POST", srv.url + "/v1/completions",
                         {"model": "m1", "prompt": "p", "max_tokens": max_tokens},
                         headers=bearer(key) if key else None, timeout=timeout)

    # -- finding 1 -----------------------------------------------------------
    def test_huge_usage_is_refused_and_nothing_applied(self):
        srv = self.h.start_server(FAST)
        a = FakeAgent(srv.url)
        self.assertEqual(a.poll()[0], 200)
        get = in_thread(self.complete, srv)
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(st, 200)
        jid = jobs[0]["job_id"]
        st, body = a.events(jid, [{"type": "started"}, {"type": "token", "text": "Hi"},
                                  {"type": "end", "finish_reason": "stop",
                                   "usage": {"prompt_tokens": INT64_MAX,
                                             "completion_tokens": 1}}], seq=0)
        self.assertEqual(st, 400, body)
        self.assertEqual(body["error"]["code"], "INVALID_EVENT")
        self.assertEqual(param(body), "events[2].usage.prompt_tokens", body)
        self.assertIn("events[2].usage.prompt_tokens", body["error"]["message"])
        # Nothing of that upload was applied: seq 0 is still expected and
        # the text is what the next upload says.
        st, body = a.events(jid, [{"type": "started"}, {"type": "token", "text": "Yo"},
                                  {"type": "end", "finish_reason": "stop",
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 1}}],
                            seq=0)
        self.assertEqual(st, 200, body)
        st, _, body = get()
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], "Yo")
        self.assertEqual(body["usage"], {"prompt_tokens": 3, "completion_tokens": 1,
                                         "total_tokens": 4})
        # Other numbers: a bad seq, token_id, metrics value.
        for evs, seq, field in (
                ([{"type": "token", "text": "x", "token_id": -5}], 0, "events[0].token_id"),
                ([{"type": "metrics", "tokens_per_sec": 1e300}], 0, "events[0].tokens_per_sec"),
                ([], INT64_MAX, "seq")):
            st, body = a.events(jid, evs, seq=seq)
            self.assertEqual((st, body["error"]["code"], param(body)),
                             (400, "INVALID_EVENT", field), body)

    def test_batched_plain_events_refused_as_before(self):
        """The batched upload reads started, progress, metrics and end events
        of the agents' shape without a tree (issue 24); one of that shape
        outside the check's bounds still gets the check's refusal, naming the
        field, and a valid one is applied as before."""
        srv = self.h.start_server(FAST)
        a = FakeAgent(srv.url)
        self.assertEqual(a.poll()[0], 200)
        get = in_thread(self.complete, srv)
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(st, 200)
        jid = jobs[0]["job_id"]

        def batch(evs):
            st, _, body = http_json("POST", srv.url + "/agents/events", {
                "agent_id": a.agent_id, "jobs": [{"job_id": jid, "seq": 0, "events": evs}]},
                timeout=10)
            self.assertEqual(st, 200, body)
            return body["jobs"][0]

        for ev, field in (
                ({"type": "metrics", "prompt_tokens": 1.5}, "prompt_tokens"),
                ({"type": "metrics", "tokens_per_sec": -1}, "tokens_per_sec"),
                ({"type": "metrics", "other": 1e16}, "other"),
                ({"type": "end", "finish_reason": ""}, "finish_reason"),
                ({"type": "end", "usage": {"completion_tokens": 1000000001}},
                 "usage.completion_tokens"),
                ({"type": "end", "stop_sequence": ""}, "stop_sequence"),
                ({"type": "progress", "prompt_tokens_total": -1}, "prompt_tokens_total")):
            r = batch([{"type": "started"}, ev])
            self.assertEqual((r["status"], r["error"]["code"], param(r)),
                             (400, "INVALID_EVENT", "events[1]." + field), r)
        r = batch([{"type": "started"},
                   {"type": "progress", "prompt_tokens_done": 2, "prompt_tokens_total": 5},
                   {"type": "token", "text": "Hi"},
                   {"type": "metrics", "prompt_tokens": 5, "tokens_per_sec": 12.5},
                   {"type": "end", "finish_reason": "length",
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1}}])
        self.assertEqual(r["status"], 200, r)
        st, _, body = get()
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], "Hi")
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(body["usage"], {"prompt_tokens": 5, "completion_tokens": 1,
                                         "total_tokens": 6})

    def test_usage_row_with_int64_max_in_db(self):
        db = self.h.path("usage.db")
        lim = create_key(self.h, db, "client", "limited", "--tokens-per-day", "50")
        free = create_key(self.h, db, "client", "free")
        srv = self.h.start_server(FAST, db=db)  # migrates the DB (key_usage exists)
        srv.stop()
        day = int(time.time() * 1000) // 86400000
        for name in ("limited", "free"):
            kid = key_id_of(self.h, db, name)
            # What INSERT OR REPLACE did, in SQL both engines take.
            self.h.execute(db, "DELETE FROM key_usage WHERE key_id = ? AND day = ?", (kid, day))
            self.h.execute(db, "INSERT INTO key_usage (key_id, day, requests, prompt_tokens, "
                           "completion_tokens, rate_limited) VALUES (?, ?, 1, ?, ?, -7)",
                           (kid, day, INT64_MAX, INT64_MAX))
        ak = create_key(self.h, db, "agent", "fake-agent")
        srv = self.h.start_server(FAST, db=db)
        a = FakeAgent(srv.url, key=ak).start()
        self.addCleanup(a.stop)
        srv.wait_model("m1", key=free)
        # The limited key is refused by its daily budget...
        st, _, body = self.complete(srv, lim)
        self.assertEqual(st, 429, body)
        # ...the other key's first request is handled (no overflow: the
        # sanitized build checks this) and its usage stays sane.
        st, _, body = self.complete(srv, free)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["usage"]["total_tokens"], 5)
        self.assertTrue(srv.log_events("key_usage_clamped"), "clamping was not logged")
        st, _, body = http_json("GET", srv.url + "/health", timeout=5)
        self.assertEqual(st, 200)

    # -- finding 2 -----------------------------------------------------------
    def test_impostor_cannot_take_an_agent_id(self):
        db = self.h.path("ids.db")
        ck = create_key(self.h, db, "client", "client")
        vk = create_key(self.h, db, "agent", "victim")
        ik = create_key(self.h, db, "agent", "impostor")
        ok = create_key(self.h, db, "agent", "other")
        tok = create_key(self.h, db, "enrollment", "tok")
        srv = self.h.start_server(FAST, db=db, key=ck)
        victim = FakeAgent(srv.url, key=vk)
        self.assertEqual(victim.poll()[0], 200)
        srv.wait_model("m1")
        imp = FakeAgent(srv.url, key=ik, agent_id=victim.agent_id, models=())

        def refused(st, body):
            self.assertEqual((st, body["error"]["code"]), (403, "AGENT_ID_TAKEN"), body)
            self.assertEqual(param(body), "agent_id")

        refused(*imp.poll())
        self.assertEqual(srv.models(), ["m1"])  # models: [] did not empty the list
        # The victim's job goes to the victim; the impostor cannot ask for
        # work, nor upload into it; another agent's upload is NOT_ASSIGNED.
        get = in_thread(self.complete, srv, ck)
        st, b = imp._post("/agents/work", {"agent_id": victim.agent_id, "free_slots": 1})
        refused(st, b)
        st, jobs = victim.work(1, timeout=10)
        self.assertEqual(st, 200)
        jid = jobs[0]["job_id"]
        refused(*imp.events(jid, [{"type": "token", "text": "pwned"}], seq=0))
        other = FakeAgent(srv.url, key=ok)
        self.assertEqual(other.poll()[0], 200)
        st, b = other.events(jid, [{"type": "token", "text": "pwned"}], seq=0)
        self.assertEqual((st, b["error"]["code"]), (409, "NOT_ASSIGNED"), b)
        st, b = victim.run_job(jobs[0])
        self.assertEqual(st, 200, b)
        st, hdr, body = get()
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], "Hello world")
        self.assertEqual(hdr["x-pool-agent"], victim.agent_id)
        # Enrollment never adopts an id that exists.
        st, _, b = http_json("POST", srv.url + "/agents/enroll", {"agent_id": victim.agent_id},
                             headers=bearer(tok), timeout=10)
        self.assertEqual((st, b["error"]["code"]), (403, "AGENT_ID_TAKEN"), b)

        # After a restart the binding holds; the victim keeps working.
        port = srv.port
        srv.stop()
        srv = self.h.start_server(FAST, db=db, key=ck, port=port)
        refused(*imp.poll())
        st, b = imp._post("/agents/work", {"agent_id": victim.agent_id, "free_slots": 1})
        refused(st, b)
        self.assertEqual(victim.poll()[0], 200)
        srv.wait_model("m1")
        victim.start()
        self.addCleanup(victim.stop)
        st, hdr, body = self.complete(srv, ck)
        self.assertEqual(st, 200, body)
        self.assertEqual(hdr["x-pool-agent"], victim.agent_id)
        self.assertEqual(srv.models(), ["m1"])
        # The impostor's key still works for an id of its own.
        self.assertEqual(FakeAgent(srv.url, key=ik, models=("m2",)).poll()[0], 200)

    # -- finding 4 -----------------------------------------------------------
    def test_event_memory_is_bounded(self):
        srv = self.h.start_server(FAST)
        a = FakeAgent(srv.url)
        self.assertEqual(a.poll()[0], 200)
        get = in_thread(self.complete, srv, None, 10)
        st, jobs = a.work(1, timeout=10)
        jid = jobs[0]["job_id"]
        # One 3.5 MB metrics event: refused (an event is at most 64 KiB).
        big = {"type": "metrics", "junk": "x" * (3500 * 1024)}
        st, body = a.events(jid, [big], seq=0)
        self.assertEqual((st, body["error"]["code"], param(body)),
                         (400, "INVALID_EVENT", "events[0]"), body)
        # Unknown events of 60 KB each: dropped, but counted against the
        # job's budget (max_tokens=10: 256 KiB + 74 * 512 bytes). The job
        # fails and the agent is told to stop well before 40 x 3 MB.
        piece = {"type": "future_thing", "blob": "y" * 60000}
        seq, cancelled = 0, False
        for _ in range(40):
            st, body = a.events(jid, [piece] * 50, seq=seq)
            self.assertEqual(st, 200, body)
            seq += 50
            if body.get("cancel"):
                cancelled = True
                break
        self.assertTrue(cancelled, "the agent was never told to stop")
        self.assertLessEqual(seq, 50)  # the first 3 MB upload already overran
        st, _, body = get()
        self.assertEqual(st, 502, body)
        self.assertIn("more event data", body["error"]["message"])
        self.assertGreaterEqual(metric(srv, 'gpupool_agent_events_dropped_total{reason="too_large"}'), 1)

    def test_max_job_event_bytes_caps_large_max_tokens(self):
        # max_tokens=100000 would allow ~51 MB by the per-token rule; the
        # operator's cap (64 KiB here) wins.
        srv = self.h.start_server(FAST + ["--max_job_event_bytes", "65536"])
        a = FakeAgent(srv.url)
        self.assertEqual(a.poll()[0], 200)
        get = in_thread(self.complete, srv, None, 100000)
        st, jobs = a.work(1, timeout=10)
        jid = jobs[0]["job_id"]
        st, body = a.events(jid, [{"type": "token", "text": "t" * 30000}], seq=0)
        self.assertEqual((st, body.get("cancel")), (200, False), body)
        st, body = a.events(jid, [{"type": "token", "text": "u" * 40000}], seq=1)
        self.assertEqual((st, body.get("cancel")), (200, True), body)
        st, _, body = get()
        self.assertEqual(st, 502, body)

    def test_metrics_events_do_not_pile_up(self):
        srv = self.h.start_server(FAST)
        a = FakeAgent(srv.url)
        self.assertEqual(a.poll()[0], 200)
        get = in_thread(self.complete, srv, None, 10)
        st, jobs = a.work(1, timeout=10)
        jid = jobs[0]["job_id"]
        st, body = a.events(jid, [{"type": "metrics", "tokens_per_sec": 1.0}] * 40 +
                            [{"type": "future_thing"}] +
                            [{"type": "token", "text": "ok"},
                             {"type": "end", "finish_reason": "stop"}], seq=0)
        self.assertEqual(st, 200, body)
        st, _, body = get()
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], "ok")
        self.assertEqual(metric(srv, 'gpupool_agent_events_dropped_total{reason="metrics"}'), 24)
        self.assertEqual(metric(srv, 'gpupool_agent_events_dropped_total{reason="unknown_type"}'),
                         1)

    # -- findings 10 / 12 ------------------------------------------------------
    def test_names_from_agents_are_printable(self):
        srv = self.h.start_server(FAST)
        cases = (
            ({"name": "box\x1b[31mred"}, "name"),
            ({"name": "n" * 257}, "name"),
            ({"models": [{"id": "m\u009b1"}]}, "models[0].id"),
            ({"models": [{"id": "m1", "aliases": ["a\u202eb"]}]}, "models[0].aliases[0]"),
            ({"labels": {"region": "eu\n"}}, "labels.region"),
            ({"labels": {"re\x07gion": "eu"}}, "labels"),
            ({"gpus": [{"vendor": "nvidia", "name": "RTX\x1b]0;pwn\x07"}]}, "gpus[0].name"),
            ({"gpus": [{"vram_total": INT64_MAX}]}, "gpus[0].vram_total"),
            ({"models": [{"id": "m1", "context_length": INT64_MAX}]}, "models[0].context_length"),
            ({"queue_depth": INT64_MAX}, "queue_depth"),
            ({"junk": "z" * (1100 * 1024)}, "body"),  # kept per agent: at most 1 MiB
        )
        for patch, field in cases:
            a = FakeAgent(srv.url)
            body = a.poll_body()
            body.update(patch)
            st, b = a._post("/agents/poll", body)
            self.assertEqual((st, b["error"]["code"]), (400, "INVALID_REQUEST"), (patch, b))
            self.assertIn(field, b["error"]["message"], patch)
        self.assertEqual(srv.models(), [])
        a = FakeAgent(srv.url, name="gpu-box-\u00e4\u65e5")  # printable UTF-8 is fine
        self.assertEqual(a.poll()[0], 200)

    def test_enroll_with_a_client_key_says_so(self):
        db = self.h.path("enroll.db")
        ck = create_key(self.h, db, "client", "client")
        tok = create_key(self.h, db, "enrollment", "tok")
        srv = self.h.start_server(FAST, db=db, key=ck)
        st, _, b = http_json("POST", srv.url + "/agents/enroll", {"agent_id": str(uuid.uuid4())},
                             headers=bearer(ck), timeout=10)
        self.assertEqual((st, b["error"]["code"]), (403, "WRONG_ROLE"), b)
        self.assertIn("needs an enrollment token", b["error"]["message"])
        self.assertIn("client key", b["error"]["message"])
        st, _, b = http_json("POST", srv.url + "/agents/enroll",
                             {"agent_id": str(uuid.uuid4()), "name": "bad\u202ename"},
                             headers=bearer(tok), timeout=10)
        self.assertEqual((st, b["error"]["code"]), (400, "INVALID_REQUEST"), b)
        self.assertIn("name", b["error"]["message"])


    def test_agent_whose_id_is_taken_exits_2(self):
        """A real agent process started with a state dir whose agent_id is
        bound to another key exits 2 (the unit's RestartPreventExitStatus)
        with a line naming the problem, instead of retrying forever."""
        db = self.h.path("taken.db")
        ck = create_key(self.h, db, "client", "client")
        vk = create_key(self.h, db, "agent", "victim")
        ik = create_key(self.h, db, "agent", "impostor")
        srv = self.h.start_server(FAST, db=db, key=ck)
        victim = FakeAgent(srv.url, key=vk)
        self.assertEqual(victim.poll()[0], 200)
        up = self.h.start_upstream(["--tokens", "2"])
        state = self.h.path("impostor.state")
        os.makedirs(state)
        with open(os.path.join(state, "agent_id"), "w") as f:
            f.write(victim.agent_id + "\n")
        ag = self.h.start_agent(srv, up, token=ik, state_dir=state)
        self.assertEqual(ag.wait(timeout=60), 2)
        lines = ag.log_events("agent_id_refused")
        self.assertTrue(lines, "no agent_id_refused line")
        self.assertIn("AGENT_ID_TAKEN", str(lines[0]))
        self.assertEqual(srv.models(), ["m1"])


class HostileUpstream(harness.TestCase):
    """Issue 25: the agent forwarded upstream values the server refuses
    (x_pool_meta over 4 KiB, usage 2^62): the whole upload was refused, the
    agent dropped the job without a word and the client waited minutes. The
    agent now drops such values (with a warning), and when the server
    refuses an upload anyway it sends an error event that ends the job."""
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN)

    def setUp(self):
        super().setUp()
        self.up = self.h.start_upstream(["--tokens", "4"])
        self.srv = self.h.start_server(FAST + ["--request_timeout_sec", "300"])
        self.agent = self.h.start_agent(self.srv, upstream=self.up, model="m1")
        self.srv.wait_model("m1")

    def chat(self):
        return http_json("POST", self.srv.url + "/v1/chat/completions",
                         {"model": "m1", "max_tokens": 4,
                          "messages": [{"role": "user", "content": "one two three"}]},
                         timeout=30)

    def test_absurd_usage_is_dropped(self):
        self.up.control(usage_prompt_tokens=2 ** 62)
        st, _, body = self.chat()
        self.assertEqual(st, 200, body)
        self.assertLess(body["usage"]["prompt_tokens"], 10 ** 9)
        self.assertTrue(self.agent.log_events("upstream_value_dropped"))

    def test_oversized_pool_meta_is_dropped(self):
        self.up.control(x_pool_meta_bytes=5000)
        st, _, body = self.chat()
        self.assertEqual(st, 200, body)
        self.assertNotIn("upstream", body.get("x_pool_meta") or {})
        self.assertTrue(self.agent.log_events("upstream_value_dropped"))

    def test_a_refused_upload_ends_the_job_with_an_error(self):
        # A token over the server's bound for one event (64 KiB).
        self.up.control(first_token_bytes=70000)
        st, _, body = self.chat()
        self.assertGreaterEqual(st, 500, body)
        self.assertIn("refused", json.dumps(body))
        self.assertTrue(self.agent.log_events("upload_refused"))


if __name__ == "__main__":
    unittest.main()
