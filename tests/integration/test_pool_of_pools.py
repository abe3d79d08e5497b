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
        self.inner = self.h.start_server(["--poll_interval_sec", "1"], name="inner")
        self.h.start_agent(self.inner, slots=2, alias="tiny",
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
        # Both endpoints were tried once; the next count goes straight to them
        # again (the agent remembers only a method that answered).
        paths = [r["path"] for r in up.log_entries()]
        self.assertEqual(paths, ["/v1/messages/count_tokens", "/tokenize"])


if __name__ == "__main__":
    harness.main()
