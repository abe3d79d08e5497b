"""Native tasks token-exact across a server crash (issue 25, finding 8).

The gguf agent on a random-weight Q8_0 model (tests/data, GP_MODEL_DATA):
a greedy task is run once uninterrupted; then the same task again, and
once the client has read n token events the server (and the agent, whose
attempt would otherwise go on by itself) is killed -9. A new server on the
same port and DB resumes the task on another agent process serving a copy
of the file (same digest): the client, resuming with Last-Event-ID, gets
every event id once, and the text and the token ids (the store's hidden
"ids" of each token event) are those of the uninterrupted run. Resuming
from the text instead re-tokenises the junction and takes another path.

The kill point is read from the uninterrupted run: right after a token
whose text is a piece of a UTF-8 character, which a text continuation
cannot give back.

A copy with other bytes (another digest) cannot take the ids: the task
continues from the text, and says so (x_pool_meta.continuation).

Waiting is on events (the n-th token event; agent A waits at the gate
GPUPOOL_TEST_TOKEN_GATE after n tokens), never on sleeps.
"""

import json
import os
import shutil
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json  # noqa: E402
from test_e2e_token_failover import GatedAgent, gguf_built, write_atomic  # noqa: E402

MODEL = os.path.join(os.environ.get("GP_MODEL_DATA") or
                     os.path.join(harness.BUILD_DIR, "tests", "data"), "tiny-random-q8_0.gguf")
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]
OPEN = "999999"
BODY = {"model": "tiny", "prompt": "Once upon a time, in a land far away", "max_tokens": 48,
        "temperature": 0}
# Seeded sampling: the resumed attempt's sampler continues at the position
# the ids give (sampler.n_sampled) with the task's recorded seed.
SAMPLED = dict(BODY, temperature=0.9, top_p=0.9, top_k=40, seed=4242)


def stored_token_ids(h, db, tid):
    """The ids of each of tid's token events, in order (None: an event
    without ids), from job_events (either engine: Harness.query)."""
    rows = h.query(db, "SELECT events FROM job_events WHERE job_id = ?", (tid,))
    evs = {}
    for (row,) in rows:
        for e in json.loads(row):
            evs[e["seq"]] = e
    return [evs[seq].get("ids") for seq in sorted(evs) if evs[seq]["type"] == "token"]


def stored_ids(h, db, tid):
    out = []
    for ids in stored_token_ids(h, db, tid):
        out += ids or [None]
    return out


def stream_of(data):
    return [(int(e["id"]), e["event"], json.loads(e["data"])) for e in harness.parse_sse(data)]


class TaskRestartTokenExact(harness.TestCase):
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN)

    def setUp(self):
        super().setUp()
        if not os.path.exists(MODEL):
            self.skipTest("no %s (tests/synth not built)" % MODEL)
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.db = self.h.path("restart.db")
        self.gate = self.h.path("gate")
        write_atomic(self.gate, OPEN)

    def agent(self, srv, path, gated=False):
        args = ["--slots", "2", "--alias", "tiny", "--model", path, "--threads", "1"]
        name = self.h._name("agent")
        if gated:
            a = GatedAgent(self.h, name, srv, args, self.h.path(name + ".state"), self.gate)
        else:
            a = harness.Agent(self.h, name, srv, args, self.h.path(name + ".state"))
        self.h.procs.append(a)
        srv.wait_model("tiny")
        return a

    def create(self, srv, body):
        st, _, r = http_json("POST", srv.url + "/v2/tasks", body, timeout=10)
        self.assertEqual(st, 202, r)
        return r["job_id"]

    def whole(self, srv, tid):
        st, _, data = harness.http_request("GET", srv.url + "/v2/tasks/%s/events" % tid,
                                           timeout=120)
        self.assertEqual(st, 200)
        return stream_of(data)

    def crash_and_resume(self, other_bytes, body=BODY):
        """Baseline, then the crashed run resumed on a fresh agent (serving
        a copy of the file, or with other_bytes a file of another digest).
        Returns (baseline text, baseline ids, stream, ids, status)."""
        srv = self.h.start_server(FAST, db=self.db)
        a = self.agent(srv, self.h.path("a.gguf"), gated=True)
        base_tid = self.create(srv, body)
        base = self.whole(srv, base_tid)
        self.assertEqual(base[-1][1], "end", base[-1])
        base_text = base[-1][2]["text"]
        base_ids = stored_ids(self.h, self.db, base_tid)
        # Kill after a token whose text is a piece of a UTF-8 character
        # (U+FFFD: a byte token of the random vocabulary): a continuation
        # from the text cannot give that byte back. None: after token 9.
        # The gate counts sampled tokens, and an event may stand for several
        # (a byte held back until the character is whole): the gate is the
        # ids up to that event, as the uninterrupted run recorded them.
        toks = [e[2]["text"] for e in base if e[1] == "token"]
        n = next((k + 1 for k in range(2, len(toks) - 6) if "\ufffd" in toks[k]), 9)
        self.assertGreater(len(toks), n + 5)
        per_event = stored_token_ids(self.h, self.db, base_tid)
        if None in per_event[:n]:
            # A server that stores no ids: one token per event holds for
            # the greedy run only.
            self.assertEqual(body, BODY, "the server stored no token ids")
            per_event = [[None]] * n
        write_atomic(self.gate, str(sum(len(ids) for ids in per_event[:n])))
        tid = self.create(srv, body)
        s = harness.SSEStream("GET", srv.url + "/v2/tasks/%s/events" % tid, timeout=60)
        seen = []
        # A guard, not a timing: keep-alives would hold next_event forever
        # if the n-th token event never came.
        guard = threading.Timer(120, lambda: s.conn.sock and
                                s.conn.sock.shutdown(socket.SHUT_RDWR))
        guard.start()
        try:
            while sum(1 for e in seen if e[1] == "token") < n:
                e = s.next_event(timeout=60)
                self.assertIsNotNone(e, "the stream ended before token event %d: %s"
                                     % (n, seen))
                seen.append((int(e["id"]), e["event"], json.loads(e["data"])))
        finally:
            guard.cancel()
        # What the client read is durable (released only once committed).
        port = srv.port
        srv.kill9()
        a.kill9()
        s.close()
        srv2 = self.h.start_server(FAST, db=self.db, name="server2", port=port)
        path = self.h.path("b.gguf")
        shutil.copyfile(MODEL, path)
        if other_bytes:
            with open(path, "ab") as f:
                f.write(b"other bytes, other digest")
        self.agent(srv2, path)
        st, _, data = harness.http_request(
            "GET", srv2.url + "/v2/tasks/%s/events" % tid,
            headers={"Last-Event-ID": str(seen[-1][0])}, timeout=120)
        self.assertEqual(st, 200)
        stream = seen + stream_of(data)
        st, _, status = http_json("GET", srv2.url + "/v2/tasks/" + tid)
        self.assertEqual(st, 200, status)
        return base_text, base_ids, stream, stored_ids(self.h, self.db, tid), status

    def check_once(self, stream):
        self.assertEqual([e[0] for e in stream], list(range(1, len(stream) + 1)))
        terms = [e for e in stream if e[1] in ("end", "error")]
        self.assertEqual(len(terms), 1, stream)
        self.assertIs(terms[0], stream[-1])
        self.assertEqual(stream[-1][1], "end", stream[-1])
        self.assertEqual([e[2]["reason"] for e in stream if e[1] == "failover"],
                         ["SERVER_RESTART"])
        text = "".join(e[2]["text"] for e in stream if e[1] == "token")
        self.assertEqual(stream[-1][2]["text"], text)
        return text

    def test_kill9_mid_task_resumes_token_exact(self):
        shutil.copyfile(MODEL, self.h.path("a.gguf"))
        base_text, base_ids, stream, ids, status = self.crash_and_resume(False)
        text = self.check_once(stream)
        self.assertEqual(text, base_text)
        self.assertEqual(status["x_pool_meta"].get("continuation"), "tokens", status)
        self.assertNotIn(None, base_ids)
        self.assertEqual(ids, base_ids)
        self.assertEqual(status["usage"]["completion_tokens"], len(base_ids))

    def test_kill9_mid_sampled_task_resumes_token_exact(self):
        shutil.copyfile(MODEL, self.h.path("a.gguf"))
        base_text, base_ids, stream, ids, status = self.crash_and_resume(False, SAMPLED)
        self.assertEqual(self.check_once(stream), base_text)
        self.assertEqual(status["x_pool_meta"].get("continuation"), "tokens", status)
        self.assertNotIn(None, base_ids)
        self.assertEqual(ids, base_ids)

    def test_another_file_continues_from_the_text(self):
        shutil.copyfile(MODEL, self.h.path("a.gguf"))
        base_text, _, stream, _, status = self.crash_and_resume(True)
        text = self.check_once(stream)
        self.assertEqual(status["x_pool_meta"].get("continuation"), "text", status)
        self.assertEqual(text[:len(text) // 4], base_text[:len(text) // 4])


if __name__ == "__main__":
    harness.main()
