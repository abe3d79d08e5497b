#!/usr/bin/env python3
"""Relay overhead of gpupool (server + agent, openai backend) against calling
the upstream directly. Printed, never asserted.

  python3 bench/relay_bench.py [--build DIR] [--tokens 32] [--pace-ms 5]
                               [--quick]

Measures, with the scripted upstream (tests/integration/upstream.py):
  1. time to first token, total time and each token's delay after its
     stream's first (how much later than the upstream's pace it came) of
     streamed completions, at 1 and 64 concurrent streams, direct vs through
     server+agent;
  2. requests per second of non-streamed completions with a zero-delay
     upstream, direct vs relayed;
  3. server RSS with 1,000 idle streams (streamed requests waiting for a
     free slot: the server holds each client connection and its job).

Everything runs on 127.0.0.1; the machine's other load shows in the figures,
so compare the direct and relayed columns of the same run.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402


def stream_once(url, path, body, pace_s, timeout=120):
    """(ttft_s, total_s, n_chunks, delays_s) of one streamed request.

    delays_s: how much later than due each token after the first came, token
    k being due at the first one's arrival + k x pace_s (the upstream's pace).
    TTFT counts the first token and the total the last; this is what a
    reader sees in between (a relay that holds tokens back shows here). The
    scripted upstream's pace drifts a little with each token (its sleeps):
    the direct row of the same run is the baseline."""
    t0 = time.monotonic()
    ttft = None
    n = 0
    first = None
    k = 0
    delays = []
    with harness.SSEStream("POST", url + path, body, timeout=timeout) as s:
        if s.status != 200:
            raise RuntimeError("HTTP %d: %r" % (s.status, s.body()[:200]))
        while True:
            e = s.next_event()
            if e is None or e["data"] == "[DONE]":
                break
            now = time.monotonic()
            ch = json.loads(e["data"]).get("choices") or [{}]
            text = ch[0].get("text")
            if text:
                if first is None:
                    first = now
                    ttft = now - t0
                else:
                    k += 1
                    delays.append(max(0.0, now - (first + k * pace_s)))
            n += 1
    return (ttft if ttft is not None else float("nan")), time.monotonic() - t0, n, delays


def run_concurrent(fn, conc, per_worker):
    out, errs = [], []
    lock = threading.Lock()

    def worker(w):
        for i in range(per_worker):
            try:
                r = fn(w, i)
                with lock:
                    out.append(r)
            except Exception as e:  # noqa: BLE001 - counted and printed
                with lock:
                    errs.append(repr(e))
    ts = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(conc)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    return out, errs, time.monotonic() - t0


def pct(xs, p):
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("GPUPOOL_BUILD_DIR", os.path.join(HERE, "..", "build")))
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--pace-ms", type=float, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    ap.add_argument("--idle", type=int, default=1000)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    harness.SERVER_BIN = os.path.join(build, "src", "server", "gpupool-server")
    harness.AGENT_BIN = os.path.join(build, "src", "agent", "gpupool-agent")
    for b in (harness.SERVER_BIN, harness.AGENT_BIN):
        if not os.access(b, os.X_OK):
            sys.exit("not built: " + b)
    n1 = 10 if args.quick else 30
    rounds64 = 1 if args.quick else 2
    rps_secs = 3 if args.quick else 6

    h = harness.Harness(prefix="gpupool-bench-")
    try:
        up = h.start_upstream(["--tokens", str(args.tokens), "--pace-ms", str(args.pace_ms)])
        srv = h.start_server(["--poll_interval_sec", "5", "--max_queue", str(args.idle + 100),
                              "--queue_timeout_sec", "600", "--log_level", "warn"])
        # Two agents, 64 slots in all, so 64 streams run at once.
        for _ in range(2):
            a = h.start_agent(srv, upstream=up, model="m1", slots=32,
                              args=["--log-level", "warn"])
        srv.wait_model("m1")
        time.sleep(1.0)  # let both agents park their long-polls

        print("gpupool relay benchmark (upstream: %d tokens, %.0f ms/token; times in ms)"
              % (args.tokens, args.pace_ms))
        # "delay": each token's lateness after its stream's first (stream_once).
        print("%-34s %9s %9s %9s %9s %9s %9s %6s" % ("case", "ttft p50", "ttft p90", "total p50",
                                                     "total p90", "delay p50", "delay p99",
                                                     "errors"))
        body = {"model": "m1", "prompt": "bench relay overhead", "stream": True,
                "max_tokens": args.tokens}
        for conc, per in ((1, n1), (64, rounds64)):
            for label, url in (("direct", up.url), ("relay", srv.url)):
                res, errs, _ = run_concurrent(
                    lambda w, i: stream_once(url, "/v1/completions", body, args.pace_ms / 1000.0),
                    conc, per)
                tt = [r[0] * 1000 for r in res]
                tot = [r[1] * 1000 for r in res]
                late = [d * 1000 for r in res for d in r[3]]
                print("%-34s %9.1f %9.1f %9.1f %9.1f %9.2f %9.2f %6d" % (
                    "stream %s, %d concurrent" % (label, conc), pct(tt, 50), pct(tt, 90),
                    pct(tot, 50), pct(tot, 90), pct(late, 50), pct(late, 99), len(errs)))
                if errs:
                    print("   first error:", errs[0][:200])

        # Requests per second, zero-delay upstream, non-streamed.
        up.control(pace_ms=0, first_delay_ms=0, tokens=8)
        nb = {"model": "m1", "prompt": "rps", "max_tokens": 8}
        for label, url in (("direct", up.url), ("relay", srv.url)):
            stop_at = time.monotonic() + rps_secs

            def one(w, i, url=url):
                if time.monotonic() > stop_at:
                    return None
                st, _, _ = harness.http_request("POST", url + "/v1/completions", nb, timeout=60)
                if st != 200:
                    raise RuntimeError("HTTP %d" % st)
                return 1
            res, errs, el = run_concurrent(one, 16, 100000 if not args.quick else 2000)
            done = sum(1 for r in res if r)
            print("%-34s %9.0f req/s  (%d requests, %d errors, 16 clients)"
                  % ("non-stream rps %s" % label, done / el, done, len(errs)))

        # Server RSS with idle streams: hold every slot with a stalled request,
        # then open `idle` streamed requests that wait in the queue.
        up.control(first_delay_ms=600000)
        base_rss = rss_kb(srv.pid)
        holders = []
        for _ in range(64):
            s = socket.create_connection(("127.0.0.1", srv.port))
            holders.append(s)
        reqb = (b'{"model":"m1","prompt":"idle","stream":true}')
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\n\r\n" % len(reqb)).encode()
        for s in holders:
            s.sendall(head + reqb)
        harness.wait_until(lambda: len(up.log_entries()) >= 64 + 0, timeout=60, interval=0.2,
                           what="64 held requests upstream")
        rss_busy = rss_kb(srv.pid)
        idle = []
        for _ in range(args.idle):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(head + reqb)
            idle.append(s)
        # Wait until the server has taken them all (bounded), then measure.
        time.sleep(2.0)
        rss_idle = rss_kb(srv.pid)
        print("%-34s %9d kB" % ("server RSS, after the load above", base_rss))
        print("%-34s %9d kB" % ("server RSS, 64 running", rss_busy))
        print("%-34s %9d kB  (+%.1f kB per idle stream)" % (
            "server RSS, +%d idle streams" % args.idle, rss_idle,
            (rss_idle - rss_busy) / float(args.idle)))
        for s in holders + idle:
            s.close()
    finally:
        h.cleanup()


if __name__ == "__main__":
    main()
