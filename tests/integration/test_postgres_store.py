"""gpupool-server on PostgreSQL (issue 28 item 1), with real processes: a
PostgreSQL that pg.py starts from Debian's binaries in the test's temporary
directory (stopped by PID in tearDown), gpupool-server with
--db postgresql://..., a real gpupool-agent (openai backend) on the scripted
upstream (upstream.py).

Covers: `keys create` and `keys revoke` with --db URI (and GPUPOOL_DB), a
real request through the agent, per-key usage and keys and jobs that
survive a server restart, the same pool given by `db =` in a config file,
and a database the server cannot reach: a clear refusal that never prints
the URI's password. Skipped, with the reason, where PostgreSQL's binaries
are absent (scripts/install-deps.sh installs them).
"""

import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pg  # noqa: E402
from harness import bearer, http_json  # noqa: E402
from pg_fixture import PgServersCase, server_has_libpq, state  # noqa: E402,F401 (also used by other tests)

FAST = ["--poll_interval_sec", "1", "--work_wait_sec", "5"]


def complete(srv, key, max_tokens=3):
    return http_json("POST", srv.url + "/v1/completions",
                     {"model": "m1", "prompt": "hello there", "max_tokens": max_tokens},
                     headers=bearer(key), timeout=60)


class PostgresStoreTest(PgServersCase):
    """PgServersCase gives each test its PostgreSQL (self.pg, self.uri), or
    skips it with the reason."""

    def keys(self, *args, env=None):
        r = subprocess.run([harness.SERVER_BIN, "keys"] + list(args), capture_output=True,
                           text=True, timeout=60, env=env or self.h.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def create_key(self, role, *opts):
        r = self.keys("create", "--role", role, "--db", self.uri, "--name", "pg-" + role, *opts)
        return r.stdout.strip().splitlines()[-1]

    def pool(self, agent_key, port=0, args=()):
        srv = self.h.start_server(FAST + state(self.h) + list(args), db=self.uri, port=port)
        if not hasattr(self, "up"):
            self.up = self.h.start_upstream(["--tokens", "6"])
            self.h.start_agent(srv, upstream=self.up, model="m1", slots=2, token=agent_key)
        return srv

    def test_keys_requests_and_a_restart(self):
        ck = self.create_key("client", "--tokens-per-day", "5")
        ak = self.create_key("agent")
        srv = self.pool(ak)
        srv.key = ck
        srv.wait_model("m1")
        st, _, body = complete(srv, ck, max_tokens=6)
        self.assertEqual(st, 200, body)
        used = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        st, _, body = complete(srv, ck)
        self.assertEqual(st, 429, body)
        self.assertEqual(body["error"]["code"], "token_limit")

        # The request log is in PostgreSQL (read after SIGTERM flushed it).
        port = srv.port
        srv.stop()
        rows = self.psql("SELECT status, model FROM jobs ORDER BY created_at")
        self.assertIn("done|m1", rows)
        usage = self.psql("SELECT u.requests, u.prompt_tokens + u.completion_tokens, "
                                        "u.rate_limited FROM key_usage u JOIN api_keys k "
                                        "ON k.id = u.key_id WHERE k.role = 'client'")
        self.assertEqual(usage.strip(), "1|%d|1" % used)

        # A restart on the same database: the keys, the agent's key and
        # today's spending are all there.
        srv2 = self.pool(ak, port=port)
        srv2.key = ck
        srv2.wait_model("m1")
        st, _, body = complete(srv2, ck)
        self.assertEqual(st, 429, body)
        self.assertEqual(body["error"]["code"], "token_limit")

        # keys revoke --db URI, seen by the running server after SIGHUP.
        other = self.create_key("client")
        srv2.signal(signal.SIGHUP)
        harness.wait_until(lambda: complete(srv2, other)[0] == 200, timeout=30,
                           what="the new key accepted after SIGHUP")
        key_id = self.psql("SELECT id FROM api_keys WHERE role = 'client' "
                                         "AND tokens_per_day = 0").strip()
        self.keys("revoke", key_id, "--db", self.uri)
        srv2.signal(signal.SIGHUP)
        harness.wait_until(lambda: complete(srv2, other)[0] == 401, timeout=30,
                           what="the revoked key refused after SIGHUP")

    def test_a_postgresql_restart_is_survived(self):
        ck = self.create_key("client")
        ak = self.create_key("agent")
        srv = self.pool(ak)
        srv.key = ck
        srv.wait_model("m1")
        st, _, body = complete(srv, ck)
        self.assertEqual(st, 200, body)
        self.pg.restart()  # every connection of the server's is cut

        # Requests go on (the store is off their path) and, without a server
        # restart, their rows reach the database again: the store's
        # connections were re-established.
        def done_rows():
            return int(self.psql("SELECT count(*) FROM jobs WHERE status = 'done'"))

        def stored_again():
            st, _, _ = complete(srv, ck)
            return st == 200 and done_rows() >= 3
        harness.wait_until(stored_again, timeout=60, what="jobs stored after PostgreSQL restarted")
        # The owner thread's connection too: a key created now loads on SIGHUP.
        other = self.create_key("client")
        srv.signal(signal.SIGHUP)
        harness.wait_until(lambda: complete(srv, other)[0] == 200, timeout=30,
                           what="a key created after the restart, loaded on SIGHUP")
        harness.wait_until(lambda: http_json("GET", srv.url + "/health")[2].get("db") == "ok",
                           timeout=30, what="/health db ok")

    def test_db_from_the_environment_and_the_config_file(self):
        env = self.h.env()
        env["GPUPOOL_DB"] = self.uri
        r = self.keys("create", "--role", "agent", "--name", "from-env", env=env)
        ak = r.stdout.strip().splitlines()[-1]
        ck = self.create_key("client")
        conf = self.h.path("server.conf")
        with open(conf, "w") as f:
            f.write("db = %s\n" % self.uri)
        # No --db: the config file's.
        port_file = self.h.path("conf.port")
        srv = harness.Proc("confserver", [harness.SERVER_BIN, "--config", conf, "--listen",
                                          "127.0.0.1:0", "--port-file", port_file] + FAST
                           + state(self.h),
                           self.h.path("confserver.log"), env=self.h.env())
        self.h.procs.append(srv)
        port = harness.read_port_file(port_file, srv.p)
        url = "http://127.0.0.1:%d" % port

        class S:
            pass
        s = S()
        s.url = url
        up = self.h.start_upstream(["--tokens", "4"])
        self.h.start_agent(s, upstream=up, model="m1", token=ak)
        harness.wait_until(lambda: complete(s, ck)[0] == 200, timeout=60,
                           what="a request through the config file's database")
        names = self.psql("SELECT name FROM api_keys ORDER BY name")
        self.assertIn("from-env", names)

    def test_unreachable_database_is_refused_without_the_password(self):
        closed = pg._free_port()
        uri = "postgresql://gpupool:s3cretpw@127.0.0.1:%d/gpupool" % closed
        r = subprocess.run([harness.SERVER_BIN, "keys", "create", "--role", "client", "--db", uri],
                           capture_output=True, text=True, timeout=60, env=self.h.env())
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot connect to PostgreSQL", r.stderr)
        self.assertIn("postgresql://gpupool@127.0.0.1:%d/gpupool" % closed, r.stderr)
        self.assertNotIn("s3cretpw", r.stderr + r.stdout)
        log = self.h.path("bad.log")
        p = harness.Proc("badserver", [harness.SERVER_BIN, "--listen", "127.0.0.1:0", "--db", uri]
                         + state(self.h),
                         log, env=self.h.env())
        self.h.procs.append(p)
        self.assertNotEqual(p.wait(60), 0)
        text = p.log_text()
        self.assertIn("db_open_failed", text)
        self.assertNotIn("s3cretpw", text)


if __name__ == "__main__":
    harness.main()
