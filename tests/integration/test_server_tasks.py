"""gpupool-server, native task API (/v2/tasks): a real server process and
fake agents (server_fakes.py) driven step by step.

Covers: create (202, seed generated and sent to the agent), the event
stream (ids 1..n, queued -> started -> token* -> metrics -> end), status
with result/usage/timings/agent/attempts, reconnect with Last-Event-ID
(header and query) giving exactly the uninterrupted stream, cancel while
queued and while running (idempotent, CANCELLED, the agent is told to
stop), priority ordering with one busy slot and queue-position updates,
replay of a finished task's whole event log from the store after a restart,
400/404 errors. Durability (checkpoints mid-run, restarts): test_tasks_durable.py.
"""

import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402


def events_of(data):
    return [(int(e["id"]), e["event"], json.loads(e["data"])) for e in harness.parse_sse(data)]


class ServerTasks(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def setUp(self):
        super().setUp()
        self.db = self.h.path("tasks.db")
        self.srv = self.h.start_server([], db=self.db)

    def agent(self, slots=1):
        a = FakeAgent(self.srv.url, models=("m1",), slots=slots)
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        return a

    def create(self, **kw):
        body = {"model": "m1", "prompt": "hello", "max_tokens": 16}
        body.update(kw)
        st, hdr, r = harness.http_json("POST", self.srv.url + "/v2/tasks", body)
        self.assertEqual(st, 202, r)
        return r

    def all_events(self, tid, last=None, query=False, timeout=10):
        url = self.srv.url + "/v2/tasks/%s/events" % tid
        headers = {}
        if last is not None and query:
            url += "?last_event_id=%d" % last
        elif last is not None:
            headers["Last-Event-ID"] = str(last)
        st, _, data = harness.http_request("GET", url, headers=headers, timeout=timeout)
        self.assertEqual(st, 200, data)
        return events_of(data)

    def status(self, tid):
        st, _, r = harness.http_json("GET", self.srv.url + "/v2/tasks/" + tid)
        self.assertEqual(st, 200, r)
        return r

    def test_create_run_and_status(self):
        a = self.agent()
        r = self.create(temperature=0.5)
        self.assertTrue(r["job_id"].startswith("job_"))
        self.assertEqual(r["status"], "queued")
        self.assertEqual(r["queue_position"], 0)
        self.assertEqual(r["events_url"], "/v2/tasks/%s/events" % r["job_id"])
        self.assertIsInstance(r["seed"], int)
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(jobs[0]["job_id"], r["job_id"])
        self.assertEqual(jobs[0]["params"]["seed"], r["seed"])
        a.events(r["job_id"], [{"type": "started"}, {"type": "token", "text": "a"},
                               {"type": "token", "text": "b"},
                               {"type": "metrics", "prompt_tokens": 1, "tokens_per_sec": 9.5},
                               {"type": "end", "finish_reason": "stop",
                                "usage": {"prompt_tokens": 1, "completion_tokens": 2}}])
        ev = self.all_events(r["job_id"])
        self.assertEqual([e[0] for e in ev], list(range(1, len(ev) + 1)))
        self.assertEqual([e[1] for e in ev], ["queued", "started", "token", "token", "metrics", "end"])
        self.assertEqual(ev[0][2]["position"], 0)
        self.assertIn("estimated_wait_ms", ev[0][2])
        self.assertEqual(ev[1][2]["agent_id"], a.agent_id)
        self.assertEqual(ev[-1][2]["text"], "ab")
        s = self.status(r["job_id"])
        self.assertEqual(s["status"], "done")
        self.assertEqual(s["result"], {"text": "ab", "finish_reason": "stop"})
        self.assertEqual(s["usage"], {"prompt_tokens": 1, "completion_tokens": 2})
        self.assertEqual(s["agent_id"], a.agent_id)
        self.assertEqual(s["attempts"], 1)
        self.assertEqual(s["seed"], r["seed"])
        self.assertIn("total_ms", s["timings"])
        # x_pool_meta in the body and as x-pool-* headers, as in the other dialects
        meta = s["x_pool_meta"]
        self.assertEqual(meta["agent_id"], a.agent_id)
        self.assertEqual(meta["attempts"], 1)
        self.assertEqual(meta["model"], "m1")
        self.assertEqual(meta["warnings"], [])
        self.assertGreaterEqual(meta["inference_ms"], 0)
        self.assertGreaterEqual(meta["queue_ms"], 0)
        st, hdr, _ = harness.http_json("GET", self.srv.url + "/v2/tasks/" + r["job_id"])
        self.assertEqual(st, 200)
        self.assertEqual(hdr["x-pool-agent"], a.agent_id)
        self.assertEqual(hdr["x-pool-attempts"], "1")

    def test_reconnect_with_last_event_id(self):
        a = self.agent()
        r = self.create(seed=7)
        tid = r["job_id"]
        self.assertEqual(r["seed"], 7)
        st, jobs = a.work(1, timeout=10)
        a.events(tid, [{"type": "started"}, {"type": "token", "text": "t1"}])
        # Read k=4 events (3 replayed, 1 live), then drop the connection.
        s = harness.SSEStream("GET", self.srv.url + "/v2/tasks/%s/events" % tid, timeout=10)
        got = [s.next_event(timeout=10) for _ in range(3)]
        a.events(tid, [{"type": "token", "text": "t2"}])
        got.append(s.next_event(timeout=10))
        s.close()
        a.events(tid, [{"type": "token", "text": "t3"}, {"type": "token", "text": "t4"},
                       {"type": "end", "finish_reason": "length",
                        "usage": {"prompt_tokens": 1, "completion_tokens": 4}}])
        first = [(int(e["id"]), e["event"], json.loads(e["data"])) for e in got]
        rest = self.all_events(tid, last=first[-1][0])
        whole = self.all_events(tid)
        self.assertEqual(first + rest, whole)
        self.assertEqual([e[1] for e in whole].count("end"), 1)
        self.assertEqual("".join(e[2]["text"] for e in whole if e[1] == "token"), "t1t2t3t4")
        self.assertEqual(self.all_events(tid, last=4, query=True), whole[4:])
        # Everything seen: nothing more, the stream just ends.
        self.assertEqual(self.all_events(tid, last=len(whole)), [])

    def test_cancel_queued_and_running(self):
        a = self.agent()
        # Queued: the agent asks for no work yet.
        r = self.create()
        st, _, d = harness.http_json("DELETE", self.srv.url + "/v2/tasks/" + r["job_id"])
        self.assertEqual(st, 200, d)
        self.assertEqual(d["status"], "cancelled")
        self.assertEqual(d["error"]["code"], "CANCELLED")
        st, _, d = harness.http_json("DELETE", self.srv.url + "/v2/tasks/" + r["job_id"])
        self.assertEqual((st, d["status"]), (200, "cancelled"))
        ev = self.all_events(r["job_id"])
        self.assertEqual(ev[-1][1], "error")
        self.assertEqual(ev[-1][2]["code"], "CANCELLED")
        # Running.
        r = self.create()
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(jobs[0]["job_id"], r["job_id"])
        st, body = a.events(r["job_id"], [{"type": "started"}, {"type": "token", "text": "x"}])
        self.assertFalse(body["cancel"])
        st, _, d = harness.http_json("DELETE", self.srv.url + "/v2/tasks/" + r["job_id"])
        self.assertEqual(d["status"], "cancelled")
        st, body = a.events(r["job_id"], [{"type": "token", "text": "y"}])
        self.assertTrue(body["cancel"])
        ev = self.all_events(r["job_id"])
        self.assertEqual([e[1] for e in ev], ["queued", "started", "token", "error"])

    def test_priority_ordering_and_queue_updates(self):
        a = self.agent(slots=1)
        busy = self.create()
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(jobs[0]["job_id"], busy["job_id"])
        b = self.create(priority="batch")
        c = self.create(priority="interactive")
        self.assertEqual(c["queue_position"], 0)
        # b is now behind c: its stream announces position 1.
        harness.wait_until(lambda: self.status(b["job_id"]).get("queue_position") == 1, timeout=30)
        s = harness.SSEStream("GET", self.srv.url + "/v2/tasks/%s/events" % b["job_id"], timeout=10)
        seen = []
        # One bound for both phases, generous for a loaded ASan build: the
        # loop ends on the event, the deadline only stops a broken server.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            e = s.next_event(timeout=10)
            seen.append((e["event"], json.loads(e["data"])))
            if e["event"] == "queued" and json.loads(e["data"])["position"] == 1:
                break
        a.run_job(jobs[0])
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(jobs[0]["job_id"], c["job_id"], "interactive before batch")
        # b moved to the head of the queue: a new queued event says so.
        while time.monotonic() < deadline:
            e = s.next_event(timeout=10)
            seen.append((e["event"], json.loads(e["data"])))
            if e["event"] == "queued" and json.loads(e["data"])["position"] == 0:
                break
        s.close()
        self.assertEqual([p["position"] for n, p in seen if n == "queued"][-2:], [1, 0])
        a.run_job(jobs[0])
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(jobs[0]["job_id"], b["job_id"])
        a.run_job(jobs[0])

    def test_replay_from_the_store_after_restart(self):
        a = self.agent()
        r = self.create()
        st, jobs = a.work(1, timeout=10)
        a.run_job(jobs[0], tokens=("He", "llo"))
        whole = self.all_events(r["job_id"])
        self.assertEqual(whole[-1][1], "end")
        self.srv.stop()
        self.srv = self.h.start_server([], db=self.db, name="server2")
        s = self.status(r["job_id"])
        self.assertEqual(s["status"], "done")
        self.assertEqual(s["result"]["text"], "Hello")
        # The whole log comes back from job_events, same ids, same data.
        self.assertEqual(self.all_events(r["job_id"]), whole)
        self.assertEqual(self.all_events(r["job_id"], last=2), whole[2:])
        self.assertEqual(self.all_events(r["job_id"], last=whole[-1][0]), [])
        st, _, d = harness.http_json("DELETE", self.srv.url + "/v2/tasks/" + r["job_id"])
        self.assertEqual((st, d["status"]), (200, "done"))

    def test_errors(self):
        self.agent()
        url = self.srv.url + "/v2/tasks"
        cases = [({"model": "m1", "prompt": "x"}, "max_tokens"),
                 ({"model": "m1", "prompt": "x", "max_tokens": 4, "priority": "urgent"}, "priority"),
                 ({"model": "m1", "max_tokens": 4}, "prompt"),
                 ({"model": "m1", "prompt": "x", "messages": [], "max_tokens": 4}, "prompt"),
                 ({"model": "m1", "prompt": "x", "max_tokens": 4, "temperature": 9}, "temperature")]
        for body, param in cases:
            st, _, r = harness.http_json("POST", url, body)
            self.assertEqual(st, 400, body)
            self.assertEqual(r["error"]["code"], "INVALID_REQUEST")
            self.assertEqual(r["error"]["details"]["param"], param)
            self.assertIn("correlation_id", r["error"])
        st, _, r = harness.http_json("POST", url, {"model": "nope", "prompt": "x", "max_tokens": 4})
        self.assertEqual((st, r["error"]["code"]), (404, "MODEL_NOT_FOUND"))
        for m in ("GET", "DELETE"):
            st, _, r = harness.http_json(m, url + "/job_000000000000000000000000")
            self.assertEqual((st, r["error"]["code"]), (404, "JOB_NOT_FOUND"))
        st, _, r = harness.http_json("GET", url + "/job_000000000000000000000000/events")
        self.assertEqual((st, r["error"]["code"]), (404, "JOB_NOT_FOUND"))
        t = self.create()
        st, _, r = harness.http_json("GET", url + "/%s/events" % t["job_id"],
                                     headers={"Last-Event-ID": "abc"})
        self.assertEqual((st, r["error"]["code"]), (400, "INVALID_REQUEST"))


class TasksRealAgent(harness.TestCase):
    """DELETE reaches a real gpupool-agent: it stops its upstream request."""
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN)

    def test_cancel_stops_the_agent_within_a_second(self):
        srv = self.h.start_server([])
        up = self.h.start_upstream(["--pace-ms", "100", "--tokens", "200"])
        self.h.start_agent(srv, up, model="m1")
        srv.wait_model("m1")
        st, _, r = harness.http_json("POST", srv.url + "/v2/tasks",
                                     {"model": "m1", "prompt": "a b c", "max_tokens": 200})
        self.assertEqual(st, 202, r)
        tid = r["job_id"]
        s = harness.SSEStream("GET", srv.url + "/v2/tasks/%s/events" % tid, timeout=20)
        while True:  # bounded by the stream timeout
            e = s.next_event(timeout=20)
            self.assertIsNotNone(e)
            if e["event"] == "token":
                break
        t0 = time.monotonic()
        st, _, d = harness.http_json("DELETE", srv.url + "/v2/tasks/" + tid)
        self.assertEqual((st, d["status"]), (200, "cancelled"))
        rest = s.events(limit=1000)
        s.close()
        self.assertEqual(rest[-1]["event"], "error")
        self.assertEqual(json.loads(rest[-1]["data"])["code"], "CANCELLED")
        harness.wait_until(lambda: any(x.get("outcome") == "client_gone" for x in up.log_entries()),
                           timeout=5, what="upstream request abandoned")
        gone = [x for x in up.log_entries() if x.get("outcome") == "client_gone"][0]
        took = gone["disconnect_mono"] - t0
        print("cancel -> upstream request closed: %.3f s" % took)
        self.assertLess(gone["tokens_sent"], 200)


if __name__ == "__main__":
    harness.main()
