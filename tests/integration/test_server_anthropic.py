"""gpupool-server, Anthropic Messages dialect: a real server process with fake
agents (server_fakes.py) that speak the agent protocol directly, so each
test controls exactly what the "model" answers and what it reports.

Covers: a recorded Claude Code style request (tests/data/claude_code_request.json,
~77 KB: system blocks with cache_control, 24 tools, thinking, metadata.user_id
holding JSON, a system entry inside messages, stream) answered with a valid
event stream; max_tokens clamped to the context (stream ends with max_tokens);
a prompt longer than the context (400 with both numbers, from the estimate
and from the agent's CONTEXT_OVERFLOW); tools rendered when the model's
template takes them; a mid-stream failure ending with an error event; error
shapes and statuses (400, 404, 405, 413); count_tokens; request-id.
"""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402

SRC = os.environ.get("GPUPOOL_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURE = os.path.join(SRC, "tests", "data", "claude_code_request.json")
CC_HEADERS = {"x-api-key": "sk-anything", "anthropic-version": "2023-06-01",
              "anthropic-beta": "interleaved-thinking-2025-05-14,context-management-2025-06-27"}


class Agent(FakeAgent):
    """A fake agent whose model facts can say context_length / supports_tools."""

    def __init__(self, url, ctx=512, tools=False, **kw):
        super().__init__(url, **kw)
        self.ctx, self.tools = ctx, tools

    def poll_body(self, **kw):
        b = super().poll_body(**kw)
        for m in b["models"]:
            m["context_length"] = self.ctx
            if self.tools:
                m["supports_tools"] = True
        return b



in_thread = harness.in_thread


def msg(content="hi", **kw):
    b = {"model": "claude-pool", "max_tokens": 64, "messages": [{"role": "user", "content": content}]}
    b.update(kw)
    return b


class ServerAnthropic(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def setUp(self):
        super().setUp()
        self.srv = self.h.start_server([])
        self.url = self.srv.url + "/v1/messages"

    def agent(self, **kw):
        a = Agent(self.srv.url, models=("claude-pool",), **kw)
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        return a

    def take_job(self, a):
        """Long-poll until the agent gets exactly one job."""
        st, jobs = a.work(1, timeout=15)
        self.assertEqual(st, 200)
        self.assertEqual(len(jobs), 1)
        return jobs[0]

    def check_stream(self, events):
        """Assert the Anthropic event grammar; return (text, message_start, message_delta)."""
        for e in events:
            self.assertIsNotNone(e["event"], "every event has an event: line: %r" % e)
            self.assertEqual(json.loads(e["data"])["type"], e["event"])
        names = [e["event"] for e in events]
        self.assertEqual(names[:3], ["message_start", "content_block_start", "ping"])
        self.assertEqual(names[-3:], ["content_block_stop", "message_delta", "message_stop"])
        self.assertTrue(all(n == "content_block_delta" for n in names[3:-3]), names)
        start = json.loads(events[0]["data"])["message"]
        self.assertTrue(start["id"].startswith("msg_"))
        self.assertEqual(start["role"], "assistant")
        self.assertEqual(start["content"], [])
        self.assertIn("input_tokens", start["usage"])
        self.assertIn("output_tokens", start["usage"])
        text = "".join(json.loads(e["data"])["delta"]["text"] for e in events[3:-3])
        delta = json.loads(events[-2]["data"])
        self.assertIn("output_tokens", delta["usage"])
        return text, start, delta

    def test_claude_code_request(self):
        with open(FIXTURE, encoding="utf-8") as f:
            raw = f.read()
        body = json.loads(raw)
        self.assertGreater(len(raw), 70000)
        self.assertEqual(len(body["tools"]), 24)
        # A context that forces the 32000 max_tokens down.
        a = self.agent(ctx=20000)
        get = in_thread(harness.http_request, "POST", self.url, raw, dict(CC_HEADERS, **{"Content-Type": "application/json"}))
        job = self.take_job(a)
        # What the agent got: one leading system message with the three system
        # blocks and the in-message system entry; the user text; clamped max_tokens.
        msgs = job["messages"]
        self.assertEqual(msgs[0]["role"], "system")
        self.assertIn("You are a command-line coding assistant.", msgs[0]["content"])
        self.assertIn("# Project notes (CLAUDE.md)", msgs[0]["content"])
        self.assertTrue(msgs[0]["content"].endswith("The user's terminal is 120 columns wide; keep lines short."))
        self.assertNotIn("# Tools", msgs[0]["content"])  # the template takes no tools
        self.assertEqual([m["role"] for m in msgs], ["system", "user"])
        self.assertIn("Summarise what src/server/jobs/jobs.c does", msgs[1]["content"])
        mt = job["params"]["max_tokens"]
        self.assertLess(mt, 20000)
        self.assertGreater(mt, 20000 - len(raw) // 4)
        self.assertEqual(job["user"], body["metadata"]["user_id"])
        # The model fills the rest of its context.
        a.events(job["job_id"], [{"type": "started"}, {"type": "metrics", "prompt_tokens": 9000}])
        for t in ["I", " will", " read", " it"]:
            st, r = a.events(job["job_id"], [{"type": "token", "text": t}])
            self.assertEqual(st, 200)
        a.events(job["job_id"], [{"type": "end", "finish_reason": "length",
                                  "usage": {"prompt_tokens": 9000, "completion_tokens": 4}}])
        st, hdr, data = get()
        self.assertEqual(st, 200, data)
        self.assertTrue(hdr["content-type"].startswith("text/event-stream"))
        self.assertTrue(hdr["request-id"].startswith("req_"))
        events = harness.parse_sse(data)
        text, start, delta = self.check_stream(events)
        self.assertEqual(text, "I will read it")
        self.assertEqual(start["usage"]["input_tokens"], 9000)
        self.assertEqual(delta["delta"]["stop_reason"], "max_tokens")
        self.assertEqual(delta["usage"]["output_tokens"], 4)
        warnings = " | ".join(start["x_pool_meta"]["warnings"])
        for part in ("tools were ignored", "thinking (adaptive)", "'context_management'",
                     "output_config.effort", "max_tokens 32000 was clamped"):
            self.assertIn(part, warnings)

    def test_tools_structured_when_supported(self):
        a = self.agent(ctx=8192, tools=True)
        body = msg("list files", system="S", tools=[
            {"name": "LS", "description": "List a directory",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
            messages=[{"role": "user", "content": "list files"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "LS", "input": {"path": "/"}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "bin etc"}]}])
        get = in_thread(harness.http_json, "POST", self.url, body)
        job = self.take_job(a)
        # The agent takes tools: they and the tool turns go in OpenAI form.
        self.assertEqual(job["tools"], [{"type": "function", "function": {
            "name": "LS", "description": "List a directory",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}])
        self.assertEqual(job["tool_choice"], "auto")
        self.assertEqual(job["messages"], [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "t1", "type": "function",
                 "function": {"name": "LS", "arguments": '{"path":"/"}'}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "bin etc"}])
        # A malformed tool_call event is refused, nothing of the batch applied.
        st, r = a.events(job["job_id"], [{"type": "started"},
                                          {"type": "tool_call", "index": "x"}])
        self.assertEqual(st, 400, r)
        a.events(job["job_id"], [
            {"type": "started"}, {"type": "token", "text": "ok"},
            {"type": "tool_call", "index": 0, "id": "call_9", "name": "LS", "arguments": '{"pa'},
            {"type": "tool_call", "index": 0, "arguments": 'th":"/etc"}'},
            {"type": "end", "finish_reason": "tool_calls",
             "usage": {"prompt_tokens": 5, "completion_tokens": 3}}])
        st, _, r = get()
        self.assertEqual(st, 200, r)
        self.assertEqual(r["content"], [
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "toolu_9", "name": "LS", "input": {"path": "/etc"}}])
        self.assertEqual(r["stop_reason"], "tool_use")
        self.assertEqual(r["x_pool_meta"]["warnings"], [])

    def test_tool_blocks_as_text_without_tool_support(self):
        a = self.agent(ctx=8192)
        body = msg("x", tools=[{"name": "LS", "input_schema": {"type": "object"}}],
                   messages=[{"role": "user", "content": "list files"},
                             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "LS", "input": {"path": "/"}}]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "bin etc"}]}])
        get = in_thread(harness.http_json, "POST", self.url, body)
        job = self.take_job(a)
        self.assertNotIn("tools", job)
        self.assertEqual(job["messages"][1]["content"], '[tool_use id=t1 name=LS] {"path":"/"}')
        self.assertEqual(job["messages"][2]["content"], "[tool_result id=t1]\nbin etc")
        a.run_job(job, tokens=("ok",))
        st, _, r = get()
        self.assertEqual(st, 200, r)
        self.assertIn("tools were ignored", " ".join(r["x_pool_meta"]["warnings"]))

    def test_prompt_longer_than_context(self):
        self.agent(ctx=512)
        st, hdr, r = harness.http_json("POST", self.url, msg("x" * (8 * 600)))
        self.assertEqual(st, 400, r)
        self.assertEqual(r["type"], "error")
        self.assertEqual(r["error"]["type"], "invalid_request_error")
        self.assertIn("at least 600 tokens", r["error"]["message"])
        self.assertIn("512", r["error"]["message"])

    def test_context_overflow_from_agent(self):
        a = self.agent(ctx=512)
        for stream in (False, True):
            get = in_thread(harness.http_request, "POST", self.url, msg("a b c", stream=stream))
            job = self.take_job(a)
            a.events(job["job_id"], [{"type": "started"}, {"type": "error", "code": "CONTEXT_OVERFLOW",
                                      "message": "prompt has 700 tokens; the context holds 512"}])
            st, hdr, data = get()
            self.assertEqual(st, 400, data)
            self.assertTrue(hdr["content-type"].startswith("application/json"))
            r = json.loads(data)
            self.assertEqual(r["error"]["type"], "invalid_request_error")
            self.assertIn("700", r["error"]["message"])
            self.assertIn("512", r["error"]["message"])

    def test_error_mid_stream(self):
        a = self.agent()
        get = in_thread(harness.http_request, "POST", self.url, msg("hi", stream=True))
        job = self.take_job(a)
        a.events(job["job_id"], [{"type": "started"}, {"type": "token", "text": "Hel"}])
        a.events(job["job_id"], [{"type": "error", "code": "ENGINE_FAILED", "message": "GPU fell off the bus"}])
        st, _, data = get()
        self.assertEqual(st, 200)
        events = harness.parse_sse(data)
        self.assertEqual(events[-1]["event"], "error")
        err = json.loads(events[-1]["data"])
        self.assertEqual(err["type"], "error")
        self.assertEqual(err["error"]["type"], "api_error")
        self.assertIn("GPU fell off the bus", err["error"]["message"])
        deltas = [json.loads(e["data"])["delta"]["text"] for e in events if e["event"] == "content_block_delta"]
        self.assertEqual(deltas, ["Hel"])
        self.assertNotIn("message_stop", [e["event"] for e in events])

    def test_stop_sequence_stops_the_agent(self):
        a = self.agent()
        get = in_thread(harness.http_json, "POST", self.url, msg("hi", stop_sequences=["STOP"]))
        job = self.take_job(a)
        a.events(job["job_id"], [{"type": "started"}, {"type": "token", "text": "one ST"}])
        st, reply = a.events(job["job_id"], [{"type": "token", "text": "OP two"}])
        self.assertEqual(st, 200)
        st, _, r = get()
        self.assertEqual(st, 200, r)
        self.assertEqual(r["content"][0]["text"], "one ")
        self.assertEqual(r["stop_reason"], "stop_sequence")
        self.assertEqual(r["stop_sequence"], "STOP")
        # The agent is told to stop at its next upload (or in this reply).
        st, reply2 = a.events(job["job_id"], [{"type": "token", "text": " three"}])
        self.assertTrue(reply.get("cancel") or reply2.get("cancel"), (reply, reply2))

    def test_count_tokens(self):
        a = self.agent()
        get = in_thread(harness.http_json, "POST", self.url + "/count_tokens",
                        {"model": "claude-pool", "system": "S", "messages": [{"role": "user", "content": "a b"}]})
        job = self.take_job(a)
        self.assertEqual(job["kind"], "count_tokens")
        self.assertEqual(job["messages"][0], {"role": "system", "content": "S"})
        a.events(job["job_id"], [{"type": "started"}, {"type": "end", "finish_reason": "stop",
                                  "usage": {"prompt_tokens": 42, "completion_tokens": 0}}])
        st, _, r = get()
        self.assertEqual(st, 200, r)
        self.assertEqual(r, {"input_tokens": 42})

    def test_errors(self):
        self.agent()
        st, hdr, r = harness.http_json("POST", self.url, msg(model="nope"))
        self.assertEqual(st, 404)
        self.assertEqual(r["error"]["type"], "not_found_error")
        self.assertTrue(hdr["request-id"].startswith("req_"))
        st, _, r = harness.http_json("POST", self.url, {"model": "claude-pool", "messages": []})
        self.assertEqual(st, 400)
        self.assertEqual(r, {"type": "error", "error": {"type": "invalid_request_error",
                                                        "message": r["error"]["message"]}})
        st, _, r = harness.http_json("POST", self.url, msg([{"type": "document", "source": {}}]))
        self.assertEqual(st, 400)
        self.assertIn("'document'", r["error"]["message"])
        st, _, r = harness.http_json("POST", self.url, "{not json", {"Content-Type": "application/json"})
        self.assertEqual(st, 400)
        self.assertEqual(r["error"]["type"], "invalid_request_error")
        st, hdr, r = harness.http_json("GET", self.url)
        self.assertEqual(st, 405)
        self.assertEqual(r["type"], "error")
        # A streaming request that cannot be served is a plain HTTP error.
        st, hdr, r = harness.http_json("POST", self.url, msg(model="nope", stream=True))
        self.assertEqual(st, 404)
        self.assertTrue(hdr["content-type"].startswith("application/json"))

    def test_large_bodies(self):
        a = self.agent(ctx=1 << 20)
        big = msg("word " * (1200 * 1024 // 5))  # ~1.2 MB: accepted
        get = in_thread(harness.http_json, "POST", self.url, big)
        job = self.take_job(a)
        a.run_job(job)
        st, _, r = get()
        self.assertEqual(st, 200, r)
        st, _, r = harness.http_json("POST", self.url, msg("w" * (5 << 20)))  # over 4 MiB
        self.assertEqual(st, 413)
        self.assertEqual(r["error"]["type"], "request_too_large")


if __name__ == "__main__":
    harness.main()
