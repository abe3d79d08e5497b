#!/usr/bin/env python3
"""A pool of pools: an outer gpupool-server whose agent's upstream is another
gpupool-server (docs/agent.md "Counting tokens", docs/api.md).

    client -> outer server <- agent (openai backend) -> inner server <- agent (gguf, stories260K)

- every dialect through both tiers, streamed and not (OpenAI completions and
  chat, Anthropic messages, native tasks), with greedy sampling: the text is
  the inner pool's own answer to the same request, byte for byte;
- /v1/messages/count_tokens through the outer pool is the inner pool's exact
  count (the agent uses the inner server's count endpoint), never a 502 and
  not marked as an estimate;
- the client's X-Correlation-Id reaches the inner pool's request log;
- x_pool_options reach the inner pool (the session key and a batch priority,
  passed by the agent as an X-Pool-Options header), from the body or from
  the client's own X-Pool-Options header; a bad header is a 400 in the
  dialect's shape; the outer reply's x_pool_meta.upstream is the inner
  pool's x_pool_meta (its agent, its attempts);
- a failover inside the inner pool is invisible outside it: the outer
  client's stream is whole, with no error and one attempt, and only
  x_pool_meta.upstream says the inner pool used two agents;
- an upstream with neither count endpoint (a plain OpenAI-compatible server,
  tests/integration/upstream.py --no-tokenize) gets a count marked
  `x_pool_meta.estimated`, equal to the documented estimate.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request, parse_sse, sse_data_json  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
MSGS = [{"role": "system", "content": "You tell stories."},
        {"role": "user", "content": "Once upon a time there was a little dog"}]


class PoolOfPools(harness.TestCase):

    def setUp(self):
        super().setUp()
        # (job_submitted, read by inner_job, is a debug line)
        self.inner = self.h.start_server(["--poll_interval_sec", "1", "--log_level", "debug"],
                                         name="inner")
        self.gguf = self.h.start_agent(self.inner, slots=2, alias="tiny",
                           args=["--model", MODEL, "--threads", "1"], name="gguf")
        self.inner.wait_model("tiny")
        self.outer = self.h.start_server(["--poll_interval_sec", "1"], name="outer")
        self.h.start_agent(self.outer, slots=4, name="relay",
                           args=["--upstream", self.inner.url + "/v1", "--upstream-model",
                                 "tiny", "--alias", "tiny"])
        self.outer.wait_model("tiny")

    def post(self, srv, path, body, headers=None):
        return http_json("POST", srv.url + path, body, headers=headers, timeout=120)

    def stream(self, srv, path, body):
        st, _, raw = http_request("POST", srv.url + path, dict(body, stream=True), timeout=120)
        self.assertEqual(st, 200, raw)
        return sse_data_json(parse_sse(raw))

    def both(self, fn):
        """fn(server) through the inner pool directly and through the outer."""
        return fn(self.inner), fn(self.outer)

    def test_openai_both_tiers(self):
        comp = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 12,
                "temperature": 0}
        inner, outer = self.both(lambda s: self.post(s, "/v1/completions", comp))
        self.assertEqual(outer[0], 200, outer[2])
        self.assertEqual(outer[2]["choices"][0]["text"], inner[2]["choices"][0]["text"])
        self.assertEqual(outer[2]["usage"], inner[2]["usage"])

        chat = {"model": "tiny", "messages": MSGS, "max_tokens": 12, "temperature": 0}
        inner, outer = self.both(lambda s: self.post(s, "/v1/chat/completions", chat))
        self.assertEqual(outer[0], 200, outer[2])
        self.assertEqual(outer[2]["choices"][0]["message"]["content"],
                         inner[2]["choices"][0]["message"]["content"])
        self.assertEqual(outer[2]["usage"], inner[2]["usage"])

        def chat_stream(s):
            chunks = self.stream(s, "/v1/chat/completions",
                                 dict(chat, stream_options={"include_usage": True}))
            text = "".join(c["choices"][0]["delta"].get("content") or ""
                           for c in chunks if c.get("choices"))
            return text, [c["usage"] for c in chunks if c.get("usage")][-1]
        inner, outer = self.both(chat_stream)
        self.assertTrue(inner[0])
        self.assertEqual(outer, inner)

        def comp_stream(s):
            chunks = self.stream(s, "/v1/completions", comp)
            return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        inner, outer = self.both(comp_stream)
        self.assertEqual(outer, inner)

    def test_anthropic_both_tiers(self):
        msg = {"model": "tiny", "system": "You tell stories.", "max_tokens": 12,
               "temperature": 0, "messages": MSGS[1:]}
        inner, outer = self.both(lambda s: self.post(s, "/v1/messages", msg))
        self.assertEqual(outer[0], 200, outer[2])
        self.assertEqual(outer[2]["content"], inner[2]["content"])
        self.assertEqual(outer[2]["usage"]["output_tokens"], inner[2]["usage"]["output_tokens"])
        self.assertEqual(outer[2]["usage"]["input_tokens"], inner[2]["usage"]["input_tokens"])
        self.assertGreater(outer[2]["usage"]["input_tokens"], 0)

        def streamed(s):
            evs = self.stream(s, "/v1/messages", msg)
            text = "".join(e["delta"].get("text", "") for e in evs
                           if e.get("type") == "content_block_delta")
            usage = [e["usage"] for e in evs if e.get("type") == "message_delta"][-1]
            self.assertEqual(evs[-1]["type"], "message_stop")
            return text, usage["output_tokens"]
        inner, outer = self.both(streamed)
        self.assertTrue(inner[0])
        self.assertEqual(outer, inner)

        count = {"model": "tiny", "system": "You tell stories.", "messages": MSGS[1:]}
        inner, outer = self.both(lambda s: self.post(s, "/v1/messages/count_tokens", count))
        self.assertEqual(inner[0], 200, inner[2])
        self.assertEqual(outer[0], 200, outer[2])
        self.assertEqual(outer[2], inner[2])  # exact: no x_pool_meta.estimated
        self.assertGreater(outer[2]["input_tokens"], 0)

    def test_native_tasks_and_correlation(self):
        cid = "pool-of-pools-0001"
        st, hdr, b = self.post(self.outer, "/v2/tasks",
                               {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8,
                                "temperature": 0},
                               headers={"X-Correlation-Id": cid})
        self.assertIn(st, (200, 202), b)
        tid = b["job_id"]

        def done():
            s, _, t = http_json("GET", self.outer.url + "/v2/tasks/" + tid, timeout=10)
            return t if s == 200 and t.get("status") in ("done", "failed", "cancelled") else None
        task = harness.wait_until(done, timeout=60, what="task done")
        self.assertEqual(task["status"], "done", task)
        st, _, direct = self.post(self.inner, "/v1/completions",
                                  {"model": "tiny", "prompt": "Once upon a time",
                                   "max_tokens": 8, "temperature": 0})
        self.assertEqual(task["result"]["text"], direct["choices"][0]["text"])
        # The inner pool's request log has the client's correlation id.
        st, _, jobs = http_json("GET", self.inner.url + "/admin/jobs?limit=50", timeout=10)
        self.assertEqual(st, 200, jobs)
        self.assertIn(cid, [j.get("correlation_id") for j in jobs["jobs"]])

    def inner_job(self, cid, kind=None):
        """The inner pool's job of correlation id cid (and kind; by default
        the one that is not a count): its request-log row (priority) and
        its job_submitted log line (session)."""
        st, _, jobs = http_json("GET", self.inner.url + "/admin/jobs?limit=50", timeout=10)
        self.assertEqual(st, 200, jobs)
        mine = [j for j in jobs["jobs"] if j.get("correlation_id") == cid and
                (j["kind"] == kind if kind else j["kind"] != "count_tokens")]
        self.assertEqual(len(mine), 1, jobs)
        sub = [e for e in self.inner.log_events("job_submitted")
               if e.get("job_id") == mine[0]["id"]]
        self.assertEqual(len(sub), 1)
        self.assertEqual(sub[0]["priority"], mine[0]["priority"])
        return dict(mine[0], session=sub[0].get("session"))

    def test_pool_options_and_meta_cross_both_tiers(self):
        gguf_id = [self.gguf.agent_id()]
        chat = {"model": "tiny", "messages": MSGS, "max_tokens": 6, "temperature": 0,
                "x_pool_options": {"session": "conv-7", "priority": "batch"}}
        st, hdr, b = self.post(self.outer, "/v1/chat/completions", chat,
                               headers={"X-Correlation-Id": "tiers-body"})
        self.assertEqual(st, 200, b)
        job = self.inner_job("tiers-body")
        self.assertEqual((job["priority"], job.get("session")), ("batch", "conv-7"), job)
        meta = b["x_pool_meta"]
        self.assertEqual(meta["attempts"], 1)
        self.assertEqual(meta["upstream"]["agent_id"], gguf_id[0])
        self.assertEqual(meta["upstream"]["attempts"], 1)
        self.assertEqual(meta["upstream"]["model"], "tiny")
        self.assertNotEqual(meta["agent_id"], gguf_id[0])

        # The same options as a client header (no body field), streamed, in
        # the Anthropic dialect: the meta rides on message_delta.
        msg = {"model": "tiny", "system": "You tell stories.", "max_tokens": 6,
               "temperature": 0, "messages": MSGS[1:], "stream": True}
        st, _, raw = http_request("POST", self.outer.url + "/v1/messages", msg, timeout=120,
                                  headers={"X-Correlation-Id": "tiers-header",
                                           "X-Pool-Options": json.dumps(
                                               {"session": "conv-8", "priority": "batch"})})
        self.assertEqual(st, 200, raw)
        evs = sse_data_json(parse_sse(raw))
        delta = [e for e in evs if e.get("type") == "message_delta"][-1]
        self.assertEqual(delta["x_pool_meta"]["upstream"]["agent_id"], gguf_id[0])
        job = self.inner_job("tiers-header")
        self.assertEqual((job["priority"], job.get("session")), ("batch", "conv-8"), job)
        # Issue 26 item 4: message_start has the prompt's size, which the
        # outer agent asked the inner pool for (count_tokens, with the
        # inner model's template) before generating: exact.
        count = self.inner_job("tiers-header", kind="count_tokens")
        self.assertEqual(count["session"], "conv-8")
        self.assertLess(count["created_at"], job["created_at"] + 1)
        self.assertEqual(evs[0]["message"]["usage"]["input_tokens"], job["prompt_tokens"])
        self.assertEqual(delta["usage"]["input_tokens"], job["prompt_tokens"])

        # A body key wins over the header's; the header fills the rest.
        st, _, b = self.post(self.outer, "/v1/completions",
                             {"model": "tiny", "prompt": "Once", "max_tokens": 2,
                              "x_pool_options": {"session": "from-body"}},
                             headers={"X-Correlation-Id": "tiers-both",
                                      "X-Pool-Options": '{"session":"hdr","priority":"batch"}'})
        self.assertEqual(st, 200, b)
        job = self.inner_job("tiers-both")
        self.assertEqual((job["priority"], job.get("session")), ("batch", "from-body"), job)

        # A header that is not a JSON object: 400 in each dialect's shape.
        bad = {"X-Pool-Options": "{session: nope"}
        st, _, b = self.post(self.outer, "/v1/chat/completions", chat, headers=bad)
        self.assertEqual(st, 400, b)
        self.assertEqual(b["error"]["param"], "x_pool_options")
        self.assertIn("X-Pool-Options", b["error"]["message"])
        st, _, b = self.post(self.outer, "/v1/messages", dict(msg, stream=False), headers=bad)
        self.assertEqual(st, 400, b)
        self.assertEqual(b["type"], "error")
        self.assertEqual(b["error"]["type"], "invalid_request_error")
        st, _, b = self.post(self.outer, "/v2/tasks", {"model": "tiny", "prompt": "x"},
                             headers={"X-Pool-Options": "[1]"})
        self.assertEqual(st, 400, b)
        self.assertEqual(b["error"]["code"], "INVALID_REQUEST")
        plain = {k: v for k, v in chat.items() if k != "x_pool_options"}
        st, _, b = self.post(self.outer, "/v1/chat/completions", plain,
                             headers={"X-Pool-Options": '{"priority":"urgent"}'})
        self.assertEqual(st, 400, b)
        self.assertEqual(b["error"]["param"], "x_pool_options.priority")

    def test_count_without_endpoints_is_an_estimate(self):
        up = self.h.start_upstream(["--no-tokenize", "--models", "plain"])
        self.h.start_agent(self.outer, upstream=up, model="plain", name="plainagent")
        self.outer.wait_model("plain")
        msgs = [{"role": "user", "content": "12345678"}, {"role": "assistant", "content": "abc"},
                {"role": "user", "content": "hello"}]
        st, _, b = self.post(self.outer, "/v1/messages/count_tokens",
                             {"model": "plain", "messages": msgs})
        self.assertEqual(st, 200, b)
        self.assertEqual(b["x_pool_meta"], {"estimated": True})
        # ceil(UTF-8 bytes of the contents joined by newlines / 4) + 4 per message:
        text = "\n".join(m["content"] for m in msgs)
        self.assertEqual(b["input_tokens"], (len(text.encode()) + 3) // 4 + 4 * len(msgs))
        # Every endpoint was tried once; the next count goes straight to them
        # again (the agent remembers only a method that answered).
        paths = [r["path"] for r in up.log_entries()]
        self.assertEqual(paths, ["/v1/messages/count_tokens", "/apply-template", "/tokenize"])


class InnerFailover(harness.TestCase):
    """client -> outer server <- relay agent -> inner server <- agents A, B
    (openai backends over continuation-aware upstreams). A's upstream sends
    4 tokens and stalls; B joins; A is killed; the inner pool continues the
    reply on B. Outside, nothing happened."""

    def test_inner_failover_is_invisible_outside(self):
        from test_e2e_failover import FAST, N, ContUpstream, expected
        inner = self.h.start_server(FAST, name="inner")
        ua = ContUpstream(self.h, self.h._name("upstream"),
                          ["--tokens", str(N), "--mode", "stall", "--after", "4"])
        self.h.procs.append(ua)
        aa = self.h.start_agent(inner, upstream=ua, model="m1", slots=1, name="inner_a")
        inner.wait_model("m1")
        outer = self.h.start_server(FAST, name="outer")
        self.h.start_agent(outer, slots=2, name="relay",
                           args=["--upstream", inner.url + "/v1", "--upstream-model", "m1",
                                 "--alias", "m1"])
        outer.wait_model("m1")

        prompt = "the lighthouse keeper said ::"
        s = harness.SSEStream("POST", outer.url + "/v1/completions",
                              {"model": "m1", "stream": True, "prompt": prompt,
                               "max_tokens": 40, "stream_options": {"include_usage": True}},
                              timeout=60)
        self.assertEqual(s.status, 200)
        got = []
        while len(got) < 4:
            e = s.next_event(timeout=30)
            self.assertIsNotNone(e)
            d = json.loads(e["data"])
            got += [c["text"] for c in d.get("choices") or [] if c.get("text")]
        # A is stalled holding the job (one slot: it has no long-poll
        # parked). B joins and parks; then A dies.
        ub = ContUpstream(self.h, self.h._name("upstream"), ["--tokens", str(N)])
        self.h.procs.append(ub)
        ab = self.h.start_agent(inner, upstream=ub, model="m1", name="inner_b")
        idb = ab.agent_id()

        def parked():
            _, _, raw = http_request("GET", inner.url + "/metrics", timeout=5)
            return any(line.startswith("gpupool_agents_parked ") and float(line.split()[-1]) >= 1
                       for line in raw.decode().splitlines())
        harness.wait_until(parked, timeout=30, what="agent B parked on the inner pool")
        aa.kill9()

        events = s.events()
        s.close()
        datas = sse_data_json(events)
        self.assertFalse([d for d in datas if "error" in d], datas)
        self.assertEqual(events[-1]["data"], "[DONE]")
        text = "".join(got) + "".join(c.get("text") or "" for d in datas
                                      for c in d.get("choices") or [])
        self.assertEqual(text, expected(prompt))
        self.assertEqual([d["usage"] for d in datas if d.get("usage")][-1]["completion_tokens"], N)
        last = [d for d in datas if any(c.get("finish_reason") for c in d.get("choices") or [])]
        self.assertEqual(len(last), 1)
        self.assertEqual(last[0]["choices"][0]["finish_reason"], "stop")
        meta = last[0]["x_pool_meta"]
        self.assertEqual(meta["attempts"], 1)            # the outer pool saw one attempt
        self.assertNotIn("continuation", meta)
        self.assertEqual(meta["upstream"]["attempts"], 2)  # the inner one used two agents
        self.assertEqual(meta["upstream"]["agent_id"], idb)
        self.assertEqual(meta["upstream"]["continuation"], "text")
        self.assertEqual([e.get("mode") for e in inner.log_events("job_failover")], ["continue"])
        self.assertEqual(outer.log_events("job_failover"), [])


class PoolLoop(harness.TestCase):
    """Issue 25: an agent whose upstream is its own server filled its slots
    and the queue for the whole queue timeout. Every pool appends its id to
    X-Pool-Via; a pool that finds itself there refuses at once (508
    POOL_LOOP), and the client learns of the loop within seconds."""
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN)

    def test_an_agent_looping_back_is_refused_at_once(self):
        srv = self.h.start_server(["--poll_interval_sec", "1", "--request_timeout_sec", "120"])
        self.h.start_agent(srv, slots=1, name="loop",
                           args=["--upstream", srv.url + "/v1", "--upstream-model", "m1",
                                 "--alias", "m1"])
        srv.wait_model("m1")
        st, _, body = http_json("POST", srv.url + "/v1/chat/completions",
                                {"model": "m1", "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
        self.assertGreaterEqual(st, 500, body)
        self.assertIn("loop", json.dumps(body))

    def test_hops_are_bounded_and_a_foreign_chain_passes(self):
        srv = self.h.start_server([])
        chain = ", ".join("%016x" % i for i in range(4))
        st, _, body = http_json("GET", srv.url + "/v1/models", headers={"X-Pool-Via": chain})
        self.assertEqual(st, 508, body)
        self.assertIn("4 pools", body["error"]["message"])
        st, _, body = http_json("GET", srv.url + "/v1/models",
                                headers={"X-Pool-Via": "0123456789abcdef"})
        self.assertEqual(st, 200, body)


if __name__ == "__main__":
    harness.main()
