#!/usr/bin/env python3
"""Batched event uploads, POST /agents/events (docs/protocol.md "Batched
uploads"), against the real server:

- the poll reply announces `features: ["events_batch"]`;
- one request carries several jobs' events; each entry is judged as its own
  upload would be, and the reply lists every outcome in order: applied
  (cancel false), a malformed entry (400 INVALID_EVENT naming the field:
  that entry only, nothing of it applied), a seq gap (409 SEQ_GAP with
  expected_seq), an unknown job (404), another agent's job (409
  NOT_ASSIGNED), an entry without job_id (400); a retried entry is applied
  once; a cancelled job's entry says cancel true;
- a bad request as a whole (agent_id, jobs) is a 400; an agent key bound to
  another agent is refused;
- a batch's "instance" is checked (400) and a new one ends the previous
  process's jobs, as on any agent request;
- the real gpupool-agent uses it (gpupool_agent_uploads_total{route="batch"})
  with four concurrent streams whose texts are whole, and with
  --events-batch=false uploads per job as before.
"""

import os
import re
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402
import upstream as upstream_mod  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--work_wait_sec", "2"]


def metric(srv, series):
    _, _, raw = http_request("GET", srv.url + "/metrics", timeout=10)
    m = re.search(r"^%s (\S+)$" % re.escape(series), raw.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def param(err):
    """The field a native error names (error.details.param)."""
    return (err.get("details") or {}).get("param")


def end(n):
    return {"type": "end", "finish_reason": "stop",
            "usage": {"prompt_tokens": 2, "completion_tokens": n}}


class EventsBatch(harness.TestCase):

    def batch(self, srv, agent, jobs, **extra):
        body = dict({"agent_id": agent.agent_id, "jobs": jobs}, **extra)
        return http_json("POST", srv.url + "/agents/events", body, timeout=30)

    def task(self, srv):
        st, _, b = http_json("POST", srv.url + "/v2/tasks",
                             {"model": "m1", "prompt": "hello", "max_tokens": 8}, timeout=30)
        self.assertIn(st, (200, 202), b)
        return b["job_id"]

    def task_text(self, srv, tid):
        def done():
            st, _, t = http_json("GET", srv.url + "/v2/tasks/" + tid, timeout=10)
            return t if t.get("status") in ("done", "failed", "cancelled") else None
        return harness.wait_until(done, timeout=30, what="task " + tid)

    def test_entries_are_judged_alone(self):
        srv = self.h.start_server(FAST)
        a = FakeAgent(srv.url, slots=4)
        st, reply = a.poll()
        self.assertEqual(st, 200)
        self.assertIn("events_batch", reply["features"])
        tids = [self.task(srv) for _ in range(4)]
        st, jobs = a.work(4, timeout=10)
        self.assertEqual(st, 200)
        got = sorted(j["job_id"] for j in jobs)
        self.assertEqual(got, sorted(tids))
        j1, j2, j3, j4 = got
        other = FakeAgent(srv.url)
        self.assertEqual(other.poll()[0], 200)

        st, _, b = self.batch(srv, a, [
            {"job_id": j1, "seq": 0, "events": [{"type": "started"},
                                                 {"type": "token", "text": "A1"}]},
            {"job_id": j2, "seq": 0, "events": [{"type": "token", "text": "B"},
                                                 {"type": "token", "text": 5}]},
            {"job_id": j3, "seq": 7, "events": [{"type": "token", "text": "C"}]},
            {"job_id": "job_000000000000000000000000", "seq": 0,
             "events": [{"type": "token", "text": "x"}]},
            {"seq": 0, "events": []},
        ])
        self.assertEqual(st, 200, b)
        res = b["jobs"]
        self.assertEqual([e.get("status") for e in res], [200, 400, 409, 404, 400])
        self.assertEqual(res[0], {"job_id": j1, "status": 200, "cancel": False})
        self.assertEqual(res[1]["error"]["code"], "INVALID_EVENT")
        self.assertEqual(param(res[1]["error"]), "events[1].text")
        self.assertEqual(res[2]["error"]["code"], "SEQ_GAP")
        self.assertEqual(res[2]["error"]["details"], {"expected_seq": 0})
        self.assertEqual(res[3]["error"]["code"], "JOB_NOT_FOUND")
        self.assertEqual(param(res[4]["error"]), "job_id")

        # Another agent cannot upload for these jobs, batched or not.
        st, _, b = self.batch(srv, other, [{"job_id": j4, "seq": 0,
                                            "events": [{"type": "token", "text": "no"}]}])
        self.assertEqual((st, b["jobs"][0]["status"], b["jobs"][0]["error"]["code"]),
                         (200, 409, "NOT_ASSIGNED"), b)

        # The rest: j1's second half plus a retry of its first (applied
        # once), j2 from seq 0 (nothing of the refused entry was applied),
        # j3 and j4 in full.
        st, _, b = self.batch(srv, a, [
            {"job_id": j1, "seq": 0, "events": [{"type": "started"},
                                                 {"type": "token", "text": "A1"},
                                                 {"type": "token", "text": "A2"}, end(2)]},
            {"job_id": j2, "seq": 0, "events": [{"type": "token", "text": "B1"}, end(1)]},
            {"job_id": j3, "seq": 0, "events": [{"type": "token", "text": "C1"}, end(1)]},
            {"job_id": j4, "seq": 0, "events": [{"type": "token", "text": "D1"}, end(1)]},
        ])
        self.assertEqual(st, 200, b)
        self.assertEqual([e["status"] for e in b["jobs"]], [200] * 4, b)
        texts = {tid: self.task_text(srv, tid)["result"]["text"] for tid in tids}
        self.assertEqual(sorted(texts.values()), ["A1A2", "B1", "C1", "D1"])
        self.assertGreaterEqual(metric(srv, 'gpupool_agent_uploads_total{route="batch"}'), 3)
        self.assertEqual(metric(srv, 'gpupool_agent_upload_entries_total{route="batch"}'), 10)

    def test_cancel_and_bad_requests(self):
        srv = self.h.start_server(FAST)
        a = FakeAgent(srv.url, slots=2)
        self.assertEqual(a.poll()[0], 200)
        tid = self.task(srv)
        st, jobs = a.work(2, timeout=10)
        self.assertEqual(st, 200)
        st, _, _ = http_json("DELETE", srv.url + "/v2/tasks/" + tid, timeout=10)
        self.assertIn(st, (200, 202))
        st, _, b = self.batch(srv, a, [{"job_id": tid, "seq": 0,
                                        "events": [{"type": "token", "text": "late"}]}])
        self.assertEqual(st, 200, b)
        self.assertTrue(b["jobs"][0].get("cancel") or b["jobs"][0]["status"] != 200, b)
        for body, want in (({"agent_id": "nope", "jobs": [{}]}, "agent_id"),
                            ({"agent_id": a.agent_id, "jobs": []}, "jobs"),
                            ({"agent_id": a.agent_id, "jobs": {"x": 1}}, "jobs"),
                            ({"agent_id": a.agent_id,
                              "jobs": [{"job_id": "j", "seq": 0, "events": []}] * 1025}, "jobs")):
            st, _, b = http_json("POST", srv.url + "/agents/events", body, timeout=30)
            self.assertEqual((st, param(b["error"])), (400, want), b)
        st, _, b = http_json("POST", srv.url + "/agents/events", "{not json", timeout=30)
        self.assertEqual(st, 400, b)

    def test_instance_in_a_batch(self):
        """A batch's "instance" is the process's liveness, as on any request:
        a bad one is a 400 naming it, the same one applies the entries, a
        new one ends the previous process's jobs first (its entry is then
        not this agent's: 409 NOT_ASSIGNED)."""
        srv = self.h.start_server(FAST)
        a = FakeAgent(srv.url, slots=2)
        self.assertEqual(a.poll()[0], 200)
        tid = self.task(srv)
        st, jobs = a.work(2, timeout=10)
        self.assertEqual((st, [j["job_id"] for j in jobs]), (200, [tid]))
        tok = [{"job_id": tid, "seq": 0, "events": [{"type": "token", "text": "x"}]}]
        for bad in ("short", "has space in it"):
            st, _, b = self.batch(srv, a, tok, instance=bad)
            self.assertEqual((st, param(b["error"])), (400, "instance"), b)
        st, _, b = self.batch(srv, a, tok, instance="process-one")
        self.assertEqual((st, b["jobs"][0]["status"]), (200, 200), b)
        st, _, b = self.batch(srv, a, [{"job_id": tid, "seq": 1,
                                        "events": [{"type": "token", "text": "y"}]}],
                              instance="process-one")
        self.assertEqual((st, b["jobs"][0]["status"]), (200, 200), b)
        # A new process: the old one's job is no longer this agent's.
        st, _, b = self.batch(srv, a, [{"job_id": tid, "seq": 2,
                                        "events": [{"type": "token", "text": "z"}]}],
                              instance="process-two")
        self.assertEqual((st, b["jobs"][0]["status"], b["jobs"][0]["error"]["code"]),
                         (200, 409, "NOT_ASSIGNED"), b)

    def test_agent_key_bound_to_another_agent(self):
        db = self.h.path("keys.db")
        k1 = self.h.create_key(db, "agent", "k1")
        k2 = self.h.create_key(db, "agent", "k2")
        srv = self.h.start_server(FAST, db=db)
        a = FakeAgent(srv.url, key=k1)
        self.assertEqual(a.poll()[0], 200)
        b_agent = FakeAgent(srv.url, key=k2)
        self.assertEqual(b_agent.poll()[0], 200)
        # k2 is bound to b_agent: it may not upload as a.
        st, _, b = http_json("POST", srv.url + "/agents/events",
                             {"agent_id": a.agent_id,
                              "jobs": [{"job_id": "job_x", "seq": 0, "events": []}]},
                             headers={"Authorization": "Bearer " + k2}, timeout=30)
        self.assertEqual(st, 403, b)

    def run_streams(self, agent_args):
        srv = self.h.start_server(FAST)
        up = self.h.start_upstream(["--tokens", "20", "--pace-ms", "10"])
        self.h.start_agent(srv, upstream=up, model="m1", slots=4, args=agent_args)
        srv.wait_model("m1")
        prompts = ["story number %d of the pool" % i for i in range(4)]
        out = [None] * 4

        def one(i):
            st, _, raw = http_request("POST", srv.url + "/v1/chat/completions",
                                      {"model": "m1", "stream": True,
                                       "messages": [{"role": "user", "content": prompts[i]}]},
                                      timeout=60)
            evs = harness.sse_data_json(harness.parse_sse(raw))
            out[i] = (st, "".join((c.get("delta") or {}).get("content") or ""
                                  for e in evs for c in e.get("choices") or []))
        ts = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(90)
        for i in range(4):
            self.assertEqual(out[i], (200, "".join(upstream_mod.expected_tokens(prompts[i], 20))))
        return (metric(srv, 'gpupool_agent_uploads_total{route="batch"}'),
                metric(srv, 'gpupool_agent_uploads_total{route="job"}'))

    def test_real_agent_batches(self):
        batch, job = self.run_streams([])
        self.assertGreater(batch, 0)
        self.assertEqual(job, 0)

    def test_real_agent_without_batches(self):
        batch, job = self.run_streams(["--events-batch=false"])
        self.assertEqual(batch, 0)
        self.assertGreater(job, 0)


if __name__ == "__main__":
    harness.main()
