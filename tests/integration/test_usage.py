#!/usr/bin/env python3
"""Usage that is always right (Anthropic stop_sequences, both backends).

Anthropic's stop_sequences used to be matched by the server alone: it cut
the reply and finished the job before the agent's usage arrived, so such a
reply said `input_tokens: 0` (and the key was charged that). Now the agent
gets them as params.stop too, stops before the string, and its end event
says which string it was (`stop_sequence`): the reply has the agent's usage
and `stop_reason: "stop_sequence"`.

- gguf agent (stories260K, greedy): a stop on "." gives the same
  input_tokens as the same request without stop_sequences, in the body and
  in the stream (message_start already has it: the agent reports the
  prompt's size before the first token), and the text before the ".";
- openai agent on an upstream that honours `stop` like vLLM (upstream.py
  --honor-stop: it names the string in the choice's stop_reason);
- what the key is charged for the day equals the usage the replies reported.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json, http_request, parse_sse, sse_data_json  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
MSGS = [{"role": "user", "content": "Once upon a time"}]


class Usage(harness.TestCase):

    def setUp(self):
        super().setUp()
        db = self.h.path("usage.db")
        self.admin = self.h.create_key(db, "admin", "ops")
        self.client = self.h.create_key(db, "client", "c")
        akey = self.h.create_key(db, "agent", "a")
        akey2 = self.h.create_key(db, "agent", "a2")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"], db=db)
        self.h.start_agent(self.srv, slots=1, alias="tiny", token=akey,
                           args=["--model", MODEL, "--threads", "1"])
        self.up = self.h.start_upstream(["--tokens", "20", "--honor-stop"])
        self.h.start_agent(self.srv, upstream=self.up, model="m1", token=akey2)
        self.srv.wait_model("tiny", key=self.client)
        self.srv.wait_model("m1", key=self.client)
        self.charged = [0, 0]

    def message(self, body):
        st, _, b = http_json("POST", self.srv.url + "/v1/messages", body,
                             headers=bearer(self.client), timeout=120)
        self.assertEqual(st, 200, b)
        self.charged[0] += b["usage"]["input_tokens"]
        self.charged[1] += b["usage"]["output_tokens"]
        return b

    def streamed(self, body):
        st, _, raw = http_request("POST", self.srv.url + "/v1/messages", dict(body, stream=True),
                                  headers=bearer(self.client), timeout=120)
        self.assertEqual(st, 200, raw)
        evs = sse_data_json(parse_sse(raw))
        start = evs[0]["message"]["usage"]
        delta = [e for e in evs if e.get("type") == "message_delta"][-1]
        text = "".join(e["delta"].get("text", "") for e in evs
                       if e.get("type") == "content_block_delta")
        self.charged[0] += delta["usage"]["input_tokens"]
        self.charged[1] += delta["usage"]["output_tokens"]
        return start, delta, text

    def check_charged(self):
        st, _, b = http_json("GET", self.srv.url + "/admin/keys", headers=bearer(self.admin))
        self.assertEqual(st, 200, b)
        k = [k for k in b["keys"] if k["name"] == "c"][0]
        u = k["usage_today"]

        def settled():
            st, _, b = http_json("GET", self.srv.url + "/admin/keys",
                                 headers=bearer(self.admin))
            u = [k for k in b["keys"] if k["name"] == "c"][0]["usage_today"]
            return u if [u["prompt_tokens"], u["completion_tokens"]] == self.charged else None
        u = harness.wait_until(settled, timeout=10, what="key usage equal to the replies'")
        self.assertGreater(u["prompt_tokens"], 0)

    def test_gguf_stop_sequence_usage(self):
        base = {"model": "tiny", "max_tokens": 40, "temperature": 0, "messages": MSGS}
        plain = self.message(base)
        n_in = plain["usage"]["input_tokens"]
        self.assertGreater(n_in, 0)
        full = plain["content"][0]["text"]
        self.assertIn(".", full)
        b = self.message(dict(base, stop_sequences=["."]))
        self.assertEqual((b["stop_reason"], b["stop_sequence"]), ("stop_sequence", "."))
        self.assertEqual(b["usage"]["input_tokens"], n_in)
        self.assertEqual(b["content"][0]["text"], full[:full.index(".")])
        self.assertGreater(b["usage"]["output_tokens"], 0)
        start, delta, text = self.streamed(dict(base, stop_sequences=["."]))
        self.assertEqual(start["input_tokens"], n_in)
        self.assertEqual((delta["delta"]["stop_reason"], delta["delta"]["stop_sequence"]),
                         ("stop_sequence", "."))
        self.assertEqual(delta["usage"], b["usage"])
        self.assertEqual(text, b["content"][0]["text"])
        self.check_charged()

    def test_openai_backend_stop_sequence_usage(self):
        base = {"model": "m1", "max_tokens": 40, "messages": MSGS,
                "stop_sequences": ["never there", "a2"]}
        b = self.message(base)
        self.assertEqual((b["stop_reason"], b["stop_sequence"]), ("stop_sequence", "a2"))
        self.assertEqual(b["content"][0]["text"], " Once0 upon1 ")
        self.assertEqual(b["usage"], {"input_tokens": 4, "output_tokens": 3})
        self.assertEqual(self.up.log_entries()[-1]["body"]["stop"], ["never there", "a2"])
        start, delta, text = self.streamed(base)
        self.assertEqual(text, " Once0 upon1 ")
        self.assertEqual(delta["delta"]["stop_sequence"], "a2")
        self.assertEqual(delta["usage"], {"input_tokens": 4, "output_tokens": 3})
        # A stop string the request did not give is not believed.
        b = self.message(dict(base, stop_sequences=None))
        self.assertEqual(b["stop_reason"], "end_turn")
        self.check_charged()


if __name__ == "__main__":
    harness.main()
