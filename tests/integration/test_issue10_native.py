"""Issue 10 (items 1, 5, 6, 7, 8): exact replies after a requeue, native
event ids that mean one thing forever, usage and outcome counts.

A real gpupool-server with scripted fake agents (server_fakes.py) that speak
the agent protocol directly, so each test decides exactly what each attempt
sends and when it ends. An attempt is ended at once by the agent's next poll
carrying a new `instance` (docs/protocol.md "Liveness": the agent restarted),
so nothing here waits on a stall timer.

- item 1: a non-streaming reply whose first attempt sent text the client never
  saw, then was requeued: the body holds exactly the second attempt's text
  (Anthropic and OpenAI); a native task (whose events went out) continues.
- item 5: Last-Event-ID beyond the current end gets only later ids.
- item 6: kill -9 of the server while a native task streams, k events after
  the client's last read: every id the client holds replays byte-identical,
  the resume gets exactly the rest, the text equals an uninterrupted run.
- item 7: usage after a continuation reports the client's prompt.
- item 8: requests_total counts a native task's outcome once, when it ends.
"""

import json
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402


class Agent(FakeAgent):
    """A fake agent that reports a liveness instance (restart() ends every
    attempt the server assigned to it)."""

    def __init__(self, url, **kw):
        super().__init__(url, **kw)
        self.instance = "inst%08d" % 1
        self.n_inst = 1

    def poll_body(self, **kw):
        b = super().poll_body(**kw)
        b["instance"] = self.instance
        return b

    def restart(self):
        """A new process on the same agent id: its attempts end at once."""
        self.n_inst += 1
        self.instance = "inst%08d" % self.n_inst
        st, body = self.poll()
        assert st == 200, (st, body)



in_thread = harness.in_thread


def tok(text):
    return {"type": "token", "text": text}


def end(n, prompt=7):
    return {"type": "end", "finish_reason": "stop",
            "usage": {"prompt_tokens": prompt, "completion_tokens": n}}


class Issue10(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def server(self, args=(), db=None, port=0):
        self.srv = self.h.start_server(list(args), db=db, port=port)
        return self.srv

    def agents(self, model="m1"):
        a = Agent(self.srv.url, models=(model,))
        b = Agent(self.srv.url, models=(model,))
        for x in (a, b):
            st, body = x.poll()
            self.assertEqual(st, 200, body)
        return a, b

    def take(self, agent, timeout=15):
        st, jobs = agent.work(1, timeout=timeout)
        self.assertEqual(st, 200)
        self.assertEqual(len(jobs), 1, jobs)
        return jobs[0]

    def metric(self, name, labels):
        st, _, body = harness.http_request("GET", self.srv.url + "/metrics")
        self.assertEqual(st, 200)
        total = 0.0
        for line in body.decode().splitlines():
            if (line.startswith(name + "{") or line.startswith(name + " ")) and \
                    all(l in line for l in labels):
                total += float(line.rsplit(" ", 1)[1])
        return total

    # -- item 1 -------------------------------------------------------------
    def requeue_nonstream(self, path, body):
        """A sends text that never reaches the (non-streaming) client and
        is lost; B serves the requeued job. Returns (status, reply)."""
        self.server()
        a, b = self.agents()
        reply = in_thread(lambda: harness.http_json("POST", self.srv.url + path, body)[::2])
        job = self.take(a)
        a.events(job["job_id"], [{"type": "started"}, tok("partial "), tok("text of A")])
        a.restart()
        job_b = self.take(b)
        self.assertEqual(job_b["job_id"], job["job_id"])
        # A requeue, not a continuation: B is asked for the whole answer.
        self.assertFalse(job_b.get("continuation"), job_b)
        b.events(job["job_id"], [{"type": "started"}, tok("the full "), tok("answer of B"),
                                 end(2)])
        return reply()

    def test_item1_anthropic_nonstream_requeue_is_exact(self):
        st, body = self.requeue_nonstream(
            "/v1/messages", {"model": "m1", "max_tokens": 50, "stream": False,
                             "messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(st, 200, body)
        texts = [c["text"] for c in body["content"] if c["type"] == "text"]
        self.assertEqual(texts, ["the full answer of B"])
        self.assertEqual(body["x_pool_meta"]["attempts"], 2)

    def test_item1_anthropic_stop_holdback_requeue_is_exact(self):
        # Streaming with a stop sequence: A's text is held back (it could
        # be the start of the stop sequence) when A is lost, so the client
        # saw nothing and the job is requeued: the held text must not be
        # emitted in front of B's.
        self.server()
        a, b = self.agents()
        def read_all():
            with harness.SSEStream(
                    "POST", self.srv.url + "/v1/messages",
                    {"model": "m1", "max_tokens": 50, "stream": True,
                     "stop_sequences": ["XYZW"],
                     "messages": [{"role": "user", "content": "hi"}]}) as st:
                return st.events()
        s = in_thread(read_all)
        job = self.take(a)
        a.events(job["job_id"], [{"type": "started"}, tok("XY")])
        a.restart()
        self.take(b)
        b.events(job["job_id"], [{"type": "started"}, tok("B says"), end(1)])
        evs = s()
        text = "".join(json.loads(e["data"])["delta"].get("text", "")
                       for e in evs if e["event"] == "content_block_delta")
        self.assertEqual(text, "B says")

    def test_item1_openai_nonstream_requeue_is_exact(self):
        st, body = self.requeue_nonstream(
            "/v1/chat/completions", {"model": "m1", "max_tokens": 50,
                                     "messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["message"]["content"], "the full answer of B")

    def test_item1_native_result_after_continuation(self):
        # Native events go out as they come, so the lost attempt's tokens
        # were the client's: the job continues and the result is every
        # token event's text in order, once.
        self.server()
        a, b = self.agents()
        st, _, t = harness.http_json("POST", self.srv.url + "/v2/tasks",
                                  {"model": "m1", "prompt": "p", "max_tokens": 50})
        self.assertEqual(st, 202, t)
        job = self.take(a)
        a.events(job["job_id"], [{"type": "started"}, tok("partial "), tok("text of A")])
        with harness.SSEStream("GET", self.srv.url + t["events_url"]) as s:
            seen = [s.next_event(timeout=10) for _ in range(4)]  # queued started token token
            self.assertEqual([e["event"] for e in seen][-2:], ["token", "token"])
            a.restart()
            self.take(b)
            b.events(job["job_id"], [{"type": "started"}, tok(" and B"), end(1)])
            evs = seen + s.events()
        toks = "".join(json.loads(e["data"])["text"] for e in evs if e["event"] == "token")
        self.assertEqual(toks, "partial text of A and B")
        st, _, status = harness.http_json("GET", self.srv.url + "/v2/tasks/" + t["job_id"])
        self.assertEqual(status["result"]["text"], toks)

    # -- item 5 -------------------------------------------------------------
    def test_item5_last_event_id_beyond_the_end(self):
        self.server()
        a, _ = self.agents()
        st, _, t = harness.http_json("POST", self.srv.url + "/v2/tasks",
                                     {"model": "m1", "prompt": "p", "max_tokens": 50})
        self.assertEqual(st, 202, t)
        job = self.take(a)
        a.events(job["job_id"], [{"type": "started"}, tok("1"), tok("2")])
        # queued 1, started 2, token 3, token 4: the client says it has 1..6.
        harness.wait_until(lambda: harness.http_json(
            "GET", self.srv.url + "/v2/tasks/" + t["job_id"])[2]["events"] >= 4,
            timeout=10, what="4 events recorded")
        s = harness.SSEStream("GET", self.srv.url + t["events_url"],
                              headers={"Last-Event-ID": "6"}, timeout=15)
        self.assertEqual(s.status, 200)
        a.events(job["job_id"], [tok("3"), tok("4"), tok("5"), end(5)])
        evs = s.events()
        s.close()
        self.assertEqual([int(e["id"]) for e in evs], [7, 8])
        self.assertEqual([e["event"] for e in evs], ["token", "end"])

    # -- item 7 -------------------------------------------------------------
    def continued(self, path, body, read_first):
        """A relays 3 tokens the client reads, then is lost; B continues
        and reports the continuation's prompt (7 + 3). Returns the events."""
        self.server()
        a, b = self.agents()
        box = in_thread(lambda: harness.SSEStream("POST", self.srv.url + path, body, timeout=15))
        job = self.take(a)
        a.events(job["job_id"], [{"type": "started"}, tok("x"), tok("y"), tok("z")])
        s = box()
        self.assertEqual(s.status, 200)
        first = read_first(s)
        a.restart()
        jb = self.take(b)
        self.assertEqual(jb.get("continuation"), "xyz")
        b.events(job["job_id"], [{"type": "started"}, tok("!"), end(1, prompt=10)])
        evs = first + s.events()
        s.close()
        return evs

    def until(self, s, pred, limit=50):
        out = []
        for _ in range(limit):
            e = s.next_event(timeout=10)
            self.assertIsNotNone(e)
            out.append(e)
            if pred(e):
                return out
        self.fail("event not seen")

    def test_item7_usage_after_continuation_counts_the_clients_prompt(self):
        msgs = [{"role": "user", "content": "hi"}]
        # OpenAI
        evs = self.continued("/v1/chat/completions",
                             {"model": "m1", "max_tokens": 50, "stream": True, "messages": msgs,
                              "stream_options": {"include_usage": True}},
                             lambda s: self.until(s, lambda e: "xyz" in e["data"] or
                                                  '"z"' in e["data"]))
        usage = [json.loads(e["data"])["usage"] for e in evs
                 if e["data"] != "[DONE]" and json.loads(e["data"]).get("usage")]
        self.assertEqual(usage[-1]["prompt_tokens"], 7, usage)
        self.assertEqual(usage[-1]["completion_tokens"], 4, usage)
        self.h.cleanup()
        self.h = harness.Harness()
        # Anthropic
        evs = self.continued("/v1/messages",
                             {"model": "m1", "max_tokens": 50, "stream": True, "messages": msgs},
                             lambda s: self.until(s, lambda e: e["event"] == "content_block_delta"
                                                  and '"z"' in e["data"]))
        md = [json.loads(e["data"]) for e in evs if e["event"] == "message_delta"]
        self.assertEqual(md[-1]["usage"]["input_tokens"], 7, md)
        self.assertEqual(md[-1]["usage"]["output_tokens"], 4, md)
        self.h.cleanup()
        self.h = harness.Harness()
        # native
        self.server()
        a, b = self.agents()
        st, _, t = harness.http_json("POST", self.srv.url + "/v2/tasks",
                                     {"model": "m1", "prompt": "p", "max_tokens": 50})
        job = self.take(a)
        a.events(job["job_id"], [{"type": "started"}, tok("x"), tok("y"), tok("z")])
        with harness.SSEStream("GET", self.srv.url + t["events_url"], timeout=15) as s:
            self.until(s, lambda e: e["event"] == "token" and '"z"' in e["data"])
            a.restart()
            self.take(b)
            b.events(job["job_id"], [{"type": "started"}, tok("!"), end(1, prompt=10)])
            evs = s.events()
        self.assertEqual(json.loads(evs[-1]["data"])["usage"],
                         {"prompt_tokens": 7, "completion_tokens": 4})
        st, _, status = harness.http_json("GET", self.srv.url + "/v2/tasks/" + t["job_id"])
        self.assertEqual(status["usage"], {"prompt_tokens": 7, "completion_tokens": 4})

    # -- item 8 -------------------------------------------------------------
    def test_item8_native_outcome_counted_once_at_the_end(self):
        self.server()
        a, _ = self.agents()
        created = []
        for _ in range(2):
            st, _, t = harness.http_json("POST", self.srv.url + "/v2/tasks",
                                         {"model": "m1", "prompt": "p", "max_tokens": 50})
            self.assertEqual(st, 202, t)
            created.append(t["job_id"])
        native = 'api="native"'
        self.assertEqual(self.metric("gpupool_requests_total", [native]), 0)
        self.assertEqual(self.metric("gpupool_tasks_accepted_total", []), 2)
        job = self.take(a)
        a.events(job["job_id"], [{"type": "started"}, tok("hi"), end(1)])
        other = [c for c in created if c != job["job_id"]][0]
        st, _, _ = harness.http_json("DELETE", self.srv.url + "/v2/tasks/" + other)
        self.assertEqual(st, 200)
        harness.wait_until(lambda: self.metric("gpupool_requests_total", [native]) >= 2,
                           timeout=10, what="both outcomes counted")
        self.assertEqual(self.metric("gpupool_requests_total", [native, 'outcome="ok"']), 1)
        self.assertEqual(self.metric("gpupool_requests_total",
                                     [native, 'outcome="cancelled"']), 1)
        self.assertEqual(self.metric("gpupool_requests_total", [native]), 2)
        # Reading the task again counts nothing more.
        for c in created:
            harness.http_request("GET", self.srv.url + "/v2/tasks/%s/events" % c)
        self.assertEqual(self.metric("gpupool_requests_total", [native]), 2)
        self.assertEqual(self.metric("gpupool_request_duration_seconds_count", [native]), 2)


    # -- item 6 -------------------------------------------------------------
    def test_item6_server_kill9_loses_and_reuses_no_event_id(self):
        from test_e2e_failover import ContUpstream, expected  # noqa: E402
        fast = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]
        db = self.h.path("kills.db")
        srv = self.server(fast, db=db)
        ntok = 40
        up = ContUpstream(self.h, "upstream", ["--tokens", str(ntok), "--pace-ms", "60"])
        self.h.procs.append(up)
        self.h.start_agent(srv, upstream=up, model="m1")
        srv.wait_model("m1")
        prompt = "a story told across crashes ::"
        st, _, t = harness.http_json("POST", srv.url + "/v2/tasks",
                                     {"model": "m1", "prompt": prompt, "max_tokens": ntok,
                                      "temperature": 0})
        self.assertEqual(st, 202, t)
        tid = t["job_id"]
        got = {}      # id -> (event, data bytes) as the client received it
        last = 0
        kills = 0
        done = False
        # Kill -9 right after the client read k more events (no wait for
        # the store): what it read must survive whatever the moment.
        for rnd, k in enumerate([3, 5, 2, 7, 4]):
            s = harness.SSEStream("GET", srv.url + "/v2/tasks/%s/events" % tid,
                                  headers={"Last-Event-ID": str(last)}, timeout=90)
            self.assertEqual(s.status, 200)
            for _ in range(k):
                e = s.next_event(timeout=90)
                self.assertIsNotNone(e, "stream ended early in round %d" % rnd)
                self.assertEqual(int(e["id"]), last + 1, "ids of a resume continue at once")
                last = int(e["id"])
                got[last] = (e["event"], e["data"])
                if e["event"] in ("end", "error"):
                    done = True
                    break
            if done:
                s.close()
                break
            port = srv.port
            srv.kill9()
            s.close()
            kills += 1
            srv = self.server(fast, db=db, port=port)
        if not done:
            s = harness.SSEStream("GET", srv.url + "/v2/tasks/%s/events" % tid,
                                  headers={"Last-Event-ID": str(last)}, timeout=90)
            for e in s.events():
                self.assertEqual(int(e["id"]), last + 1)
                last = int(e["id"])
                got[last] = (e["event"], e["data"])
            s.close()
        # The last server's whole replay: every id the client ever got,
        # byte-identical; none missing.
        st, _, data = harness.http_request("GET", srv.url + "/v2/tasks/%s/events" % tid,
                                           timeout=30)
        self.assertEqual(st, 200)
        replay = {int(e["id"]): (e["event"], e["data"]) for e in harness.parse_sse(data.decode())}
        lost = [i for i in got if i not in replay]
        changed = [i for i in got if i in replay and replay[i] != got[i]]
        sys.stderr.write("\nitem 6: %d server kills, %d ids received, %d lost, %d changed\n"
                         % (kills, len(got), len(lost), len(changed)))
        self.assertEqual(lost, [])
        self.assertEqual(changed, [])
        self.assertEqual(sorted(replay), list(range(1, len(replay) + 1)))
        self.assertEqual(sorted(got), sorted(replay))
        self.assertGreaterEqual(kills, 3)
        evs = [got[i] for i in sorted(got)]
        self.assertEqual(evs[-1][0], "end", evs[-1])
        text = "".join(json.loads(d)["text"] for ev, d in evs if ev == "token")
        self.assertEqual(text, expected(prompt, ntok))
        self.assertEqual(json.loads(evs[-1][1])["text"], text)
        restarts = [json.loads(d) for ev, d in evs if ev == "failover"]
        self.assertEqual([r["reason"] for r in restarts], ["SERVER_RESTART"] * kills)


    def test_item6_db_without_job_events_still_streams(self):
        # A custom migrations dir without job_events: no event can become
        # durable, so none is held back waiting for it (they go out at once).
        src = os.environ.get("GPUPOOL_SOURCE_DIR", os.path.dirname(os.path.dirname(
            os.path.dirname(os.path.abspath(__file__)))))
        mig = self.h.path("mig")
        os.mkdir(mig)
        with open(os.path.join(src, "migrations", "0001_init.sql")) as f, \
                open(os.path.join(mig, "0001_init.sql"), "w") as g:
            g.write(f.read())
        self.server(["--migrations_dir", mig])
        a, _ = self.agents()
        st, _, t = harness.http_json("POST", self.srv.url + "/v2/tasks",
                                     {"model": "m1", "prompt": "p", "max_tokens": 5})
        self.assertEqual(st, 202, t)
        job = self.take(a)
        a.events(job["job_id"], [{"type": "started"}, tok("ok"), end(1)])
        st, _, data = harness.http_request("GET", self.srv.url + t["events_url"], timeout=15)
        self.assertEqual(st, 200)
        evs = harness.parse_sse(data.decode())
        self.assertEqual([e["event"] for e in evs], ["queued", "started", "token", "end"])


if __name__ == "__main__":
    harness.main()
