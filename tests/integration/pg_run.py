"""pg_run.py [--dbs N] -- COMMAND...: run COMMAND next to a real PostgreSQL
(pg.py) with a database `gpupool` holding empty schemas t1..tN, and
GPUPOOL_TEST_PG_BASE set to the URI they share but for the schema's name
(postgresql://gpupool@127.0.0.1:PORT/gpupool?options=-c%20search_path%3D);
tests/unit/server/db_fixture.h appends one per test. (Schemas, not
databases: a CREATE DATABASE takes most of a second.) Exits with COMMAND's
status, or 77 (CTest's SKIP_RETURN_CODE) with the reason when PostgreSQL
cannot be started here. PostgreSQL is stopped by its PID in every case.
"""
import os
import subprocess
import sys
import tempfile
import shutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pg  # noqa: E402


def main():
    args = sys.argv[1:]
    dbs = 40
    if args[:1] == ["--dbs"]:
        dbs = int(args[1])
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    ok, why = pg.available()
    if not ok:
        print("SKIP: " + why)
        return 77
    tmp = tempfile.mkdtemp(prefix="gpupool-pg-")
    db = None
    try:
        db = pg.Postgres(tmp)
        db.createdb("gpupool")
        db.createschemas("gpupool", ["t%d" % i for i in range(1, dbs + 1)])
        env = dict(os.environ, GPUPOOL_TEST_PG_BASE=db.schema_uri("gpupool"))
        return subprocess.run(args, env=env).returncode
    finally:
        if db:
            db.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
