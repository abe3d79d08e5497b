"""What docs/operations.md tells an operator to do, done on the real server:

- back up the DB with `sqlite3 DB ".backup FILE"` while the server runs and
  restore it as documented: the keys in the backup work, later ones do not;
- migrations are recorded in schema_migrations, and a DB with a newer schema
  is refused with a clear message;
- keys created with `gpupool-server keys create` while the server runs are
  picked up on SIGHUP (`systemctl reload`);
- log_file: SIGHUP reopens it, so a rotation (mv, then reload) continues in
  a fresh file with nothing lost;
- SIGTERM with a job that never finishes: the server waits shutdown_grace_sec,
  logs shutdown_grace_expired and exits 0 (so the unit's TimeoutStopSec only
  has to exceed the grace).

Needs the sqlite3 command-line shell (Debian package `sqlite3`).
"""

import os
import re
import shutil
import signal
import stat
import sqlite3
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def sqlite3_cli():
    p = shutil.which("sqlite3")
    if not p:
        raise AssertionError("sqlite3 not found: install the Debian package 'sqlite3'")
    return p


def models_status(srv, key):
    st, _, _ = harness.http_json("GET", srv.url + "/v1/models", headers=harness.bearer(key),
                                 timeout=5)
    return st


def migration_files():
    d = os.path.join(harness.SOURCE_DIR, "migrations")
    out = []
    for f in sorted(os.listdir(d)):
        m = re.match(r"^(\d{4})_(.+)\.sql$", f)
        if m:
            out.append((int(m.group(1)), m.group(2)))
    return out


class ServiceOps(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def test_backup_while_running_and_restore(self):
        cli = sqlite3_cli()
        db = self.h.path("live.db")
        k1 = self.h.create_key(db, "client", "before-backup")
        ka = self.h.create_key(db, "agent", "agent-key")
        srv = self.h.start_server(db=db, key=k1)
        self.assertEqual(models_status(srv, k1), 200)
        # Some writes in the WAL, not yet checkpointed, at backup time: an
        # agent registers (the DB thread commits it a few ms later).
        st, body = FakeAgent(srv.url, key=ka).poll()
        self.assertEqual(st, 200, body)

        def agents_in(path):
            c = sqlite3.connect(path)
            try:
                return c.execute("SELECT count(*) FROM agents").fetchone()[0]
            finally:
                c.close()
        harness.wait_until(lambda: agents_in(db) == 1, timeout=10, what="agent row committed")
        backup = self.h.path("backup.db")
        # As documented: under umask 077, so the copy is 0600 like the DB.
        r = subprocess.run([cli, db, ".backup " + backup], capture_output=True, text=True,
                           timeout=60, preexec_fn=lambda: os.umask(0o077))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(stat.S_IMODE(os.stat(backup).st_mode), 0o600)
        self.assertTrue(srv.alive())
        k2 = self.h.create_key(db, "client", "after-backup")
        srv.signal(signal.SIGHUP)
        harness.wait_until(lambda: models_status(srv, k2) == 200, timeout=10,
                           what="new key accepted after SIGHUP")
        self.assertEqual(srv.stop(grace=20), 0)

        r = subprocess.run([cli, backup, "PRAGMA integrity_check"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.stdout.strip(), "ok", r.stderr)
        con = sqlite3.connect(backup)
        try:
            rows = con.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
            self.assertEqual(rows, migration_files())
            names = sorted(n for (n,) in con.execute("SELECT name FROM api_keys"))
            # Auth is on and no admin key existed: the server made one at start.
            self.assertEqual(names, ["agent-key", "before-backup", "generated at first start"])
            self.assertEqual(con.execute("SELECT count(*) FROM agents").fetchone()[0], 1)
        finally:
            con.close()

        # Restore as documented: server stopped, -wal/-shm removed, file replaced.
        for suffix in ("-wal", "-shm"):
            try:
                os.unlink(db + suffix)
            except FileNotFoundError:
                pass
        shutil.copyfile(backup, db)
        srv2 = self.h.start_server(db=db, key=k1)
        self.assertEqual(models_status(srv2, k1), 200)
        self.assertEqual(models_status(srv2, k2), 401)

    def test_sighup_reopens_the_log_file(self):
        log = self.h.path("server.log")
        srv = self.h.start_server(args=["--log_file", log])
        harness.wait_until(lambda: os.path.exists(log) and "listening" in open(log).read(),
                           timeout=20, what="log lines in log_file")
        # The process's own stderr stays quiet but for sanitizer reports.
        self.assertNotIn('"event":"listening"', srv.log_text())
        os.rename(log, log + ".1")                  # logrotate's move
        srv.signal(signal.SIGHUP)
        harness.wait_until(lambda: os.path.exists(log) and "keys_reloaded" in open(log).read(),
                           timeout=20, what="reopened log file gets the reload line")
        st, _, _ = harness.http_json("GET", srv.url + "/health", timeout=5)
        self.assertEqual(st, 200)
        with open(log + ".1") as f:
            self.assertNotIn("keys_reloaded", f.read())
        # A log_file that cannot be opened stops start-up with a clear message.
        r = subprocess.run([harness.SERVER_BIN, "--listen", "127.0.0.1:0", "--db",
                            self.h.path("x.db"), "--log_file", "/nonexistent/dir/x.log"],
                           capture_output=True, text=True, timeout=30, env=self.h.env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("log_file", r.stderr)

    def test_newer_schema_refused(self):
        db = self.h.path("newer.db")
        self.h.create_key(db, "client")          # creates the DB at the current schema
        con = sqlite3.connect(db)
        try:
            con.execute("INSERT INTO schema_migrations (version, name, applied_at) "
                        "VALUES (9999, 'from_the_future', 0)")
            con.commit()
        finally:
            con.close()
        log = self.h.path("newer.log")
        with open(log, "wb") as f:
            p = subprocess.Popen([harness.SERVER_BIN, "--listen", "127.0.0.1:0", "--db", db],
                                 stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=self.h.env(), start_new_session=True)
            try:
                rc = p.wait(timeout=30)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
        self.assertNotEqual(rc, 0, text)
        self.assertIn("9999", text)
        self.assertIn("newer than this binary", text)

    def test_sigterm_waits_for_the_grace_then_exits(self):
        srv = self.h.start_server(["--shutdown_grace_sec", "2"])
        a = FakeAgent(srv.url)
        a.poll()
        result = {}

        def client():
            try:
                with harness.SSEStream("POST", srv.url + "/v1/chat/completions",
                                       dict(CHAT, stream=True), timeout=60) as s:
                    result["status"] = s.status
                    result["events"] = s.events()
            except Exception as e:  # the server closes the stream when it exits
                result["error"] = repr(e)
        t = threading.Thread(target=client, daemon=True)
        t.start()
        st, jobs = a.work(1, timeout=20)
        self.assertEqual(st, 200)
        jid = jobs[0]["job_id"]
        a.events(jid, [{"type": "started"}, {"type": "token", "text": "one"}])
        srv.signal(signal.SIGTERM)
        # The job never ends: the server must still exit, after the grace.
        self.assertEqual(srv.wait(30), 0)
        t.join(timeout=30)
        self.assertFalse(t.is_alive(), "client stream still open after the server exited")
        events = [e["event"] for e in srv.log_events()]
        self.assertIn("shutdown_begin", events)
        self.assertIn("shutdown_grace_expired", events)
        self.assertIn("shutdown_done", events)
        self.assertLess(events.index("shutdown_begin"), events.index("shutdown_grace_expired"))
        expired = srv.log_events("shutdown_grace_expired")[0]
        self.assertEqual(expired.get("jobs_active"), 1)


if __name__ == "__main__":
    harness.main()
