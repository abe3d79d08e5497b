"""fallback_models after a failover (issue 10 item 9), with real processes:
gpupool-server and two gguf agents on copies of models/stories260K.gguf,
one serving model "alpha", the other "beta" (a copy with other bytes: another
digest, so the continuation is text).

A streaming chat for "alpha" with x_pool_options.fallback_models ["beta"]
runs on alpha's only agent, which is killed -9 once the client has read N
chunks (event-based: the agent holds at N tokens, GPUPOOL_TEST_TOKEN_GATE,
see test_e2e_token_failover.py). With no live agent left for alpha, the job
moves to beta at once instead of waiting out queue_timeout: the stream goes
on and ends on beta's agent, and x_pool_meta says which model served, that
the continuation was text, and warns that alpha had no capacity. Without
fallback_models the same kill leaves the job queued for alpha, which fails
with a queue timeout.
"""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_e2e_token_failover import GatedAgent, gguf_built, write_atomic  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
# queue_timeout 20: the control case must end, and must not end before the
# agent loss has been handled (grace 1 s).
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5",
        "--queue_timeout_sec", "20"]
N = 6


class FallbackFailoverTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.srv = self.h.start_server(FAST)
        self.file_a = self.h.path("alpha.gguf")
        self.file_b = self.h.path("beta.gguf")
        shutil.copyfile(MODEL, self.file_a)
        shutil.copyfile(MODEL, self.file_b)
        with open(self.file_b, "ab") as f:
            f.write(b"other bytes, other digest")
        self.gate = self.h.path("gate")
        write_atomic(self.gate, str(N))

    def agent(self, path, alias, gated):
        args = ["--slots", "2", "--log-level", "debug", "--alias", alias, "--model", path,
                "--threads", "1"]
        name = self.h._name("agent")
        state = self.h.path(name + ".state")
        if gated:
            a = GatedAgent(self.h, name, self.srv, args, state, self.gate)
        else:
            a = harness.Agent(self.h, name, self.srv, args, state)
        self.h.procs.append(a)
        aid = a.agent_id()
        harness.wait_until(lambda: any(e.get("agent_id") == aid and e.get("to") == "healthy"
                                       for e in self.srv.log_events("agent_state")),
                           timeout=30, what="agent healthy")
        self.srv.wait_model(alias)
        return a, aid

    def stream(self, body, kill):
        """Stream body, kill -9 `kill` after N chunks with text. Returns
        (text before the kill, whole text, last x_pool_meta, error or None)."""
        s = harness.SSEStream("POST", self.srv.url + "/v1/chat/completions", body, timeout=120)
        self.assertEqual(s.status, 200)
        text, before, n, meta, err = "", None, 0, None, None
        while True:
            e = s.next_event(timeout=90)
            if e is None:          # an error may end the stream without [DONE]
                err = err or "stream ended without [DONE]"
                break
            if e["data"] == "[DONE]":
                break
            d = json.loads(e["data"])
            if "error" in d:
                err = d["error"]
                continue
            for c in d.get("choices") or []:
                t = (c.get("delta") or {}).get("content") or ""
                if t:
                    text += t
                    n += 1
                    if n == N:
                        before = text
                        kill.kill9()
            if d.get("x_pool_meta"):
                meta = d["x_pool_meta"]
        s.close()
        return before, text, meta, err

    def body(self, fallback):
        b = {"model": "alpha", "stream": True, "max_tokens": 60, "temperature": 0,
             "messages": [{"role": "user", "content": "Tell me a story about a cat"}]}
        if fallback:
            b["x_pool_options"] = {"fallback_models": ["beta"]}
        return b

    def test_stream_moves_to_fallback_model(self):
        a, ida = self.agent(self.file_a, "alpha", gated=True)
        b, idb = self.agent(self.file_b, "beta", gated=False)
        before, text, meta, err = self.stream(self.body(True), a)
        self.assertIsNone(err, err)
        self.assertIsNotNone(before, "the stream ended before the kill")
        self.assertTrue(text.startswith(before) and len(text) > len(before), (before, text))
        self.assertEqual(meta["agent_id"], idb, meta)
        self.assertEqual(meta["model"], "beta", meta)
        self.assertEqual(meta["attempts"], 2, meta)
        self.assertEqual(meta["continuation"], "text", meta)
        self.assertTrue(any("alpha" in w and "beta" in w for w in meta["warnings"]), meta)
        fb = self.srv.log_events("job_fallback")
        self.assertEqual([(e["from_model"], e["model"]) for e in fb], [("alpha", "beta")], fb)

    def anthropic_stream(self, body, kill):
        """As stream(), through /v1/messages: text from content_block_delta,
        x_pool_meta from message_delta."""
        s = harness.SSEStream("POST", self.srv.url + "/v1/messages", body, timeout=120)
        self.assertEqual(s.status, 200)
        text, before, n, meta, err = "", None, 0, None, None
        while True:
            e = s.next_event(timeout=90)
            if e is None:
                err = err or "stream ended without message_stop"
                break
            d = json.loads(e["data"])
            if d.get("type") == "message_stop":
                break
            if d.get("type") == "error":
                err = d["error"]
                continue
            t = (d.get("delta") or {}).get("text") or ""
            if d.get("type") == "content_block_delta" and t:
                text += t
                n += 1
                if n == N:
                    before = text
                    kill.kill9()
            if d.get("x_pool_meta"):
                meta = d["x_pool_meta"]
        s.close()
        return before, text, meta, err

    def test_anthropic_stream_moves_to_fallback_model_and_says_so(self):
        # Anthropic built its pool meta from a copy made at submit: a
        # fallback taken at failover was not among its warnings.
        a, ida = self.agent(self.file_a, "alpha", gated=True)
        b, idb = self.agent(self.file_b, "beta", gated=False)
        body = self.body(True)
        before, text, meta, err = self.anthropic_stream(body, a)
        self.assertIsNone(err, err)
        self.assertIsNotNone(before, "the stream ended before the kill")
        self.assertTrue(text.startswith(before) and len(text) > len(before), (before, text))
        self.assertEqual((meta["agent_id"], meta["model"], meta["attempts"]), (idb, "beta", 2),
                         meta)
        self.assertTrue(any("alpha" in w and "beta" in w for w in meta["warnings"]), meta)

    def test_without_fallback_the_job_waits_for_its_model(self):
        a, ida = self.agent(self.file_a, "alpha", gated=True)
        b, idb = self.agent(self.file_b, "beta", gated=False)
        before, text, meta, err = self.stream(self.body(False), a)
        self.assertIsNotNone(before)
        self.assertIsNotNone(err, "expected the stream to end with an error")
        self.assertEqual(self.srv.log_events("job_fallback"), [])


if __name__ == "__main__":
    harness.main()
