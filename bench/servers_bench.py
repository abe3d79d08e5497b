#!/usr/bin/env python3
"""1, 2 and 3 gpupool-servers on one PostgreSQL behind HAProxy (issue 28
item 5's figures): throughput side by side, and the recovery times of the
failure cases. Printed, never asserted.

  python3 bench/servers_bench.py BUILD_DIR [--seconds 3] [--concurrency 16]
                                 [--max-tokens 32] [--reps 3]
                                 [--heartbeat 1] [--lease 3]

Starts, on 127.0.0.1, a PostgreSQL (tests/integration/pg.py, Debian's
binaries, fsync=off), three gpupool-servers A, B, C on it (auth off: no
keys; --heartbeat_sec/--lease_sec as given, --shared_refresh_sec 1), one
scripted upstream per agent (tests/integration/upstream.py, no pacing) and
three openai-backend agents with --server A,B,C / B,C,A / C,A,B (64 slots
each), so every server has an agent for the model (there is no job
hand-off between servers). Debian's haproxy runs conf/haproxy.cfg with its
bind and server lines replaced by loopback ones (as in
tests/integration/test_haproxy.py), one haproxy per server count.

Throughput, for each target (A direct; HAProxy over A; over A,B; over
A,B,C), --concurrency client threads (keep-alive connections) for
--seconds each:
  req/s:    POST /v1/completions, max_tokens 1, not streamed;
  tokens/s: POST /v1/chat/completions streamed, max_tokens --max-tokens;
            tokens = the SSE chunks with content that reached the client.
Per cell it also prints the CPU cores each group of processes used (from
/proc: servers, agents, upstreams, haproxy, postgres, this client), the
error statuses and the first error body.

Recovery (HAProxy over A,B,C, a client thread sending completions one after
the other through it during each case, --reps times):
  kill -9 of a server: from the kill to the first success through HAProxy
    of a request sent after the kill, and the requests that failed (those
    in flight on the killed server); A and its agent are then started again.
  PostgreSQL down past the lease, then started: from the stop to all three
    servers answering 503 (the lease expired); it stays down --down s more
    (HAProxy marks the servers down meanwhile), then from PostgreSQL
    accepting again to all three admitting (a completion succeeds on each,
    directly) and to the first success through HAProxy (its health checks
    must see /health 200 twice, 1 s apart).

Everything (client threads, HAProxy, three servers, three agents, three
upstreams and PostgreSQL) shares the machine's cores: on a small machine
the figures say what the processes cost together, not how the servers
scale on separate hosts.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import sys
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SYSTEM_LINES = re.compile(r"^\s*(user|group|chroot|log /dev/log|stats socket)\b")


def haproxy_config(port, ports):
    """conf/haproxy.cfg bound to 127.0.0.1:port, one server line per port,
    without the lines that need root or syslog; the rest as shipped."""
    out = []
    done = False
    with open(os.path.join(SRC, "conf", "haproxy.cfg")) as f:
        for line in f:
            s = line.strip()
            if SYSTEM_LINES.match(line):
                continue
            if s.startswith("bind "):
                out.append("    bind 127.0.0.1:%d\n" % port)
            elif s.startswith("server "):
                if not done:
                    out += ["    server s%d 127.0.0.1:%d check\n" % (i + 1, p)
                            for i, p in enumerate(ports)]
                    done = True
            else:
                out.append(line)
    return "".join(out)


class Client:
    """One keep-alive HTTP/1.1 connection, reopened after any error."""

    def __init__(self, url):
        hp = url.split("://", 1)[1]
        self.host, port = hp.split(":")
        self.port = int(port)
        self.c = None
        self.last_error = b""

    def post(self, path, body, stream=False, timeout=30):
        """(status, tokens): tokens = streamed content chunks, or the
        usage's completion_tokens. status 0: transport error."""
        try:
            if self.c is None:
                self.c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            data = json.dumps(body).encode()
            self.c.request("POST", path, data, {"Content-Type": "application/json"})
            r = self.c.getresponse()
            if not stream or r.status != 200:
                raw = r.read()
                if r.status != 200:
                    self.last_error = raw[:300]
                    return r.status, 0
                d = json.loads(raw)
                return 200, (d.get("usage") or {}).get("completion_tokens", 0)
            n = 0
            done = False
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    p = line[6:].strip()
                    if p == b"[DONE]":
                        done = True
                        continue
                    for ch in json.loads(p).get("choices") or []:
                        if (ch.get("delta") or {}).get("content"):
                            n += 1
            r.read()
            return (200 if done else 0), n
        except (OSError, http.client.HTTPException, ValueError):
            self.close()
            return 0, 0

    def close(self):
        if self.c:
            self.c.close()
        self.c = None


TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """CPU seconds (user + system) pid has used so far; 0 once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def children(ppid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == ppid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def cpu_snapshot(groups):
    """{group: CPU seconds} for {group: [pid, ...]}, plus this process."""
    snap = {g: sum(proc_cpu(p) for p in pids) for g, pids in groups.items()}
    t = os.times()
    snap["client"] = t.user + t.system
    return snap


def load(url, kind, seconds, conc, max_tokens):
    """conc threads for `seconds`: (requests ok per s, tokens per s, errors)."""
    stop = time.monotonic() + seconds
    ok, toks, errs = [0] * conc, [0] * conc, [[] for _ in range(conc)]
    bodies = []

    def run(i):
        c = Client(url)
        n = 0
        while time.monotonic() < stop:
            n += 1
            if kind == "req":
                st, t = c.post("/v1/completions", {"model": "m1", "prompt": "r%d.%d" % (i, n),
                                                   "max_tokens": 1})
            else:
                st, t = c.post("/v1/chat/completions", {
                    "model": "m1", "stream": True, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": "s%d.%d" % (i, n)}]}, stream=True)
            if st == 200:
                ok[i] += 1
                toks[i] += t
            else:
                errs[i].append(st)
                if c.last_error and not bodies:
                    bodies.append(c.last_error)
        c.close()
    t0 = time.monotonic()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.monotonic() - t0
    if bodies:
        print("  first error body: %r" % bodies[0])
    return sum(ok) / dt, sum(toks) / dt, [st for e in errs for st in e]


class Prober:
    """A thread sending completions one after the other to url; records
    (send time, end time, status) of each."""

    def __init__(self, url):
        self.url = url
        self.rec = []
        self.lock = threading.Lock()
        self.go = True
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        c = Client(self.url)
        n = 0
        while self.go:
            n += 1
            t0 = time.monotonic()
            st, _ = c.post("/v1/completions", {"model": "m1", "prompt": "p%d" % n,
                                               "max_tokens": 1}, timeout=60)
            if st != 200:
                c.close()  # a fresh connection for the next one, as a client retrying
            with self.lock:
                self.rec.append((t0, time.monotonic(), st))
            if st != 200:
                time.sleep(0.01)

    def first_ok_sent_after(self, t, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for t0, t1, st in self.rec:
                    if t0 >= t and st == 200:
                        return t1
            time.sleep(0.005)
        return None

    def failed_between(self, a, b):
        """The statuses (0: transport error) of the failures in [a, b]."""
        with self.lock:
            return [st for t0, t1, st in self.rec if st != 200 and t1 >= a and t0 <= b]

    def stop(self):
        self.go = False
        self.t.join(timeout=90)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--heartbeat", type=int, default=1)
    ap.add_argument("--lease", type=int, default=3)
    ap.add_argument("--down", type=float, default=3.0,
                    help="seconds PostgreSQL stays down once all servers answer 503")
    ap.add_argument("--parts", default="throughput,kill,pgrestart")
    args = ap.parse_args()
    os.environ["GPUPOOL_BUILD_DIR"] = os.path.abspath(args.build_dir)
    os.environ["GPUPOOL_SOURCE_DIR"] = SRC
    import harness  # noqa: E402 (reads GPUPOOL_BUILD_DIR)
    import pg  # noqa: E402
    from harness import http_json  # noqa: E402

    ok, why = pg.available()
    if not ok:
        print("skipped:", why)
        return
    if not os.access(HAPROXY, os.X_OK):
        print("skipped: haproxy is not installed (apt-get install haproxy)")
        return
    parts = args.parts.split(",")
    print("machine: %d CPUs (os.cpu_count), load average %.2f %.2f %.2f at start"
          % ((os.cpu_count() or 0,) + os.getloadavg()))
    print("every process of this bench shares those CPUs; each case runs %.1f s: short "
          "runs on a shared machine, read them as orders of magnitude" % args.seconds)
    srv_args = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5",
                "--heartbeat_sec", str(args.heartbeat), "--lease_sec", str(args.lease),
                "--shared_refresh_sec", "1"]
    h = harness.Harness()
    db = None
    haproxies = []
    try:
        db = pg.Postgres(h.tmp)
        db.createdb("gpupool")
        uri = db.uri("gpupool")
        st_dir = ["--state_dir", h.tmp]
        srv = {n: h.start_server(srv_args + st_dir, db=uri, name="server" + n) for n in "ABC"}
        orders = {"A": "ABC", "B": "BCA", "C": "CAB"}
        ups = {n: h.start_upstream(["--tokens", "4096"], name="upstream" + n) for n in "ABC"}
        agents = {}

        def start_agent(n, tag=""):
            agents[n] = h.start_agent(
                types.SimpleNamespace(url=",".join(srv[m].url for m in orders[n])),
                upstream=ups[n], slots=64, name="agent%s%s" % (n, tag),
                args=["--log-level", "info"])
            srv[n].wait_model("m1")
        for n in "ABC":
            start_agent(n)

        def start_haproxy(names):
            port = harness.free_port()
            cfg = h.path("haproxy%d.cfg" % port)
            with open(cfg, "w") as f:
                f.write(haproxy_config(port, [srv[n].port for n in names]))
            hp = harness.Proc("haproxy%d" % port, [HAPROXY, "-db", "-f", cfg],
                              h.path("haproxy%d.log" % port), env=h.env())
            h.procs.append(hp)
            haproxies.append(hp)
            hp.url = "http://127.0.0.1:%d" % port
            # every server up in HAProxy's view: its stats are not exposed
            # here, so wait for 2 checks (rise 2, inter 1s) and an answer
            harness.wait_until(lambda: http_json("GET", hp.url + "/health", timeout=2)[0] == 200,
                               timeout=20, what="haproxy /health")
            time.sleep(2.5)
            return hp

        if "throughput" in parts:
            targets = [("1 server, direct", srv["A"].url)]
            for names in ("A", "AB", "ABC"):
                targets.append(("%d server%s behind HAProxy" % (len(names), "s" if len(names) > 1
                                                                 else ""),
                                start_haproxy(names).url))
            load(targets[0][1], "req", 1.0, args.concurrency, args.max_tokens)  # warm up
            rows = []
            for label, url in targets:
                groups = {"servers": [srv[n].pid for n in "ABC"],
                          "agents": [agents[n].pid for n in "ABC"],
                          "upstreams": [ups[n].pid for n in "ABC"],
                          "haproxy": [hp.pid for hp in haproxies],
                          "postgres": [db.pid] + children(db.pid)}
                c0, w0 = cpu_snapshot(groups), time.monotonic()
                rps, _, e1 = load(url, "req", args.seconds, args.concurrency, args.max_tokens)
                _, tps, e2 = load(url, "stream", args.seconds, args.concurrency, args.max_tokens)
                c1, wall = cpu_snapshot(groups), time.monotonic() - w0
                use = {g: (c1[g] - c0[g]) / wall for g in c1}
                errs = e1 + e2
                if errs:
                    print("  errors (status: count, 0 = connection error): %s"
                          % {st: errs.count(st) for st in set(errs)})
                rows.append((label, rps, tps, len(errs), sum(use.values())))
                print("  %-28s %8.0f req/s %10.0f tokens/s  (%d errors)  CPU cores busy: %s, "
                      "total %.2f" % (label, rps, tps, len(errs),
                                      ", ".join("%s %.2f" % (g, use[g]) for g in sorted(use)),
                                      rows[-1][-1]), flush=True)
            print("\nthroughput, %d client threads, %.1f s per cell (req/s: completions of 1 "
                  "token; tokens/s: streamed chats of %d tokens):"
                  % (args.concurrency, args.seconds, args.max_tokens))
            print("| target | req/s | relayed tokens/s | errors | CPU cores busy (all processes of the bench) |")
            print("| --- | --- | --- | --- | --- |")
            for r in rows:
                print("| %s | %.0f | %.0f | %d | %.2f |" % r)
            print("load average after: %.2f %.2f %.2f" % os.getloadavg(), flush=True)

        hp3 = start_haproxy("ABC") if ("kill" in parts or "pgrestart" in parts) else None
        if "kill" in parts:
            rec, fails = [], []
            for rep in range(args.reps):
                victim = "ABC"[rep % 3]
                pr = Prober(hp3.url)
                harness.wait_until(lambda: pr.first_ok_sent_after(0, 1) is not None, timeout=30)
                t_kill = time.monotonic()
                srv[victim].kill9()
                t_ok = pr.first_ok_sent_after(t_kill)
                pr.stop()
                rec.append(t_ok - t_kill)
                fails.append(pr.failed_between(t_kill - 1, t_ok))
                print("  kill -9 of server %s: next success through HAProxy after %.3f s, "
                      "failed: %s" % (victim, rec[-1], fails[-1] or "none"), flush=True)
                # back as it was: the server on its port, its agent (which
                # moved to the next server of its list) back to it
                srv[victim] = h.start_server(srv_args + st_dir, db=uri, port=srv[victim].port,
                                             name="server%s%d" % (victim, rep))
                agents[victim].stop()
                start_agent(victim, str(rep))
                time.sleep(2.5)  # HAProxy's rise 2 at inter 1 s
            print("kill -9 of a server -> next success through HAProxy: p50 %.3f s, max %.3f s; "
                  "requests failed per kill: %s (%d reps)"
                  % (statistics.median(rec), max(rec), [len(f) for f in fails], args.reps), flush=True)

        if "pgrestart" in parts:
            to503, toall, tohp = [], [], []

            def answers(n):
                try:
                    return http_json("POST", srv[n].url + "/v1/completions",
                                     {"model": "m1", "prompt": "x", "max_tokens": 1}, timeout=10)[0]
                except OSError:
                    return 0
            for rep in range(args.reps):
                pr = Prober(hp3.url)
                t_stop = time.monotonic()
                db.stop()
                harness.wait_until(lambda: all(answers(n) == 503 for n in "ABC"), timeout=60,
                                   interval=0.05, what="all servers 503")
                to503.append(time.monotonic() - t_stop)
                time.sleep(args.down)  # HAProxy's checks (fall 2) take them out meanwhile
                db.start()
                t_up = time.monotonic()
                harness.wait_until(lambda: all(answers(n) == 200 for n in "ABC"), timeout=60,
                                   interval=0.05, what="all servers admitting")
                toall.append(time.monotonic() - t_up)
                t_hp = pr.first_ok_sent_after(t_up)
                pr.stop()
                tohp.append(t_hp - t_up)
                print("  PostgreSQL stopped: all 503 after %.2f s; started: all three admitting "
                      "after %.2f s, first success through HAProxy after %.2f s"
                      % (to503[-1], toall[-1], tohp[-1]), flush=True)
                time.sleep(2.5)
            print("PostgreSQL down (heartbeat %d s, lease %d s, then %.0f s more): all servers 503 after p50 %.2f s; "
                  "started again: all admitting after p50 %.2f s (max %.2f), through HAProxy "
                  "after p50 %.2f s (max %.2f) (%d reps)"
                  % (args.heartbeat, args.lease, args.down, statistics.median(to503),
                     statistics.median(toall), max(toall), statistics.median(tohp), max(tohp),
                     args.reps), flush=True)
    finally:
        for hp in haproxies:
            hp.signal(signal.SIGTERM)
        if db:
            db.stop()  # before the harness removes its directory
        h.cleanup()


if __name__ == "__main__":
    main()
