"""Tool use end to end with real processes: gpupool-server, a real
gpupool-agent (openai backend, which reports supports_tools) and the
scripted upstream in tool-call mode (upstream.py --tool-call NAME).

Covers: Anthropic non-streaming and streaming tool_use (ids, parsed input,
input_json_delta pieces that join to the arguments, exactly one
content_block_stop per block, text block closed before a tool block,
stop_reason tool_use); Anthropic tools and tool_choice arriving upstream
as OpenAI tools; a tool_result round trip arriving upstream as a role
"tool" message after the assistant's tool_calls; the OpenAI chat dialect
passing tools through (message.tool_calls, streamed delta.tool_calls with
index, finish_reason tool_calls) and its tool messages.

MixedFleetTest (issue 4): one openai-backend agent that takes tools and one
gguf agent (stories260K, whose template has no tool format) serve the same
name; every request with tools reaches the tool agent (queued while it is
busy, never given to the free gguf agent), plain requests reach both.
"""

import concurrent.futures
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, parse_sse, sse_data_json  # noqa: E402
import upstream as upstream_mod  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--work_wait_sec", "5"]

LS_TOOL = {"name": "list_dir", "description": "List a directory",
           "input_schema": {"type": "object",
                            "properties": {"path": {"type": "string"}},
                            "required": ["path"]}}
OTHER_TOOL = {"name": "read_file", "input_schema": {"type": "object"}}
OAI_LS_TOOL = {"type": "function",
               "function": {"name": "list_dir", "description": "List a directory",
                            "parameters": LS_TOOL["input_schema"]}}


def args_of(k):
    return upstream_mod.tool_arguments(k)


def expected(prompt, n):
    return "".join(upstream_mod.expected_tokens(prompt, n))


class ToolsTest(harness.TestCase):

    def pool(self, up_args=()):
        self.up = self.h.start_upstream(["--tokens", "4", "--tool-call", "list_dir"]
                                        + list(up_args))
        self.srv = self.h.start_server(FAST)
        self.agent = self.h.start_agent(self.srv, upstream=self.up, model="m1", slots=2)
        self.srv.wait_model("m1")
        return self.srv

    def messages(self, body, stream=False):
        b = dict(body)
        b.setdefault("model", "m1")
        b.setdefault("max_tokens", 64)
        if stream:
            b["stream"] = True
            st, hdr, raw = harness.http_request(
                "POST", self.srv.url + "/v1/messages", b,
                headers={"anthropic-version": "2023-06-01"})
            self.assertEqual(st, 200, raw)
            return [(e.get("event"), json.loads(e["data"])) for e in parse_sse(raw)]
        st, _, out = http_json("POST", self.srv.url + "/v1/messages", b,
                               headers={"anthropic-version": "2023-06-01"})
        self.assertEqual(st, 200, out)
        return out

    # ------------------------------------------------------------------
    def test_anthropic_non_streaming_tool_use(self):
        self.pool(["--tool-calls", "2"])
        out = self.messages({"messages": [{"role": "user", "content": "list /tmp"}],
                             "tools": [LS_TOOL, OTHER_TOOL],
                             "tool_choice": {"type": "tool", "name": "list_dir"}})
        self.assertEqual(out["stop_reason"], "tool_use")
        blocks = out["content"]
        self.assertEqual([b["type"] for b in blocks], ["tool_use", "tool_use"], blocks)
        for k, b in enumerate(blocks):
            self.assertEqual(b["name"], "list_dir")
            self.assertEqual(b["input"], args_of(k))
            self.assertEqual(b["id"], "toolu_up1_%d" % k)
        rec = self.up.log_entries()[-1]
        self.assertEqual(rec["tools"][0], OAI_LS_TOOL)
        self.assertEqual(rec["tools"][1]["function"]["name"], "read_file")
        self.assertEqual(rec["tools"][1]["function"]["parameters"], {"type": "object"})
        self.assertEqual(rec["tool_choice"],
                         {"type": "function", "function": {"name": "list_dir"}})
        self.assertEqual(rec["messages"], [{"role": "user", "content": "list /tmp"}])

    def test_anthropic_tool_choice_mapping(self):
        self.pool()
        for anth, oai in (({"type": "any"}, "required"), ({"type": "auto"}, "auto")):
            self.messages({"messages": [{"role": "user", "content": "hi"}],
                           "tools": [LS_TOOL], "tool_choice": anth})
            self.assertEqual(self.up.log_entries()[-1]["tool_choice"], oai)
        # none: tools are dropped, the answer is text
        out = self.messages({"messages": [{"role": "user", "content": "hi"}],
                             "tools": [LS_TOOL], "tool_choice": {"type": "none"}})
        self.assertEqual(out["stop_reason"], "end_turn")
        self.assertIsNone(self.up.log_entries()[-1]["tools"])

    def test_anthropic_streaming_tool_use(self):
        self.pool(["--tool-calls", "2", "--tool-text", "2"])
        evs = self.messages({"messages": [{"role": "user", "content": "go look"}],
                             "tools": [LS_TOOL]}, stream=True)
        names = [n for n, _ in evs]
        self.assertEqual(names[0], "message_start")
        self.assertEqual(names[-1], "message_stop")
        starts = [d for n, d in evs if n == "content_block_start"]
        stops = [d["index"] for n, d in evs if n == "content_block_stop"]
        self.assertEqual([s["index"] for s in starts], [0, 1, 2])
        self.assertEqual(stops, [0, 1, 2])  # exactly one stop per block
        self.assertEqual(starts[0]["content_block"]["type"], "text")
        for k in (1, 2):
            cb = starts[k]["content_block"]
            self.assertEqual(cb["type"], "tool_use")
            self.assertEqual(cb["name"], "list_dir")
            self.assertEqual(cb["input"], {})
            self.assertTrue(cb["id"].startswith("toolu_"), cb)
        # every block is stopped before the next starts
        open_idx = None
        for n, d in evs:
            if n == "content_block_start":
                self.assertIsNone(open_idx, "block %s still open" % open_idx)
                open_idx = d["index"]
            elif n == "content_block_delta":
                self.assertEqual(d["index"], open_idx)
            elif n == "content_block_stop":
                self.assertEqual(d["index"], open_idx)
                open_idx = None
        text = "".join(d["delta"]["text"] for n, d in evs
                       if n == "content_block_delta" and d["delta"]["type"] == "text_delta")
        self.assertEqual(text, expected("go look", 2))
        for k in (1, 2):
            pieces = [d["delta"]["partial_json"] for n, d in evs
                      if n == "content_block_delta" and d["index"] == k]
            self.assertGreater(len(pieces), 1)  # streamed in pieces
            self.assertTrue(all(d["delta"]["type"] == "input_json_delta" for n, d in evs
                                if n == "content_block_delta" and d["index"] == k))
            self.assertEqual(json.loads("".join(pieces)), args_of(k - 1))
        md = [d for n, d in evs if n == "message_delta"][0]
        self.assertEqual(md["delta"]["stop_reason"], "tool_use")

    def test_anthropic_streaming_tool_only(self):
        self.pool()
        evs = self.messages({"messages": [{"role": "user", "content": "go"}],
                             "tools": [LS_TOOL]}, stream=True)
        starts = [d for n, d in evs if n == "content_block_start"]
        self.assertEqual([s["content_block"]["type"] for s in starts], ["tool_use"])
        self.assertEqual([d["index"] for n, d in evs if n == "content_block_stop"], [0])

    def test_anthropic_tool_result_round_trip(self):
        self.pool()
        first = self.messages({"messages": [{"role": "user", "content": "list /tmp"}],
                               "tools": [LS_TOOL]})
        tu = first["content"][0]
        self.assertEqual(tu["type"], "tool_use")
        convo = [{"role": "user", "content": "list /tmp"},
                 {"role": "assistant", "content": first["content"]},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": tu["id"],
                      "content": [{"type": "text", "text": "alpha beta"}]},
                     {"type": "text", "text": "thanks"}]}]
        second = self.messages({"messages": convo, "tools": [LS_TOOL], "system": "S"})
        self.assertEqual(second["stop_reason"], "end_turn")
        self.assertEqual(second["content"][0]["text"], expected("thanks", 4))
        msgs = self.up.log_entries()[-1]["messages"]
        self.assertEqual(msgs[0], {"role": "system", "content": "S"})
        self.assertEqual(msgs[1], {"role": "user", "content": "list /tmp"})
        self.assertEqual(msgs[2]["role"], "assistant")
        self.assertIsNone(msgs[2]["content"])
        call = msgs[2]["tool_calls"][0]
        self.assertEqual(call["id"], tu["id"])
        self.assertEqual(call["function"]["name"], "list_dir")
        self.assertEqual(json.loads(call["function"]["arguments"]), args_of(0))
        self.assertEqual(msgs[3], {"role": "tool", "tool_call_id": tu["id"],
                                   "content": "alpha beta"})
        self.assertEqual(msgs[4], {"role": "user", "content": "thanks"})
        # is_error is noted in the text
        convo[2]["content"][0]["is_error"] = True
        self.messages({"messages": convo, "tools": [LS_TOOL]})
        tool_msg = self.up.log_entries()[-1]["messages"][2]
        self.assertEqual(tool_msg["role"], "tool")
        self.assertEqual(tool_msg["content"], "Error: alpha beta")

    # ------------------------------------------------------------------
    def test_openai_non_streaming_tool_calls(self):
        srv = self.pool()
        st, _, out = http_json("POST", srv.url + "/v1/chat/completions",
                               {"model": "m1", "tools": [OAI_LS_TOOL], "tool_choice": "required",
                                "messages": [{"role": "user", "content": "list"}]})
        self.assertEqual(st, 200, out)
        ch = out["choices"][0]
        self.assertEqual(ch["finish_reason"], "tool_calls")
        self.assertIsNone(ch["message"]["content"])
        tc = ch["message"]["tool_calls"]
        self.assertEqual(len(tc), 1)
        self.assertEqual(tc[0]["id"], "call_up1_0")
        self.assertEqual(tc[0]["type"], "function")
        self.assertEqual(tc[0]["function"]["name"], "list_dir")
        self.assertEqual(json.loads(tc[0]["function"]["arguments"]), args_of(0))
        rec = self.up.log_entries()[-1]
        self.assertEqual(rec["tools"], [OAI_LS_TOOL])
        self.assertEqual(rec["tool_choice"], "required")

    def test_openai_streaming_tool_calls_and_tool_message(self):
        srv = self.pool(["--tool-calls", "2"])
        st, _, raw = harness.http_request(
            "POST", srv.url + "/v1/chat/completions",
            {"model": "m1", "stream": True, "tools": [OAI_LS_TOOL],
             "messages": [{"role": "user", "content": "list"}]})
        self.assertEqual(st, 200, raw)
        evs = parse_sse(raw)
        self.assertEqual(evs[-1]["data"], "[DONE]")
        chunks = [c for c in sse_data_json(evs) if c.get("choices")]
        calls = {}
        for c in chunks:
            for d in c["choices"][0]["delta"].get("tool_calls") or []:
                i = d["index"]
                if i not in calls:
                    self.assertEqual(d["type"], "function")
                    calls[i] = {"id": d["id"], "name": d["function"]["name"], "args": ""}
                else:
                    self.assertNotIn("id", d)
                calls[i]["args"] += d["function"]["arguments"]
        self.assertEqual(sorted(calls), [0, 1])
        for i in (0, 1):
            self.assertEqual(calls[i]["name"], "list_dir")
            self.assertEqual(json.loads(calls[i]["args"]), args_of(i))
        finals = [c["choices"][0]["finish_reason"] for c in chunks
                  if c["choices"][0].get("finish_reason")]
        self.assertEqual(finals, ["tool_calls"])
        # the next turn: assistant tool_calls + tool messages go upstream as sent
        convo = [{"role": "user", "content": "list"},
                 {"role": "assistant", "content": None,
                  "tool_calls": [{"id": calls[0]["id"], "type": "function",
                                  "function": {"name": "list_dir",
                                               "arguments": calls[0]["args"]}}]},
                 {"role": "tool", "tool_call_id": calls[0]["id"], "content": "one two"}]
        st, _, out = http_json("POST", srv.url + "/v1/chat/completions",
                               {"model": "m1", "tools": [OAI_LS_TOOL], "messages": convo})
        self.assertEqual(st, 200, out)
        self.assertEqual(out["choices"][0]["finish_reason"], "stop")
        self.assertEqual(out["choices"][0]["message"]["content"], expected("one two", 4))
        self.assertEqual(self.up.log_entries()[-1]["messages"], convo)

    def test_openai_bad_tools_rejected(self):
        srv = self.pool()
        for body, param in (({"tools": [{"type": "function"}]}, "tools"),
                            ({"tools": [OAI_LS_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
                            ({"messages": [{"role": "tool", "content": "x"}]}, "messages")):
            b = {"model": "m1", "messages": [{"role": "user", "content": "x"}]}
            b.update(body)
            st, _, out = http_json("POST", srv.url + "/v1/chat/completions", b)
            self.assertEqual(st, 400, out)
            self.assertEqual(out["error"]["param"], param, out)


GGUF_MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")


def gguf_built():
    """The agent has the gguf backend (the e2e gguf test's probe)."""
    import test_e2e_gguf
    return test_e2e_gguf.gguf_built()


class MixedFleetTest(harness.TestCase):
    """Issue 4: tools requests with a mixed fleet go to tool-capable agents
    only; plain requests use every agent."""

    N = 8   # requests per kind

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        # The upstream holds each answer back a little so that concurrent
        # requests overlap and tools jobs have to queue for the tool agent
        # while the gguf agent is free.
        self.up = self.h.start_upstream(["--tokens", "4", "--tool-call", "list_dir",
                                         "--first-delay-ms", "200"])
        self.srv = self.h.start_server(FAST)
        self.tool_agent = self.h.start_agent(self.srv, upstream=self.up, model="m1", slots=2)
        self.gguf_agent = self.h.start_agent(self.srv, upstream=None, slots=2, alias="m1",
                                             args=["--model", GGUF_MODEL, "--threads", "1"])
        self.tid = self.tool_agent.agent_id()
        self.gid = self.gguf_agent.agent_id()
        for aid in (self.tid, self.gid):
            harness.wait_until(lambda aid=aid: any(
                e.get("agent_id") == aid and e.get("to") == "healthy"
                for e in self.srv.log_events("agent_state")),
                timeout=harness.START_TIMEOUT, what="agent %s healthy" % aid)

    def chat(self, tools, content="list /tmp"):
        body = {"model": "m1", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": content}]}
        if tools:
            body["tools"] = [OAI_LS_TOOL]
        st, _, out = http_json("POST", self.srv.url + "/v1/chat/completions", body, timeout=120)
        self.assertEqual(st, 200, out)
        return out

    def anthropic(self):
        st, _, out = http_json("POST", self.srv.url + "/v1/messages",
                               {"model": "m1", "max_tokens": 8, "tools": [LS_TOOL],
                                "messages": [{"role": "user", "content": "list /tmp"}]},
                               headers={"anthropic-version": "2023-06-01"}, timeout=120)
        self.assertEqual(st, 200, out)
        return out

    def run_all(self, fn, n):
        with concurrent.futures.ThreadPoolExecutor(max_workers=n) as ex:
            return list(ex.map(lambda _: fn(), range(n)))

    def test_tools_only_on_tool_agent(self):
        # N concurrent tools requests, more than the tool agent's 2 slots:
        # the rest wait for it, none goes to the free gguf agent.
        for out in self.run_all(lambda: self.chat(True), self.N):
            ch = out["choices"][0]
            self.assertEqual(ch["finish_reason"], "tool_calls", out)
            self.assertEqual(ch["message"]["tool_calls"][0]["function"]["name"], "list_dir")
            self.assertEqual(out["x_pool_meta"]["agent_id"], self.tid)
            self.assertEqual(out["x_pool_meta"]["warnings"], [], out)
        for out in self.run_all(self.anthropic, self.N // 2):
            self.assertEqual(out["stop_reason"], "tool_use", out)
            self.assertEqual(out["content"][-1]["type"], "tool_use")
            self.assertEqual(out["x_pool_meta"]["agent_id"], self.tid)
        offered = [r for r in self.up.log_entries() if r.get("tools")]
        self.assertEqual(len(offered), self.N + self.N // 2)
        # Plain requests go to both agents by round robin. Each is sent when
        # both agents have a long-poll parked (round robin skips one between
        # two polls: a stressed CI run saw every plain request go to the
        # gguf agent), with its own text, so that no slot's cached prefix
        # pulls it to the gguf agent.
        seen = []
        for i in range(4):
            self.srv.wait_parked(2)
            out = self.chat(False, content="list /tmp/%d" % i)
            self.assertIn(out["choices"][0]["finish_reason"], ("stop", "length"), out)
            seen.append(out["x_pool_meta"]["agent_id"])
        self.assertEqual(set(seen), {self.tid, self.gid}, seen)

if __name__ == "__main__":
    unittest.main()
