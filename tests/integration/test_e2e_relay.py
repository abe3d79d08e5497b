"""End to end with real processes: gpupool-server, real gpupool-agents (openai
backend) and the scripted upstream (upstream.py).

Covers: streaming and non-streaming completions and chat (text checked
against what the upstream generates), round-robin spread over three agents,
503 when no agent serves a model any more, 429 with a full queue, 401 on a
bad key (and an agent with a bad key never registers).
"""

import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request, parse_sse, sse_data_json  # noqa: E402
import upstream as upstream_mod  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--work_wait_sec", "5"]


def expected(prompt, n):
    return "".join(upstream_mod.expected_tokens(prompt, n))


class RelayTest(harness.TestCase):

    def setUp(self):
        super().setUp()

    def pool(self, n_agents=1, up_args=("--tokens", "6"), server_args=(), slots=1, key=None,
             agent_token=None, db=None):
        self.up = self.h.start_upstream(list(up_args))
        self.srv = self.h.start_server(FAST + list(server_args), key=key, db=db)
        self.agents = [self.h.start_agent(self.srv, upstream=self.up, model="m1", slots=slots,
                                          token=agent_token)
                       for _ in range(n_agents)]
        self.srv.wait_model("m1")
        return self.srv

    # ------------------------------------------------------------------
    def test_completion_non_streaming(self):
        srv = self.pool()
        st, hdr, body = http_json("POST", srv.url + "/v1/completions",
                                  {"model": "m1", "prompt": "the quick fox", "max_tokens": 4})
        self.assertEqual(st, 200, body)
        self.assertEqual(body["object"], "text_completion")
        self.assertEqual(body["choices"][0]["text"], expected("the quick fox", 4))
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(body["usage"]["completion_tokens"], 4)
        self.assertEqual(hdr.get("x-pool-agent"), self.agents[0].agent_id())
        rec = self.up.log_entries()[-1]
        self.assertEqual(rec["prompt"], "the quick fox")
        self.assertEqual(rec["body"]["max_tokens"], 4)

    def test_completion_streaming(self):
        srv = self.pool()
        st, hdr, raw = http_request("POST", srv.url + "/v1/completions",
                                    {"model": "m1", "prompt": "a b c", "stream": True})
        self.assertEqual(st, 200, raw)
        self.assertTrue(hdr["content-type"].startswith("text/event-stream"))
        evs = parse_sse(raw)
        self.assertEqual(evs[-1]["data"], "[DONE]")
        chunks = sse_data_json(evs)
        text = "".join(c["choices"][0].get("text", "") for c in chunks if c.get("choices"))
        self.assertEqual(text, expected("a b c", 6))
        finals = [c["choices"][0]["finish_reason"] for c in chunks
                  if c.get("choices") and c["choices"][0].get("finish_reason")]
        self.assertEqual(finals, ["stop"])

    def test_chat_non_streaming(self):
        srv = self.pool()
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello there"}]
        st, _, body = http_json("POST", srv.url + "/v1/chat/completions",
                                {"model": "m1", "messages": msgs})
        self.assertEqual(st, 200, body)
        self.assertEqual(body["object"], "chat.completion")
        self.assertEqual(body["choices"][0]["message"]["role"], "assistant")
        self.assertEqual(body["choices"][0]["message"]["content"], expected("hello there", 6))
        self.assertEqual(self.up.log_entries()[-1]["messages"], msgs)

    def test_chat_streaming(self):
        srv = self.pool(up_args=("--tokens", "5", "--pace-ms", "20"))
        with harness.SSEStream("POST", srv.url + "/v1/chat/completions",
                               {"model": "m1", "stream": True,
                                "messages": [{"role": "user", "content": "x y z"}]}) as s:
            self.assertEqual(s.status, 200)
            evs = s.events()
        chunks = sse_data_json(evs)
        self.assertEqual(evs[-1]["data"], "[DONE]")
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        self.assertEqual(text, expected("x y z", 5))
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))

    def test_round_robin_spread_over_three_agents(self):
        srv = self.pool(n_agents=3, slots=2)
        for a in self.agents:
            a.agent_id()
        harness.wait_until(lambda: len(self._healthy_agents()) >= 3, timeout=20,
                           what="three agents registered")
        served = {}
        for i in range(9):
            # Round robin runs over the agents that are ready: one between
            # two long-polls (it just finished the previous job) is skipped,
            # which a loaded CI run saw as a 4/3/2 spread. Send each request
            # when all three have a long-poll parked.
            srv.wait_parked(3, timeout=20)
            st, hdr, body = http_json("POST", srv.url + "/v1/completions",
                                      {"model": "m1", "prompt": "n%d" % i, "max_tokens": 2})
            self.assertEqual(st, 200, body)
            self.assertEqual(body["choices"][0]["text"], expected("n%d" % i, 2))
            aid = body["x_pool_meta"]["agent_id"]
            served[aid] = served.get(aid, 0) + 1
        ids = {a.agent_id() for a in self.agents}
        self.assertEqual(set(served), ids, served)
        self.assertLessEqual(max(served.values()) - min(served.values()), 1, served)

    def _healthy_agents(self):
        ids = set()
        for e in self.srv.log_events("agent_state"):
            if e.get("to") == "healthy":
                ids.add(e.get("agent_id"))
        return ids

    def test_404_or_503_for_unknown_model_and_503_after_agent_left(self):
        srv = self.pool(server_args=["--queue_timeout_sec", "2"])
        st, hdr, body = http_json("POST", srv.url + "/v1/completions",
                                  {"model": "never-registered", "prompt": "x"})
        self.assertIn(st, (404, 503), body)
        self.assertIn("error", body)
        # The only agent drains and leaves: the model has no agent any more.
        self.assertEqual(self.agents[0].stop(grace=20), 0)

        def unavailable():
            st, hdr, body = http_json("POST", srv.url + "/v1/completions",
                                      {"model": "m1", "prompt": "x"}, timeout=30)
            return (st, hdr, body) if st == 503 else None
        st, hdr, body = harness.wait_until(unavailable, timeout=30, interval=0.2,
                                           what="503 once the agent left")
        self.assertIn("retry-after", hdr)
        self.assertIsInstance(body["error"]["message"], str)

    def test_429_when_queue_full(self):
        srv = self.pool(up_args=("--tokens", "2", "--first-delay-ms", "60000"),
                        server_args=["--max_queue", "1", "--queue_timeout_sec", "60",
                                     "--log_level", "debug"])  # job_submitted is a debug line
        results = []

        def bg(i):
            try:
                results.append(http_json("POST", srv.url + "/v1/completions",
                                         {"model": "m1", "prompt": "bg%d" % i}, timeout=120))
            except Exception as e:  # noqa: BLE001 - the teardown kills the server
                results.append(e)
        t1 = threading.Thread(target=bg, args=(1,), daemon=True)
        t1.start()
        harness.wait_until(lambda: len(self.up.log_entries()) == 1, timeout=20,
                           what="first request running upstream")
        t2 = threading.Thread(target=bg, args=(2,), daemon=True)
        t2.start()
        # The second waits in the queue (the only slot is busy); a third is refused.
        harness.wait_until(lambda: len(srv.log_events("job_submitted")) >= 2, timeout=20,
                           what="second request queued")
        st, hdr, body = http_json("POST", srv.url + "/v1/completions",
                                  {"model": "m1", "prompt": "third"}, timeout=30)
        self.assertEqual(st, 429, body)
        self.assertIn("retry-after", hdr)
        self.assertIn("error", body)
        # Let the held ones finish so that nothing is left half-done.
        self.up.control(first_delay_ms=0)
        t1.join(60)
        t2.join(60)
        self.assertEqual([r[0] for r in results if isinstance(r, tuple)], [200, 200])

    def test_401_on_bad_key_and_agent_with_bad_key_never_registers(self):
        db = self.h.path("auth.db")
        client_key = self.h.create_key(db, "client", "c")
        agent_key = self.h.create_key(db, "agent", "a")
        srv = self.pool(key=client_key, agent_token=agent_key, db=db)
        body = {"model": "m1", "prompt": "k"}
        st, _, b = http_json("POST", srv.url + "/v1/completions", body,
                             headers=harness.bearer("gp-wrong-key"))
        self.assertEqual(st, 401, b)
        self.assertIn("error", b)
        st, _, b = http_json("POST", srv.url + "/v1/completions", body)
        self.assertEqual(st, 401, b)
        st, _, b = http_json("POST", srv.url + "/v1/completions", body,
                             headers=harness.bearer(client_key))
        self.assertEqual(st, 200, b)
        self.assertEqual(b["choices"][0]["text"], expected("k", 6))
        # An agent with an unknown key is refused (401 from the enrollment
        # it tries first: it exits naming the reason), one with a client
        # key too (not an enrollment token, so used as the key: its polls
        # get 403, wrong role); neither registers its model.
        bad = self.h.start_agent(srv, upstream=self.up, model="m2", token="gp-bogus")
        wrong = self.h.start_agent(srv, upstream=self.up, model="m3", token=client_key)
        harness.wait_until(lambda: bad.log_events("enroll_rejected") and wrong.log_events("poll_rejected"),
                           timeout=20, what="agents log their rejections")
        self.assertIn("HTTP 401", bad.log_events("enroll_rejected")[0]["msg"])
        harness.wait_until(lambda: not bad.alive(), timeout=20, what="agent with a bad key exits")
        self.assertNotEqual(bad.p.returncode, 0)
        self.assertIn("HTTP 403", wrong.log_events("poll_rejected")[0]["msg"])
        models = srv.models(client_key)
        self.assertIn("m1", models)
        self.assertNotIn("m2", models)
        self.assertNotIn("m3", models)


if __name__ == "__main__":
    harness.main()
