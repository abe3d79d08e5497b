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
"""

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


if __name__ == "__main__":
    unittest.main()
