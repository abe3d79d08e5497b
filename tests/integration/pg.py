"""A real PostgreSQL for the tests: Debian's binaries (initdb, postgres) on a
fresh data directory in a temporary directory, listening on a free loopback
port and a unix socket there, trust authentication, stopped by its PID.

    import pg
    ok, why = pg.available()          # skip the test with `why` when not ok
    db = pg.Postgres(tmpdir)          # initdb + start; waits until it accepts
    db.createdb("gpupool")
    uri = db.uri("gpupool")           # postgresql://gpupool@127.0.0.1:PORT/gpupool
    db.restart()                      # stop, then start on the same port and data
    db.stop()                         # fast shutdown, waits for the PID to exit

PostgreSQL refuses to run as root: as root, initdb and postgres run as the
`postgres` user (Debian's package creates it) and the data directory is
handed to it. Standard library only, like harness.py.
"""
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time


def bin_dir():
    """Directory of initdb/postgres: $GPUPOOL_PG_BIN, else the newest
    /usr/lib/postgresql/N/bin that has both, else None."""
    env = os.environ.get("GPUPOOL_PG_BIN")
    cands = [env] if env else sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                     key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
                                     reverse=True)
    for d in cands:
        if d and all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "postgres", "pg_ctl")):
            return d
    return None


def _run_as():
    """The user to run PostgreSQL as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return False


def available():
    """(True, "") when a PostgreSQL can be started here, else (False, why)."""
    if not bin_dir():
        return False, ("PostgreSQL binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin "
                       "(scripts/install-deps.sh installs Debian's postgresql)")
    if _run_as() is False:
        return False, "running as root and there is no `postgres` user to run PostgreSQL as"
    return True, ""


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Postgres:
    USER = "gpupool"

    def __init__(self, tmp, timeout=60.0):
        self.bin = bin_dir()
        self.dir = os.path.join(tmp, "pg")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "postgres.log")
        self.port = _free_port()
        self.pid = None
        self.user = _run_as()
        os.makedirs(self.dir, exist_ok=True)
        if self.user:
            # The postgres user must reach its directory: the caller's
            # temporary directory (0700, root's) is opened for traversal.
            os.chmod(tmp, os.stat(tmp).st_mode | 0o011)
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self._as([os.path.join(self.bin, "initdb"), "-D", self.data, "-A", "trust", "-U", self.USER,
                  "-E", "UTF8", "--no-sync"], check=True)
        self.start(timeout)

    def start(self, timeout=60.0):
        """Start (again) on the same data directory and port."""
        # pg_ctl -w waits until the server accepts connections (its own
        # readiness check, no sleep here) and returns; the PID is then the
        # first line of postmaster.pid.
        self._as([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l", self.log, "-w",
                  "-t", str(int(timeout)), "-o",
                  "-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c max_connections=200"
                  % (self.port, self.dir), "start"], check=True)
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            self.pid = int(f.readline().strip())

    def restart(self):
        self.stop()
        self.start()

    def _as(self, argv, check=False):
        kw = {}
        if self.user:
            u = self.user

            def demote():
                os.setgid(u.pw_gid)
                os.setgroups([])
                os.setuid(u.pw_uid)
            kw["preexec_fn"] = demote
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)
        if check and r.returncode != 0:
            raise RuntimeError("%s failed (%d): %s%s" % (os.path.basename(argv[0]), r.returncode,
                                                        r.stdout[-2000:], r.stderr[-2000:]))
        return r

    def createdb(self, name):
        self._as([os.path.join(self.bin, "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                  "-U", self.USER, name], check=True)

    def createdbs(self, names):
        """Several empty databases in one psql run."""
        argv = [os.path.join(self.bin, "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.USER,
                "-d", "postgres", "-q", "-v", "ON_ERROR_STOP=1"]
        for n in names:
            argv += ["-c", 'CREATE DATABASE "%s"' % n]
        self._as(argv, check=True)

    def createschemas(self, db, names):
        """Empty schemas in db, in one psql run: a fresh namespace costs
        milliseconds where a database costs most of a second."""
        self.psql(db, "; ".join('CREATE SCHEMA "%s"' % n for n in names))

    def schema_uri(self, db, schema=""):
        """A URI whose connections use schema (search_path): the store's
        tables land there. With schema "", the prefix to append one to."""
        return self.uri(db) + "?options=-c%20search_path%3D" + schema

    def psql(self, db, sql):
        """Run sql in db (checks only); returns stdout (unaligned, tuples only)."""
        r = self._as([os.path.join(self.bin, "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                      "-U", self.USER, "-d", db, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True)
        return r.stdout

    def uri(self, db):
        return "postgresql://%s@127.0.0.1:%d/%s" % (self.USER, self.port, db)

    def base_uri(self):
        return "postgresql://%s@127.0.0.1:%d/" % (self.USER, self.port)

    def stop(self, timeout=60.0):
        """Fast shutdown (SIGINT to the postmaster), wait for the PID to go."""
        if not self.pid:
            return
        pid, self.pid = self.pid, None
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
