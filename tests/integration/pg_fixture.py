"""pg_fixture.py start|stop DIR: one real PostgreSQL (pg.py) shared by the
integration tests' PostgreSQL variant (CTest fixture `pg`, see
CMakeLists.txt), so that each test does not pay for its own initdb.

start: stops what an earlier run left in DIR (by the PID it recorded), then
initdb + start in DIR/pg and writes DIR/uri (postgresql://...@127.0.0.1:PORT/
gpupool), DIR/bin (the PostgreSQL binaries' directory) and DIR/pid. Where
PostgreSQL cannot be started here it writes DIR/skip with the reason and
exits 0: the tests then skip (77) with that reason.
stop: stops PostgreSQL by the PID in DIR/pid and removes DIR.

Each test gets its own schemas in the one database (harness.py's
`Harness.db`), so tests running side by side never share tables.

As a module, the common part of the tests that start a PostgreSQL of their
own and several servers on it (test_pg_servers, test_jobs_owner_pg,
test_tasks_shared_pg; they stop, restart or cut off their database, which
the shared one above must not suffer):

    class MyTest(pg_fixture.PgServersCase):
        def test_x(self):
            a, b = self.start_servers(2, ["--lease_sec", "3"], key=client)
            self.psql("SELECT ...")           # in the database `gpupool`
            self.server_id(a)                 # the id a announces (/admin/status)

PgServersCase skips (with the reason) where PostgreSQL's binaries are
absent or the server was built without libpq, else starts a PostgreSQL in
the test's temporary directory (pg.Postgres, stopped by its PID before the
directory goes) with an empty database: self.pg, self.uri.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pg  # noqa: E402
from harness import bearer, http_json  # noqa: E402


def stop(d):
    try:
        with open(os.path.join(d, "pid")) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        pid = None
    if pid:
        try:
            os.kill(pid, signal.SIGINT)   # fast shutdown
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(d, ignore_errors=True)


def start(d):
    stop(d)
    os.makedirs(d)
    ok, why = pg.available()
    if not ok:
        with open(os.path.join(d, "skip"), "w") as f:
            f.write(why + "\n")
        print("SKIP: " + why)
        return 0
    db = pg.Postgres(d)
    with open(os.path.join(d, "pid"), "w") as f:
        f.write("%d\n" % db.pid)
    db.createdb("gpupool")
    with open(os.path.join(d, "bin"), "w") as f:
        f.write(db.bin + "\n")
    with open(os.path.join(d, "uri"), "w") as f:
        f.write(db.uri("gpupool") + "\n")
    print("PostgreSQL %d on %s" % (db.pid, db.uri("gpupool")))
    return 0


def state(h):
    """A database URI has no directory: the admin key the server generates
    goes to state_dir (default: the working directory), so give it the
    test's temporary directory."""
    return ["--state_dir", h.tmp]


def server_has_libpq():
    """False when gpupool-server was built without libpq (it then refuses
    every postgresql:// database, by design)."""
    if not os.access(harness.SERVER_BIN, os.X_OK):
        return True  # harness.TestCase skips with "not built"
    r = subprocess.run([harness.SERVER_BIN, "keys", "create", "--role", "client", "--db",
                        "postgresql://probe@127.0.0.1:1/probe"], capture_output=True, text=True,
                       timeout=60)
    return "built without libpq" not in r.stderr


class PgServersCase(harness.TestCase):
    """harness.TestCase with a PostgreSQL of its own (see the top)."""

    DB = "gpupool"
    LIBPQ_MISSING = "gpupool-server was built without libpq"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.libpq = server_has_libpq()

    def setUp(self):
        ok, why = pg.available()
        if not ok:
            self.skipTest(why)
        if not self.libpq:
            self.skipTest(self.LIBPQ_MISSING)
        super().setUp()
        self.pg = pg.Postgres(self.h.tmp)
        self.addCleanup(self.pg.stop)  # before the harness removes its directory
        self.pg.createdb(self.DB)
        self.uri = self.pg.uri(self.DB)

    def start_servers(self, n, args=(), key=None, names=None, db=None):
        """n servers on the database (db: another URI to it, e.g. through a
        relay), one after the other: the first migrates, the others find it
        done. key: the client key harness's helpers send."""
        return [self.h.start_server(list(args) + state(self.h), db=db or self.uri, key=key,
                                    name=names[i] if names else None) for i in range(n)]

    def psql(self, sql):
        return self.pg.psql(self.DB, sql)

    def servers_status(self, srv, key=None):
        """The servers part of srv's /admin/status: {self, lease_ok,
        servers: [...]}. key: an admin key where auth is on."""
        st, _, body = http_json("GET", srv.url + "/admin/status",
                                headers=bearer(key) if key else None, timeout=10)
        self.assertEqual(st, 200, body)
        return body.get("servers") or {}

    def server_id(self, srv, key=None):
        """The id srv announces in the servers table."""
        return self.servers_status(srv, key)["self"]

    def server_states(self, srv, key=None):
        """{pid: state} of the servers srv lists (its last read)."""
        return {s["pid"]: s["state"] for s in self.servers_status(srv, key).get("servers", [])}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        print("usage: pg_fixture.py start|stop DIR", file=sys.stderr)
        return 2
    d = os.path.abspath(sys.argv[2])
    if sys.argv[1] == "start":
        return start(d)
    stop(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
