"""Many concurrent streams through one openai-backend agent (issue 24 item 3).

The agent relays every upstream stream on its own loop thread (libcurl's
multi interface on the agent's libevent loop), not a thread per job nor a
thread of the backend's. 200 streaming requests (completions and
chat) go through one agent with --slots 256 to the scripted upstream, which
holds each one before its first token (first_delay_ms, a gate that a control
call opens). Once the upstream holds all 200 at once, the agent's thread
count (/proc/PID/status) must still be small; then the gate opens and every
stream must complete with exactly the text the upstream generated for it.
A second test cancels 100 held streams at once (their clients go away): the
upstream must see every one of its clients go, and the agent's slots must be
free again.
"""

import json
import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_request, parse_sse, sse_data_json, wait_until  # noqa: E402
import upstream as upstream_mod  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--work_wait_sec", "5"]
STREAMS = 200
TOKENS = 5
# The agent's loop, which relays every stream (the openai backend runs on
# it: bind_loop), and the signal thread. A thread per job would be over
# 200; the backend's own loop thread of before made 3. Every URL here is
# numeric (no resolver thread) and the upstream answers the embeddings
# probe (no probe thread).
MAX_THREADS = 2


def threads_of(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line for pid %d" % pid)


class ManyStreamsTest(harness.TestCase):

    def test_200_streams_one_agent_few_threads(self):
        up = self.h.start_upstream(["--tokens", str(TOKENS), "--first-delay-ms", "600000"])
        srv = self.h.start_server(FAST)
        agent = self.h.start_agent(srv, upstream=up, model="m1", slots=256)
        srv.wait_model("m1")
        self.assertLessEqual(threads_of(agent.pid), MAX_THREADS)

        results = [None] * STREAMS

        def one(i):
            chat = i % 2 == 1
            words = "w%d x%d" % (i, i)
            if chat:
                path = "/v1/chat/completions"
                body = {"model": "m1", "stream": True,
                        "messages": [{"role": "user", "content": words}]}
            else:
                path = "/v1/completions"
                body = {"model": "m1", "stream": True, "prompt": words}
            try:
                st, _, raw = http_request("POST", srv.url + path, body, timeout=120)
                results[i] = (chat, words, st, raw)
            except Exception as e:  # reported below, with the index
                results[i] = (chat, words, None, repr(e))

        ths = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(STREAMS)]
        for t in ths:
            t.start()
        # Every request is held at the upstream at the same time: the agent
        # holds 200 upstream streams now.
        wait_until(lambda: len(up.log_entries()) >= STREAMS, timeout=60,
                   what="%d requests held at the upstream" % STREAMS)
        held = threads_of(agent.pid)
        self.assertLessEqual(held, MAX_THREADS,
                             "agent has %d threads while it holds %d streams" % (held, STREAMS))
        up.control(first_delay_ms=0)
        for t in ths:
            t.join(120)
            self.assertFalse(t.is_alive(), "a stream did not finish")

        for i, (chat, words, st, raw) in enumerate(results):
            self.assertEqual(st, 200, "stream %d: %r" % (i, raw))
            evs = parse_sse(raw)
            self.assertEqual(evs[-1]["data"], "[DONE]", "stream %d" % i)
            chunks = [c for c in sse_data_json(evs) if c.get("choices")]
            if chat:
                text = "".join(c["choices"][0].get("delta", {}).get("content") or ""
                               for c in chunks)
            else:
                text = "".join(c["choices"][0].get("text") or "" for c in chunks)
            self.assertEqual(text, "".join(upstream_mod.expected_tokens(words, TOKENS)),
                             "stream %d" % i)
            finals = [c["choices"][0]["finish_reason"] for c in chunks
                      if c["choices"][0].get("finish_reason")]
            self.assertEqual(finals, ["stop"], "stream %d" % i)
        log = up.log_entries()
        self.assertEqual(len(log), STREAMS)
        self.assertTrue(all(r["outcome"] == "complete" for r in log),
                        [r["outcome"] for r in log if r["outcome"] != "complete"])
        self.assertLessEqual(threads_of(agent.pid), MAX_THREADS)

    def test_100_held_streams_cancelled_at_once(self):
        n = 100
        up = self.h.start_upstream(["--tokens", str(TOKENS), "--first-delay-ms", "600000"])
        srv = self.h.start_server(FAST)
        agent = self.h.start_agent(srv, upstream=up, model="m1", slots=n)
        srv.wait_model("m1")
        host, port = "127.0.0.1", int(srv.url.rsplit(":", 1)[1])
        socks = []
        for i in range(n):
            body = json.dumps({"model": "m1", "stream": True, "prompt": "c%d" % i}).encode()
            s = socket.create_connection((host, port), timeout=30)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body)
            socks.append(s)
        wait_until(lambda: len(up.log_entries()) >= n, timeout=60,
                   what="%d requests held at the upstream" % n)
        self.assertLessEqual(threads_of(agent.pid), MAX_THREADS)
        for s in socks:
            s.close()
        # Every client went away: the server cancels each job, the agent drops
        # each transfer, and the upstream sees each of its clients go.
        wait_until(lambda: all(r["outcome"] == "client_gone" for r in up.log_entries()),
                   timeout=60, what="the upstream saw all %d clients go" % n)
        # All n slots are free again: a request after them is served at once.
        up.control(first_delay_ms=0)
        st, _, raw = http_request("POST", srv.url + "/v1/completions",
                                  {"model": "m1", "stream": True, "prompt": "after all"},
                                  timeout=60)
        self.assertEqual(st, 200, raw)
        chunks = [c for c in sse_data_json(parse_sse(raw)) if c.get("choices")]
        self.assertEqual("".join(c["choices"][0].get("text") or "" for c in chunks),
                         "".join(upstream_mod.expected_tokens("after all", TOKENS)))
        self.assertLessEqual(threads_of(agent.pid), MAX_THREADS)


if __name__ == "__main__":
    harness.main()
