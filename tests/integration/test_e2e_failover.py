"""Failover and fallback with real processes: gpupool-server, two
gpupool-agents (openai backend) and continuation-aware scripted upstreams
(upstream_continue.py over upstream.py).

- continue (default): agent A's upstream dies after k tokens, or agent A is
  killed mid-stream; the client's stream goes on on agent B with exactly the
  text upstream.py would have produced in one go (nothing missing, nothing
  repeated) and usage counting every token;
- restart: transparent while nothing was sent (non-streaming), an error
  after output; error: no failover at all;
- the native API records a `failover` event among its numbered events, and
  a replay returns the same events;
- fallback_models: a model without an agent falls back to the next one;
- bad x_pool_options.failover / fallback_models: 400 in each dialect's shape.
"""

import json
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json  # noqa: E402
import upstream as upstream_mod  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]
CONT_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream_continue.py")
N = 12  # tokens per reply


def expected(prompt, n=N):
    return "".join(upstream_mod.expected_tokens(prompt, n))


class ContUpstream(harness.Upstream):
    """harness.Upstream running upstream_continue.py."""

    def __init__(self, h, name, args):
        self.port_file = os.path.join(h.tmp, name + ".port")
        argv = [sys.executable, CONT_PY, "--port", "0", "--port-file", self.port_file] + list(args)
        harness.Proc.__init__(self, name, argv, os.path.join(h.tmp, name + ".log"), env=h.env())
        self.port = harness.read_port_file(self.port_file, self.p)
        self.url = "http://127.0.0.1:%d" % self.port


def chat_text(events):
    out = []
    for e in harness.sse_data_json(events):
        for c in e.get("choices") or []:
            out.append((c.get("delta") or {}).get("content") or "")
    return "".join(out)


class FailoverTest(harness.TestCase):

    def pool(self, a_args, b_args=("--pace-ms", "5"), server_args=(), agent_a_args=()):
        """Server, upstream A (a_args) behind agent A (agent_a_args), upstream B
        behind agent B; returns when both agents have a long-poll parked."""
        self.srv = self.h.start_server(FAST + list(server_args))
        self.ua = self.start_cont(["--tokens", str(N)] + list(a_args))
        self.ub = self.start_cont(["--tokens", str(N)] + list(b_args))
        self.aa = self.h.start_agent(self.srv, upstream=self.ua, model="m1",
                                     args=list(agent_a_args))
        self.ab = self.h.start_agent(self.srv, upstream=self.ub, model="m1")
        self.srv.wait_model("m1")
        self.ida, self.idb = self.aa.agent_id(), self.ab.agent_id()
        for aid in (self.ida, self.idb):
            harness.wait_until(lambda aid=aid: self.healthy(aid), timeout=20, what="agent healthy")
        # prefer_agent is not strict: a job sent while A is between two
        # long-polls goes straight to B and the test sees one attempt. Wait
        # until both agents have a parked long-poll.
        harness.wait_until(lambda: self.parked() >= 2, timeout=20, what="both agents parked")

    def parked(self):
        return self.metric("gpupool_agents_parked")

    def metric(self, series):
        """The value of one series of /metrics, given as it is written
        (name{labels}); 0 when absent."""
        _, _, raw = harness.http_request("GET", self.srv.url + "/metrics", timeout=5)
        for line in raw.decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return 0

    def start_cont(self, args):
        u = ContUpstream(self.h, self.h._name("upstream"), args)
        self.h.procs.append(u)
        return u

    def healthy(self, aid):
        return any(e.get("agent_id") == aid and e.get("to") == "healthy"
                   for e in self.srv.log_events("agent_state"))

    def opts(self, **kw):
        o = {"prefer_agent": self.ida}
        o.update(kw)
        return o

    # -- continue ---------------------------------------------------------
    def test_continue_chat_stream_upstream_dies(self):
        self.pool(["--mode", "die", "--after", "4", "--pace-ms", "20"])
        prompt = "once upon a time there was a pool"
        s = harness.SSEStream("POST", self.srv.url + "/v1/chat/completions",
                              {"model": "m1", "stream": True, "max_tokens": 50,
                               "stream_options": {"include_usage": True},
                               "messages": [{"role": "user", "content": prompt}],
                               "x_pool_options": self.opts()}, timeout=60)
        self.assertEqual(s.status, 200)
        events = s.events()
        s.close()
        datas = harness.sse_data_json(events)
        self.assertFalse([d for d in datas if "error" in d], datas)
        self.assertEqual(events[-1]["data"], "[DONE]")
        self.assertEqual(chat_text(events), expected(prompt))
        usage = [d["usage"] for d in datas if d.get("usage")]
        self.assertEqual(usage[-1]["completion_tokens"], N)
        fins = [c["finish_reason"] for d in datas for c in d.get("choices") or [] if c.get("finish_reason")]
        self.assertEqual(fins, ["stop"])
        last = [d for d in datas if any(c.get("finish_reason") for c in d.get("choices") or [])][0]
        self.assertEqual(last["x_pool_meta"]["attempts"], 2)
        self.assertEqual(last["x_pool_meta"]["agent_id"], self.idb)
        self.assertEqual(s.headers.get("x-pool-agent"), self.ida)  # sent with the first token
        # B was given A's 4 tokens as the assistant's partial answer.
        recs = [r for r in self.ub.log_entries() if r.get("path", "").endswith("chat/completions")]
        self.assertEqual(len(recs), 1)
        self.assertEqual(recs[0]["body"]["x_continued_from"], 4)
        self.assertEqual(recs[0]["body"]["x_continuation"], expected(prompt, 4))
        fo = self.srv.log_events("job_failover")
        self.assertEqual([e.get("mode") for e in fo], ["continue"])

    def test_continue_anthropic_stream(self):
        # With stop_sequences the Anthropic stream scans (and may hold back)
        # text on the server; the continuation follows all the job's text.
        self.pool(["--mode", "die", "--after", "5", "--pace-ms", "20"])
        prompt = "sing a song of sixpence"
        s = harness.SSEStream("POST", self.srv.url + "/v1/messages",
                              {"model": "m1", "stream": True, "max_tokens": 50,
                               "stop_sequences": [" never"],
                               "messages": [{"role": "user", "content": prompt}],
                               "x_pool_options": self.opts()}, timeout=60)
        self.assertEqual(s.status, 200)
        evs = s.events()
        s.close()
        names = [e.get("event") for e in evs]
        self.assertNotIn("error", names)
        datas = [json.loads(e["data"]) for e in evs]
        text = "".join(d["delta"]["text"] for d in datas
                       if d.get("type") == "content_block_delta")
        self.assertEqual(text, expected(prompt))
        md = [d for d in datas if d.get("type") == "message_delta"][0]
        self.assertEqual(md["delta"]["stop_reason"], "end_turn")
        self.assertEqual(md["usage"]["output_tokens"], N)
        self.assertEqual(md["x_pool_meta"]["attempts"], 2)
        self.assertEqual(md["x_pool_meta"]["agent_id"], self.idb)
        self.assertEqual(names[-1], "message_stop")

    def test_continue_completion_nonstream_max_tokens(self):
        # Output of a non-streaming request never reached the client: a
        # transparent restart on B, text from scratch.
        self.pool(["--mode", "die", "--after", "3", "--pace-ms", "20"])
        prompt = "count the sheep ::"
        st, hdr, body = http_json("POST", self.srv.url + "/v1/completions",
                                  {"model": "m1", "prompt": prompt, "max_tokens": 10,
                                   "x_pool_options": self.opts()}, timeout=60)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], expected(prompt, 10))
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(body["usage"]["completion_tokens"], 10)
        self.assertEqual(body["x_pool_meta"]["attempts"], 2)
        self.assertEqual(body["x_pool_meta"]["agent_id"], self.idb)
        self.assertEqual(hdr.get("x-pool-attempts"), "2")
        self.assertEqual(hdr.get("x-pool-model"), "m1")

    def test_continue_completion_stream_agent_killed(self):
        self.pool(["--pace-ms", "250"])
        prompt = "the lighthouse keeper said ::"
        s = harness.SSEStream("POST", self.srv.url + "/v1/completions",
                              {"model": "m1", "stream": True, "prompt": prompt, "max_tokens": 40,
                               "stream_options": {"include_usage": True},
                               "x_pool_options": self.opts()}, timeout=60)
        self.assertEqual(s.status, 200)
        got = []
        while len(got) < 3:
            e = s.next_event(timeout=20)
            self.assertIsNotNone(e)
            d = json.loads(e["data"])
            got += [c["text"] for c in d.get("choices") or [] if c.get("text")]
        self.aa.kill9()
        events = s.events()
        s.close()
        datas = harness.sse_data_json(events)
        self.assertFalse([d for d in datas if "error" in d], datas)
        text = "".join(got) + "".join(c.get("text") or "" for d in datas for c in d.get("choices") or [])
        self.assertEqual(text, expected(prompt))
        self.assertEqual([d["usage"] for d in datas if d.get("usage")][-1]["completion_tokens"], N)
        rec = [r for r in self.ub.log_entries() if r.get("path", "").endswith("completions")][-1]
        k = rec["body"]["x_continued_from"]
        self.assertGreaterEqual(k, 3)
        self.assertEqual(rec["body"]["max_tokens"], 40 - k)

    def stream_completion(self, prompt, max_tokens=40, **opts):
        return harness.SSEStream("POST", self.srv.url + "/v1/completions",
                                 {"model": "m1", "stream": True, "prompt": prompt,
                                  "max_tokens": max_tokens,
                                  "stream_options": {"include_usage": True},
                                  "x_pool_options": self.opts(**opts)}, timeout=60)

    def read_rest(self, s, got):
        """got: texts read so far; returns (whole text, last usage)."""
        events = s.events()
        s.close()
        datas = harness.sse_data_json(events)
        self.assertFalse([d for d in datas if "error" in d], datas)
        text = "".join(got) + "".join(c.get("text") or "" for d in datas
                                      for c in d.get("choices") or [])
        return text, [d["usage"] for d in datas if d.get("usage")][-1]

    def first_texts(self, s, n):
        got = []
        while len(got) < n:
            e = s.next_event(timeout=20)
            self.assertIsNotNone(e)
            d = json.loads(e["data"])
            got += [c["text"] for c in d.get("choices") or [] if c.get("text")]
        return got

    def test_continue_after_agent_drain_timeout(self):
        # SIGTERM with a 1 s drain timeout: agent A stops the job with
        # AGENT_SHUTDOWN, which fails over like a lost agent.
        # Through pool(): the job must start on A, and prefer_agent only gets
        # it there when A has a long-poll parked (a CI run sent it to B).
        self.pool(["--pace-ms", "300"], agent_a_args=["--drain-timeout-sec", "1"])
        prompt = "drain the pool ::"
        s = self.stream_completion(prompt)
        self.assertEqual(s.status, 200)
        got = self.first_texts(s, 2)
        self.assertEqual(s.headers.get("x-pool-agent"), self.ida)
        self.aa.signal(signal.SIGTERM)
        text, usage = self.read_rest(s, got)
        self.assertEqual(text, expected(prompt))
        self.assertEqual(usage["completion_tokens"], N)
        fo = self.srv.log_events("job_failover")
        self.assertEqual([(e.get("reason"), e.get("mode")) for e in fo],
                         [("AGENT_SHUTDOWN", "continue")])
        self.assertEqual(self.metric('gpupool_attempts_lost_total{reason="agent_shutdown"}'), 1)

    def test_upstream_stall_counts_as_lost(self):
        # The agent is alive (its polls list the job, so the server's stall
        # timer keeps restarting): its own upstream timeout reports the
        # stall, which fails over like a lost agent.
        self.pool(["--mode", "stall", "--after", "3", "--pace-ms", "20"],
                  agent_a_args=["--upstream-timeout-sec", "2"])
        prompt = "silence then more ::"
        s = self.stream_completion(prompt)
        self.assertEqual(s.status, 200)
        text, usage = self.read_rest(s, [])
        self.assertEqual(text, expected(prompt))
        self.assertEqual(usage["completion_tokens"], N)
        fo = self.srv.log_events("job_failover")
        self.assertEqual([(e.get("reason"), e.get("mode")) for e in fo],
                         [("UPSTREAM_TIMEOUT", "continue")])
        self.assertEqual(self.metric('gpupool_attempts_lost_total{reason="upstream_error"}'), 1)
        self.assertEqual(self.metric('gpupool_attempts_lost_total{reason="stalled"}'), 0)
        # The stalled agent was told to stop: its upstream saw the client go.
        harness.wait_until(lambda: self.ua.log_entries()[-1]["outcome"] == "client_gone",
                           timeout=20, what="stalled upstream request closed")

    def test_native_failover_event_and_replay(self):
        self.pool(["--mode", "die", "--after", "5", "--pace-ms", "20"])
        prompt = "a native task ::"
        st, _, r = http_json("POST", self.srv.url + "/v2/tasks",
                             {"model": "m1", "prompt": prompt, "max_tokens": 30,
                              "x_pool_options": self.opts()}, timeout=10)
        self.assertEqual(st, 202, r)
        url = self.srv.url + "/v2/tasks/%s/events" % r["job_id"]
        st, _, data = harness.http_request("GET", url, timeout=60)
        self.assertEqual(st, 200)
        evs = [(int(e["id"]), e["event"], json.loads(e["data"])) for e in harness.parse_sse(data)]
        self.assertEqual([e[0] for e in evs], list(range(1, len(evs) + 1)))
        types = [e[1] for e in evs]
        self.assertEqual(types.count("failover"), 1, types)
        self.assertEqual(types[-1], "end", types)
        fi = types.index("failover")
        fo = evs[fi][2]
        self.assertEqual(fo["from_agent"], self.ida)
        self.assertEqual(fo["completion_tokens"], 5)
        self.assertEqual(fo["attempt"], 2)
        self.assertEqual(types[:fi].count("token"), 5)
        self.assertIn("started", types[fi:])
        tokens = "".join(e[2]["text"] for e in evs if e[1] == "token")
        self.assertEqual(tokens, expected(prompt))
        self.assertEqual(evs[-1][2]["text"], expected(prompt))
        self.assertEqual(evs[-1][2]["usage"]["completion_tokens"], N)
        # Replay after the failover event gives exactly the rest.
        st, _, data2 = harness.http_request("GET", url, headers={"Last-Event-ID": str(fi + 1)},
                                            timeout=10)
        self.assertEqual(st, 200)
        evs2 = [(int(e["id"]), e["event"], json.loads(e["data"])) for e in harness.parse_sse(data2)]
        self.assertEqual(evs2, evs[fi + 1:])
        st, _, status = http_json("GET", self.srv.url + "/v2/tasks/" + r["job_id"])
        self.assertEqual(status["attempts"], 2)

    # -- restart / error ----------------------------------------------------
    def test_restart_stream_after_output_is_an_error(self):
        self.pool(["--mode", "die", "--after", "4", "--pace-ms", "20"])
        prompt = "no second chances"
        s = harness.SSEStream("POST", self.srv.url + "/v1/chat/completions",
                              {"model": "m1", "stream": True,
                               "messages": [{"role": "user", "content": prompt}],
                               "x_pool_options": self.opts(failover="restart")}, timeout=60)
        self.assertEqual(s.status, 200)
        events = s.events()
        s.close()
        datas = harness.sse_data_json(events)
        errs = [d["error"] for d in datas if "error" in d]
        self.assertEqual(len(errs), 1, datas)
        self.assertEqual(chat_text(events), expected(prompt, 4))
        self.assertEqual([r for r in self.ub.log_entries() if r.get("path", "").endswith("completions")], [])

    def test_restart_nonstream_is_transparent(self):
        self.pool(["--mode", "die", "--after", "4", "--pace-ms", "20"])
        prompt = "try again"
        st, _, body = http_json("POST", self.srv.url + "/v1/chat/completions",
                                {"model": "m1", "messages": [{"role": "user", "content": prompt}],
                                 "x_pool_options": self.opts(failover="restart")}, timeout=60)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["message"]["content"], expected(prompt))
        self.assertEqual(body["x_pool_meta"]["attempts"], 2)
        rec = [r for r in self.ub.log_entries() if r.get("path", "").endswith("completions")][-1]
        self.assertNotIn("x_continued_from", rec["body"])

    def test_error_mode_never_fails_over(self):
        self.pool(["--mode", "die", "--after", "4", "--pace-ms", "20"])
        st, _, body = http_json("POST", self.srv.url + "/v1/completions",
                                {"model": "m1", "prompt": "fragile ::",
                                 "x_pool_options": self.opts(failover="error")}, timeout=60)
        self.assertEqual(st, 502, body)
        self.assertIn("error", body)
        self.assertEqual([r for r in self.ub.log_entries() if r.get("path", "").endswith("completions")], [])

    # -- fallback_models / validation ----------------------------------------
    def test_fallback_models_and_validation(self):
        srv = self.h.start_server(FAST)
        up = self.h.start_upstream(["--tokens", "3"])
        self.h.start_agent(srv, upstream=up, model="small")
        srv.wait_model("small")
        prompt = "fall back"
        st, hdr, body = http_json("POST", srv.url + "/v1/completions",
                                  {"model": "big", "prompt": prompt,
                                   "x_pool_options": {"fallback_models": ["gone", "small"]}},
                                  timeout=30)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["model"], "small")
        self.assertEqual(body["choices"][0]["text"], expected(prompt, 3))
        self.assertEqual(body["x_pool_meta"]["model"], "small")
        self.assertEqual(len(body["x_pool_meta"]["warnings"]), 1)
        self.assertIn("'big'", body["x_pool_meta"]["warnings"][0])
        self.assertEqual(hdr.get("x-pool-model"), "small")
        # Anthropic, streaming: message_start names the serving model.
        s = harness.SSEStream("POST", srv.url + "/v1/messages",
                              {"model": "big", "max_tokens": 10, "stream": True,
                               "messages": [{"role": "user", "content": prompt}],
                               "x_pool_options": {"fallback_models": ["small"]}}, timeout=30)
        self.assertEqual(s.status, 200)
        evs = s.events()
        s.close()
        start = json.loads([e for e in evs if e.get("event") == "message_start"][0]["data"])
        self.assertEqual(start["message"]["model"], "small")
        self.assertIn("'big'", start["message"]["x_pool_meta"]["warnings"][0])
        # Native.
        st, _, r = http_json("POST", srv.url + "/v2/tasks",
                             {"model": "big", "prompt": prompt, "max_tokens": 5,
                              "x_pool_options": {"fallback_models": ["small"]}})
        self.assertEqual(st, 202, r)
        st, _, stat = http_json("GET", srv.url + "/v2/tasks/" + r["job_id"])
        self.assertEqual(stat["model"], "small")
        # No fallback can serve: the first model's error.
        st, _, body = http_json("POST", srv.url + "/v1/completions",
                                {"model": "big", "prompt": prompt,
                                 "x_pool_options": {"fallback_models": ["gone"]}})
        self.assertEqual(st, 404, body)
        self.assertIn("'big'", body["error"]["message"])
        # Validation, in each dialect's error shape.
        bad = {"failover": "sometimes"}
        st, _, body = http_json("POST", srv.url + "/v1/completions",
                                {"model": "small", "prompt": "x", "x_pool_options": bad})
        self.assertEqual(st, 400, body)
        self.assertEqual(body["error"]["param"], "x_pool_options.failover")
        st, _, body = http_json("POST", srv.url + "/v1/messages",
                                {"model": "small", "max_tokens": 5, "x_pool_options": bad,
                                 "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(st, 400, body)
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        self.assertIn("failover", body["error"]["message"])
        st, _, body = http_json("POST", srv.url + "/v2/tasks",
                                {"model": "small", "prompt": "x", "max_tokens": 5,
                                 "x_pool_options": {"fallback_models": "small"}})
        self.assertEqual(st, 400, body)
        self.assertEqual(body["error"]["code"], "INVALID_REQUEST")
        self.assertEqual(body["error"]["details"]["param"], "x_pool_options.fallback_models")
        st, _, body = http_json("POST", srv.url + "/v1/chat/completions",
                                {"model": "small", "messages": [{"role": "user", "content": "x"}],
                                 "x_pool_options": {"fallback_models": ["a", "b", "c", "d", "e"]}})
        self.assertEqual(st, 400, body)
        self.assertEqual(body["error"]["param"], "x_pool_options.fallback_models")


if __name__ == "__main__":
    harness.main()
