"""Unfinished requests on a shared PostgreSQL belong to the server that
holds their client (jobs.owner_server): a server starting no longer fails
every unfinished OpenAI/Anthropic job of the database (other live servers
are running them); the jobs of a server that is gone (no lease renewal for
two leases) are failed by the others' periodic sweep (SERVER_RESTART).

Real PostgreSQL (pg.py, Debian's binaries, in the test's temporary
directory), three real servers on it, real agents on the scripted
upstream. A streams a long chat completion; C streams one too and is
killed -9; B is restarted (SIGTERM, then a new process on the same
database). While A's stream is still in flight: C's job row is failed
(SERVER_RESTART) by the sweep, A's is not, and A's stream then finishes
whole and its row says done. On the old code B's start marks A's row
failed at once and C's row is never failed.
"""

import os
import sys
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pg_fixture  # noqa: E402
from harness import bearer  # noqa: E402
import upstream as upstream_mod  # noqa: E402

CLUSTER = ["--heartbeat_sec", "1", "--lease_sec", "3", "--shared_refresh_sec", "1"]
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]
TOKENS = 600  # at 50 ms: 30 s of stream, longer than the sweep needs (about 12 s)


class JobsOwnerPgTest(pg_fixture.PgServersCase):

    def setUp(self):
        super().setUp()
        self.client = self.h.create_key(self.uri, "client", "app")
        self.agent_keys = [self.h.create_key(self.uri, "agent", "agent%d" % i) for i in range(2)]

    def start_server(self):
        return self.start_servers(1, FAST + CLUSTER, key=self.client)[0]

    def rows(self):
        """[(status, error_code, finished), ...] of the chat jobs, oldest first."""
        out = self.psql("SELECT status, COALESCE(error_code, ''), finished_at IS NOT NULL "
                        "FROM jobs WHERE api = 'openai' ORDER BY created_at, id")
        return [tuple(line.split("|")) for line in out.splitlines() if line]

    def stream(self, srv, prompt):
        s = harness.SSEStream("POST", srv.url + "/v1/chat/completions",
                              {"model": "m1", "stream": True, "max_tokens": TOKENS,
                               "messages": [{"role": "user", "content": prompt}]},
                              headers=bearer(self.client), timeout=120)
        self.addCleanup(s.close)
        self.assertEqual(s.status, 200)
        first = s.next_event(timeout=30)
        self.assertIsNotNone(first)
        return s, [first]

    def test_restart_spares_live_jobs_and_sweep_fails_dead_ones(self):
        up = self.h.start_upstream(["--tokens", str(TOKENS), "--pace-ms", "50"])
        a, b, c = self.start_server(), self.start_server(), self.start_server()
        for srv in (a, c):
            self.h.start_agent(types.SimpleNamespace(url=srv.url), upstream=up, model="m1",
                               slots=2, token=self.agent_keys.pop())
            srv.wait_model("m1")

        sa, events = self.stream(a, "owner-a")
        self.stream(c, "owner-c")
        harness.wait_until(lambda: len(self.rows()) == 2, timeout=30,
                           what="both job rows committed")

        # C dies with its stream in flight; B restarts on the same database.
        c.kill9()
        t_kill = time.monotonic()
        b.stop()
        b2 = self.start_server()
        harness.wait_until(lambda: b2.log_events("server_announced"), timeout=30,
                           what="the new B announced")
        # B's start left A's row alone (the old code failed every unfinished row).
        self.assertNotEqual(self.rows()[0][0], "failed", self.rows())
        # The sweep (A's or B2's) fails C's job once C is two leases gone.
        harness.wait_until(lambda: self.rows()[1][:2] == ("failed", "SERVER_RESTART"),
                           timeout=60, interval=0.3, what="C's job failed by the sweep")
        sys.stderr.write("\nC's row failed by the sweep %.1f s after its kill -9 (lease 3 s)\n"
                         % (time.monotonic() - t_kill))
        self.assertTrue(any(s.log_events("jobs_orphaned") for s in (a, b2)))
        # A's stream is still in flight: its row is not failed.
        self.assertEqual(self.rows()[0][2], "f", self.rows())
        self.assertNotEqual(self.rows()[0][0], "failed", self.rows())

        while True:
            ev = sa.next_event(timeout=60)
            self.assertIsNotNone(ev, "A's stream ended without [DONE]")
            events.append(ev)
            if ev["data"] == "[DONE]":
                break
        text = "".join((ch.get("delta") or {}).get("content") or ""
                       for d in harness.sse_data_json(events) for ch in d.get("choices") or [])
        self.assertEqual(text, "".join(upstream_mod.expected_tokens("owner-a", TOKENS)))
        harness.wait_until(lambda: self.rows()[0][:3] == ("done", "", "t"), timeout=30,
                           what="A's row done")


if __name__ == "__main__":
    harness.main()
