"""Server memory under incomplete request bodies (issue 9, finding 3).

Starts gpupool-server (auth on: one client key), opens N connections, each
sends a head declaring BODY bytes and then as much of the body as the server
takes, less one byte, and holds. Prints the server's RSS before, while
holding, and after the connections close. Not a test: it prints figures.

    python3 bench/http_body_rss.py --server build/plain/src/server/gpupool-server \
        --conns 100 --body 8400000 [--auth]   # --auth: send the key (body within limits)
"""
import argparse
import os
import select
import socket
import subprocess
import sys
import tempfile
import time


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--conns", type=int, default=100)
    ap.add_argument("--body", type=int, default=8400000)
    ap.add_argument("--auth", action="store_true", help="send a valid client key")
    ap.add_argument("--max-body", type=int, default=0, help="server max_body_bytes (0: default)")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long to push bodies")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gpupool-rss-")
    db = os.path.join(tmp, "db")
    key = subprocess.run([a.server, "keys", "create", "--role", "client", "--db", db],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    pf = os.path.join(tmp, "port")
    argv = [a.server, "--listen", "127.0.0.1:0", "--port-file", pf, "--db", db]
    if a.max_body:
        argv += ["--max_body_bytes", str(a.max_body)]
    log = open(os.path.join(tmp, "log"), "wb")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not (os.path.exists(pf) and open(pf).read().strip()):
            if time.monotonic() > deadline or p.poll() is not None:
                sys.exit("server did not start")
            time.sleep(0.05)
        port = int(open(pf).read())
        time.sleep(0.5)
        r0 = rss_kb(p.pid)
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\n"
                "Content-Length: %d\r\n\r\n" % ("Authorization: Bearer %s\r\n" % key if a.auth else "",
                                                a.body)).encode()
        socks, left = [], {}
        for _ in range(a.conns):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head)
            s.setblocking(False)
            socks.append(s)
            left[s] = a.body - 1
        chunk = b"x" * 262144
        end = time.monotonic() + a.seconds
        while time.monotonic() < end and any(left.values()):
            _, w, _ = select.select([], [s for s in socks if left[s] > 0], [], 0.5)
            for s in w:
                try:
                    left[s] -= s.send(chunk[:min(len(chunk), left[s])])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    left[s] = 0
        time.sleep(1.0)
        r1 = rss_kb(p.pid)
        sent = sum(a.body - 1 - left[s] for s in socks)
        for s in socks:
            s.close()
        time.sleep(2.0)
        r2 = rss_kb(p.pid)
        print("conns=%d body=%d auth=%s: offered %.1f MB; server RSS %.1f MB -> %.1f MB while "
              "holding (+%.1f MB) -> %.1f MB after close"
              % (a.conns, a.body, a.auth, sent / 1e6, r0 / 1024, r1 / 1024, (r1 - r0) / 1024,
                 r2 / 1024))
    finally:
        p.terminate()
        p.wait(10)


if __name__ == "__main__":
    main()
