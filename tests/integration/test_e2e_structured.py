"""Structured outputs end to end (issue 26): gpupool-server + gpupool-agent
--model models/stories260K.gguf. Chat `response_format` (json_schema,
json_object) and Responses `text.format`, streamed and not: every reply of
the tiny model parses, validates against its schema (a small validator
here, standard library only) and ends with finish_reason "stop"; an
unsupported schema keyword is a 400 naming it, before any agent work.
Skipped when the agent was built without the gguf backend.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request, parse_sse, sse_data_json  # noqa: E402
from test_e2e_gguf import MODEL, gguf_built  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 1, "maximum": 99},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]},
                 "minItems": 1, "maxItems": 3},
        "nick": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
        "home": {"$ref": "#/$defs/place"},
    },
    "required": ["name", "age", "pets", "nick", "home"],
    "additionalProperties": False,
    "$defs": {"place": {"type": "object",
                        "properties": {"city": {"type": "string", "minLength": 1,
                                                "maxLength": 8},
                                       "ok": {"type": "boolean"}},
                        "required": ["city", "ok"], "additionalProperties": False}},
}


def valid(v, s, root):
    """The keywords the tests use, as JSON Schema defines them."""
    if "$ref" in s:
        return valid(v, root["$defs"][s["$ref"].split("/")[-1]], root)
    if "anyOf" in s:
        return any(valid(v, a, root) for a in s["anyOf"])
    if "enum" in s and v not in s["enum"]:
        return False
    t = s.get("type")
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool,
             "null": type(None)}
    if t == "integer":
        if not isinstance(v, int) or isinstance(v, bool):
            return False
    elif t is not None and not isinstance(v, kinds[t]):
        return False
    if isinstance(v, int) and not isinstance(v, bool):
        if v < s.get("minimum", v) or v > s.get("maximum", v):
            return False
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", len(v)):
            return False
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", len(v)):
            return False
        if not all(valid(e, s.get("items", {}), root) for e in v):
            return False
    if isinstance(v, dict):
        props = s.get("properties", {})
        if any(r not in v for r in s.get("required", [])):
            return False
        for k, e in v.items():
            if k in props:
                if not valid(e, props[k], root):
                    return False
            elif s.get("additionalProperties") is False:
                return False
    return True


class StructuredE2ETest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.agent = self.h.start_agent(self.srv, upstream=None, slots=2, alias="tiny",
                                        args=["--model", MODEL, "--threads", "1"])
        self.srv.wait_model("tiny")

    def chat(self, rf, stream, seed, max_tokens=400):
        body = {"model": "tiny", "stream": stream, "max_tokens": max_tokens, "temperature": 1,
                "seed": seed, "response_format": rf,
                "messages": [{"role": "user", "content": "Tell me about a person"}]}
        if not stream:
            st, _, b = http_json("POST", self.srv.url + "/v1/chat/completions", body,
                                 timeout=120)
            self.assertEqual(st, 200, b)
            return b["choices"][0]["message"]["content"], b["choices"][0]["finish_reason"]
        st, _, raw = http_request("POST", self.srv.url + "/v1/chat/completions", body,
                                  timeout=120)
        self.assertEqual(st, 200, raw)
        chunks = sse_data_json(parse_sse(raw))
        text = "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in chunks if c.get("choices"))
        finish = [c["choices"][0]["finish_reason"] for c in chunks
                  if c.get("choices") and c["choices"][0].get("finish_reason")]
        return text, finish[-1]

    def test_chat_json_schema(self):
        rf = {"type": "json_schema",
              "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
        for seed in range(1, 5):
            for stream in (False, True):
                text, finish = self.chat(rf, stream, seed)
                self.assertEqual(finish, "stop", text)
                v = json.loads(text)
                self.assertTrue(valid(v, PERSON, PERSON), text)

    def test_chat_json_object_closes_within_budget(self):
        for seed in range(1, 4):
            for stream in (False, True):
                text, finish = self.chat({"type": "json_object"}, stream, seed, max_tokens=40)
                self.assertEqual(finish, "stop", text)
                self.assertIsInstance(json.loads(text), dict)

    def test_responses_text_format(self):
        fmt = {"type": "json_schema", "name": "person", "strict": True, "schema": PERSON}
        body = {"model": "tiny", "input": "Tell me about a person", "temperature": 1,
                "max_output_tokens": 400, "text": {"format": fmt}}
        st, _, b = http_json("POST", self.srv.url + "/v1/responses", body, timeout=120)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["status"], "completed", b)
        self.assertEqual(b["text"]["format"]["name"], "person")
        text = b["output"][0]["content"][0]["text"]
        self.assertTrue(valid(json.loads(text), PERSON, PERSON), text)

        body["stream"] = True
        st, _, raw = http_request("POST", self.srv.url + "/v1/responses", body, timeout=120)
        self.assertEqual(st, 200, raw)
        evs = sse_data_json(parse_sse(raw))
        text = "".join(e.get("delta", "") for e in evs
                       if e.get("type") == "response.output_text.delta")
        done = [e for e in evs if e.get("type") == "response.completed"]
        self.assertEqual(len(done), 1, evs[-1])
        self.assertTrue(valid(json.loads(text), PERSON, PERSON), text)

    def test_unsupported_keyword_is_400_naming_it(self):
        bad = {"type": "object", "properties": {"host": {"type": "string", "format": "hostname"}}}
        st, _, b = http_json("POST", self.srv.url + "/v1/chat/completions",
                             {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "m", "schema": bad}}},
                             timeout=30)
        self.assertEqual(st, 400, b)
        self.assertIn("'format'", b["error"]["message"])
        self.assertEqual(b["error"]["param"], "response_format")
        st, _, b = http_json("POST", self.srv.url + "/v1/responses",
                             {"model": "tiny", "input": "x",
                              "text": {"format": {"type": "json_schema", "name": "m",
                                                  "schema": {"type": "string",
                                                             "pattern": "(a)\\1"}}}},
                             timeout=30)
        self.assertEqual(st, 400, b)
        self.assertIn("backreferences", b["error"]["message"])

    def test_anthropic_output_format(self):
        """Anthropic's structured outputs: output_config.format (GA) and
        output_format (beta) hold the text block to the schema; an unsupported
        keyword is a 400 in Anthropic's dialect (before: ignored with a
        warning, unconstrained text)."""
        for field in ("output_config", "output_format"):
            fmt = {"type": "json_schema", "schema": PERSON}
            body = {"model": "tiny", "max_tokens": 400, "temperature": 1,
                    "messages": [{"role": "user", "content": "A person"}]}
            body[field] = {"format": fmt} if field == "output_config" else fmt
            st, _, b = http_json("POST", self.srv.url + "/v1/messages", body, timeout=120)
            self.assertEqual(st, 200, b)
            self.assertEqual(b["stop_reason"], "end_turn", b)
            self.assertTrue(valid(json.loads(b["content"][0]["text"]), PERSON, PERSON), b)
        body = {"model": "tiny", "max_tokens": 50,
                "messages": [{"role": "user", "content": "x"}],
                "output_config": {"format": {"type": "json_schema",
                                             "schema": {"type": "integer", "multipleOf": 2}}}}
        st, _, b = http_json("POST", self.srv.url + "/v1/messages", body, timeout=30)
        self.assertEqual(st, 400, b)
        self.assertEqual(b["type"], "error")
        self.assertIn("multipleOf", b["error"]["message"])

    def test_pattern_and_format(self):
        """pattern and format are enforced (they were refused before)."""
        schema = {"type": "object",
                  "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                                 "day": {"type": "string", "format": "date"}},
                  "required": ["code", "day"], "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
        for seed in (1, 2, 3):
            for stream in (False, True):
                text, finish = self.chat(rf, stream, seed, max_tokens=60)
                self.assertEqual(finish, "stop", text)
                v = json.loads(text)
                self.assertRegex(v["code"], r"^[A-Z]{2}-[0-9]{3}$")
                self.assertRegex(v["day"], r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


class StructuredOpenaiBackendTest(harness.TestCase):
    """An openai-backend agent passes response_format to its upstream as
    it is (llama-server, vLLM and Ollama enforce it); the scripted upstream
    answers with a JSON value for the schema, streamed in pieces."""

    def test_passed_to_the_upstream(self):
        up = self.h.start_upstream(["--tokens", "6"])
        srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.h.start_agent(srv, upstream=up, model="m1")
        srv.wait_model("m1")
        rf = {"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": {
            "type": "object", "additionalProperties": False, "required": ["name", "n"],
            "properties": {"name": {"type": "string", "maxLength": 20},
                           "n": {"type": "integer", "minimum": 3}}}}}
        for stream in (False, True):
            body = {"model": "m1", "stream": stream, "response_format": rf,
                    "messages": [{"role": "user", "content": "alpha beta"}]}
            if stream:
                s = harness.SSEStream("POST", srv.url + "/v1/chat/completions", body,
                                      timeout=60)
                self.assertEqual(s.status, 200)
                text = ""
                for d in harness.sse_data_json(s.events()):
                    for c in d.get("choices") or []:
                        text += (c.get("delta") or {}).get("content") or ""
                s.close()
            else:
                st, _, b = http_json("POST", srv.url + "/v1/chat/completions", body, timeout=60)
                self.assertEqual(st, 200, b)
                text = b["choices"][0]["message"]["content"]
            value = json.loads(text)
            self.assertEqual(sorted(value), ["n", "name"])
            self.assertGreaterEqual(value["n"], 3)
            st, _, log = http_json("GET", up.url + "/_control/log")
            self.assertEqual(log["requests"][-1]["response_format"], rf)


class StructuredOpenaiBackendCheckedTest(harness.TestCase):
    """Issue 26: the openai backend checks what its upstream returned
    against the schema (src/engine/jvalidate.c). An upstream that ignores
    response_format, or calls a strict tool with arguments outside its
    parameters, fails the request: 502 naming the first violation's place
    (non-streamed), an error event after the relayed text (streamed). The
    old agent relayed such output as a success."""

    SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "n"],
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "n": {"type": "integer", "minimum": 3}}}

    def setUp(self):
        super().setUp()
        self.up = self.h.start_upstream(["--tokens", "6", "--tool-call", "list_dir"])
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.h.start_agent(self.srv, upstream=self.up, model="m1")
        self.srv.wait_model("m1")

    def chat(self, body, stream):
        """Non-streamed: (status, body). Streamed: (status, data payloads)."""
        body = dict(body, model="m1", stream=stream)
        if not stream:
            st, _, b = http_json("POST", self.srv.url + "/v1/chat/completions", body,
                                 timeout=60)
            return st, b
        st, _, raw = http_request("POST", self.srv.url + "/v1/chat/completions", body,
                                  timeout=60)
        return st, [json.loads(e["data"]) for e in parse_sse(raw) if e["data"] != "[DONE]"]

    def rf_body(self):
        return {"response_format": {"type": "json_schema", "json_schema": {
                    "name": "r", "strict": True, "schema": self.SCHEMA}},
                "messages": [{"role": "user", "content": "alpha beta"}]}

    def test_valid_output_passes(self):
        for stream in (False, True):
            st, b = self.chat(self.rf_body(), stream)
            self.assertEqual(st, 200, b)
            if stream:
                self.assertFalse([d for d in b if "error" in d], b)
                text = "".join((c.get("delta") or {}).get("content") or ""
                               for d in b for c in d.get("choices") or [])
            else:
                text = b["choices"][0]["message"]["content"]
            self.assertEqual(sorted(json.loads(text)), ["n", "name"])

    def test_invalid_output_fails_naming_the_place(self):
        # valid JSON, properties in another order, but n below its minimum
        self.up.control(structured_text='{"n": 2, "name": "x"}')
        st, b = self.chat(self.rf_body(), False)
        self.assertEqual(st, 502, b)
        msg = b["error"]["message"]
        self.assertIn("response_format", msg)
        self.assertIn("at /n: 2 is less than minimum 3", msg)
        self.assertEqual(b["error"]["code"].lower(), "upstream_invalid_output", b)
        # streamed: the text went out as it came, then an error event
        st, events = self.chat(self.rf_body(), True)
        self.assertEqual(st, 200)
        text = "".join((c.get("delta") or {}).get("content") or ""
                       for d in events for c in d.get("choices") or [])
        self.assertEqual(text, '{"n": 2, "name": "x"}')
        errs = [d["error"] for d in events if "error" in d]
        self.assertEqual(len(errs), 1, events)
        self.assertIn("at /n: 2 is less than minimum 3", errs[0]["message"])
        self.assertFalse([c for d in events for c in d.get("choices") or []
                          if c.get("finish_reason")], events)

    def test_text_that_is_not_json_fails(self):
        self.up.control(structured_text="Sure! Here it is: {\"name\": \"x\"}")
        for path, body in (("/v1/chat/completions", dict(self.rf_body(), model="m1")),
                           ("/v1/responses", {"model": "m1", "input": "alpha beta",
                                              "text": {"format": {
                                                  "type": "json_schema", "name": "r",
                                                  "schema": self.SCHEMA}}})):
            st, _, b = http_json("POST", self.srv.url + path, body, timeout=60)
            self.assertEqual(st, 502, (path, b))
            self.assertIn("not JSON", b["error"]["message"], path)
        # json_object: any object, but an object
        self.up.control(structured_text="[1, 2]")
        st, b = self.chat({"response_format": {"type": "json_object"},
                           "messages": [{"role": "user", "content": "alpha"}]}, False)
        self.assertEqual(st, 502, b)
        self.assertIn("an array, not of type 'object'", b["error"]["message"])

    def test_anthropic_output_format(self):
        self.up.control(structured_text='{"name": "x", "n": 3, "extra": true}')
        body = {"model": "m1", "max_tokens": 50,
                "messages": [{"role": "user", "content": "alpha beta"}],
                "output_format": {"type": "json_schema", "schema": self.SCHEMA}}
        st, _, b = http_json("POST", self.srv.url + "/v1/messages", body,
                             headers={"anthropic-version": "2023-06-01"}, timeout=60)
        self.assertEqual(st, 502, b)
        self.assertEqual(b["type"], "error", b)
        self.assertIn("property 'extra' is not allowed", b["error"]["message"])

    def test_strict_tool_arguments(self):
        tool = {"type": "function", "function": {
            "name": "list_dir", "strict": True,
            "parameters": {"type": "object", "additionalProperties": False,
                           "required": ["path", "depth", "note"],
                           "properties": {"path": {"type": "string", "pattern": "^/"},
                                          "depth": {"type": "integer", "maximum": 5},
                                          "note": {"type": "string"}}}}}
        body = {"tools": [tool], "messages": [{"role": "user", "content": "list"}]}
        for stream in (False, True):   # the scripted arguments fit
            st, b = self.chat(body, stream)
            self.assertEqual(st, 200, b)
            if not stream:
                self.assertEqual(b["choices"][0]["finish_reason"], "tool_calls")
        self.up.control(tool_arguments_text='{"path": "tmp", "depth": 1, "note": ""}')
        st, b = self.chat(body, False)
        self.assertEqual(st, 502, b)
        self.assertIn("tool call 0 (list_dir)", b["error"]["message"])
        self.assertIn("at /path: string does not match pattern '^/'", b["error"]["message"])
        # the same call of a tool that is not strict is relayed as it is
        loose = json.loads(json.dumps(tool))
        del loose["function"]["strict"]
        st, b = self.chat(dict(body, tools=[loose]), False)
        self.assertEqual(st, 200, b)

    def test_unsupported_strict_tool_keyword_is_400(self):
        tool = {"type": "function", "function": {
            "name": "list_dir", "strict": True,
            "parameters": {"type": "object", "properties": {
                "depth": {"type": "integer", "multipleOf": 2}}}}}
        st, b = self.chat({"tools": [tool], "messages": [{"role": "user", "content": "x"}]},
                          False)
        self.assertEqual(st, 400, b)
        self.assertIn("'multipleOf'", b["error"]["message"])


if __name__ == "__main__":
    harness.main()
