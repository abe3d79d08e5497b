#!/usr/bin/env python3
"""What relaying costs the server, per dialect: server CPU per token event,
and server RSS per client that does not read. Printed, never asserted.

  python3 bench/relay_cpu.py [--build DIR] [--streams 400] [--tokens 64]
                             [--stalled 4] [--stalled-mib 2]
                             [--clients 16] [--pace-ms 0] [--slots 64]

One gpupool-server and one openai-backend agent (64 slots) on the scripted
upstream (tests/integration/upstream.py, zero delay). For each dialect
(/v1/completions, /v1/chat/completions, /v1/messages, /v1/responses) it runs
--streams streamed requests of --tokens tokens from 16 threads and divides
the server's CPU time over that phase (utime + stime of /proc/PID/stat) by
the token events relayed. Then --stalled clients start streams of
--stalled-mib MiB each and never read: the server's RSS growth per such
client shows what backpressure leaves in memory (the job's text, where what
is behind waits, plus client_buffer_bytes).

--pace-ms N paces the upstream (a token every N ms, as relaybench's paced
streams): with --clients streams open at once, each agent upload then
carries a token or two of many jobs instead of many tokens of a few, which
is what the server sees at 1,000 paced streams.

Everything runs on 127.0.0.1; the upstream and this script share the
machine, so compare figures of one run.
"""

import argparse
import os
import socket
import sys
import threading
import time
import json

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402

DIALECTS = [
    ("completions", "/v1/completions",
     lambda n: {"model": "m1", "prompt": "Once upon a time", "max_tokens": n, "stream": True}),
    ("chat", "/v1/chat/completions",
     lambda n: {"model": "m1", "max_tokens": n, "stream": True,
                "messages": [{"role": "user", "content": "Once upon a time"}]}),
    ("messages", "/v1/messages",
     lambda n: {"model": "m1", "max_tokens": n, "stream": True,
                "messages": [{"role": "user", "content": "Once upon a time"}]}),
    ("responses", "/v1/responses",
     lambda n: {"model": "m1", "max_output_tokens": n, "stream": True,
                "input": "Once upon a time"}),
]


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def stream_once(url, path, body):
    st, _, raw = harness.http_request("POST", url + path, body, timeout=120)
    if st != 200:
        raise RuntimeError("HTTP %d" % st)
    return raw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("GPUPOOL_BUILD_DIR",
                                                      os.path.join(HERE, "..", "build")))
    ap.add_argument("--streams", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--stalled", type=int, default=4)
    ap.add_argument("--stalled-mib", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--pace-ms", type=float, default=0)
    ap.add_argument("--slots", type=int, default=64)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    harness.SERVER_BIN = os.path.join(build, "src", "server", "gpupool-server")
    harness.AGENT_BIN = os.path.join(build, "src", "agent", "gpupool-agent")
    for b in (harness.SERVER_BIN, harness.AGENT_BIN):
        if not os.access(b, os.X_OK):
            sys.exit("not built: " + b)
    h = harness.Harness(prefix="gpupool-relaycpu-")
    try:
        up = h.start_upstream(["--tokens", str(args.tokens), "--pace-ms", str(args.pace_ms)])
        srv = h.start_server(["--log_level", "warn",
                              "--max_queue", str(max(1000, 2 * args.clients)),
                              "--client_buffer_bytes", str(256 * 1024)])
        h.start_agent(srv, upstream=up, model="m1", slots=args.slots, args=["--log-level", "warn"])
        srv.wait_model("m1")
        print("relay_cpu: %d streams of %d tokens per dialect, %d client threads, pace %g ms"
              % (args.streams, args.tokens, args.clients, args.pace_ms))
        print("%-12s %9s %12s %14s %10s" % ("dialect", "requests", "token events",
                                            "server CPU s", "us/event"))
        for name, path, body in DIALECTS:
            done, errs = [0], []
            lock = threading.Lock()

            def worker(k):
                while True:
                    with lock:
                        if done[0] >= args.streams:
                            return
                        done[0] += 1
                    try:
                        stream_once(srv.url, path, body(args.tokens))
                    except Exception as e:  # noqa: BLE001 - counted and printed
                        with lock:
                            errs.append(repr(e))
            c0 = cpu_s(srv.pid)
            ts = [threading.Thread(target=worker, args=(k,), daemon=True)
                  for k in range(args.clients)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(600)
            cpu = cpu_s(srv.pid) - c0
            events = args.streams * args.tokens
            print("%-12s %9d %12d %14.2f %10.1f%s" % (name, args.streams, events, cpu,
                                                      cpu * 1e6 / events,
                                                      "  errors: %d" % len(errs) if errs else ""))
        # Clients that never read: what stays in the server per client.
        base = rss_kb(srv.pid)
        n_tok = args.stalled_mib * 1024 * 1024 // 8  # the upstream's tokens are ~8 bytes
        up.control(tokens=n_tok)
        socks = []
        for k in range(args.stalled):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            b = json.dumps({"model": "m1", "max_tokens": n_tok, "stream": True,
                            "messages": [{"role": "user", "content": "x" * 1000}]}).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
            socks.append(s)
        deadline = time.monotonic() + 120
        last = -1
        while time.monotonic() < deadline:
            time.sleep(1.0)
            r = rss_kb(srv.pid)
            if r == last:
                break
            last = r
        grown = (rss_kb(srv.pid) - base) / 1024.0
        print("stalled clients: %d x %d MiB streams, server RSS +%.1f MiB (%.1f MiB per client;"
              " the job's text holds what is behind)" % (args.stalled, args.stalled_mib, grown,
                                                         grown / max(1, args.stalled)))
        for s in socks:
            s.close()
    finally:
        h.cleanup()


if __name__ == "__main__":
    main()
