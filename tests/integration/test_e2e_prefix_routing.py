#!/usr/bin/env python3
"""Prefix-aware routing end to end (docs/scheduling.md "Prefix routing"):
gpupool-server with the default round_robin policy and two gguf agents
(stories260K, one slot each). A conversation's first turn runs on one agent;
its second turn (the first resent with the reply and a new question, no
session key, no prefer_agent) lands on the same agent, although round robin
would send it to the other, because that agent's slot advertises the first
turn's prompt. x_pool_meta.prefix_units and gpupool_prefix_routed_total say
so. With `prefix_routing = false` the same second turn goes by round robin
to the other agent (so it is the prefix, not chance, that routes it).
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
SYSTEM = "You are a friendly story teller. You tell short stories about animals."


def metric(text, series):
    m = re.search(r"^%s (\S+)$" % re.escape(series), text, re.M)
    return float(m.group(1)) if m else 0.0


class PrefixRoutingTest(harness.TestCase):

    def pool(self, server_args):
        self.srv = self.h.start_server(["--poll_interval_sec", "1"] + server_args)
        self.agents = [self.h.start_agent(self.srv, slots=1, alias="tiny", name=n,
                                          args=["--model", MODEL, "--threads", "1"])
                       for n in ("pa", "pb")]
        self.srv.wait_model("tiny")
        self.ids = [a.agent_id() for a in self.agents]
        self.wait_parked()

    def scrape(self):
        return http_request("GET", self.srv.url + "/metrics", timeout=10)[2].decode()

    def wait_parked(self):
        # Both agents parked with their free slot: the one that just ran a
        # job re-parks with what its slot now holds.
        harness.wait_until(lambda: metric(self.scrape(), "gpupool_agents_parked") >= 2,
                           timeout=60, what="both agents parked")

    def chat(self, messages):
        st, hdr, b = http_json("POST", self.srv.url + "/v1/chat/completions",
                               {"model": "tiny", "temperature": 0, "max_tokens": 12,
                                "messages": messages}, timeout=120)
        self.assertEqual(st, 200, b)
        self.assertEqual(hdr.get("x-pool-agent"), b["x_pool_meta"]["agent_id"])
        return b

    def two_turns(self):
        turn1 = [{"role": "system", "content": SYSTEM},
                 {"role": "user", "content": "Tell me about a cat and a ball."}]
        b1 = self.chat(turn1)
        # The agent that ran it reports what its slot now holds (with its
        # next long-poll, or its next heartbeat at the latest).
        aid = b1["x_pool_meta"]["agent_id"]
        harness.wait_until(
            lambda: metric(self.scrape(),
                           'gpupool_agent_prefix_cache_lookups_total{agent="%s",name="%s"}'
                           % (aid, ("pa", "pb")[self.ids.index(aid)])) >= 1,
            timeout=30, what="the first turn's agent reporting its slot")
        self.wait_parked()
        turn2 = turn1 + [{"role": "assistant",
                          "content": b1["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "What happened next?"}]
        b2 = self.chat(turn2)
        return b1, b2

    def test_second_turn_follows_the_prefix(self):
        self.pool([])
        b1, b2 = self.two_turns()
        first = b1["x_pool_meta"]["agent_id"]
        self.assertIn(first, self.ids)
        self.assertNotIn("prefix_units", b1["x_pool_meta"])
        self.assertEqual(b2["x_pool_meta"]["agent_id"], first)
        # The slot held the first turn's two messages (system + user).
        self.assertEqual(b2["x_pool_meta"]["prefix_units"], 2)
        t = self.scrape()
        # (The first turn was placed before any agent advertised a prefix:
        # no chain computed, neither hit nor miss.)
        self.assertEqual(metric(t, 'gpupool_prefix_routed_total{result="hit"}'), 1)
        self.assertEqual(metric(t, 'gpupool_prefix_routed_total{result="miss"}'), 0)
        # Another conversation (same system prompt, other question) is not
        # pulled to that agent by the shared first message alone: round
        # robin sends it to the other one.
        self.wait_parked()
        b3 = self.chat([{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "Tell me about a dog."}])
        self.assertNotIn("prefix_units", b3["x_pool_meta"])
        self.assertNotEqual(b3["x_pool_meta"]["agent_id"], first)
        self.assertEqual(metric(self.scrape(), 'gpupool_prefix_routed_total{result="miss"}'), 1)

    def test_without_prefix_routing_round_robin_decides(self):
        self.pool(["--prefix_routing=false"])
        b1, b2 = self.two_turns()
        self.assertNotEqual(b2["x_pool_meta"]["agent_id"], b1["x_pool_meta"]["agent_id"])
        self.assertNotIn("prefix_units", b2["x_pool_meta"])
        self.assertEqual(metric(self.scrape(), 'gpupool_prefix_routed_total{result="hit"}'), 0)


if __name__ == "__main__":
    harness.main()
