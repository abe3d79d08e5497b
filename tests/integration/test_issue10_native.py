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
import threading
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


def in_thread(fn, *a, **kw):
    box = {}

    def run():
        try:
            box["v"] = fn(*a, **kw)
        except BaseException as e:  # noqa: BLE001 - re-raised by get()
            box["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()

    def get(timeout=30):
        t.join(timeout)
        if t.is_alive():
            raise AssertionError("thread did not finish in %ss" % timeout)
        if "e" in box:
            raise box["e"]
        return box["v"]
    return get


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
            if line.startswith(name + "{") and all(l in line for l in labels):
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
        s = in_thread(lambda: harness.SSEStream(
            "POST", self.srv.url + "/v1/messages",
            {"model": "m1", "max_tokens": 50, "stream": True, "stop_sequences": ["XYZW"],
             "messages": [{"role": "user", "content": "hi"}]}).events())
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


if __name__ == "__main__":
    harness.main()
