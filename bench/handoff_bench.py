#!/usr/bin/env python3
"""The hand-off of a job to another server (issue 28 item 3, docs/scaling.md
3e): what it adds to the time to the first token. Printed, never asserted.

  python3 bench/handoff_bench.py BUILD_DIR [--reps 40] [--tokens 8]
  python3 bench/handoff_bench.py BUILD_DIR --busy [--jobs 40] [--tokens 8]
  python3 bench/handoff_bench.py BUILD_DIR --queued [--reps 40] [--tokens 8]

Starts, on 127.0.0.1, a PostgreSQL (tests/integration/pg.py, Debian's
binaries), two gpupool-servers A and B on it, a scripted upstream (a token
every 20 ms) and one openai-backend agent polling B only. Then, one request
at a time, alternating: a streaming chat completion sent to B directly, and
the same sent to A (no agent: offered in the database, claimed by B, relayed
back). TTFT is the client's time from sending the request to the first
content token; the whole time to [DONE] is printed too, and the gaps
between one content token and the next as the client receives them (the
upstream sends one every 20 ms: a relay that delivers in batches shows
gaps near 0 and near its period).

--busy: what a busy cluster writes to the handoffs table. A and B, each
with one agent of one slot (tokens every 20 ms), get --jobs requests each,
all at once: every agent busy, every queue long. Triggers the bench adds
to the database count the offers inserted, the offers withdrawn (a
waiting row deleted: a local dispatch that paid the round trip) and the
claims; printed per job, with the whole run's time and the jobs that ran
on the other server. The table's writes and their round trips are the
cost: before migration 0013 every queued job was offered (one insert, then
a withdraw or a claim), busy peer or not.

--queued: a job waits in A's queue while A's and B's one agent are busy;
B's client leaves: the time from then to the job's first token (on B). The
price of offering only where a peer has a free agent: the offer now waits
for B to say so (its free slots, notified).
"""

import argparse
import json
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def one(harness, url, key, tokens, i):
    """(ttft_ms, total_ms, [gap_ms between content tokens]) of one
    streaming request."""
    body = {"model": "m1", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "bench %d" % i}]}
    t0 = time.monotonic()
    s = harness.SSEStream("POST", url + "/v1/chat/completions", body,
                          headers=harness.bearer(key), timeout=60)
    ttft = None
    seen = []
    try:
        while True:
            ev = s.next_event(timeout=60)
            if ev is None:
                raise RuntimeError("stream ended early")
            if ev.get("data") == "[DONE]":
                break
            d = json.loads(ev["data"])
            if any((ch.get("delta") or {}).get("content") for ch in d.get("choices") or []):
                seen.append(time.monotonic())
                if ttft is None:
                    ttft = (seen[0] - t0) * 1000
    finally:
        s.close()
    gaps = [(b - a) * 1000 for a, b in zip(seen, seen[1:])]
    return ttft, (time.monotonic() - t0) * 1000, gaps


COUNT_SQL = """
CREATE TABLE bench_handoff_ops (op TEXT NOT NULL);
CREATE FUNCTION bench_handoff_op() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO bench_handoff_ops VALUES ('insert');
  ELSIF TG_OP = 'DELETE' AND OLD.state = 'waiting' THEN
    INSERT INTO bench_handoff_ops VALUES ('withdraw');
  ELSIF TG_OP = 'UPDATE' AND NEW.state = 'claimed' AND OLD.state = 'waiting' THEN
    INSERT INTO bench_handoff_ops VALUES ('claim');
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER bench_handoff_ops AFTER INSERT OR UPDATE OR DELETE ON handoffs
  FOR EACH ROW EXECUTE FUNCTION bench_handoff_op();
"""


def chat(harness, url, key, tokens, prompt):
    st, _, r = harness.http_json("POST", url + "/v1/chat/completions",
                                 {"model": "m1", "max_tokens": tokens,
                                  "messages": [{"role": "user", "content": prompt}]},
                                 headers=harness.bearer(key), timeout=300)
    if st != 200:
        raise RuntimeError("%s: %s %s" % (prompt, st, r))


def busy(harness, h, db, uri, key, args, fast, st):
    """The --busy run: both servers' agents busy, both queues long."""
    # Agent keys before the servers: a server reads its keys at start.
    akeys = [h.create_key(uri, "agent", "agent" + name) for name in "AB"]
    ups, srvs = [], []
    for name in ("A", "B"):
        ups.append(h.start_upstream(["--tokens", "400", "--pace-ms", "20"]))
        srvs.append(h.start_server(fast + st + ["--log_level", "warn",
                                                "--queue_timeout_sec", "300"],
                                   db=uri, key=key, name="server" + name))
    for name, srv, up, akey in zip("AB", srvs, ups, akeys):
        h.start_agent(types.SimpleNamespace(url=srv.url), upstream=up, model="m1", slots=1,
                      token=akey, name="agent" + name)
        srv.wait_model("m1")
    time.sleep(3)  # each server reads the other's models (every 2 s)
    db.psql("gpupool", COUNT_SQL)
    t0 = time.monotonic()
    gets = [harness.in_thread(chat, harness, srv.url, key, args.tokens,
                              "busy %s %d" % (name, i))
            for i in range(args.jobs) for name, srv in zip("AB", srvs)]
    for g in gets:
        g(timeout=600)
    wall = time.monotonic() - t0
    time.sleep(1)
    rows = dict((r.split("|")[0], int(r.split("|")[1])) for r in db.psql(
        "gpupool", "SELECT op, count(*) FROM bench_handoff_ops GROUP BY op").splitlines() if r)
    seen = [[e["messages"][-1]["content"] for e in up.log_entries()
             if e["path"].endswith("/chat/completions")] for up in ups]
    elsewhere = sum(1 for p in seen[0] if p.startswith("busy B")) + \
        sum(1 for p in seen[1] if p.startswith("busy A"))
    n = 2 * args.jobs
    print("%d jobs (%d to each server at once), one agent of one slot each, %d tokens at 20 ms"
          % (n, args.jobs, args.tokens))
    print("%-10s %8s %8s %8s %10s %12s" % ("", "inserts", "withdraws", "claims",
                                              "ran there", "wall"))
    print("%-10s %8d %8d %8d %10d %10.1f s" % ("total", rows.get("insert", 0),
                                                 rows.get("withdraw", 0), rows.get("claim", 0),
                                                 elsewhere, wall))
    print("%-10s %8.2f %8.2f %8.2f %10.2f" % ("per job", rows.get("insert", 0) / n,
                                               rows.get("withdraw", 0) / n,
                                               rows.get("claim", 0) / n, elsewhere / n))


def first_token_at(harness, url, key, tokens, prompt, out):
    """Stream one request; out["t"]: monotonic time of its first content token."""
    body = {"model": "m1", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": prompt}]}
    s = harness.SSEStream("POST", url + "/v1/chat/completions", body,
                          headers=harness.bearer(key), timeout=120)
    try:
        while True:
            ev = s.next_event(timeout=120)
            if ev is None or ev.get("data") == "[DONE]":
                return
            d = json.loads(ev["data"])
            if "t" not in out and any((ch.get("delta") or {}).get("content")
                                      for ch in d.get("choices") or []):
                out["t"] = time.monotonic()
    finally:
        s.close()


def queued(harness, h, uri, key, args, fast, st):
    """The --queued run: a job waits in A's queue while both agents are
    busy; B's client leaves (its agent frees up); the time from then to the
    job's first token (it runs on B, A's agent still busy)."""
    akeys = [h.create_key(uri, "agent", "agent" + name) for name in "AB"]
    up = h.start_upstream(["--tokens", "400", "--pace-ms", "20"])
    srvs = [h.start_server(fast + st + ["--log_level", "warn", "--queue_timeout_sec", "60"],
                           db=uri, key=key, name="server" + name) for name in "AB"]
    for srv, akey, name in zip(srvs, akeys, "AB"):
        h.start_agent(types.SimpleNamespace(url=srv.url), upstream=up, model="m1", slots=1,
                      token=akey, name="agent" + name)
        srv.wait_model("m1")
    time.sleep(3)
    a, b = srvs
    lat = []
    for i in range(args.reps):
        holds = []
        for srv, name in ((a, "A"), (b, "B")):
            s = harness.SSEStream("POST", srv.url + "/v1/chat/completions",
                                  {"model": "m1", "stream": True, "max_tokens": 400,
                                   "messages": [{"role": "user", "content": "hold %s %d"
                                                 % (name, i)}]},
                                  headers=harness.bearer(key), timeout=120)
            if s.next_event(timeout=60) is None:
                raise RuntimeError("hold stream ended")
            holds.append(s)
        time.sleep(1.5)  # each server reads that the other is busy
        out = {}
        get = harness.in_thread(first_token_at, harness, a.url, key, args.tokens,
                                "queued %d" % i, out)
        time.sleep(1.0)  # the job waits in A's queue
        t0 = time.monotonic()
        holds[1].close()  # B's agent frees up
        get(timeout=120)
        holds[0].close()
        if "t" not in out:
            raise RuntimeError("no token")
        lat.append((out["t"] - t0) * 1000)
        time.sleep(1.0)  # both agents free again
    print("%d jobs queued at A while both agents were busy; from B's agent freeing up to "
          "the job's first token:" % args.reps)
    print("p50 %.1f ms  p95 %.1f ms  max %.1f ms" % (pct(lat, 50), pct(lat, 95), max(lat)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--busy", action="store_true",
                    help="count the handoffs writes of a busy cluster instead")
    ap.add_argument("--jobs", type=int, default=40, help="--busy: requests to each server")
    ap.add_argument("--queued", action="store_true",
                    help="time a queued job takes to reach a peer that frees up instead")
    args = ap.parse_args()
    os.environ["GPUPOOL_BUILD_DIR"] = os.path.abspath(args.build_dir)
    import harness  # noqa: E402 (reads GPUPOOL_BUILD_DIR)
    import pg  # noqa: E402

    ok, why = pg.available()
    if not ok:
        print("skipped:", why)
        return
    fast = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5",
            "--heartbeat_sec", "1", "--lease_sec", "3"]
    h = harness.Harness()
    db = None
    try:
        db = pg.Postgres(h.tmp)
        db.createdb("gpupool")
        uri = db.uri("gpupool")
        key = h.create_key(uri, "client", "bench")
        akey = h.create_key(uri, "agent", "agentB")
        st = ["--state_dir", h.tmp]
        if args.busy:
            busy(harness, h, db, uri, key, args, fast, st)
            return
        if args.queued:
            queued(harness, h, uri, key, args, fast, st)
            return
        up = h.start_upstream(["--tokens", "400", "--pace-ms", "20"])
        a = h.start_server(fast + st + ["--log_level", "warn"], db=uri, key=key, name="serverA")
        b = h.start_server(fast + st + ["--log_level", "warn"], db=uri, key=key, name="serverB")
        h.start_agent(types.SimpleNamespace(url=b.url), upstream=up, model="m1", slots=2,
                      token=akey, name="agentB")
        b.wait_model("m1")
        # A learns B's models with its next models tick (1 s): one request
        # through A until it is no longer refused.
        deadline = time.monotonic() + 30
        while True:
            try:
                one(harness, a.url, key, 1, -1)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        res = {"direct to B": ([], [], []), "through A": ([], [], [])}
        for i in range(args.reps):
            for name, url in (("direct to B", b.url), ("through A", a.url)):
                t, tot, gaps = one(harness, url, key, args.tokens, i)
                res[name][0].append(t)
                res[name][1].append(tot)
                res[name][2].extend(gaps)
        print("%d requests each, %d tokens at 20 ms, one at a time" % (args.reps, args.tokens))
        print("%-12s %9s %9s %9s %12s %10s %10s %10s" %
              ("", "TTFT p50", "TTFT p95", "TTFT max", "total p50", "gap p5", "gap p50",
               "gap p95"))
        for name, (ttft, total, gaps) in res.items():
            print("%-12s %7.1f ms %7.1f ms %7.1f ms %10.1f ms %7.1f ms %7.1f ms %7.1f ms" %
                  (name, pct(ttft, 50), pct(ttft, 95), max(ttft), pct(total, 50),
                   pct(gaps, 5), pct(gaps, 50), pct(gaps, 95)))
    finally:
        h.cleanup()
        if db:
            db.stop()


if __name__ == "__main__":
    main()
