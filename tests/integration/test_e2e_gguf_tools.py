"""Tool calls on the gguf backend end to end (issue 26): gpupool-server + a
real gpupool-agent on stories260K given a chatml template with a tools
format (gguf_kv.py adds it to a copy of the file), so the agent reports
supports_tools and the engine renders tools and reads calls back.

The tiny model does not call tools of its own accord, so the calls come
from tool_choice: "required" and a named function hold the model to a call
by grammar (after the family's opener), and the agent must read it back out
of the text as a call: OpenAI message.tool_calls / streamed
delta.tool_calls with finish_reason "tool_calls", Anthropic tool_use blocks
with stop_reason "tool_use". Before this, the model's call reached the
client as plain text (or, unforced, not at all). Arguments follow the
tool's parameters (one candidate tool); a strict tool whose parameters use
a keyword the grammar cannot enforce is a 400 naming it.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_kv  # noqa: E402
import harness  # noqa: E402
from harness import http_json, http_request, parse_sse, sse_data_json  # noqa: E402
from test_e2e_gguf import MODEL, gguf_built  # noqa: E402
from test_e2e_structured import valid  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endfor %}{% if tools %}<tools>{{ tools }}</tools> <tool_call>{% endif %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 5},
                          "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "ls"}}]


class GgufToolsTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        model = self.h.path("tools.gguf")
        # The chatml tools preamble alone is longer than the model's 512
        # positions in its 512-token vocabulary: give the copy 2,048.
        gguf_kv.set_values(MODEL, model, {"tokenizer.chat_template": TEMPLATE,
                                          "llama.context_length": 2048})
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.agent = self.h.start_agent(self.srv, upstream=None, slots=2, alias="tiny",
                                        args=["--model", model, "--threads", "1"])
        self.srv.wait_model("tiny")

    def chat(self, tool_choice, stream, seed=1, tools=TOOLS):
        body = {"model": "tiny", "stream": stream, "max_tokens": 60, "temperature": 1,
                "seed": seed, "tools": tools, "tool_choice": tool_choice,
                "messages": [{"role": "user", "content": "Hi"}]}
        if not stream:
            st, _, b = http_json("POST", self.srv.url + "/v1/chat/completions", body,
                                 timeout=120)
            self.assertEqual(st, 200, b)
            ch = b["choices"][0]
            calls = [(c["function"]["name"], c["function"]["arguments"], c["id"])
                     for c in ch["message"].get("tool_calls") or []]
            return ch["message"].get("content"), calls, ch["finish_reason"]
        st, _, raw = http_request("POST", self.srv.url + "/v1/chat/completions", body,
                                  timeout=120)
        self.assertEqual(st, 200, raw)
        chunks = [c for c in sse_data_json(parse_sse(raw)) if c.get("choices")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        calls = {}
        for c in chunks:
            for tc in c["choices"][0]["delta"].get("tool_calls") or []:
                cur = calls.setdefault(tc["index"], ["", "", tc.get("id")])
                fn = tc.get("function") or {}
                cur[0] += fn.get("name") or ""
                cur[1] += fn.get("arguments") or ""
        finish = [c["choices"][0]["finish_reason"] for c in chunks
                  if c["choices"][0].get("finish_reason")]
        return text or None, [tuple(calls[i]) for i in sorted(calls)], finish[-1]

    def test_named_function_is_called_with_valid_arguments(self):
        choice = {"type": "function", "function": {"name": "weather"}}
        for seed in (1, 2, 3):
            for stream in (False, True):
                content, calls, finish = self.chat(choice, stream, seed)
                self.assertEqual(finish, "tool_calls", (content, calls))
                self.assertEqual(len(calls), 1, (content, calls))
                name, args, cid = calls[0]
                self.assertEqual(name, "weather")
                self.assertTrue(cid and cid.startswith("call_"), cid)
                self.assertTrue(valid(json.loads(args), WEATHER, WEATHER), args)
                self.assertFalse(content and "tool_call" in content, content)

    def test_required_calls_one_of_the_tools(self):
        """Each tool's arguments follow its own parameters (a union of calls
        told apart by the name)."""
        names = set()
        for seed in range(1, 9):
            content, calls, finish = self.chat("required", False, seed)
            self.assertEqual(finish, "tool_calls", (content, calls))
            self.assertEqual(len(calls), 1)
            self.assertIn(calls[0][0], ("weather", "ls"))
            args = json.loads(calls[0][1])
            self.assertIsInstance(args, dict)
            if calls[0][0] == "weather":
                self.assertTrue(valid(args, WEATHER, WEATHER), args)
            names.add(calls[0][0])
        self.assertEqual(names, {"weather", "ls"})

    def test_auto_leaves_text_as_text(self):
        content, calls, finish = self.chat("auto", False)
        self.assertEqual(calls, [])
        self.assertIn(finish, ("stop", "length"))
        self.assertTrue(content)

    def test_schema_and_tools_auto_calls_or_answers(self):
        """tool_choice auto with a response_format schema (what the OpenAI Agents
        SDK sends): each reply is either the schema's JSON or a tool call, and
        over these seeds both happen (before, the schema held from the first
        token and the model could never call)."""
        rf = {"type": "json_schema",
              "json_schema": {"name": "w", "strict": True, "schema": WEATHER}}
        kinds = set()
        for seed in range(1, 9):
            body = {"model": "tiny", "max_tokens": 60, "temperature": 1, "seed": seed,
                    "tools": TOOLS, "tool_choice": "auto", "response_format": rf,
                    "messages": [{"role": "user", "content": "Hi"}]}
            st, _, b = http_json("POST", self.srv.url + "/v1/chat/completions", body,
                                 timeout=120)
            self.assertEqual(st, 200, b)
            ch = b["choices"][0]
            calls = ch["message"].get("tool_calls") or []
            if calls:
                kinds.add("call")
                self.assertEqual(ch["finish_reason"], "tool_calls", b)
                self.assertEqual(len(calls), 1, b)
                self.assertIn(calls[0]["function"]["name"], ("weather", "ls"))
                self.assertIsInstance(json.loads(calls[0]["function"]["arguments"]), dict)
                self.assertFalse(ch["message"].get("content"), b)
            else:
                kinds.add("answer")
                self.assertEqual(ch["finish_reason"], "stop", b)
                self.assertTrue(valid(json.loads(ch["message"]["content"]), WEATHER, WEATHER),
                                b)
        self.assertEqual(kinds, {"call", "answer"})

    def test_anthropic_tool_choice_tool(self):
        body = {"model": "tiny", "max_tokens": 60, "temperature": 1,
                "tools": [{"name": "weather", "input_schema": WEATHER}],
                "tool_choice": {"type": "tool", "name": "weather"},
                "messages": [{"role": "user", "content": "Hi"}]}
        st, _, b = http_json("POST", self.srv.url + "/v1/messages", body, timeout=120)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["stop_reason"], "tool_use", b)
        uses = [c for c in b["content"] if c["type"] == "tool_use"]
        self.assertEqual(len(uses), 1, b)
        self.assertEqual(uses[0]["name"], "weather")
        self.assertTrue(valid(uses[0]["input"], WEATHER, WEATHER), uses[0])

    def test_strict_tool_with_unenforceable_parameters_is_refused(self):
        tools = [{"type": "function",
                  "function": {"name": "f", "strict": True,
                               "parameters": {"type": "object",
                                              "properties": {"n": {"type": "integer",
                                                                   "multipleOf": 3}}}}}]
        body = {"model": "tiny", "max_tokens": 50, "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "messages": [{"role": "user", "content": "hi"}]}
        st, _, b = http_json("POST", self.srv.url + "/v1/chat/completions", body, timeout=120)
        self.assertEqual(st, 400, b)
        self.assertIn("multipleOf", json.dumps(b))


if __name__ == "__main__":
    harness.main()
