#!/usr/bin/env python3
"""The hand-off of a job to another server (issue 28 item 3, docs/scaling.md
3e): what it adds to the time to the first token. Printed, never asserted.

  python3 bench/handoff_bench.py BUILD_DIR [--reps 40] [--tokens 8]

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=8)
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
