"""Three gpupool-servers on one PostgreSQL (issue 28 items 2 and 4, the
failure cases that need no native-task hand-off): a real PostgreSQL that
pg.py starts from Debian's binaries in the test's temporary directory,
three real servers on it (--db postgresql://...), real agents on the
scripted upstream.

- each server announces itself in the servers table: /admin/status on any
  of them lists the three, alive; kill -9 of one: its agents (started with
  --server A,B,C and --server A,C,B) move to the others, new requests on
  both others succeed, and the others list the dead one as lease_expired;
- PostgreSQL stopped: once their lease has expired, all three answer new
  work 503 with Retry-After, in each dialect's error shape (OpenAI,
  Anthropic, native), while a stream in flight finishes whole; PostgreSQL
  started again: they admit new work by themselves, without a restart;
- a key created on A authenticates on B, and its revocation on A is
  refused on B, within the refresh interval (shared_refresh_sec);
- a daily token budget spent through A holds on B: B reads the usage A
  added and refuses the key with 429;
- one server partitioned from PostgreSQL (its connection goes through a
  relay the test cuts): it answers new work 503 once its lease expired,
  the others go on and list it lease_expired; healed, it admits again;
- with SQLite (no PostgreSQL needed): the one server's row, listed alive,
  marked stopped by SIGTERM.

Every wait polls a condition with a generous deadline; every process
(PostgreSQL included) is stopped by its PID. Skipped, with the reason,
where PostgreSQL's binaries are absent or the server has no libpq.
"""

import os
import socket
import sys
import threading
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pg  # noqa: E402
import pg_fixture  # noqa: E402
from harness import bearer, http_json  # noqa: E402
import upstream as upstream_mod  # noqa: E402

# Heartbeat every second, lease 5 s (room for a loaded CI machine), keys and
# usage re-read every second.
CLUSTER = ["--heartbeat_sec", "1", "--lease_sec", "5", "--shared_refresh_sec", "1"]
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]


def expected(prompt, n):
    return "".join(upstream_mod.expected_tokens(prompt, n))


def servers(*srvs):
    """harness.Agent's server: an object with .url, here the comma list."""
    return types.SimpleNamespace(url=",".join(s.url for s in srvs))


class Link:
    """A TCP relay between one server and PostgreSQL that the test can cut
    (listener closed, every relayed connection shut down: the server's
    connection breaks and reconnecting is refused) and heal (listening
    again on the same port): a partition of that one server."""

    def __init__(self, target_port):
        self.target = target_port
        self.port = harness.free_port()
        self.lock = threading.Lock()
        self.socks = []
        self.lsock = None
        self.flowing = threading.Event()
        self.flowing.set()
        self.heal()

    def pause(self):
        """Hold what either side sends, connections open: the server's
        statements wait for answers, as on a database that hangs."""
        self.flowing.clear()

    def resume(self):
        self.flowing.set()

    def heal(self):
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(16)
        self.lsock = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls):
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.socks += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                self.flowing.wait()
                dst.sendall(d)
        except OSError:
            pass
        for x in (src, dst):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        # shutdown first: a close alone leaves the socket listening while
        # the accept thread is blocked in it.
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.lsock.close()
        with self.lock:
            socks, self.socks = self.socks, []
        for x in socks:
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            x.close()


class PgServersTest(pg_fixture.PgServersCase):

    def setUp(self):
        super().setUp()
        self.admin = self.h.create_key(self.uri, "admin", "ops")
        self.client = self.h.create_key(self.uri, "client", "app")
        # Agent keys made before the servers start (each binds to one agent):
        # an agent refused at its first poll exits rather than wait for the
        # next re-read of the keys.
        self.agent_keys = [self.h.create_key(self.uri, "agent", "agent%d" % i) for i in range(3)]

    def start_servers(self, n=3, db=None):
        return super().start_servers(n, FAST + CLUSTER, key=self.client, db=db)

    def start_agent(self, srv, up):
        return self.h.start_agent(srv, upstream=up, model="m1", slots=2,
                                  token=self.agent_keys.pop())

    def status(self, srv):
        return {"servers": self.servers_status(srv, self.admin)}

    def server_states(self, srv):
        return super().server_states(srv, self.admin)

    def complete(self, srv, prompt, key=None, n=3):
        return http_json("POST", srv.url + "/v1/completions",
                         {"model": "m1", "prompt": prompt, "max_tokens": n},
                         headers=bearer(key or self.client), timeout=60)

    def assert_completes(self, srv, prompt):
        st, _, body = self.complete(srv, prompt)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], expected(prompt, 3))

    def test_status_lists_servers_and_kill9_moves_agents(self):
        up = self.h.start_upstream(["--tokens", "3"])
        a, b, c = self.start_servers()
        pids = {a.pid, b.pid, c.pid}
        for srv in (a, b, c):
            harness.wait_until(
                lambda: self.server_states(srv) == {p: "alive" for p in pids},
                timeout=30, what="3 servers alive in %s's /admin/status" % srv.name)
        st = self.status(a)["servers"]
        mine = [s for s in st["servers"] if s["self"]]
        self.assertEqual(len(mine), 1, st)
        self.assertEqual(mine[0]["id"], st["self"])
        self.assertEqual(mine[0]["pid"], a.pid)
        self.assertEqual(mine[0]["name"], "127.0.0.1:%d" % a.port)
        self.assertTrue(st["lease_ok"])

        g1 = self.start_agent(servers(a, b, c), up)
        g2 = self.start_agent(servers(a, c, b), up)
        a.wait_model("m1")
        self.assert_completes(a, "through a")

        t_kill = time.monotonic()
        a.kill9()
        for g, to in ((g1, b), (g2, c)):
            harness.wait_until(lambda: any(e.get("to") == to.url
                                           for e in g.log_events("server_switch")),
                               timeout=60, what="%s moving to %s" % (g.name, to.name))
        for srv in (b, c):
            srv.wait_model("m1", timeout=60, key=self.client)
            for i in range(3):
                self.assert_completes(srv, "after the kill %s %d" % (srv.name, i))
        # The dead server's lease runs out: the others say so.
        for srv in (b, c):
            harness.wait_until(
                lambda: self.server_states(srv).get(a.pid) == "lease_expired",
                timeout=30, what="%s listing the killed server as lease_expired" % srv.name)
            self.assertEqual(self.server_states(srv)[b.pid], "alive")
        sys.stderr.write("\nkill -9: agents served by b and c and a listed lease_expired "
                         "within %.1f s\n" % (time.monotonic() - t_kill))
        # A clean stop is told apart from a death.
        c.stop()
        harness.wait_until(lambda: self.server_states(b).get(c.pid) == "stopped",
                           timeout=30, what="the stopped server listed as stopped")

    def test_database_down_then_back(self):
        up = self.h.start_upstream(["--tokens", "120", "--pace-ms", "50"])
        a, b, c = self.start_servers()
        for srv in (a, b, c):
            self.start_agent(srv, up)
        for srv in (a, b, c):
            srv.wait_model("m1")
        # A stream in flight through the outage (about 6 s of tokens).
        stream = harness.SSEStream("POST", a.url + "/v1/chat/completions",
                                   {"model": "m1", "stream": True,
                                    "messages": [{"role": "user", "content": "outage"}]},
                                   headers=bearer(self.client), timeout=60)
        try:
            self.assertEqual(stream.status, 200)
            first = stream.next_event(timeout=30)
            self.assertIsNotNone(first)
            events = [first]
            t_down = time.monotonic()
            self.pg.stop()

            # The task first: sent while c's lease still runs, its creation
            # waits for a commit that cannot come, and is answered 503
            # after a lease rather than held until the database returns.
            shapes = [
                (c, "/v2/tasks", {"model": "m1", "prompt": "x", "max_tokens": 3}, {}),
                (a, "/v1/completions", {"model": "m1", "prompt": "x", "max_tokens": 3}, {}),
                (b, "/v1/messages", {"model": "m1", "max_tokens": 3,
                                     "messages": [{"role": "user", "content": "x"}]},
                 {"anthropic-version": "2023-06-01"}),
            ]
            for srv, path, body, extra in shapes:
                def busy():
                    st, _, err = http_json("POST", srv.url + path, body,
                                           dict(bearer(self.client), **extra), timeout=30)
                    if st == 503 and "did not confirm" in (err or {}).get("error", {}).get(
                            "message", ""):
                        sys.stderr.write("\n%s: creation held, then 503 after a lease\n"
                                         % srv.name)
                    return st == 503
                harness.wait_until(busy, timeout=30, interval=0.2,
                                   what="503 from %s with the database down" % srv.name)
                st, hdr, err = http_json("POST", srv.url + path, body,
                                         dict(bearer(self.client), **extra), timeout=30)
                self.assertEqual(st, 503, err)
                self.assertGreaterEqual(int(hdr.get("retry-after", "0")), 1, hdr)
                e = err["error"]
                self.assertIn("database", e["message"])
                self.assertEqual(e["retry_after_sec"], int(hdr["retry-after"]))
                if path == "/v1/messages":
                    self.assertEqual(err["type"], "error")
                    self.assertEqual(e["type"], "overloaded_error")
                elif path == "/v1/completions":
                    self.assertEqual(e["code"], "server_busy")
                else:
                    self.assertEqual(e["code"], "SERVER_BUSY")
            sys.stderr.write("\n503 on all three %.1f s after PostgreSQL was told to stop\n"
                             % (time.monotonic() - t_down))
            # Admin and health stay up: the operator can see why.
            st = self.status(a)["servers"]
            self.assertFalse(st["lease_ok"], st)

            # The stream in flight finishes whole, the database still down.
            while True:
                ev = stream.next_event(timeout=60)
                self.assertIsNotNone(ev, "stream ended without [DONE]")
                events.append(ev)
                if ev["data"] == "[DONE]":
                    break
        finally:
            stream.close()
        text = "".join((ch.get("delta") or {}).get("content") or ""
                       for d in harness.sse_data_json(events) for ch in d.get("choices") or [])
        self.assertEqual(text, expected("outage", 120))

        self.pg.start()
        t_up = time.monotonic()
        up.control(pace_ms=0)
        for srv in (a, b, c):
            harness.wait_until(lambda: self.complete(srv, "back")[0] == 200,
                               timeout=60, interval=0.2,
                               what="%s admitting again after PostgreSQL came back" % srv.name)
        sys.stderr.write("admitting again %.1f s after PostgreSQL started\n"
                         % (time.monotonic() - t_up))
        for srv in (a, b, c):
            self.assert_completes(srv, "after the outage")
            self.assertTrue(self.status(srv)["servers"]["lease_ok"])
            self.assertTrue(srv.alive())
            self.assertTrue(srv.log_events("server_lease_expired"), srv.name)
            renewed = srv.log_events("server_lease_renewed")
            self.assertTrue(renewed and renewed[-1].get("was_refusing"), (srv.name, renewed))

    def test_partitioned_server_stops_admitting(self):
        up = self.h.start_upstream(["--tokens", "3"])
        link = Link(self.pg.port)
        self.addCleanup(link.cut)
        cut_uri = "postgresql://%s@127.0.0.1:%d/gpupool" % (pg.Postgres.USER, link.port)
        a, = self.start_servers(1, db=cut_uri)
        b, c = self.start_servers(2)
        for srv in (a, b):
            self.start_agent(srv, up)
        for srv in (a, b):
            srv.wait_model("m1")
        self.assert_completes(a, "before the cut")
        link.cut()
        t_cut = time.monotonic()
        harness.wait_until(lambda: self.complete(a, "cut off")[0] == 503, timeout=30,
                           interval=0.2, what="the partitioned server refusing new work")
        st, hdr, err = self.complete(a, "cut off")
        self.assertEqual(st, 503, err)
        self.assertIn("database", err["error"]["message"])
        self.assertGreaterEqual(int(hdr["retry-after"]), 1)
        sys.stderr.write("\npartitioned server refusing %.1f s after the cut\n"
                         % (time.monotonic() - t_cut))
        # Its health check fails (a balancer sends clients elsewhere).
        st, _, health = http_json("GET", a.url + "/health", timeout=10)
        self.assertEqual((st, health["status"]), (503, "degraded"), health)
        self.assertIn("database", health["db_error"])
        self.assertEqual(http_json("GET", b.url + "/health", timeout=10)[0], 200)
        # The others go on, and see its lease run out.
        self.assert_completes(b, "the others go on")
        for srv in (b, c):
            harness.wait_until(
                lambda: self.server_states(srv).get(a.pid) == "lease_expired",
                timeout=30, what="%s listing the partitioned server" % srv.name)
        link.heal()
        harness.wait_until(lambda: self.complete(a, "healed")[0] == 200, timeout=60,
                           interval=0.2, what="the partitioned server admitting again")
        self.assertEqual(http_json("GET", a.url + "/health", timeout=10)[0], 200)
        harness.wait_until(lambda: self.server_states(b).get(a.pid) == "alive", timeout=30,
                           what="b listing the healed server alive")

    def test_store_backlog_refuses_new_work(self):
        """The database hangs (the link holds every byte, connections open:
        nothing fails, and the lease, 600 s here, does not run out): the
        writes of admitted requests queue up; from three quarters of
        db_queue_max the server answers new work 503 with Retry-After
        (logged store_backlog) instead of queueing more; the database
        back, the queue drains and it admits again by itself
        (store_backlog_cleared)."""
        up = self.h.start_upstream(["--tokens", "3"])
        link = Link(self.pg.port)
        self.addCleanup(link.cut)
        uri = "postgresql://%s@127.0.0.1:%d/gpupool" % (pg.Postgres.USER, link.port)
        a, = super().start_servers(1, FAST + ["--heartbeat_sec", "1", "--lease_sec", "600",
                                              "--db_queue_max", "40"], key=self.client, db=uri)
        self.start_agent(a, up)
        a.wait_model("m1")
        self.assert_completes(a, "before the hang")
        link.pause()
        self.addCleanup(link.resume)
        sent = []

        def refused():
            sent.append(self.complete(a, "held %d" % len(sent)))
            return sent[-1][0] != 200
        harness.wait_until(refused, timeout=120, interval=0,
                           what="a refusal once the store's queue backed up")
        st, hdr, err = sent[-1]
        self.assertEqual(st, 503, err)
        self.assertIn("not keeping up", err["error"]["message"])
        self.assertGreaterEqual(int(hdr["retry-after"]), 1)
        self.assertGreater(len(sent), 1, "refused before any write queued")
        # Refused, the queue stays where it is: more requests, all 503.
        for i in range(5):
            self.assertEqual(self.complete(a, "still held %d" % i)[0], 503)
        self.assertLessEqual(a.metric("gpupool_db_queue_depth"), 40)
        self.assertEqual(len(a.log_events("store_backlog")), 1)
        sys.stderr.write("\n%d requests admitted before the backlog refused new work\n"
                         % (len(sent) - 1))
        link.resume()
        harness.wait_until(lambda: self.complete(a, "back")[0] == 200, timeout=60,
                           interval=0.2, what="admitting again once the database answers")
        self.assertTrue(a.log_events("store_backlog_cleared"))
        self.assert_completes(a, "after the hang")

    def test_keys_and_budgets_shared(self):
        up = self.h.start_upstream(["--tokens", "3"])
        a, b, _ = self.start_servers()
        self.start_agent(a, up)
        self.start_agent(b, up)
        a.wait_model("m1")
        b.wait_model("m1")

        st, _, k = http_json("POST", a.url + "/admin/keys",
                             {"role": "client", "name": "made on a", "tokens_per_day": 20},
                             headers=bearer(self.admin), timeout=10)
        self.assertIn(st, (200, 201), k)
        t0 = time.monotonic()
        harness.wait_until(lambda: self.complete(b, "new key", key=k["key"])[0] == 200,
                           timeout=30, interval=0.1, what="a key created on a working on b")
        sys.stderr.write("\nkey created on a usable on b after %.2f s\n" % (time.monotonic() - t0))

        # Spend the budget through a.
        spent = 0
        for i in range(20):
            st, _, body = self.complete(a, "spend %d" % i, key=k["key"])
            if st == 429:
                break
            self.assertEqual(st, 200, body)
            spent += body["usage"]["total_tokens"]
        self.assertGreaterEqual(spent, 20)

        def b_sees():
            st, _, lst = http_json("GET", b.url + "/admin/keys", headers=bearer(self.admin),
                                   timeout=10)
            row = next(x for x in lst["keys"] if x["id"] == k["id"])
            u = row["usage_today"]
            return u["prompt_tokens"] + u["completion_tokens"] >= 20
        harness.wait_until(b_sees, timeout=30, what="b reading the usage a added")
        st, _, body = self.complete(b, "over budget", key=k["key"])
        self.assertEqual(st, 429, body)

        # Revoked on a: refused on b.
        st, _, _ = http_json("DELETE", a.url + "/admin/keys/" + k["id"],
                             headers=bearer(self.admin), timeout=10)
        self.assertIn(st, (200, 204))
        harness.wait_until(lambda: self.complete(b, "revoked", key=k["key"])[0] == 401,
                           timeout=30, interval=0.1, what="a key revoked on a refused on b")

    def test_agent_waits_for_a_lagging_server_to_learn_its_key(self):
        """An agent key made on a, after b read the keys: when a dies, b
        refuses the agent (401) until its next re-read. The agent goes on
        along its list for a grace period rather than exit as revoked (it
        exited at the first 401). b re-reads every 20 s, so the agent
        most likely meets the 401 first."""
        up = self.h.start_upstream(["--tokens", "3"])
        a, = self.start_servers(1)
        b, = super().start_servers(1, FAST + CLUSTER + ["--shared_refresh_sec", "20"],
                                   key=self.client)
        st, _, k = http_json("POST", a.url + "/admin/keys", {"role": "agent", "name": "late"},
                             headers=bearer(self.admin), timeout=10)
        self.assertIn(st, (200, 201), k)
        g = self.h.start_agent(servers(a, b), upstream=up, model="m1", slots=2, token=k["key"])
        a.wait_model("m1")
        a.kill9()
        b.wait_model("m1", timeout=60, key=self.client)
        self.assert_completes(b, "after the late key")
        self.assertTrue(g.alive())
        self.assertFalse(g.log_events("auth_revoked"))


class SqliteOneServerTest(harness.TestCase):
    """With SQLite there is one server: its row, listed alive, marked
    stopped by a clean shutdown; nothing to refuse (no PostgreSQL needed)."""

    def test_one_row(self):
        import sqlite3
        s = self.h.start_server(["--heartbeat_sec", "1"])
        harness.wait_until(lambda: len((http_json("GET", s.url + "/admin/status")[2]
                                        .get("servers") or {}).get("servers", [])) == 1,
                           timeout=30, what="the server listing itself")
        st = http_json("GET", s.url + "/admin/status")[2]["servers"]
        me = st["servers"][0]
        self.assertTrue(st["lease_ok"])
        self.assertEqual((me["self"], me["state"], me["pid"], me["id"]),
                         (True, "alive", s.pid, st["self"]))
        self.assertEqual(s.stop(grace=30), 0)
        con = sqlite3.connect(s.db)
        try:
            rows = con.execute("SELECT id, pid, stopped_at FROM servers").fetchall()
        finally:
            con.close()
        self.assertEqual(len(rows), 1, rows)
        self.assertEqual(rows[0][:2], (st["self"], s.pid))
        self.assertIsNotNone(rows[0][2], "a clean stop marks the row stopped")


if __name__ == "__main__":
    harness.main()
