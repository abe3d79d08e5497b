"""Fault tests with real processes: gpupool-server, gpupool-agents (openai
backend) and scripted upstreams.

- kill -9 of an agent before its first token: the request still succeeds on
  another agent;
- client disconnect: the upstream's stream is closed (the latency is printed,
  never asserted);
- agent expiry after missed heartbeats (SIGSTOP), and its return (SIGCONT);
- server restart: agents re-register by themselves and serve again.
"""

import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json  # noqa: E402
import upstream as upstream_mod  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]


def expected(prompt, n):
    return "".join(upstream_mod.expected_tokens(prompt, n))


class FaultTest(harness.TestCase):

    def agent_states(self, srv, agent_id):
        return [e.get("to") for e in srv.log_events("agent_state") if e.get("agent_id") == agent_id]

    def test_kill9_before_first_token_request_succeeds_elsewhere(self):
        srv = self.h.start_server(FAST)
        # One upstream per agent, both holding the first token back, so the
        # test knows which agent got the job.
        ups = [self.h.start_upstream(["--tokens", "4", "--first-delay-ms", "60000"]) for _ in range(2)]
        agents = [self.h.start_agent(srv, upstream=u, model="m1", slots=2) for u in ups]
        srv.wait_model("m1")
        for a in agents:
            harness.wait_until(lambda a=a: "healthy" in self.agent_states(srv, a.agent_id()),
                               timeout=20, what="agent healthy")
        result = {}

        def client():
            try:
                result["r"] = http_json("POST", srv.url + "/v1/completions",
                                        {"model": "m1", "prompt": "survive this"}, timeout=120)
            except Exception as e:  # noqa: BLE001
                result["r"] = e
        t = threading.Thread(target=client, daemon=True)
        t.start()
        def which():
            for i, u in enumerate(ups):
                if u.log_entries():
                    return [i]  # a list: index 0 must count as found
            return None
        first = harness.wait_until(which, timeout=20, what="a job reaching an upstream")[0]
        other = 1 - first
        ups[other].control(first_delay_ms=0)
        agents[first].kill9()
        t.join(90)
        self.assertFalse(t.is_alive(), "request still running after the agent was killed")
        st, hdr, body = result["r"]
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], expected("survive this", 4))
        self.assertEqual(body["x_pool_meta"]["agent_id"], agents[other].agent_id())
        self.assertGreaterEqual(body["x_pool_meta"]["attempts"], 2)

    def test_client_disconnect_closes_upstream_stream(self):
        srv = self.h.start_server(FAST)
        up = self.h.start_upstream(["--tokens", "400", "--pace-ms", "50"])
        self.h.start_agent(srv, upstream=up, model="m1")
        srv.wait_model("m1")
        s = harness.SSEStream("POST", srv.url + "/v1/chat/completions",
                              {"model": "m1", "stream": True,
                               "messages": [{"role": "user", "content": "go on"}]}, timeout=30)
        self.assertEqual(s.status, 200)
        got = 0
        while got < 3:
            e = s.next_event(timeout=20)
            self.assertIsNotNone(e)
            got += 1
        t_close = time.monotonic()
        s.close()

        def closed():
            recs = up.log_entries()
            return recs and recs[-1]["outcome"] == "client_gone" and recs[-1]
        rec = harness.wait_until(closed, timeout=15, what="upstream stream closed after client left")
        self.assertLess(rec["tokens_sent"], 400)
        sys.stderr.write("client disconnect -> upstream closed: %.0f ms\n"
                         % ((rec["disconnect_mono"] - t_close) * 1000))

    def test_agent_expiry_after_missed_heartbeats_and_return(self):
        srv = self.h.start_server(FAST)
        up = self.h.start_upstream(["--tokens", "3"])
        a = self.h.start_agent(srv, upstream=up, model="m1", slots=2)
        b = self.h.start_agent(srv, upstream=up, model="m1", slots=2)
        srv.wait_model("m1")
        aid = a.agent_id()
        harness.wait_until(lambda: "healthy" in self.agent_states(srv, aid), timeout=20,
                           what="agent healthy")
        a.signal(signal.SIGSTOP)
        try:
            harness.wait_until(lambda: "dead" in self.agent_states(srv, aid), timeout=30,
                               what="agent declared dead after missed heartbeats")
            # Meanwhile the pool still serves, through the other agent.
            st, _, body = http_json("POST", srv.url + "/v1/completions",
                                    {"model": "m1", "prompt": "still here"}, timeout=60)
            self.assertEqual(st, 200, body)
            self.assertEqual(body["x_pool_meta"]["agent_id"], b.agent_id())
            n_before = len(self.agent_states(srv, aid))
        finally:
            a.signal(signal.SIGCONT)
        harness.wait_until(lambda: "healthy" in self.agent_states(srv, aid)[n_before:], timeout=30,
                           what="agent healthy again after SIGCONT")

    def test_server_restart_agents_reregister(self):
        db = self.h.path("restart.db")
        srv = self.h.start_server(FAST, db=db)
        port = srv.port
        up = self.h.start_upstream(["--tokens", "3"])
        agents = [self.h.start_agent(srv, upstream=up, model="m1", slots=2) for _ in range(2)]
        srv.wait_model("m1")
        st, _, _ = http_json("POST", srv.url + "/v1/completions", {"model": "m1", "prompt": "one"})
        self.assertEqual(st, 200)
        srv.kill9()
        time.sleep(0.5)  # agents notice the server is gone (not an assertion)
        srv2 = self.h.start_server(FAST, db=db, port=port)
        self.assertEqual(srv2.url, srv.url)
        ids = {a.agent_id() for a in agents}
        harness.wait_until(
            lambda: ids <= {e.get("agent_id") for e in srv2.log_events("agent_state")
                            if e.get("to") == "healthy"},
            timeout=60, what="both agents registered with the new server")
        srv2.wait_model("m1", timeout=30)
        st, _, body = http_json("POST", srv2.url + "/v1/completions",
                                {"model": "m1", "prompt": "after restart"}, timeout=60)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], expected("after restart", 3))
        for a in agents:
            self.assertTrue(a.alive())


if __name__ == "__main__":
    harness.main()
