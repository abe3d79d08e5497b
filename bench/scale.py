#!/usr/bin/env python3
"""One server at scale (issue 12): runs bench/scalesim beside a
gpupool-server and adds what the server spent (CPU from /proc/PID/stat,
RSS from /proc/PID/status, sampled every 0.2 s). Printed, never asserted.

Cases (each bounded in time; --cases picks some):
  streams-10k   10,000 concurrent streaming clients (ramped over 1 s) on
                100 simulated agents x 100 slots; each reply 16 tokens at
                5 tokens/s (3.2 s, so all 10,000 are open at once).
                Figures: errors, TTFT, server RSS per open stream (peak
                minus idle, / streams), server CPU per token event.
  agents-1k     1,000 simulated agents (1 slot each), idle 20 s at the
  agents-10k    default 15 s heartbeat; then (a new server) 2,000 requests
                (16 tokens at 20 tokens/s) from 200 clients, and 3 s into
                them 10 % of the agents vanish (their connections close, no
                more polls). Figures: server CPU and RSS idle, heartbeats
                per second, scheduling latency p50/p99 (client send -> job
                at the agent, one clock), failures and failovers.

usage: bench/scale.py --bin-dir BUILD [--cases a,b] [--out results.jsonl]
BUILD is a Release build directory (src/server/gpupool-server and
bench/scalesim inside). The server gets --max_queue 20000 (10,000 jobs can
be waiting for the agents' next long-polls at once) and, for the vanishing,
--agent_timeout_sec 10; everything else is default.
"""

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

CLK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / CLK   # utime + stime


def proc_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop_ev = pid, 0, threading.Event()

    def run(self):
        while not self.stop_ev.wait(0.2):
            try:
                self.peak = max(self.peak, proc_rss_kb(self.pid))
            except OSError:
                return

    def stop(self):
        self.stop_ev.set()
        self.join()


def metric_sum(port, name):
    """Sum of every series of one metric family on the server's /metrics."""
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def start_server(bin_dir, tmp, extra):
    port_file = os.path.join(tmp, "port")
    log = open(os.path.join(tmp, "server.log"), "w")
    argv = [os.path.join(bin_dir, "src/server/gpupool-server"), "--listen", "127.0.0.1:0",
            "--port-file", port_file, "--db", os.path.join(tmp, "scale.db"),
            "--log_level", "warn", "--max_queue", "20000"] + extra
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with open(port_file) as f:
                return p, int(f.read().strip())
        except (OSError, ValueError):
            time.sleep(0.05)
    p.kill()
    raise SystemExit("scale.py: the server did not start (see %s)" % log.name)


def scalesim(bin_dir, port, args, timeout):
    argv = [os.path.join(bin_dir, "bench/scalesim"), "--port", str(port)] + args
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(r.stderr)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        raise SystemExit("scale.py: scalesim failed (%d)" % r.returncode)
    return json.loads(lines[-1])


def case_streams(bin_dir, n=10000):
    with tempfile.TemporaryDirectory(prefix="gpupool-scale-") as tmp:
        srv, port = start_server(bin_dir, tmp, [])
        try:
            time.sleep(0.5)
            rss_idle = proc_rss_kb(srv.pid)
            cpu0 = proc_cpu_s(srv.pid)
            smp = Sampler(srv.pid)
            smp.start()
            res = scalesim(bin_dir, port, ["--agents", "100", "--slots", str(max(1, n // 100)),
                                           "--clients", str(n), "--tokens", "16", "--tps", "5",
                                           "--ramp-ms", "1000", "--max-sec", "240"], 300)
            smp.stop()
            cpu = proc_cpu_s(srv.pid) - cpu0
        finally:
            srv.send_signal(signal.SIGTERM)
            srv.wait(timeout=60)
    ev = res["token_events_uploaded"] or 1
    out = dict(case="streams-%d" % n, streams=n, ok=res["ok"], failed=res["failed"],
               by_status=res["by_status"], ttft_p50_ms=res["ttft_p50_ms"],
               ttft_p99_ms=res["ttft_p99_ms"], total_p99_ms=res["total_p99_ms"],
               server_rss_idle_kb=rss_idle, server_rss_peak_kb=smp.peak,
               rss_per_stream_kib=(smp.peak - rss_idle) / n,
               server_cpu_s=cpu, token_events=res["token_events_uploaded"],
               server_cpu_us_per_token_event=cpu * 1e6 / ev)
    print("%-12s %d streams: ok %d failed %d; TTFT p50 %.0f ms p99 %.0f ms; server RSS idle %d "
          "KiB peak %d KiB = %.1f KiB per stream; server CPU %.1f s = %.1f us per token event "
          "(%d events)" % (out["case"], n, out["ok"], out["failed"], out["ttft_p50_ms"],
                           out["ttft_p99_ms"], rss_idle, smp.peak, out["rss_per_stream_kib"],
                           cpu, out["server_cpu_us_per_token_event"], ev))
    return out


def case_agents(bin_dir, m):
    with tempfile.TemporaryDirectory(prefix="gpupool-scale-") as tmp:
        srv, port = start_server(bin_dir, tmp, ["--agent_timeout_sec", "10"])
        try:
            time.sleep(0.5)
            rss0 = proc_rss_kb(srv.pid)
            # Phase 1: register and idle (20 s at the default 15 s heartbeat).
            cpu0, t0 = proc_cpu_s(srv.pid), time.monotonic()
            idle = scalesim(bin_dir, port, ["--agents", str(m), "--slots", "1", "--clients",
                                            "0", "--idle-sec", "20", "--max-sec", "120"], 180)
            # scalesim exits after the idle phase when there are no clients:
            # its agents vanish with it (a clean start for phase 2 below).
            idle_wall = time.monotonic() - t0
            cpu_idle = proc_cpu_s(srv.pid) - cpu0
            rss_idle = proc_rss_kb(srv.pid)
        finally:
            srv.send_signal(signal.SIGTERM)
            srv.wait(timeout=60)
    with tempfile.TemporaryDirectory(prefix="gpupool-scale-") as tmp:
        srv, port = start_server(bin_dir, tmp, ["--agent_timeout_sec", "10"])
        try:
            time.sleep(0.5)
            smp = Sampler(srv.pid)
            smp.start()
            cpu0 = proc_cpu_s(srv.pid)
            load = scalesim(bin_dir, port, ["--agents", str(m), "--slots", "1", "--clients",
                                            "200", "--requests", "10", "--tokens", "16", "--tps",
                                            "20", "--ramp-ms", "500", "--idle-sec", "2",
                                            "--vanish-pct", "10", "--vanish-at-ms", "3000",
                                            "--max-sec", "150"], 200)
            smp.stop()
            cpu_load = proc_cpu_s(srv.pid) - cpu0
            failovers = metric_sum(port, "gpupool_failovers_total")
        finally:
            srv.send_signal(signal.SIGTERM)
            srv.wait(timeout=60)
    out = dict(case="agents-%d" % m, agents=m, idle_polls=idle["polls"],
               idle_wall_s=idle_wall, server_cpu_idle_pct=100 * cpu_idle / idle_wall,
               server_rss_start_kb=rss0, server_rss_idle_kb=rss_idle,
               heartbeats_per_s=m / 15.0, load_ok=load["ok"], load_failed=load["failed"],
               load_by_status=load["by_status"], sched_p50_ms=load["sched_p50_ms"],
               sched_p99_ms=load["sched_p99_ms"], ttft_p50_ms=load["ttft_p50_ms"],
               ttft_p99_ms=load["ttft_p99_ms"], server_rss_peak_kb=smp.peak,
               server_cpu_load_s=cpu_load, vanished=load["agents_vanished"],
               failovers=failovers)
    print("%-12s idle: server CPU %.1f %% over %.0f s (%d polls = %.0f heartbeats/s), RSS %d -> "
          "%d KiB; load (2,000 requests of 16 tokens at 20/s from 200 clients, %d agents vanish "
          "at 3 s): ok %d failed %d %s, %d failovers; scheduling p50 %.2f ms p99 %.2f ms; TTFT "
          "p50 %.1f p99 %.1f ms; peak RSS %d KiB"
          % (out["case"], out["server_cpu_idle_pct"], idle_wall, idle["polls"],
             out["heartbeats_per_s"], rss0, rss_idle, out["vanished"], out["load_ok"],
             out["load_failed"], json.dumps(out["load_by_status"]), failovers,
             out["sched_p50_ms"],
             out["sched_p99_ms"], out["ttft_p50_ms"], out["ttft_p99_ms"], smp.peak))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--cases", default="streams-10k,agents-1k,agents-10k")
    ap.add_argument("--out")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print("open files limit %d (the server and scalesim raise theirs to it)" % hard)
    results = []
    for c in a.cases.split(","):
        if c.startswith("streams-"):
            n = int(c.split("-")[1].replace("k", "000"))
            results.append(case_streams(a.bin_dir, n))
        elif c.startswith("agents-"):
            m = int(c.split("-")[1].replace("k", "000"))
            results.append(case_agents(a.bin_dir, m))
        else:
            raise SystemExit("unknown case " + c)
    if a.out:
        with open(a.out, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
