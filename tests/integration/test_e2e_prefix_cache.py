"""Prompt-prefix cache end to end (issue 13): gpupool-server and a gguf
agent on models/stories260K.gguf with the cache (the default), then, in its
place, one started with --no-prefix-cache (one agent at a time: routing is
certain). A two-turn chat (the second turn resends the first with the reply
and a new question) runs on each: the greedy answers are identical, and the
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
    m = re.search(r'^gpupool_%s\{agent="%s",name="[^"]*"\} (\S+)$' % (name, agent), text, re.M)
    return float(m.group(1)) if m else None


class PrefixCacheE2ETest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])

    def chat(self, messages):
        st, hdr, body = http_json("POST", self.srv.url + "/v1/chat/completions",
                                  {"model": "tiny", "temperature": 0, "max_tokens": 16,
                                   "messages": messages}, timeout=120)
        self.assertEqual(st, 200, body)
        return body["choices"][0]["message"]["content"]

    def conversation(self, name, args):
        """Start one agent (the only one, so routing is certain), run two
        turns, wait for its poll facts to count both; returns the answers
        and the facts as the server's metrics show them; stops the agent."""
        agent = self.h.start_agent(self.srv, upstream=None, slots=1, alias="tiny", name=name,
                                   args=["--model", MODEL, "--threads", "1"] + args)
        self.srv.wait_model("tiny")
        aid = agent.agent_id()
        harness.wait_until(lambda: metric(self.scrape(), "agent_queue_depth", aid) is not None,
                           timeout=30, what=name + " registered")
        turn1 = [{"role": "system", "content": SYSTEM},
                 {"role": "user", "content": "Tell me about a cat and a ball."}]
        a1 = self.chat(turn1)
        a2 = self.chat(turn1 + [{"role": "assistant", "content": a1},
                                {"role": "user", "content": "What happened next?"}])
        harness.wait_until(
            lambda: metric(self.scrape(), "agent_prefix_cache_lookups_total", aid) == 2,
            timeout=30, what=name + "'s prefix facts")
        t = self.scrape()
        facts = {k: metric(t, "agent_prefix_cache_" + k, aid)
                 for k in ("hits_total", "tokens_saved_total", "tokens_computed_total",
                           "tokens_held")}
        self.assertEqual(agent.stop(grace=30), 0)
        return (a1, a2), facts

    def test_second_turn_hits_and_matches_cold(self):
        warm, wf = self.conversation("warm", [])
        cold, cf = self.conversation("cold", ["--no-prefix-cache"])
        self.assertEqual(warm, cold)
        self.assertEqual(wf["hits_total"], 1)
        self.assertGreater(wf["tokens_saved_total"], 16)
        self.assertGreater(wf["tokens_held"], 0)
        self.assertEqual(cf["hits_total"], 0)
        self.assertEqual(cf["tokens_saved_total"], 0)
        # the same prompts: what one saved, the other computed
        self.assertEqual(wf["tokens_computed_total"] + wf["tokens_saved_total"],
                         cf["tokens_computed_total"])

    def scrape(self):
        st, _, raw = http_request("GET", self.srv.url + "/metrics", timeout=30)
        self.assertEqual(st, 200)
        return raw.decode() if isinstance(raw, bytes) else raw


if __name__ == "__main__":
    harness.main()
