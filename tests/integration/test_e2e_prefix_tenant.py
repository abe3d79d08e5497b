"""Prompt-prefix cache per API key (issue 25 finding 3): a gguf agent with
two slots on models/stories260K.gguf and two client keys. Key A runs a chat
until the server routes it by its own cached prefix (x_pool_meta.prefix_units)
and the agent reuses it (the native task's `metrics` event:
prompt_tokens_cached). Key B then sends the very same messages: it must see
no cached token anywhere (task metrics, x_pool_meta of the task, of a chat
completion and of a Responses call, the Responses usage details), or it
could recover A's prompt token by token from the counts. A is still served
from its cache afterwards. With prefix_cache_scope pool the keys share it.
Skipped when the agent was built without the gguf backend.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request  # noqa: E402
from test_e2e_prefix_cache import MODEL, SYSTEM, gguf_built  # noqa: E402

MESSAGES = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Tell me about a cat and a ball."}]


def auth(key):
    return {"Authorization": "Bearer " + key}


class PrefixTenantTest(harness.TestCase):

    def pool(self, server_args):
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        db = self.h.path("tenant.db")
        self.a = self.h.create_key(db, "client", "alice")
        self.b = self.h.create_key(db, "client", "bob")
        self.c = self.h.create_key(db, "client", "carol")
        self.d = self.h.create_key(db, "client", "dave")
        akey = self.h.create_key(db, "agent", "box")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"] + server_args, db=db)
        self.h.start_agent(self.srv, slots=2, alias="tiny", token=akey,
                           args=["--model", MODEL, "--threads", "1"])
        self.srv.wait_model("tiny", key=self.a)

    def task(self, key):
        """A native task; returns (metrics event data, x_pool_meta)."""
        st, _, r = http_json("POST", self.srv.url + "/v2/tasks",
                             {"model": "tiny", "messages": MESSAGES, "max_tokens": 4,
                              "temperature": 0}, headers=auth(key), timeout=30)
        self.assertEqual(st, 202, r)
        tid = r["job_id"]
        st, _, data = http_request("GET", self.srv.url + "/v2/tasks/%s/events" % tid,
                                   headers=auth(key), timeout=120)
        self.assertEqual(st, 200, data)
        evs = [(e["event"], json.loads(e["data"])) for e in harness.parse_sse(data)]
        self.assertEqual(evs[-1][0], "end", evs)
        metrics = [d for name, d in evs if name == "metrics" and "prompt_tokens_cached" in d]
        self.assertEqual(len(metrics), 1, evs)
        st, _, t = http_json("GET", self.srv.url + "/v2/tasks/" + tid, headers=auth(key))
        self.assertEqual(st, 200, t)
        return metrics[0], t["x_pool_meta"]

    def a_until_routed(self):
        """Key A's task until the server routes it by its cached prefix (the
        agent's report of the slot arrives after the job's end)."""
        seen = []

        def routed():
            m, meta = self.task(self.a)
            seen.append((m, meta))
            return meta.get("prefix_units", 0) > 0
        harness.wait_until(routed, timeout=60, what="key A routed by its prefix")
        m, meta = seen[-1]
        self.assertEqual(meta["prefix_units"], len(MESSAGES))
        self.assertGreater(m["prompt_tokens_cached"], 16)
        return m

    def test_another_key_sees_no_cached_prefix(self):
        self.pool([])
        m, meta = self.task(self.a)
        self.assertEqual(m["prompt_tokens_cached"], 0)
        self.a_until_routed()

        m, meta = self.task(self.b)
        self.assertEqual(m["prompt_tokens_cached"], 0, m)
        self.assertNotIn("prefix_units", meta)
        # A's prefix is still there for A (B took the other slot, cold)
        m, _ = self.task(self.a)
        self.assertGreater(m["prompt_tokens_cached"], 16)

        # The other dialects, each from a key of its own (a key's second
        # request may hit what its first left).
        st, _, c = http_json("POST", self.srv.url + "/v1/chat/completions",
                             {"model": "tiny", "messages": MESSAGES, "max_tokens": 4,
                              "temperature": 0}, headers=auth(self.c), timeout=120)
        self.assertEqual(st, 200, c)
        self.assertNotIn("prefix_units", c["x_pool_meta"])
        self.assertEqual(c["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0), 0)
        st, _, r = http_json("POST", self.srv.url + "/v1/responses",
                             {"model": "tiny", "input": MESSAGES[1]["content"],
                              "instructions": SYSTEM, "max_output_tokens": 4,
                              "temperature": 0}, headers=auth(self.d), timeout=120)
        self.assertEqual(st, 200, r)
        self.assertNotIn("prefix_units", r["x_pool_meta"])
        self.assertEqual(r["usage"]["input_tokens_details"]["cached_tokens"], 0)

    def test_pool_scope_shares_the_cache(self):
        self.pool(["--prefix_cache_scope", "pool"])
        self.task(self.a)
        self.a_until_routed()
        m, meta = self.task(self.b)
        self.assertGreater(m["prompt_tokens_cached"], 16)
        self.assertEqual(meta["prefix_units"], len(MESSAGES))


class PoolOfPoolsTenantTest(harness.TestCase):
    """client -> outer pool (two keys) <- relay agent -> inner pool (home
    mode) <- gguf agent: the relay passes each job's tenant on, so the inner
    pool keeps the outer keys apart too (x_pool_meta.upstream is the inner
    pool's meta, prefix_units included)."""

    def test_outer_keys_stay_apart_upstream(self):
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        inner = self.h.start_server(["--poll_interval_sec", "1"], name="inner")
        self.h.start_agent(inner, slots=2, alias="tiny", name="gguf",
                           args=["--model", MODEL, "--threads", "1"])
        inner.wait_model("tiny")
        db = self.h.path("outer.db")
        a = self.h.create_key(db, "client", "alice")
        b = self.h.create_key(db, "client", "bob")
        akey = self.h.create_key(db, "agent", "relay")
        outer = self.h.start_server(["--poll_interval_sec", "1"], db=db, name="outer")
        self.h.start_agent(outer, slots=2, name="relay", token=akey,
                           args=["--upstream", inner.url + "/v1", "--upstream-model", "tiny",
                                 "--alias", "tiny"])
        outer.wait_model("tiny", key=a)

        def chat(key):
            st, _, c = http_json("POST", outer.url + "/v1/chat/completions",
                                 {"model": "tiny", "messages": MESSAGES, "max_tokens": 4,
                                  "temperature": 0}, headers=auth(key), timeout=120)
            self.assertEqual(st, 200, c)
            return c["x_pool_meta"]["upstream"]

        harness.wait_until(lambda: chat(a).get("prefix_units", 0) > 0, timeout=60,
                           what="key A routed by its prefix in the inner pool")
        self.assertNotIn("prefix_units", chat(b))


if __name__ == "__main__":
    harness.main()
