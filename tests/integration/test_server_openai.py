"""gpupool-server, OpenAI dialect: a real server process on 127.0.0.1:0
(--port-file) with a real SQLite file, and fake agents (server_fakes.py)
that speak the agent protocol directly.

Covers: non-streaming and streaming completions and chat (chunk shapes,
usage chunk, [DONE]), validation errors (400 with the field named), 404
unknown model / route, 405, 413, 429 queue full, 503 no agent, /v1/models,
/health, /metrics, X-Correlation-Id.
"""

import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402



in_thread = harness.in_thread


CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


class ServerOpenAI(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def start(self, *args):
        self.srv = self.h.start_server(list(args))
        return self.srv

    def agent(self, models=("m1",), slots=1):
        a = FakeAgent(self.srv.url, models=models, slots=slots)
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        self.assertEqual(body["state"], "healthy")
        return a

    def post(self, path, body, headers=None, timeout=30):
        return harness.post_json(self.srv.url, path, body, headers, timeout)

    # ------------------------------------------------------------------
    def test_tools_dropped_without_tool_support(self):
        # A fake agent whose model facts do not say supports_tools: the
        # request is served without its tools and a warning says so.
        self.start()
        a = self.agent()
        self.srv.wait_model("m1")
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        get = in_thread(self.post, "/v1/chat/completions", dict(CHAT, tools=tools,
                                                                   tool_choice="auto"))
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(st, 200)
        self.assertNotIn("tools", jobs[0])
        self.assertNotIn("tool_choice", jobs[0])
        a.run_job(jobs[0], tokens=["ok"])
        st, _, body = get()
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["message"]["content"], "ok")
        self.assertIn("tools were ignored", " ".join(body["x_pool_meta"]["warnings"]))
        # streamed: the last chunk's x_pool_meta says so
        get = in_thread(harness.http_request, "POST", self.srv.url + "/v1/chat/completions",
                        dict(CHAT, tools=tools, stream=True))
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(st, 200)
        self.assertNotIn("tools", jobs[0])
        a.run_job(jobs[0], tokens=["ok"])
        st, _, raw = get()
        self.assertEqual(st, 200, raw)
        chunks = harness.sse_data_json(harness.parse_sse(raw))
        metas = [c["x_pool_meta"] for c in chunks if "x_pool_meta" in c]
        self.assertEqual(len(metas), 1)
        self.assertIn("tools were ignored", " ".join(metas[0]["warnings"]))

    def test_nonstreaming_chat_and_completion(self):
        self.start()
        a = self.agent()
        self.srv.wait_model("m1")
        get = in_thread(self.post, "/v1/chat/completions", CHAT,
                        {"X-Correlation-Id": "corr-test-1"})
        st, jobs = a.work(1, timeout=10)
        self.assertEqual(st, 200)
        self.assertEqual(len(jobs), 1)
        job = jobs[0]
        self.assertEqual(job["kind"], "chat")
        self.assertEqual(job["messages"], [{"role": "user", "content": "hi"}])
        self.assertEqual(job["correlation_id"], "corr-test-1")
        self.assertEqual(job["continuation"], "")
        self.assertEqual(job["attempt"], 1)
        st, body = a.run_job(job, tokens=["Hel", "lo"])
        self.assertEqual((st, body), (200, {"cancel": False}))
        st, hdr, body = get()
        self.assertEqual(st, 200, body)
        self.assertEqual(hdr["x-correlation-id"], "corr-test-1")
        self.assertEqual(hdr["x-pool-agent"], a.agent_id)
        self.assertIn("x-pool-queue-ms", hdr)
        self.assertEqual(body["object"], "chat.completion")
        self.assertTrue(body["id"].startswith("chatcmpl-"))
        self.assertIsInstance(body["created"], int)
        self.assertEqual(body["choices"][0]["message"], {"role": "assistant", "content": "Hello",
                                                         "refusal": None})
        self.assertEqual(body["choices"][0]["finish_reason"], "stop")
        self.assertEqual(body["usage"], {"prompt_tokens": 3, "completion_tokens": 2,
                                         "total_tokens": 5})
        meta = body["x_pool_meta"]
        self.assertEqual(meta["agent_id"], a.agent_id)
        self.assertEqual(meta["attempts"], 1)
        self.assertGreaterEqual(meta["queue_ms"], 0)
        self.assertGreaterEqual(meta["inference_ms"], 0)

        # completion with sampling params that must reach the agent
        get = in_thread(self.post, "/v1/completions",
                        {"model": "m1", "prompt": "Once", "max_tokens": 7, "temperature": 0.5,
                         "top_p": 0.9, "stop": ["\n", "END"], "seed": 42, "user": "u1"})
        st, jobs = a.work(1, timeout=10)
        job = jobs[0]
        self.assertEqual(job["kind"], "completion")
        self.assertEqual(job["prompt"], "Once")
        p = job["params"]
        self.assertEqual((p["max_tokens"], p["temperature"], p["top_p"], p["stop"], p["seed"]),
                         (7, 0.5, 0.9, ["\n", "END"], 42))
        a.run_job(job, tokens=[" upon", " a"], finish="length")
        st, hdr, body = get()
        self.assertEqual(st, 200, body)
        self.assertEqual(body["object"], "text_completion")
        self.assertEqual(body["choices"][0]["text"], " upon a")
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(len(hdr["x-correlation-id"]), 32)  # generated

    def test_streaming_chat_with_usage(self):
        self.start()
        a = self.agent()

        def client():
            with harness.SSEStream("POST", self.srv.url + "/v1/chat/completions",
                                   dict(CHAT, stream=True,
                                        stream_options={"include_usage": True})) as s:
                return s.status, s.headers, s.events()
        get = in_thread(client)
        st, jobs = a.work(1, timeout=10)
        a.run_job(jobs[0], tokens=["A", "B", "C"])
        st, hdr, events = get()
        self.assertEqual(st, 200)
        self.assertTrue(hdr["content-type"].startswith("text/event-stream"))
        self.assertEqual(events[-1]["data"], "[DONE]")
        chunks = harness.sse_data_json(events)
        for c in chunks:
            self.assertIn("choices", c)            # every chunk has choices
            self.assertEqual(c["object"], "chat.completion.chunk")
            self.assertEqual(c["id"], chunks[0]["id"])
            self.assertEqual(c["created"], chunks[0]["created"])
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        text = "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in chunks if c["choices"])
        self.assertEqual(text, "ABC")
        finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        self.assertEqual(len(finals), 1)
        self.assertEqual(finals[0]["choices"][0]["finish_reason"], "stop")
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 3)
        self.assertEqual(chunks[-1]["usage"]["total_tokens"], 6)

    def test_streaming_completion_without_usage(self):
        self.start()
        a = self.agent()

        def client():
            with harness.SSEStream("POST", self.srv.url + "/v1/completions",
                                   {"model": "m1", "prompt": "x", "stream": True}) as s:
                return s.status, s.events()
        get = in_thread(client)
        st, jobs = a.work(1, timeout=10)
        a.run_job(jobs[0], tokens=["one", " two"], finish="length")
        st, events = get()
        self.assertEqual(st, 200)
        self.assertEqual(events[-1]["data"], "[DONE]")
        chunks = harness.sse_data_json(events)
        self.assertTrue(all(c["object"] == "text_completion" for c in chunks))
        self.assertTrue(all(len(c["choices"]) == 1 for c in chunks))
        self.assertTrue(all("usage" not in c for c in chunks))
        self.assertEqual("".join(c["choices"][0]["text"] for c in chunks), "one two")
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")

    def test_agent_error_mid_stream_is_error_chunk(self):
        self.start()
        a = self.agent()

        def client():
            with harness.SSEStream("POST", self.srv.url + "/v1/chat/completions",
                                   dict(CHAT, stream=True)) as s:
                return s.status, s.events()
        get = in_thread(client)
        st, jobs = a.work(1, timeout=10)
        jid = jobs[0]["job_id"]
        a.events(jid, [{"type": "started"}, {"type": "token", "text": "x"}])
        a.events(jid, [{"type": "error", "code": "ENGINE_FAILED", "message": "boom"}])
        st, events = get()
        self.assertEqual(st, 200)
        last = json.loads(events[-1]["data"])
        self.assertEqual(last["error"]["code"], "engine_failed")
        self.assertEqual(last["error"]["message"], "boom")

    def test_agent_error_before_output_is_http_error(self):
        self.start()
        a = self.agent()
        get = in_thread(self.post, "/v1/chat/completions", dict(CHAT, stream=True))
        st, jobs = a.work(1, timeout=10)
        a.events(jobs[0]["job_id"], [{"type": "error", "code": "OOM", "message": "no memory"}])
        st, hdr, body = get()
        self.assertEqual(st, 502)
        self.assertEqual(body["error"]["code"], "oom")

    # ------------------------------------------------------------------
    def test_validation_errors(self):
        self.start()
        self.agent()
        cases = [
            ("/v1/chat/completions", {"messages": CHAT["messages"]}, "model"),
            ("/v1/chat/completions", {"model": 5, "messages": CHAT["messages"]}, "model"),
            ("/v1/chat/completions", {"model": "m1"}, "messages"),
            ("/v1/chat/completions", {"model": "m1", "messages": []}, "messages"),
            ("/v1/chat/completions", {"model": "m1", "messages": "hi"}, "messages"),
            ("/v1/chat/completions", {"model": "m1", "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
            ("/v1/chat/completions", {"model": "m1", "messages": [{"role": "user"}]}, "messages"),
            ("/v1/chat/completions", dict(CHAT, temperature=2.5), "temperature"),
            ("/v1/chat/completions", dict(CHAT, temperature="hot"), "temperature"),
            ("/v1/chat/completions", dict(CHAT, top_p=1.5), "top_p"),
            ("/v1/chat/completions", dict(CHAT, max_tokens=0), "max_tokens"),
            ("/v1/chat/completions", dict(CHAT, max_tokens=1.5), "max_tokens"),
            ("/v1/chat/completions", dict(CHAT, stop=["a", "b", "c", "d", "e"]), "stop"),
            ("/v1/chat/completions", dict(CHAT, stop=7), "stop"),
            ("/v1/chat/completions", dict(CHAT, n=2), "n"),
            ("/v1/chat/completions", dict(CHAT, stream="yes"), "stream"),
            ("/v1/chat/completions", dict(CHAT, seed="x"), "seed"),
            ("/v1/chat/completions", dict(CHAT, stream_options={"include_usage": True}), "stream_options"),
            ("/v1/completions", {"model": "m1"}, "prompt"),
            ("/v1/completions", {"model": "m1", "prompt": [1, 2, 3]}, "prompt"),
            ("/v1/completions", {"model": "m1", "prompt": "x", "echo": True}, "echo"),
        ]
        for path, body, param in cases:
            with self.subTest(body=body):
                st, hdr, b = self.post(path, body)
                self.assertEqual(st, 400, b)
                self.assertEqual(b["error"]["type"], "invalid_request_error")
                self.assertEqual(b["error"]["param"], param)
                self.assertTrue(b["error"]["message"])
        for raw in (b"{not json", b"[1,2]", b""):
            st, hdr, b = harness.http_json("POST", self.srv.url + "/v1/chat/completions", raw,
                                           {"Content-Type": "application/json"})
            self.assertEqual(st, 400, b)
            self.assertIn("error", b)

    def test_not_found_method_and_body_limit(self):
        self.start("--max_body_bytes", "2048")
        self.agent()
        st, hdr, b = self.post("/v1/chat/completions", dict(CHAT, model="nope"))
        self.assertEqual(st, 404)
        self.assertEqual(b["error"]["code"], "model_not_found")
        self.assertEqual(b["error"]["param"], "model")
        st, hdr, b = harness.http_json("GET", self.srv.url + "/v1/unknown")
        self.assertEqual(st, 404)
        self.assertEqual(b["error"]["type"], "invalid_request_error")   # OpenAI shape
        st, hdr, b = harness.http_json("GET", self.srv.url + "/nowhere")
        self.assertEqual(st, 404)
        self.assertEqual(b["error"]["code"], "NOT_FOUND")                # native shape
        st, hdr, b = harness.http_json("GET", self.srv.url + "/v1/chat/completions")
        self.assertEqual(st, 405)
        self.assertEqual(b["error"]["code"], "method_not_allowed")
        self.assertIn("POST", hdr["allow"])
        st, hdr, b = harness.http_json("DELETE", self.srv.url + "/agents/poll")
        self.assertEqual(st, 405)
        self.assertEqual(b["error"]["code"], "METHOD_NOT_ALLOWED")
        big = dict(CHAT, messages=[{"role": "user", "content": "x" * 3000}])
        st, hdr, b = self.post("/v1/chat/completions", big)
        self.assertEqual(st, 413)
        self.assertEqual(b["error"]["code"], "body_too_large")
        # every response carries a correlation id
        self.assertTrue(hdr["x-correlation-id"])

    def test_503_without_live_agent(self):
        self.start("--poll_interval_sec", "1", "--agent_timeout_sec", "2")
        a = self.agent()
        self.srv.wait_model("m1")
        # the agent stops polling: suspect after ~1 s, dead after 2 s
        harness.wait_until(lambda: "m1" not in self.srv.models(), timeout=15,
                           what="model m1 gone after agent expiry")
        st, hdr, b = self.post("/v1/chat/completions", CHAT)
        self.assertEqual(st, 503, b)
        self.assertGreaterEqual(int(hdr["retry-after"]), 1)
        self.assertGreaterEqual(b["error"]["retry_after_sec"], 1)
        self.assertEqual(b["error"]["code"], "no_agent")
        del a

    def test_429_queue_full(self):
        self.start("--max_queue", "1")
        a = self.agent()
        # The agent has no parked long-poll: the first request waits in the queue.
        get = in_thread(self.post, "/v1/chat/completions", CHAT)
        harness.wait_until(lambda: 'gpupool_queue_depth{model="m1",priority="interactive"} 1'
                           in harness.http_request("GET", self.srv.url + "/metrics")[2].decode(),
                           timeout=10, what="one job queued")
        st, hdr, b = self.post("/v1/chat/completions", CHAT)
        self.assertEqual(st, 429, b)
        self.assertGreaterEqual(int(hdr["retry-after"]), 1)
        self.assertEqual(b["error"]["type"], "rate_limit_error")
        # the queued one is served once the agent asks for work
        st, jobs = a.work(1, timeout=10)
        a.run_job(jobs[0])
        st, hdr, b = get()
        self.assertEqual(st, 200, b)

    def test_models_health_metrics(self):
        self.start()
        self.agent(models=("alpha", "beta"))
        st, hdr, b = harness.http_json("GET", self.srv.url + "/v1/models")
        self.assertEqual(st, 200)
        self.assertEqual(b["object"], "list")
        ids = [m["id"] for m in b["data"]]
        self.assertEqual(ids, ["alpha", "beta"])
        for m in b["data"]:
            self.assertEqual(m["object"], "model")
            self.assertEqual(m["type"], "model")
            self.assertEqual(m["display_name"], m["id"])
            self.assertIsInstance(m["created"], int)
            self.assertTrue(m["created_at"].endswith("Z"))
            self.assertTrue(m["owned_by"])
        self.assertEqual((b["has_more"], b["first_id"], b["last_id"]), (False, "alpha", "beta"))
        st, hdr, b = harness.http_json("GET", self.srv.url + "/health")
        self.assertEqual(st, 200)
        self.assertEqual((b["status"], b["db"]), ("ok", "ok"))
        st, hdr, raw = harness.http_request("GET", self.srv.url + "/metrics")
        self.assertEqual(st, 200)
        text = raw.decode()
        for name in ("gpupool_requests_total", "gpupool_request_duration_seconds",
                     "gpupool_time_to_first_token_seconds", "gpupool_tokens_generated_total",
                     "gpupool_queue_depth", "gpupool_agents", "gpupool_slots_busy",
                     "gpupool_slots_capacity", "gpupool_failovers_total",
                     "gpupool_auth_failures_total"):
            self.assertIn("# TYPE " + name + " ", text)
        self.assertIn('gpupool_agents{state="healthy"} 1', text)
        self.assertIn("gpupool_slots_capacity 1", text)


if __name__ == "__main__":
    harness.main()
