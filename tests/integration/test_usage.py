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
- openai agent (issue 26 item 4): the agent matches the stop strings itself
  and does not send them upstream (an upstream that stops on one may not
  say which: upstream.py --honor-stop with name_stop off answers as
  llama-server does, finish_reason "stop" alone). A reply the agent cut
  has no upstream usage: the agent counts the prompt (the upstream's
  /tokenize) before it ends. In OpenAI's dialect: finish_reason "stop";
- openai agent, Anthropic stream (issue 26 item 4): message_start carries
  the prompt's count (the agent asks the upstream before generating); it
  is the upstream's own, chat template included, whether the upstream
  plays llama-server (/apply-template, then /tokenize of its text) or vLLM
  (/tokenize of the messages); without a count endpoint, the documented
  estimate (message_delta then has the upstream's count); a request that
  is not streamed is not counted first;
- what the key is charged for the day equals the usage the replies reported;
- a client that leaves mid-stream (OpenAI chat, Anthropic messages; gguf
  and openai agents) is charged what its request-log row says: the tokens
  the server relayed and the prompt (its real size when the agent reported
  it before the first token, as gguf does and the openai backend does for
  an Anthropic stream; else the documented estimate, since the openai
  backend learns it only from the upstream's last chunk);
- a request that failed over mid-stream reports the usage of the whole reply
  once (the prompt once, every relayed token) and is charged that.
"""

import json

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json, http_request, parse_sse, sse_data_json  # noqa: E402
import upstream as upstream_mod  # noqa: E402

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

    def chat_requests(self):
        return [e for e in self.up.log_entries() if e["path"] == "/v1/chat/completions"]

    def test_openai_backend_stop_sequence_usage(self):
        # An upstream that stops on a string without naming it (llama-server).
        st, _, _ = http_json("POST", self.up.url + "/_control/config", {"name_stop": False})
        self.assertEqual(st, 200)
        base = {"model": "m1", "max_tokens": 40, "messages": MSGS,
                "stop_sequences": ["never there", "a2"]}
        b = self.message(base)
        self.assertEqual((b["stop_reason"], b["stop_sequence"]), ("stop_sequence", "a2"))
        self.assertEqual(b["content"][0]["text"], " Once0 upon1 ")
        self.assertEqual(b["usage"], {"input_tokens": 4, "output_tokens": 3})
        # Matched by the agent: the upstream is not asked to stop.
        self.assertNotIn("stop", self.chat_requests()[-1]["body"])
        start, delta, text = self.streamed(base)
        self.assertEqual(start["input_tokens"], 4)
        self.assertEqual(text, " Once0 upon1 ")
        self.assertEqual((delta["delta"]["stop_reason"], delta["delta"]["stop_sequence"]),
                         ("stop_sequence", "a2"))
        self.assertEqual(delta["usage"], {"input_tokens": 4, "output_tokens": 3})
        # OpenAI's dialect: the text before the string, finish_reason "stop".
        st, _, c = http_json("POST", self.srv.url + "/v1/chat/completions",
                             {"model": "m1", "max_tokens": 40, "messages": MSGS,
                              "stop": ["a2"]}, headers=bearer(self.client), timeout=60)
        self.assertEqual(st, 200, c)
        self.assertEqual(c["choices"][0]["message"]["content"], " Once0 upon1 ")
        self.assertEqual(c["choices"][0]["finish_reason"], "stop")
        self.assertEqual(c["usage"]["prompt_tokens"], 4)
        self.charged[0] += c["usage"]["prompt_tokens"]
        self.charged[1] += c["usage"]["completion_tokens"]
        # A stop string the request did not give is not believed.
        b = self.message(dict(base, stop_sequences=None))
        self.assertEqual(b["stop_reason"], "end_turn")
        self.check_charged()

    def test_openai_backend_message_start_has_the_prompt_count(self):
        base = {"model": "m1", "max_tokens": 40, "messages": MSGS}
        self.up.reset()
        start, delta, text = self.streamed(base)
        self.assertEqual(start["input_tokens"], 4)
        self.assertEqual(delta["usage"]["input_tokens"], 4)
        paths = [e["path"] for e in self.up.log_entries()]
        self.assertLess(paths.index("/tokenize"), paths.index("/v1/chat/completions"), paths)
        # Not streamed: the usage comes with the body; no count first.
        self.up.reset()
        b = self.message(base)
        self.assertEqual(b["usage"]["input_tokens"], 4)
        self.assertEqual([e["path"] for e in self.up.log_entries()], ["/v1/chat/completions"])
        # An upstream without a count endpoint: the documented estimate
        # ("Once upon a time": 16 bytes -> 4, + 4 for one message), then
        # the upstream's own count at the end.
        st, _, _ = http_json("POST", self.up.url + "/_control/config", {"tokenize": False})
        self.assertEqual(st, 200)
        start, delta, text = self.streamed(base)
        self.assertEqual(start["input_tokens"], (len("Once upon a time") + 3) // 4 + 4)
        self.assertEqual(delta["usage"]["input_tokens"], 4)
        self.assertTrue(text)
        # ... and the next stream does not wait on the failed endpoints again.
        self.up.reset()
        start, _, _ = self.streamed(base)
        self.assertEqual(start["input_tokens"], (len("Once upon a time") + 3) // 4 + 4)
        self.assertEqual([e["path"] for e in self.up.log_entries()], ["/v1/chat/completions"])
        self.check_charged()

    def test_openai_backend_counts_with_the_chat_template(self):
        # The scripted upstream's chat template keeps only the last message:
        # its usage counts "Once upon a time" (4), where the contents of
        # the whole conversation have 12 words.
        base = {"model": "m1", "max_tokens": 10, "system": "You tell stories.",
                "messages": [{"role": "user", "content": "one two three"},
                             {"role": "assistant", "content": "four five"},
                             {"role": "user", "content": "Once upon a time"}]}
        for server, cfg, path in (
                ("llama-server", {"apply_template": True, "tokenize_messages": False},
                 "/apply-template"),
                ("vLLM", {"apply_template": False, "tokenize_messages": True}, "/tokenize")):
            st, _, _ = http_json("POST", self.up.url + "/_control/config", cfg)
            self.assertEqual(st, 200)
            self.up.reset()
            start, delta, _ = self.streamed(base)
            self.assertEqual(start["input_tokens"], 4, server)
            self.assertEqual(delta["usage"]["input_tokens"], 4, server)
            log = self.up.log_entries()
            asked = [e for e in log if e["path"] == path]
            self.assertTrue(asked, (server, [e["path"] for e in log]))
            self.assertEqual(asked[0]["body"]["messages"][-1]["content"], "Once upon a time")
        self.check_charged()

    def cancel_midstream(self, path, body, n_events):
        """Stream body to path, read n_events token events, hang up; returns
        the job's request-log row once the server has cancelled it."""
        cid = "cancel-%s-%s" % (path.strip("/").replace("/", "-"), body["model"])
        s = harness.SSEStream("POST", self.srv.url + path, dict(body, stream=True),
                              headers=dict(bearer(self.client), **{"X-Correlation-Id": cid}),
                              timeout=60)
        self.assertEqual(s.status, 200)
        seen = 0
        while seen < n_events:
            e = s.next_event(timeout=30)
            self.assertIsNotNone(e, "the stream ended before %d tokens" % n_events)
            d = json.loads(e["data"]) if e.get("data", "").startswith("{") else {}
            if d.get("type") == "content_block_delta" or \
                    any((c.get("delta") or {}).get("content") for c in d.get("choices") or []):
                seen += 1
        s.close()

        def row():
            st, _, b = http_json("GET", self.srv.url + "/admin/jobs?limit=50",
                                 headers=bearer(self.admin))
            rows = [j for j in b.get("jobs", []) if j.get("correlation_id") == cid]
            return rows[0] if rows and rows[0]["status"] == "cancelled" else None
        r = harness.wait_until(row, timeout=30, what="the job cancelled")
        self.assertGreaterEqual(r["completion_tokens"], n_events)
        self.assertGreater(r["prompt_tokens"], 0)
        self.charged[0] += r["prompt_tokens"]
        self.charged[1] += r["completion_tokens"]
        return r

    def test_client_gone_is_charged_what_was_logged(self):
        # A slow upstream, so that the client surely leaves first (400 tokens
        # at 100 ms). For OpenAI's dialect the openai backend learns the
        # prompt's size only from the upstream's last chunk: the server
        # charges the documented estimate ("Once upon a time": 16 bytes -> 4,
        # + 4 for one message). An Anthropic stream had it counted first.
        st, _, _ = http_json("POST", self.up.url + "/_control/config",
                             {"pace_ms": 100, "tokens": 400})
        self.assertEqual(st, 200)
        base = {"model": "m1", "max_tokens": 2000, "messages": MSGS}
        estimate = (len("Once upon a time") + 3) // 4 + 4
        for path, n, prompt in (("/v1/chat/completions", 3, estimate), ("/v1/messages", 2, 4)):
            r = self.cancel_midstream(path, base, n)
            self.assertEqual(r["prompt_tokens"], prompt)
            ev = [e for e in self.srv.log_events("job_cancelled") if e.get("job_id") == r["id"]]
            self.assertEqual(len(ev), 1)
            self.assertEqual(ev[0]["prompt_estimated"], prompt == estimate)
            self.assertEqual(ev[0]["completion_tokens"], r["completion_tokens"])
        self.check_charged()


class FailoverUsage(harness.TestCase):

    def test_failover_reports_and_charges_the_whole_reply_once(self):
        from test_e2e_failover import FAST, N, ContUpstream, expected
        db = self.h.path("fo.db")
        admin = self.h.create_key(db, "admin", "ops")
        client = self.h.create_key(db, "client", "c")
        keys = [self.h.create_key(db, "agent", "a%d" % i) for i in range(2)]
        srv = self.h.start_server(FAST, db=db)
        ua = ContUpstream(self.h, self.h._name("upstream"),
                          ["--tokens", str(N), "--mode", "die", "--after", "4"])
        ub = ContUpstream(self.h, self.h._name("upstream"), ["--tokens", str(N)])
        self.h.procs += [ua, ub]
        aa = self.h.start_agent(srv, upstream=ua, model="m1", token=keys[0])
        self.h.start_agent(srv, upstream=ub, model="m1", token=keys[1])
        srv.wait_model("m1", key=client)
        ida = aa.agent_id()

        def parked():
            _, _, raw = http_request("GET", srv.url + "/metrics", timeout=5)
            return any(line.startswith("gpupool_agents_parked ") and float(line.split()[-1]) >= 2
                       for line in raw.decode().splitlines())
        harness.wait_until(parked, timeout=30, what="both agents parked")
        prompt = "once upon a time there was a pool"
        reported = [0, 0]
        # OpenAI chat, streamed: A dies after 4 tokens, B continues.
        st, _, raw = http_request("POST", srv.url + "/v1/chat/completions",
                                  {"model": "m1", "stream": True, "max_tokens": 50,
                                   "stream_options": {"include_usage": True},
                                   "messages": [{"role": "user", "content": prompt}],
                                   "x_pool_options": {"prefer_agent": ida}},
                                  headers=bearer(client), timeout=60)
        self.assertEqual(st, 200, raw)
        datas = sse_data_json(parse_sse(raw))
        text = "".join((c.get("delta") or {}).get("content") or ""
                       for d in datas for c in d.get("choices") or [])
        self.assertEqual(text, expected(prompt))
        last = [d for d in datas if any(c.get("finish_reason") for c in d.get("choices") or [])]
        self.assertEqual(last[0]["x_pool_meta"]["attempts"], 2)
        u = [d["usage"] for d in datas if d.get("usage")][-1]
        self.assertEqual(u["completion_tokens"], N)
        # The prompt once: what B's upstream was asked minus the continuation
        # is not the client's prompt; upstream.py counts one token per word.
        self.assertEqual(u["prompt_tokens"], len(prompt.split()))
        reported[0] += u["prompt_tokens"]
        reported[1] += u["completion_tokens"]

        def settled():
            st, _, b = http_json("GET", srv.url + "/admin/keys", headers=bearer(admin))
            k = [k for k in b["keys"] if k["name"] == "c"][0]["usage_today"]
            return k if [k["prompt_tokens"], k["completion_tokens"]] == reported else None
        harness.wait_until(settled, timeout=10, what="key usage equal to the reply's")


if __name__ == "__main__":
    harness.main()
