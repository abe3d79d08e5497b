"""Prompt-prefix cache end to end (issue 13): gpupool-server with two
gguf agents on models/stories260K.gguf, one with the cache (the default)
and one started with --no-prefix-cache. A two-turn chat (the second turn
resends the first with the reply and a new question) runs on each agent
(x_pool_options.prefer_agent): the greedy answers are identical, and the
server's metrics, from the agents' poll facts, show the cached agent's hit
and saved tokens and none for the other. Skipped when the agent was built
without the gguf backend.
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
SYSTEM = ("You are a friendly story teller. You tell short stories about animals, children "
          "and their toys, with a happy ending, in simple words that a small child knows.")


def gguf_built():
    if not os.access(harness.AGENT_BIN, os.X_OK):
        return False
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    r = subprocess.run([harness.AGENT_BIN, "--model", "/nonexistent/x.gguf", "--state-dir",
                        "/nonexistent/state"], capture_output=True, text=True, timeout=30, env=env)
    return "not built" not in r.stderr


def metric(text, name, agent):
    m = re.search(r'^gpupool_%s\{agent="%s"\} (\S+)$' % (name, agent), text, re.M)
    return float(m.group(1)) if m else None


class PrefixCacheE2ETest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        common = ["--model", MODEL, "--threads", "1"]
        self.warm = self.h.start_agent(self.srv, upstream=None, slots=1, alias="tiny",
                                       name="warm", args=common)
        self.cold = self.h.start_agent(self.srv, upstream=None, slots=1, alias="tiny",
                                       name="cold", args=common + ["--no-prefix-cache"])
        self.srv.wait_model("tiny")

    def chat(self, agent, messages):
        st, hdr, body = http_json("POST", self.srv.url + "/v1/chat/completions",
                                  {"model": "tiny", "temperature": 0, "max_tokens": 16,
                                   "messages": messages,
                                   "x_pool_options": {"prefer_agent": agent}}, timeout=120)
        self.assertEqual(st, 200, body)
        return body["choices"][0]["message"]["content"]

    def test_second_turn_hits_and_matches_cold(self):
        ids = {"warm": self.warm.agent_id(), "cold": self.cold.agent_id()}
        harness.wait_until(lambda: all(metric(self.scrape(), "agent_queue_depth", i) is not None
                                       for i in ids.values()), timeout=30,
                           what="both agents registered")
        turn1 = [{"role": "system", "content": SYSTEM},
                 {"role": "user", "content": "Tell me about a cat and a ball."}]
        answers = {}
        for name in ("warm", "cold"):
            a1 = self.chat(ids[name], turn1)
            turn2 = turn1 + [{"role": "assistant", "content": a1},
                             {"role": "user", "content": "What happened next?"}]
            a2 = self.chat(ids[name], turn2)
            answers[name] = (a1, a2)
        self.assertEqual(answers["warm"], answers["cold"])

        def facts_arrived():
            t = self.scrape()
            return (metric(t, "agent_prefix_cache_lookups_total", ids["warm"]) == 2 and
                    metric(t, "agent_prefix_cache_lookups_total", ids["cold"]) == 2)
        harness.wait_until(facts_arrived, timeout=30, what="both agents' prefix facts")
        t = self.scrape()
        self.assertEqual(metric(t, "agent_prefix_cache_hits_total", ids["warm"]), 1)
        self.assertGreater(metric(t, "agent_prefix_cache_tokens_saved_total", ids["warm"]), 16)
        self.assertGreater(metric(t, "agent_prefix_cache_tokens_held", ids["warm"]), 0)
        self.assertEqual(metric(t, "agent_prefix_cache_hits_total", ids["cold"]), 0)
        self.assertEqual(metric(t, "agent_prefix_cache_tokens_saved_total", ids["cold"]), 0)
        warm_computed = metric(t, "agent_prefix_cache_tokens_computed_total", ids["warm"])
        cold_computed = metric(t, "agent_prefix_cache_tokens_computed_total", ids["cold"])
        self.assertEqual(warm_computed + metric(t, "agent_prefix_cache_tokens_saved_total",
                                                ids["warm"]), cold_computed)

    def scrape(self):
        st, _, raw = http_request("GET", self.srv.url + "/metrics", timeout=30)
        self.assertEqual(st, 200)
        return raw.decode() if isinstance(raw, bytes) else raw


if __name__ == "__main__":
    harness.main()
