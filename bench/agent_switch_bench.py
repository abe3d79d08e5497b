#!/usr/bin/env python3
"""How long an agent with two servers takes to move (issue 28 item 3).
Printed, never asserted.

  python3 bench/agent_switch_bench.py BUILD_DIR [--reps 6]

Starts, on 127.0.0.1, two gpupool-servers (auth off, their own SQLite
files, --poll_interval_sec 1 --work_wait_sec 5), a scripted upstream and
one openai-backend agent with --server URL1,URL2. Each repetition kills -9
the server the agent is attached to, measures from the kill to (a) the
agent's server_switch log line and (b) the first completion that succeeds
through the other server (tried every 20 ms), then restarts the killed
server on its port and database, so that the next repetition moves back.
Reports p50 and max of both.

With one --server (before issue 28) the agent never moves: nothing is
served through it until its server is back.
"""

import argparse
import calendar
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))


def log_time(ts):
    """gp_log's "ts" (UTC, milliseconds) as epoch seconds."""
    base, ms = ts.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + int(ms) / 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()
    os.environ["GPUPOOL_BUILD_DIR"] = os.path.abspath(args.build_dir)
    import harness  # noqa: E402 (reads GPUPOOL_BUILD_DIR)
    from harness import http_json  # noqa: E402
    import types

    fast = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]
    h = harness.Harness()
    try:
        up = h.start_upstream(["--tokens", "3"])
        srv = [h.start_server(fast), h.start_server(fast)]
        a = h.start_agent(types.SimpleNamespace(url=srv[0].url + "," + srv[1].url),
                          upstream=up, slots=2)
        srv[0].wait_model("m1")
        cur = 0
        to_switch, to_served = [], []
        for rep in range(args.reps):
            other = 1 - cur
            n_sw = len(a.log_events("server_switch"))
            t0 = time.time()
            srv[cur].kill9()
            while True:
                st, _, _ = http_json("POST", srv[other].url + "/v1/completions",
                                     {"model": "m1", "prompt": "x", "max_tokens": 3}, timeout=30)
                if st == 200:
                    break
                time.sleep(0.02)
            t_served = time.time() - t0
            harness.wait_until(lambda: len(a.log_events("server_switch")) > n_sw, timeout=60)
            sw = a.log_events("server_switch")[n_sw]
            to_switch.append(log_time(sw["ts"]) - t0)
            to_served.append(t_served)
            print("rep %d: %s -> %s: server_switch after %.3f s (%s: %s), served after %.3f s"
                  % (rep + 1, sw["from"], sw["to"], to_switch[-1], sw.get("request"),
                     sw.get("reason"), t_served))
            srv[cur] = h.start_server(fast, db=srv[cur].db, port=srv[cur].port)
            cur = other

        def p50(v):
            return sorted(v)[len(v) // 2]
        print("kill -9 -> server_switch: p50 %.3f s, max %.3f s" % (p50(to_switch), max(to_switch)))
        print("kill -9 -> first completion through the other server: p50 %.3f s, max %.3f s"
              % (p50(to_served), max(to_served)))
    finally:
        h.cleanup()


if __name__ == "__main__":
    main()
