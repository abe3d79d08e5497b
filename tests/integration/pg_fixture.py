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
"""
import os
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pg  # noqa: E402


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
