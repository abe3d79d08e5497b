#!/usr/bin/env python3
"""Native tasks across servers on one PostgreSQL (issue 28 items 2 and 4):
what following a task from another server adds, and how long a task waits
after its server is killed. Printed, never asserted.

  python3 bench/tasks_shared_bench.py BUILD_DIR [--reps 5] [--lease 2]
                                      [--parts create,follow,takeover]

Starts, on 127.0.0.1, a PostgreSQL (tests/integration/pg.py, Debian's
binaries), three gpupool-servers A, B, C on it (--task_lease_sec LEASE), a
scripted upstream (a token every 20 ms) and two openai-backend agents, one
with --server A,B,C and one with --server B,C,A.

create: 200 POST /v2/tasks to A one after the other (max_tokens 1): the
  latency of the 202, which on a shared database waits for the commit of
  the task's row and first event.
follow: a task created on A is read at once from A (memory) and from B
  (which follows the store); for each token event, its arrival at B's client
  minus its arrival at A's client.
takeover: a task on A; once its client has read 5 tokens, A and its agent
  are killed -9 and the client reconnects to C with Last-Event-ID. From the
  kill to the failover event (B claimed the expired lease and resubmitted)
  and to the first token after it. A and its agent are then started again
  on A's port for the next repetition.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lease", type=int, default=2)
    ap.add_argument("--parts", default="create,follow,takeover")
    args = ap.parse_args()
    os.environ["GPUPOOL_BUILD_DIR"] = os.path.abspath(args.build_dir)
    import harness  # noqa: E402 (reads GPUPOOL_BUILD_DIR)
    import pg  # noqa: E402
    from harness import http_json  # noqa: E402

    ok, why = pg.available()
    if not ok:
        print("skipped:", why)
        return
    fast = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5",
            "--task_lease_sec", str(args.lease)]
    h = harness.Harness()
    db = None
    try:
        db = pg.Postgres(h.tmp)
        db.createdb("gpupool")
        uri = db.uri("gpupool")
        st = ["--state_dir", h.tmp]
        up = h.start_upstream(["--tokens", "400", "--pace-ms", "20"])
        srv = {n: h.start_server(fast + st, db=uri, name="server" + n) for n in "ABC"}

        def agent(order, name):
            a = h.start_agent(types.SimpleNamespace(url=",".join(srv[n].url for n in order)),
                              upstream=up, slots=4, name=name)
            srv[order[0]].wait_model("m1")
            return a
        agent_a = agent("ABC", "agentA")
        agent("BCA", "agentB")

        def create(s, max_tokens):
            code, _, r = http_json("POST", s.url + "/v2/tasks",
                                   {"model": "m1", "prompt": "hi", "max_tokens": max_tokens},
                                   timeout=10)
            assert code == 202, r
            return r["job_id"]

        parts = args.parts.split(",")
        if "create" in parts:
            ms = []
            for _ in range(200):
                t0 = time.monotonic()
                create(srv["A"], 1)
                ms.append((time.monotonic() - t0) * 1000)
            print("create: POST /v2/tasks to 202: p50 %.2f ms, p95 %.2f ms, max %.2f ms"
                  % (pct(ms, 50), pct(ms, 95), max(ms)))
        # follow
        lat = []
        for _ in range(args.reps if "follow" in parts else 0):
            tid = create(srv["A"], 40)
            arrivals = {}

            def read(name, arrivals=arrivals, tid=tid):
                s = harness.SSEStream("GET", srv[name].url + "/v2/tasks/%s/events" % tid,
                                      timeout=60)
                got = {}
                while True:
                    e = s.next_event(timeout=60)
                    if e is None:
                        break
                    if e["event"] == "token":
                        got[int(e["id"])] = time.monotonic()
                s.close()
                arrivals[name] = got
            ts = [threading.Thread(target=read, args=(n,)) for n in "AB"]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            for i, t_a in arrivals["A"].items():
                if i in arrivals["B"]:
                    lat.append((arrivals["B"][i] - t_a) * 1000)
        if lat:
            print("follow from another server: %d token events, B minus A: p50 %.1f ms, "
                  "p95 %.1f ms, max %.1f ms" % (len(lat), pct(lat, 50), pct(lat, 95), max(lat)))

        # takeover
        to_failover, to_token = [], []
        for rep in range(args.reps if "takeover" in parts else 0):
            tid = create(srv["A"], 300)
            s = harness.SSEStream("GET", srv["A"].url + "/v2/tasks/%s/events" % tid, timeout=60)
            seen = []
            while sum(1 for e in seen if e["event"] == "token") < 5:
                seen.append(s.next_event(timeout=60))
            port = srv["A"].port
            t0 = time.monotonic()
            srv["A"].kill9()
            agent_a.kill9()
            s.close()
            s = harness.SSEStream("GET", srv["C"].url + "/v2/tasks/%s/events" % tid,
                                  headers={"Last-Event-ID": seen[-1]["id"]}, timeout=120)
            t_fo = t_tok = None
            while True:
                e = s.next_event(timeout=120)
                if e is None:
                    break
                seen.append(e)
                if e["event"] == "failover" and t_fo is None:
                    t_fo = time.monotonic()
                if e["event"] == "token" and t_fo is not None and t_tok is None:
                    t_tok = time.monotonic()
            s.close()
            ids = [int(e["id"]) for e in seen]
            assert ids == list(range(1, len(ids) + 1)), ids
            assert seen[-1]["event"] == "end", seen[-1]
            to_failover.append(t_fo - t0)
            to_token.append(t_tok - t0)
            srv["A"] = h.start_server(fast + st, db=uri, name="serverA%d" % rep, port=port)
            agent_a = agent("ABC", "agentA%d" % rep)
        if to_failover:
            print("kill -9 of the owner (lease %d s) to the failover event at a client on a "
                  "third server: p50 %.2f s, max %.2f s; to the first token after it: p50 "
                  "%.2f s, max %.2f s (%d reps)"
                  % (args.lease, statistics.median(to_failover), max(to_failover),
                     statistics.median(to_token), max(to_token), args.reps))
    finally:
        if db:
            db.stop()  # before the harness removes its directory
        h.cleanup()


if __name__ == "__main__":
    main()
