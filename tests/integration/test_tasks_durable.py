"""gpupool-server, durable native tasks (/v2/tasks): event-log checkpoints
in job_events and start-up recovery (docs/persistence.md).

A real server process and fake agents (server_fakes.py) driven step by
step, so every event is made by the test and a crash lands at a known
point. Durability is observed, not waited for: the test reads the server's
store (Harness.query: the SQLite file, or its PostgreSQL schema) until the
checkpoint batch it needs is committed, then SIGKILLs the server.

Covers:
  - resume after disconnect once the finished task left memory
    (task_hot_sec=1): the replay comes from the store (X-Gpupool-Replay)
    and equals the uninterrupted stream after Last-Event-ID;
  - SIGKILL while queued -> restart -> the task runs under the same id and
    seed, its events continue the numbering, one terminal event;
  - SIGKILL while running -> restart -> the next agent gets the text so far
    as continuation; the stream read before the crash plus the stream
    resumed with Last-Event-ID after it has every seq once, in order, one
    terminal event, and the text of all tokens is the end event's text.
"""

import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402


def events_of(data):
    return [(int(e["id"]), e["event"], json.loads(e["data"])) for e in harness.parse_sse(data)]


def check_stream(tc, evs):
    """seq 1..n once each, in order; exactly one terminal event, last."""
    tc.assertEqual([e[0] for e in evs], list(range(1, len(evs) + 1)))
    terms = [e for e in evs if e[1] in ("end", "error")]
    tc.assertEqual(len(terms), 1, evs)
    tc.assertIs(terms[0], evs[-1])


class TasksDurable(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def setUp(self):
        super().setUp()
        self.db = self.h.path("durable.db")

    # -- helpers -----------------------------------------------------------
    def agent(self, srv):
        a = FakeAgent(srv.url, models=("m1",), slots=1)
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        return a

    def create(self, srv, **kw):
        body = {"model": "m1", "prompt": "hello", "max_tokens": 16}
        body.update(kw)
        st, _, r = harness.http_json("POST", srv.url + "/v2/tasks", body)
        self.assertEqual(st, 202, r)
        return r

    def events(self, srv, tid, last=None, timeout=10):
        headers = {} if last is None else {"Last-Event-ID": str(last)}
        st, hdr, data = harness.http_request("GET", srv.url + "/v2/tasks/%s/events" % tid,
                                             headers=headers, timeout=timeout)
        self.assertEqual(st, 200, data)
        return hdr.get("x-gpupool-replay"), events_of(data)

    def status(self, srv, tid):
        st, _, r = harness.http_json("GET", srv.url + "/v2/tasks/" + tid)
        self.assertEqual(st, 200, r)
        return r

    def wait_durable(self, tid, seq, timeout=15, db=None):
        """Until job_events holds tid's events up to seq (committed)."""
        dbpath = db or self.db
        deadline = time.time() + timeout
        got = None
        while time.time() < deadline:
            got = self.h.query(dbpath, "SELECT max(last_seq) FROM job_events WHERE job_id = ?",
                               (tid,))[0][0]
            if got is not None and got >= seq:
                return
            time.sleep(0.1)
        self.fail("events of %s up to %d never reached the store (have %s)" % (tid, seq, got))

    def wait_row(self, jid, timeout=15):
        """Until the request log row of jid is committed."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.h.query(self.db, "SELECT 1 FROM jobs WHERE id = ?", (jid,)):
                return
            time.sleep(0.05)
        self.fail("job %s never reached the store" % jid)

    def stored_request(self, tid):
        rows = self.h.query(self.db, "SELECT request FROM jobs WHERE id = ?", (tid,))
        row = rows[0] if rows else None
        return json.loads(row[0]) if row and row[0] else None

    # -- tests -------------------------------------------------------------
    def test_resume_after_eviction_replays_from_the_store(self):
        srv = self.h.start_server(["--task_hot_sec", "1"], db=self.db)
        a = self.agent(srv)
        r = self.create(srv)
        tid = r["job_id"]
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(jobs[0]["job_id"], tid)
        a.events(tid, [{"type": "started"}, {"type": "token", "text": "a1"}])
        # A client reads 3 events and goes away; the task goes on.
        s = harness.SSEStream("GET", srv.url + "/v2/tasks/%s/events" % tid, timeout=10)
        first = [s.next_event(timeout=10) for _ in range(3)]
        s.close()
        first = [(int(e["id"]), e["event"], json.loads(e["data"])) for e in first]
        a.events(tid, [{"type": "token", "text": "a2"}, {"type": "token", "text": "a3"},
                       {"type": "metrics", "prompt_tokens": 2, "tokens_per_sec": 5.0},
                       {"type": "end", "finish_reason": "stop",
                        "usage": {"prompt_tokens": 2, "completion_tokens": 3}}])
        src, whole = self.events(srv, tid)
        check_stream(self, whole)
        self.assertEqual(whole[:3], first)
        # Until the task leaves memory (1 s after its end), then from the DB.
        deadline = time.time() + 20
        while True:
            src, rest = self.events(srv, tid, last=3)
            if src == "store" or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(src, "store")
        self.assertEqual(first + rest, whole)
        self.assertEqual(self.events(srv, tid)[1], whole)
        self.assertEqual(self.events(srv, tid, last=len(whole))[1], [])
        self.assertEqual(whole[-1][2]["text"], "a1a2a3")
        self.assertEqual(self.status(srv, tid)["status"], "done")

    def test_native_request_is_written_once(self):
        # Triggers added to the server's own store count every write of
        # jobs.request: the row's insert (with a request) and any UPDATE
        # that sets it. A native task's input used to go in twice (the
        # insert with prompt/messages, then an UPDATE with the whole body).
        # The same two triggers in each engine's dialect (PostgreSQL's run
        # a function; both fire per row, the UPDATE one when request is
        # among the columns SET).
        srv = self.h.start_server([], db=self.db)
        if self.h.is_pg(self.db):
            triggers = (
                "CREATE TABLE t_request_writes (job_id TEXT NOT NULL);"
                "CREATE FUNCTION t_request_write() RETURNS trigger LANGUAGE plpgsql AS "
                "$$BEGIN INSERT INTO t_request_writes VALUES (NEW.id); RETURN NULL; END$$;"
                "CREATE TRIGGER t_request_insert AFTER INSERT ON jobs FOR EACH ROW "
                "WHEN (NEW.request IS NOT NULL) EXECUTE PROCEDURE t_request_write();"
                "CREATE TRIGGER t_request_update AFTER UPDATE OF request ON jobs "
                "FOR EACH ROW EXECUTE PROCEDURE t_request_write();")
        else:
            triggers = (
                "CREATE TABLE t_request_writes (job_id TEXT NOT NULL);"
                "CREATE TRIGGER t_request_insert AFTER INSERT ON jobs "
                "WHEN NEW.request IS NOT NULL "
                "BEGIN INSERT INTO t_request_writes VALUES (NEW.id); END;"
                "CREATE TRIGGER t_request_update AFTER UPDATE OF request ON jobs "
                "BEGIN INSERT INTO t_request_writes VALUES (NEW.id); END;")
        self.h.execute(self.db, triggers)
        a = self.agent(srv)
        tid = self.create(srv, seed=99, temperature=0.25)["job_id"]
        st, jobs = a.work(1, timeout=10)
        self.assertEqual([j["job_id"] for j in jobs], [tid])
        a.run_job(jobs[0], tokens=("x",))
        self.assertEqual(self.events(srv, tid)[1][-1][1], "end")
        # The row's last update (finished) is committed after every write
        # queued before it: the request writes are all in by then.
        deadline = time.time() + 15
        while True:
            rows = self.h.query(
                self.db, "SELECT finished_at, (SELECT count(*) FROM t_request_writes "
                "WHERE job_id = ?) FROM jobs WHERE id = ?", (tid, tid))
            fin, n = rows[0] if rows else (None, 0)
            if fin is not None or time.time() > deadline:
                break
            time.sleep(0.05)
        self.assertIsNotNone(fin, "the task's row never finished in the store")
        self.assertEqual(n, 1)
        req = self.stored_request(tid)
        self.assertEqual((req["seed"], req["temperature"], req["prompt"], req["max_tokens"]),
                         (99, 0.25, "hello", 16))

    def test_sigkill_while_queued_then_restart_completes(self):
        srv = self.h.start_server([], db=self.db)
        self.agent(srv)  # serves m1 but never asks for work: the task stays queued
        r = self.create(srv, seed=4242, temperature=0.3, stop=["zz"], priority="batch")
        tid = r["job_id"]
        self.assertEqual(self.status(srv, tid)["status"], "queued")
        s = harness.SSEStream("GET", srv.url + "/v2/tasks/%s/events" % tid, timeout=10)
        before = [s.next_event(timeout=10)]
        s.close()
        before = [(int(e["id"]), e["event"], json.loads(e["data"])) for e in before]
        self.assertEqual([e[1] for e in before], ["queued"])
        self.wait_durable(tid, len(before))
        req = self.stored_request(tid)
        self.assertEqual((req["seed"], req["temperature"], req["stop"], req["priority"]),
                         (4242, 0.3, ["zz"], "batch"))
        srv.kill9()

        srv2 = self.h.start_server([], db=self.db, name="server2")
        b = self.agent(srv2)
        st, jobs = b.work(1, timeout=15)
        self.assertEqual(st, 200)
        self.assertEqual([j["job_id"] for j in jobs], [tid])
        job = jobs[0]
        self.assertEqual(job["params"]["seed"], 4242)
        self.assertEqual(job["params"]["stop"], ["zz"])
        self.assertEqual(job["continuation"], "")
        b.run_job(job, tokens=("x", "y"))
        _, after = self.events(srv2, tid)
        check_stream(self, after)
        self.assertEqual(after[:len(before)], before)
        self.assertNotIn("failover", [e[1] for e in after])  # nothing had run yet
        self.assertEqual(after[-1][1], "end")
        self.assertEqual(after[-1][2]["text"], "xy")
        # Resuming from the pre-crash position gives exactly the rest.
        self.assertEqual(self.events(srv2, tid, last=len(before))[1], after[len(before):])
        s = self.status(srv2, tid)
        self.assertEqual((s["status"], s["seed"], s["result"]["text"]), ("done", 4242, "xy"))

    def test_restored_task_waits_for_an_agent_and_can_be_cancelled(self):
        srv = self.h.start_server([], db=self.db)
        self.agent(srv)
        r = self.create(srv, seed=5)
        tid = r["job_id"]
        self.wait_durable(tid, 1)
        srv.kill9()
        # No agent after the restart: the task waits (queued), same seed.
        srv2 = self.h.start_server([], db=self.db, name="server2")
        s = self.status(srv2, tid)
        self.assertEqual((s["status"], s["seed"], s["model"]), ("queued", 5, "m1"))
        st, _, d = harness.http_json("DELETE", srv2.url + "/v2/tasks/" + tid)
        self.assertEqual((st, d["status"]), (200, "cancelled"))
        self.assertEqual(d["error"]["code"], "CANCELLED")
        _, evs = self.events(srv2, tid)
        check_stream(self, evs)
        self.assertEqual([e[1] for e in evs], ["queued", "error"])
        self.assertEqual(evs[-1][2]["code"], "CANCELLED")
        # Idempotent, and the request log row is final.
        st, _, d = harness.http_json("DELETE", srv2.url + "/v2/tasks/" + tid)
        self.assertEqual(st, 200)
        srv2.stop()
        srv3 = self.h.start_server([], db=self.db, name="server3")
        s = self.status(srv3, tid)
        self.assertEqual(s["status"], "cancelled")
        self.assertEqual(self.events(srv3, tid), ("store", evs))

    def test_sigkill_while_running_then_restart_continues(self):
        srv = self.h.start_server([], db=self.db)
        a = self.agent(srv)
        r = self.create(srv, seed=99, max_tokens=10)
        tid = r["job_id"]
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(jobs[0]["job_id"], tid)
        a.events(tid, [{"type": "started"}, {"type": "token", "text": "Once"},
                       {"type": "token", "text": " upon"}, {"type": "token", "text": " a"}])
        # The client reads everything so far live, then the server dies.
        s = harness.SSEStream("GET", srv.url + "/v2/tasks/%s/events" % tid, timeout=10)
        seen = [s.next_event(timeout=10) for _ in range(5)]
        seen = [(int(e["id"]), e["event"], json.loads(e["data"])) for e in seen]
        self.assertEqual([e[1] for e in seen], ["queued", "started", "token", "token", "token"])
        self.wait_durable(tid, 5)
        srv.kill9()
        s.close()

        srv2 = self.h.start_server([], db=self.db, name="server2")
        b = self.agent(srv2)
        st, jobs = b.work(1, timeout=15)
        self.assertEqual([j["job_id"] for j in jobs], [tid])
        job = jobs[0]
        self.assertEqual(job["continuation"], "Once upon a")
        self.assertEqual(job["params"]["seed"], 99)
        self.assertEqual(job["params"]["max_tokens"], 7)  # 10 minus the 3 already made
        b.events(tid, [{"type": "started"}, {"type": "token", "text": " time"},
                       {"type": "end", "finish_reason": "stop",
                        "usage": {"prompt_tokens": 4, "completion_tokens": 1}}])
        _, rest = self.events(srv2, tid, last=seen[-1][0])
        stream = seen + rest
        check_stream(self, stream)
        types = [e[1] for e in rest]
        self.assertEqual(types[0], "failover")
        self.assertEqual(rest[0][2]["reason"], "SERVER_RESTART")
        self.assertEqual(rest[0][2]["completion_tokens"], 3)
        self.assertIn("started", types)
        text = "".join(e[2]["text"] for e in stream if e[1] == "token")
        self.assertEqual(text, "Once upon a time")
        self.assertEqual(stream[-1][1], "end")
        self.assertEqual(stream[-1][2]["text"], text)
        self.assertEqual(stream[-1][2]["usage"]["completion_tokens"], 4)
        # The new process's own replay agrees with what the client pieced together.
        self.assertEqual(self.events(srv2, tid)[1], stream)

    def test_sigkill_fails_unfinished_openai_requests(self):
        srv = self.h.start_server([], db=self.db)
        a = self.agent(srv)
        # An OpenAI streaming request whose client is connected to the old
        # process (opened from a thread: its headers may wait for output).
        box = {}

        def client():
            box["s"] = harness.SSEStream("POST", srv.url + "/v1/completions",
                                         body={"model": "m1", "prompt": "hi", "max_tokens": 4,
                                               "stream": True}, timeout=10)
            box["ev"] = box["s"].next_event(timeout=10)

        th = threading.Thread(target=client, daemon=True)
        th.start()
        st, jobs = a.work(1, timeout=10)
        jid = jobs[0]["job_id"]
        a.events(jid, [{"type": "started"}, {"type": "token", "text": "x"}])
        th.join(timeout=10)
        self.assertIsNotNone(box.get("ev"))
        self.wait_row(jid)
        srv.kill9()
        box["s"].conn.close()
        srv2 = self.h.start_server([], db=self.db, name="server2")
        deadline = time.time() + 10
        row = None
        while time.time() < deadline:
            rows = self.h.query(self.db, "SELECT status, error_code FROM jobs WHERE id = ?",
                                (jid,))
            row = rows[0] if rows else None
            if row and row[0] == "failed":
                break
            time.sleep(0.1)
        self.assertIsNotNone(row, "job %s not in the request log" % jid)
        self.assertEqual(tuple(row), ("failed", "SERVER_RESTART"))
        srv2.stop()


class TasksDurableRealAgent(harness.TestCase):
    """SIGKILL of the server under a real gpupool-agent streaming from a
    slow, continuation-aware upstream: the restarted server (same port, same
    DB) resumes the task on the agent that comes back, and the client's
    before + after streams give upstream's text exactly once."""
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN)

    def test_sigkill_mid_stream_with_a_real_agent(self):
        from test_e2e_failover import ContUpstream, expected  # noqa: E402
        fast = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]
        db = self.h.path("real.db")
        srv = self.h.start_server(fast, db=db)
        up = ContUpstream(self.h, "upstream", ["--tokens", "12", "--pace-ms", "150"])
        self.h.procs.append(up)
        self.h.start_agent(srv, upstream=up, model="m1")
        srv.wait_model("m1")
        prompt = "a long story ::"
        st, _, r = harness.http_json("POST", srv.url + "/v2/tasks",
                                     {"model": "m1", "prompt": prompt, "max_tokens": 12})
        self.assertEqual(st, 202, r)
        tid = r["job_id"]
        s = harness.SSEStream("GET", srv.url + "/v2/tasks/%s/events" % tid, timeout=30)
        seen = []
        while sum(1 for e in seen if e[1] == "token") < 4:
            e = s.next_event(timeout=30)
            self.assertIsNotNone(e)
            seen.append((int(e["id"]), e["event"], json.loads(e["data"])))
        # Crash once what the client saw is committed (later events may or
        # may not be: the resumed stream must be right either way).
        TasksDurable.wait_durable(self, tid, seen[-1][0], db=db)
        port = srv.port
        srv.kill9()
        s.conn.close()
        srv2 = self.h.start_server(fast, db=db, name="server2", port=port)
        st, _, data = harness.http_request(
            "GET", srv2.url + "/v2/tasks/%s/events" % tid,
            headers={"Last-Event-ID": str(seen[-1][0])}, timeout=90)
        self.assertEqual(st, 200)
        stream = seen + events_of(data)
        check_stream(self, stream)
        self.assertEqual(stream[-1][1], "end", stream[-1])
        text = "".join(e[2]["text"] for e in stream if e[1] == "token")
        self.assertEqual(text, expected(prompt, 12))
        self.assertEqual(stream[-1][2]["text"], text)
        self.assertIn("SERVER_RESTART", [e[2].get("reason") for e in stream if e[1] == "failover"])


if __name__ == "__main__":
    unittest.main()
