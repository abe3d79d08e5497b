"""SSE backpressure (issue 9, finding 5): a client that does not read must not
make the server buffer its whole stream.

A real server (client_buffer_bytes small) and a fake agent that uploads long
streams fast. Clients open streams on sockets with a small SO_RCVBUF and do
not read. The server's RSS growth is compared with a measured baseline: the
same streams to clients that read everything, on a fresh server. Then each
non-reading client reads: it must get every byte, in order, and the end.
A client that stays behind for slow_client_timeout_sec is dropped and its job
cancelled (the agent is told); a native task keeps running, and its event
replays are paced the same way.

No timing assumption: every wait polls a condition (agent upload replies,
job states, /proc) with a bounded deadline; RSS bounds derive from the
config value and the measured baseline, not from durations.
"""

import fcntl
import json
import os
import socket
import struct
import sys
import termios
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402

MIB = 1024 * 1024
HWM = 256 * 1024            # client_buffer_bytes of the servers under test
TOKEN = 400                 # bytes per token event: within the server's event budget
                            # (max_tokens x 512 bytes, docs/operations.md)
BIG_TOKEN = 32 * 1024       # the too-slow client's tokens (max_tokens 100000 allows them)
STREAM = 32 * MIB           # bytes of text per stream (the figure)
N = 4                       # concurrent streams
PER_UPLOAD = 2048           # token events per upload (800 KiB bodies)


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


def token_text(job_no, i, size=TOKEN):
    """Token i of stream job_no: size bytes, its number in clear so a
    reordering or a loss shows."""
    head = "<%d:%d>" % (job_no, i)
    return head + "x" * (size - len(head))


class RawStream:
    """A streaming request on a socket with a small receive buffer that
    reads nothing until told."""

    def __init__(self, url, path, body, rcvbuf=4096):
        host, port = url.replace("http://", "").split(":")
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.connect((host, int(port)))
        if body is None:
            self.s.sendall(b"GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n" % path.encode())
            return
        data = json.dumps(body).encode()
        self.s.sendall(b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))

    def pending(self):
        """Bytes the server wrote that wait in this socket's receive queue."""
        return struct.unpack("i", fcntl.ioctl(self.s.fileno(), termios.FIONREAD,
                                              b"\0\0\0\0"))[0]

    def read_all(self, deadline_sec=300):
        """Read until the chunked body ends (0-length chunk). Returns the
        decoded body. Bounded by deadline_sec."""
        self.s.settimeout(30)
        buf = bytearray()
        end = time.monotonic() + deadline_sec
        while time.monotonic() < end:
            d = self.s.recv(1 << 20)
            if not d:
                break
            buf += d
            if buf.endswith(b"\r\n0\r\n\r\n"):
                break
        raw = bytes(buf)
        pos = raw.index(b"\r\n\r\n") + 4
        assert b" 200 " in raw[:raw.index(b"\r\n")], raw[:200]
        body = bytearray()
        while pos < len(raw):
            eol = raw.index(b"\r\n", pos)
            n = int(raw[pos:eol].split(b";")[0], 16)
            if n == 0:
                break
            body += raw[eol + 2:eol + 2 + n]
            pos = eol + 2 + n + 2
        return bytes(body).decode()

    def close(self):
        self.s.close()


def sse_events(body):
    """[{event, id, data}] of a whole SSE body (LF framing, one data line
    per event, as the server writes JSON). harness.parse_sse is made for
    small bodies; this one is linear for 64 MiB."""
    out = []
    for block in body.split("\n\n"):
        if not block:
            continue
        ev = {"event": None, "id": None, "data": None}
        for line in block.split("\n"):
            k, _, v = line.partition(": ")
            if k in ev:
                ev[k] = v
        out.append(ev)
    return out


def anthropic_deltas(body):
    """Concatenated text_delta text of an Anthropic stream, and whether it
    ended with message_stop."""
    text, done = [], False
    for ev in sse_events(body):
        if ev["event"] == "message_stop":
            done = True
        elif ev["event"] == "content_block_delta":
            d = json.loads(ev["data"])["delta"]
            if d.get("type") == "text_delta":
                text.append(d["text"])
    return "".join(text), done


def deltas(body):
    """Concatenated delta text of an OpenAI chat stream, and whether it
    ended with [DONE]."""
    text, done = [], False
    for block in body.split("\n\n"):
        if not block.startswith("data: "):
            continue
        data = block[6:]
        if data == "[DONE]":
            done = True
            continue
        j = json.loads(data)
        for ch in j.get("choices", []):
            c = ch.get("delta", {}).get("content")
            if c:
                text.append(c)
    return "".join(text), done


def responses_deltas(body):
    """Concatenated output_text deltas of a Responses stream, and whether it
    ended with response.completed or response.incomplete."""
    text, done = [], False
    for ev in sse_events(body):
        if ev["event"] in ("response.completed", "response.incomplete"):
            done = True
        elif ev["event"] == "response.output_text.delta":
            text.append(json.loads(ev["data"])["delta"])
    return "".join(text), done


def responses_body(k, count):
    return {"model": "m1", "stream": True, "max_output_tokens": count,
            "input": [{"role": "user", "content": "stream %d" % k}]}


class Backpressure(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def server(self, name, slow_sec=600):
        srv = self.h.start_server(["--client_buffer_bytes", str(HWM),
                                   "--slow_client_timeout_sec", str(slow_sec)], name=name)
        a = FakeAgent(srv.url, slots=N)
        # A context long enough for the streams (Anthropic clamps
        # max_tokens to what the model's context leaves).
        plain = a.poll_body

        def poll_body(**kw):
            b = plain(**kw)
            for m in b["models"]:
                m["context_length"] = 4 * 1024 * 1024
            return b
        a.poll_body = poll_body
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        srv.wait_model("m1")
        return srv, a

    def take_jobs(self, a, n):
        got = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            st, jobs = a.work(n - len(got), timeout=30)
            self.assertIn(st, (200, 204))
            got += jobs
        self.assertEqual(len(got), n)
        # Stream number k is the one whose prompt says k.
        return sorted(got, key=lambda j: j["messages"][0]["content"])

    def upload(self, a, job, job_no, count):
        st, body = a.events(job["job_id"], [{"type": "started"}])
        self.assertEqual(st, 200, body)
        for i in range(0, count, PER_UPLOAD):
            evs = [{"type": "token", "text": token_text(job_no, k)}
                   for k in range(i, min(count, i + PER_UPLOAD))]
            st, body = a.events(job["job_id"], evs)
            self.assertEqual(st, 200, body)
            if body.get("cancel"):
                return False
        st, body = a.events(job["job_id"], [{"type": "end", "finish_reason": "length",
                                             "usage": {"prompt_tokens": 1,
                                                       "completion_tokens": count}}])
        self.assertEqual(st, 200, body)
        return True

    def run_streams(self, name, read, path="/v1/chat/completions", n=N, make_body=None):
        """n streams of STREAM bytes; returns (server, RSS growth once every
        upload was acknowledged, clients)."""
        srv, a = self.server(name)
        count = STREAM // TOKEN
        body = lambda k: {"model": "m1", "stream": True, "max_tokens": count,  # noqa: E731
                          "messages": [{"role": "user", "content": "stream %d" % k}]}
        if make_body:
            body = lambda k: make_body(k, count)  # noqa: E731
        base = rss(srv.pid)
        clients = [RawStream(srv.url, path, body(k)) for k in range(n)]
        jobs = self.take_jobs(a, n)
        readers = []
        if read:
            out = {}
            for k, c in enumerate(clients):
                t = threading.Thread(target=lambda k=k, c=c: out.__setitem__(k, c.read_all()),
                                     daemon=True)
                t.start()
                readers.append(t)
        for k, job in enumerate(jobs):
            self.assertTrue(self.upload(a, job, k, count))
        grown = rss(srv.pid) - base
        for t in readers:
            t.join(300)
        return srv, grown, clients, count

    def check_stream(self, body, k, count, parse=None):
        text, done = (parse or deltas)(body)
        self.assertTrue(done, "stream %d did not end with [DONE]" % k)
        want = "".join(token_text(k, i) for i in range(count))
        self.assertEqual(len(text), len(want), "stream %d: length" % k)
        self.assertTrue(text == want, "stream %d: bytes differ or out of order" % k)

    def test_non_reading_clients_do_not_grow_the_server(self):
        # Baseline: the same streams to clients that read as they come.
        srv, base_growth, clients, count = self.run_streams("baseline", read=True)
        for c in clients:
            c.close()
        srv.stop()
        srv, growth, clients, count = self.run_streams("stalled", read=False)
        print("RSS growth: baseline (reading clients) %.1f MiB, %d non-reading clients "
              "%.1f MiB (client_buffer_bytes %d KiB, %d x %d MiB streams)"
              % (base_growth / MIB, N, growth / MIB, HWM // 1024, N, STREAM // MIB))
        # Each stalled stream may hold its high-water mark plus one chunk
        # in the server, and the socket buffers; the rest of each 32 MiB
        # waits in the job's text (N x STREAM: the job is finished, its
        # client is still subscribed), which the reading baseline no longer
        # holds (a finished job without subscribers drops its text at the
        # next sweep). The baseline's own growth is the allocator's (large
        # under ASan, whose quarantine keeps freed memory). Without
        # backpressure the connections' output buffers hold another
        # N x 32 MiB on top.
        allowed = base_growth + N * STREAM + N * (2 * HWM + 4 * MIB) + 32 * MIB
        self.assertLess(growth, allowed, "server buffered the streams of non-reading clients")
        # Every byte arrives, in order, once the clients read.
        for k, c in enumerate(clients):
            self.check_stream(c.read_all(), k, count)
            c.close()

    def test_anthropic_non_reading_clients(self):
        n = 2
        path = "/v1/messages"
        srv, base_growth, clients, count = self.run_streams("a-baseline", True, path, n)
        for c in clients:
            c.close()
        srv.stop()
        srv, growth, clients, count = self.run_streams("a-stalled", False, path, n)
        print("Anthropic RSS growth: baseline %.1f MiB, %d non-reading clients %.1f MiB"
              % (base_growth / MIB, n, growth / MIB))
        # As above: the jobs' texts hold what is behind, nothing else may.
        self.assertLess(growth, base_growth + n * STREAM + n * (2 * HWM + 4 * MIB) + 32 * MIB,
                        "server buffered the streams of non-reading clients")
        for k, c in enumerate(clients):
            self.check_stream(c.read_all(), k, count, anthropic_deltas)
            c.close()

    def test_responses_non_reading_clients(self):
        n = 2
        path = "/v1/responses"
        srv, base_growth, clients, count = self.run_streams("r-baseline", True, path, n,
                                                            responses_body)
        for c in clients:
            c.close()
        srv.stop()
        srv, growth, clients, count = self.run_streams("r-stalled", False, path, n,
                                                       responses_body)
        print("Responses RSS growth: baseline %.1f MiB, %d non-reading clients %.1f MiB"
              % (base_growth / MIB, n, growth / MIB))
        # As above: the jobs' texts hold what is behind, nothing else may.
        self.assertLess(growth, base_growth + n * STREAM + n * (2 * HWM + 4 * MIB) + 32 * MIB,
                        "server buffered the streams of non-reading clients")
        for k, c in enumerate(clients):
            self.check_stream(c.read_all(), k, count, responses_deltas)
            c.close()

    def test_too_slow_client_is_dropped_and_its_job_cancelled(self):
        self.too_slow("/v1/chat/completions",
                      {"model": "m1", "stream": True, "max_tokens": 100000,
                       "messages": [{"role": "user", "content": "stream 0"}]})

    def test_too_slow_responses_client_is_dropped(self):
        self.too_slow("/v1/responses", responses_body(0, 100000),
                      label='api="responses",outcome="client_too_slow"')

    def test_too_slow_anthropic_client_is_dropped(self):
        self.too_slow("/v1/messages",
                      {"model": "m1", "stream": True, "max_tokens": 100000,
                       "messages": [{"role": "user", "content": "stream 0"}]},
                      label='api="anthropic",outcome="client_too_slow"')

    def too_slow(self, path, req, label='outcome="client_too_slow"'):
        srv, a = self.server("slow", slow_sec=2)
        c = RawStream(srv.url, path, req)
        job = self.take_jobs(a, 1)[0]
        st, _ = a.events(job["job_id"], [{"type": "started"}])
        self.assertEqual(st, 200)
        # Keep producing until the server says cancel: it must, as the
        # client never reads (bounded: 4096 uploads = 2 GiB would be a bug).
        cancelled = False
        for i in range(4096):
            st, body = a.events(job["job_id"], [{"type": "token", "text": token_text(0, i, BIG_TOKEN)}])
            self.assertEqual(st, 200, body)
            if body.get("cancel"):
                cancelled = True
                break
            if i >= 64:
                time.sleep(0.05)  # pacing the producer only; not a synchronisation
        self.assertTrue(cancelled, "the job of a too slow client was never cancelled")
        logged = srv.log_events("client_too_slow")
        self.assertTrue(logged)
        # "behind" is one unit for every dialect: bytes of text not yet
        # written (Anthropic once counted its waiting events). The client
        # never read, so at least one token's text was behind.
        self.assertGreaterEqual(logged[0].get("behind", 0), BIG_TOKEN, logged[0])
        # One log, naming the job, whatever the dialect (Responses included).
        self.assertEqual(len(logged), 1, logged)
        self.assertEqual(logged[0].get("job_id"), job["job_id"], logged[0])
        st, _, text = harness.http_request("GET", srv.url + "/metrics")
        self.assertIn(label.encode(), text)
        c.close()


    def test_task_replays_are_paced(self):
        # A finished 32 MiB task (its end event carries the whole text
        # too), replayed to R clients that do not read: before the fix each
        # replay framed the whole log at once (+~64 MiB each).
        R = 10
        srv, a = self.server("replay")
        count = STREAM // TOKEN
        st, _, task = harness.http_json("POST", srv.url + "/v2/tasks",
                                        {"model": "m1", "prompt": "stream 0",
                                         "max_tokens": count})
        self.assertEqual(st, 202, task)
        tid = task["job_id"]
        st, jobs = a.work(1, timeout=30)
        self.assertEqual((st, len(jobs)), (200, 1))
        self.assertTrue(self.upload(a, jobs[0], 0, count))
        harness.wait_until(lambda: harness.http_json("GET", srv.url + "/v2/tasks/" + tid)[2]
                           .get("status") == "done", timeout=60, what="task done")
        base = rss(srv.pid)
        clients = [RawStream(srv.url, "/v2/tasks/%s/events" % tid, None) for _ in range(R)]
        # Each replay has been answered once its client has bytes waiting.
        harness.wait_until(lambda: all(c.pending() > 0 for c in clients), timeout=60,
                           what="every replay started")
        growth = rss(srv.pid) - base
        print("RSS growth with %d non-reading replays of a %d MiB task: %.1f MiB"
              % (R, STREAM // MIB, growth / MIB))
        self.assertLess(growth, R * (2 * HWM + 2 * MIB) + 32 * MIB,
                        "server framed whole replays for clients that do not read")
        # A replay read to its end: every event in order, the end whole.
        body = clients[0].read_all()
        evs = sse_events(body)
        self.assertEqual([e["id"] for e in evs], [str(i + 1) for i in range(len(evs))])
        self.assertEqual([e["event"] for e in evs][-1], "end")
        toks = [json.loads(e["data"])["text"] for e in evs if e["event"] == "token"]
        want = "".join(token_text(0, i) for i in range(count))
        self.assertTrue("".join(toks) == want, "token events differ or out of order")
        end = json.loads(evs[-1]["data"])
        self.assertTrue(end["text"] == want, "end text differs")
        self.assertEqual(end["finish_reason"], "length")
        for c in clients:
            c.close()


if __name__ == "__main__":
    harness.main()
