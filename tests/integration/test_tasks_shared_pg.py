"""Native tasks shared by three servers on one PostgreSQL (issue 28, items 2
and 4; docs/scaling.md "Native tasks across servers").

A real PostgreSQL from Debian's binaries (pg.py, in the test's temporary
directory; the test is skipped with the reason where they are absent), three
gpupool-servers A, B and C on it with a short task lease (--task_lease_sec 2),
and gguf agents on the random-weight Q8_0 model (tests/data) that take the
list of servers (--server A,B,C).

- test_kill9_owner_another_server_resumes: a greedy task on A; once the
  client has read n token events, A (and its agent, held at the gate after
  n tokens) is killed -9. B, the one survivor with an agent serving the
  model, claims the task once its lease expired and resumes it token-exact
  from the stored log; the client reconnects to C (which runs nothing) with
  Last-Event-ID and gets the rest exactly once: every id once, one terminal
  event, the text and the stored token ids those of an uninterrupted run on
  the same file. B logs task_claimed once, C never.
- test_follow_live_from_another_server: a task created on A, followed from B
  while A's agent is held at the gate after k tokens (B streams what A
  committed while A still runs it), then to its end: B's stream is A's.
  The task is leased under the id A announces in the servers table.
- test_delete_from_another_server: DELETE on B of a task A runs: A cancels
  it (asked through the database), B answers with A's status.
- test_delete_when_the_owner_is_gone: A killed -9 with a task; DELETE on C;
  B claims the lease, finds the cancel asked and cancels the task.

Waiting is on events (the gate, the n-th event, /v1/models, the stream's
end), never on sleeps. Processes are stopped by their PID (harness.py,
pg.py).
"""

import json
import os
import shutil
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pg_fixture  # noqa: E402
from harness import http_json  # noqa: E402
from test_e2e_token_failover import gguf_built, write_atomic  # noqa: E402

MODEL = os.path.join(os.environ.get("GP_MODEL_DATA") or
                     os.path.join(harness.BUILD_DIR, "tests", "data"), "tiny-random-q8_0.gguf")
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5",
        "--task_lease_sec", "2"]
OPEN = "999999"
BODY = {"model": "tiny", "prompt": "Once upon a time, in a land far away", "max_tokens": 48,
        "temperature": 0}


def stream_of(data):
    return [(int(e["id"]), e["event"], json.loads(e["data"])) for e in harness.parse_sse(data)]


class ListAgent(harness.Agent):
    """A gguf agent with a list of servers, optionally held at the token
    count in gate_file (GPUPOOL_TEST_TOKEN_GATE)."""

    def __init__(self, h, name, servers, path, gate=None):
        self.state_dir = h.path(name + ".state")
        argv = [harness.AGENT_BIN, "--server", ",".join(s.url for s in servers),
                "--state-dir", self.state_dir, "--name", name, "--slots", "2",
                "--alias", "tiny", "--model", path, "--threads", "1"]
        env = h.env()
        if gate:
            env["GPUPOOL_TEST_TOKEN_GATE"] = gate
        harness.Proc.__init__(self, name, argv, os.path.join(h.tmp, name + ".log"), env=env)


class SharedTasksTest(pg_fixture.PgServersCase):
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN)
    SERVER_ARGS = FAST

    def setUp(self):
        if not os.path.exists(MODEL):
            self.skipTest("no %s (tests/synth not built)" % MODEL)
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        super().setUp()
        self.gate = self.h.path("gate")
        write_atomic(self.gate, OPEN)
        self.a, self.b, self.c = self.start_servers(3, self.SERVER_ARGS,
                                                    names=["server" + n for n in "ABC"])
        for s in (self.a, self.b, self.c):
            self.assertTrue(s.log_events("tasks_shared"), "%s did not share its tasks" % s.name)
        shutil.copyfile(MODEL, self.h.path("a.gguf"))
        shutil.copyfile(MODEL, self.h.path("b.gguf"))  # same bytes, same digest

    def agent(self, name, servers, path, gated=False):
        a = ListAgent(self.h, self.h._name(name), servers, self.h.path(path),
                      self.gate if gated else None)
        self.h.procs.append(a)
        servers[0].wait_model("tiny")
        return a

    def create(self, srv, body=BODY):
        st, _, r = http_json("POST", srv.url + "/v2/tasks", body, timeout=10)
        self.assertEqual(st, 202, r)
        return r["job_id"]

    def whole(self, srv, tid, last=None):
        hdr = {"Last-Event-ID": str(last)} if last is not None else None
        st, headers, data = harness.http_request(
            "GET", srv.url + "/v2/tasks/%s/events" % tid, headers=hdr, timeout=120)
        self.assertEqual(st, 200)
        return stream_of(data), headers

    def owner_of(self, tid):
        return self.psql("SELECT owner_server FROM jobs WHERE id = '%s'" % tid).strip()

    def stored_token_ids(self, tid):
        """Each token event's ids (None: an event without ids), from
        job_events in PostgreSQL."""
        out = self.psql("SELECT events FROM job_events WHERE job_id = '%s' ORDER BY first_seq"
                        % tid)
        evs = {}
        for line in out.splitlines():
            if line.strip():
                for e in json.loads(line):
                    evs[e["seq"]] = e
        return [evs[s].get("ids") for s in sorted(evs) if evs[s]["type"] == "token"]

    def stored_ids(self, tid):
        out = []
        for ids in self.stored_token_ids(tid):
            out += ids or [None]
        return out

    def read_until_tokens(self, s, n, seen):
        """Events from s until n token events were read."""
        # A guard, not a timing: keep-alives would hold next_event forever
        # if the n-th token event never came.
        guard = threading.Timer(120, lambda: s.conn.sock and
                                s.conn.sock.shutdown(socket.SHUT_RDWR))
        guard.start()
        try:
            while sum(1 for e in seen if e[1] == "token") < n:
                e = s.next_event(timeout=60)
                self.assertIsNotNone(e, "the stream ended before token event %d: %s" % (n, seen))
                seen.append((int(e["id"]), e["event"], json.loads(e["data"])))
        finally:
            guard.cancel()
        return seen

    def check_once(self, stream, failovers):
        self.assertEqual([e[0] for e in stream], list(range(1, len(stream) + 1)), stream)
        terms = [e for e in stream if e[1] in ("end", "error")]
        self.assertEqual(len(terms), 1, stream)
        self.assertIs(terms[0], stream[-1])
        self.assertEqual(stream[-1][1], "end", stream[-1])
        self.assertEqual([e[2]["reason"] for e in stream if e[1] == "failover"], failovers)
        text = "".join(e[2]["text"] for e in stream if e[1] == "token")
        self.assertEqual(stream[-1][2]["text"], text)
        return text

    def baseline(self):
        """The uninterrupted run, on A; the gate is then set to hold A's
        agent after n token events (right after a token whose text is a
        piece of a UTF-8 character, which a text continuation cannot give
        back). Returns (text, ids, n)."""
        base_tid = self.create(self.a)
        base, _ = self.whole(self.a, base_tid)
        self.assertEqual(base[-1][1], "end", base[-1])
        base_text = base[-1][2]["text"]
        base_ids = self.stored_ids(base_tid)
        self.assertNotIn(None, base_ids)
        toks = [e[2]["text"] for e in base if e[1] == "token"]
        n = next((k + 1 for k in range(2, len(toks) - 6) if "\ufffd" in toks[k]), 9)
        self.assertGreater(len(toks), n + 5)
        per_event = self.stored_token_ids(base_tid)
        write_atomic(self.gate, str(sum(len(ids) for ids in per_event[:n])))
        return base_text, base_ids, n

    def test_kill9_owner_another_server_resumes(self):
        a1 = self.agent("agentA", [self.a, self.b, self.c], "a.gguf", gated=True)
        # B's agent: B is the survivor that serves the model; C serves none
        # and must not claim.
        self.agent("agentB", [self.b, self.c, self.a], "b.gguf")
        base_text, base_ids, n = self.baseline()

        tid = self.create(self.a)
        s = harness.SSEStream("GET", self.a.url + "/v2/tasks/%s/events" % tid, timeout=60)
        seen = self.read_until_tokens(s, n, [])
        # What the client read is durable (released only once committed).
        self.a.kill9()
        a1.kill9()
        s.close()

        # To C, which runs nothing: it follows the log that B writes.
        rest, headers = self.whole(self.c, tid, last=seen[-1][0])
        self.assertEqual(headers.get("x-gpupool-replay"), "store")
        stream = seen + rest
        text = self.check_once(stream, ["SERVER_RESTART"])
        self.assertEqual(text, base_text)
        self.assertEqual(self.stored_ids(tid), base_ids)

        # Claimed once, by B; B runs it (status from memory, token-exact).
        self.assertEqual([e.get("job_id") for e in self.b.log_events("task_claimed")], [tid])
        self.assertEqual(self.c.log_events("task_claimed"), [])
        st, _, status = http_json("GET", self.b.url + "/v2/tasks/" + tid)
        self.assertEqual(st, 200, status)
        self.assertEqual(status["status"], "done", status)
        self.assertEqual(status["x_pool_meta"].get("continuation"), "tokens", status)
        owner = self.psql("SELECT lease_attempt, finished_at IS NOT NULL FROM jobs "
                          "WHERE id = '%s'" % tid)
        self.assertEqual(owner.strip(), "2|t")
        self.assertEqual(self.owner_of(tid), self.server_id(self.b))
        # C answers the finished task from the store too.
        again, _ = self.whole(self.c, tid, last=0)
        self.assertEqual(again, stream)

    def test_stale_owner_is_fenced(self):
        """A keeps running a task whose lease another server took (A
        stalled past it): A's event writes for its older attempt are
        refused, A stops the task and ends its client's stream with no
        terminal event. When the lease expires again, one server claims it
        and the log goes on: token-exact, every id once."""
        self.agent("agentA", [self.a, self.b, self.c], "a.gguf", gated=True)
        self.agent("agentB", [self.b, self.c, self.a], "b.gguf")
        base_text, base_ids, n = self.baseline()
        tid = self.create(self.a)
        s = harness.SSEStream("GET", self.a.url + "/v2/tasks/%s/events" % tid, timeout=60)
        seen = self.read_until_tokens(s, n, [])
        # A's agent waits at the gate. Its lease is taken, as if A had
        # stalled past it: attempt 2, held by another server for an hour.
        self.psql("UPDATE jobs SET lease_attempt = lease_attempt + 1, "
                  "owner_server = 'srv_other', lease_until = "
                  "(extract(epoch FROM now()) * 1000)::bigint + 3600000 "
                  "WHERE id = '%s'" % tid)
        write_atomic(self.gate, OPEN)  # A's agent goes on: A's writes are refused
        guard = threading.Timer(120, lambda: s.conn.sock and
                                s.conn.sock.shutdown(socket.SHUT_RDWR))
        guard.start()
        try:
            while True:
                e = s.next_event(timeout=60)
                if e is None:
                    break
                seen.append((int(e["id"]), e["event"], json.loads(e["data"])))
        finally:
            guard.cancel()
        s.close()
        # A's stream ended with no terminal event: nothing A made after it
        # lost the lease reached a client (or the log).
        self.assertNotIn(seen[-1][1], ("end", "error"), seen)
        lost = self.a.log_events("task_lease_lost")
        self.assertEqual([e.get("job_id") for e in lost], [tid])
        stored = self.psql("SELECT max(last_seq) FROM job_events WHERE job_id = '%s'" % tid)
        self.assertEqual(int(stored.strip()), seen[-1][0])
        # The server that took it dies at once: its lease expires, one
        # server with an agent (A or B) claims it (attempt 3).
        self.psql("UPDATE jobs SET lease_until = 0 WHERE id = '%s'" % tid)
        rest, _ = self.whole(self.c, tid, last=seen[-1][0])
        stream = seen + rest
        self.assertEqual(self.check_once(stream, ["SERVER_RESTART"]), base_text)
        self.assertEqual(self.stored_ids(tid), base_ids)
        claims = [e for srv in (self.a, self.b, self.c) for e in srv.log_events("task_claimed")
                  if e.get("job_id") == tid]
        self.assertEqual(len(claims), 1, claims)
        row = self.psql("SELECT lease_attempt, status FROM jobs WHERE id = '%s'" % tid)
        self.assertEqual(row.strip(), "3|done")

    def test_follow_live_from_another_server(self):
        self.agent("agentA", [self.a, self.b, self.c], "a.gguf", gated=True)
        k = 5
        write_atomic(self.gate, str(k))
        tid = self.create(self.a)
        s = harness.SSEStream("GET", self.b.url + "/v2/tasks/%s/events" % tid, timeout=60)
        self.assertEqual(s.status, 200)
        self.assertEqual(s.headers.get("x-gpupool-replay"), "store")
        seen = self.read_until_tokens(s, 1, [])
        # A still runs it (its agent waits at the gate): B streamed what A
        # committed while the task is live.
        st, _, status = http_json("GET", self.a.url + "/v2/tasks/" + tid)
        self.assertEqual(st, 200, status)
        self.assertEqual(status["status"], "running", status)
        st, _, status_b = http_json("GET", self.b.url + "/v2/tasks/" + tid)
        self.assertEqual(st, 200, status_b)
        self.assertIn(status_b["status"], ("assigned", "running"), status_b)
        # The task is leased under the id A announces in the servers table,
        # the one every server lists (one server id per process).
        owner = self.owner_of(tid)
        self.assertEqual(owner, self.server_id(self.a))
        listed = {r["id"]: r["state"] for r in self.servers_status(self.b)["servers"]}
        self.assertEqual(listed.get(owner), "alive", listed)
        write_atomic(self.gate, OPEN)
        while True:
            e = s.next_event(timeout=60)
            if e is None:
                break
            seen.append((int(e["id"]), e["event"], json.loads(e["data"])))
        s.close()
        self.check_once(seen, [])
        from_a, _ = self.whole(self.a, tid)
        self.assertEqual(seen, from_a)

    def test_delete_from_another_server(self):
        """DELETE /v2/tasks/{id} on B of a task A runs (its agent held
        mid-task): B asks the cancel through the database and answers once
        A cancelled the job, with the status A would have answered; A's
        client gets the terminal event of a cancel, the stored log and the
        row end there."""
        self.agent("agentA", [self.a, self.b, self.c], "a.gguf", gated=True)
        write_atomic(self.gate, "3")
        tid = self.create(self.a)
        s = harness.SSEStream("GET", self.a.url + "/v2/tasks/%s/events" % tid, timeout=60)
        seen = self.read_until_tokens(s, 1, [])
        st, _, reply = http_json("DELETE", self.b.url + "/v2/tasks/" + tid, timeout=60)
        self.assertEqual(st, 200, reply)
        self.assertEqual(reply["status"], "cancelled", reply)
        self.assertNotIn("cancel_requested", reply)
        # The rest of A's stream: the terminal event a DELETE on A gives.
        while True:
            e = s.next_event(timeout=60)
            if e is None:
                break
            seen.append((int(e["id"]), e["event"], json.loads(e["data"])))
        s.close()
        write_atomic(self.gate, OPEN)
        self.assertEqual([e[0] for e in seen], list(range(1, len(seen) + 1)), seen)
        self.assertEqual(seen[-1][1], "error", seen[-1])
        code = seen[-1][2]["code"]
        self.assertEqual(reply["error"]["code"], code, reply)
        st, _, on_a = http_json("GET", self.a.url + "/v2/tasks/" + tid)
        self.assertEqual(st, 200, on_a)
        self.assertEqual((on_a["status"], on_a["error"]["code"]), ("cancelled", code), on_a)
        self.assertEqual([e.get("job_id") for e in self.a.log_events("task_cancelled_remote")],
                         [tid])
        self.assertEqual([e.get("job_id") for e in self.b.log_events("task_cancel_asked")], [tid])
        row = self.psql("SELECT status, error_code, cancel_requested IS NOT NULL FROM jobs "
                        "WHERE id = '%s'" % tid)
        self.assertEqual(row.strip(), "cancelled|%s|t" % code)
        # C, a third server, replays the same log from the store.
        again, _ = self.whole(self.c, tid, last=0)
        self.assertEqual(again, seen)
        # A second DELETE, on C, of the finished task: its status, at once.
        st, _, reply2 = http_json("DELETE", self.c.url + "/v2/tasks/" + tid, timeout=60)
        self.assertEqual((st, reply2["status"]), (200, "cancelled"), reply2)

    def test_delete_when_the_owner_is_gone(self):
        """A runs a task and dies (kill -9, with its agent); a DELETE on C
        marks it; B, the server that claims the expired lease, finds the
        mark and cancels the task instead of running it to its end. The
        reply is 200 cancelled, or 202 with cancel_requested when the claim
        came after task_lease_sec + 10 s (a loaded machine): the row ends
        cancelled either way."""
        a1 = self.agent("agentA", [self.a, self.b, self.c], "a.gguf", gated=True)
        self.agent("agentB", [self.b, self.c, self.a], "b.gguf")
        write_atomic(self.gate, "3")
        tid = self.create(self.a)
        s = harness.SSEStream("GET", self.a.url + "/v2/tasks/%s/events" % tid, timeout=60)
        seen = self.read_until_tokens(s, 1, [])
        self.a.kill9()
        a1.kill9()
        s.close()
        st, _, reply = http_json("DELETE", self.c.url + "/v2/tasks/" + tid, timeout=60)
        self.assertIn(st, (200, 202), reply)
        if st == 200:
            self.assertEqual(reply["status"], "cancelled", reply)
        else:
            self.assertTrue(reply.get("cancel_requested"), reply)
        harness.wait_until(lambda: self.psql("SELECT status FROM jobs WHERE id = '%s'"
                                             % tid).strip() == "cancelled",
                           timeout=60, what="the row cancelled by the claimant")
        self.assertEqual([e.get("job_id") for e in self.b.log_events("task_cancelled_remote")],
                         [tid])
        self.assertEqual(self.c.log_events("task_claimed"), [])
        # The client, reconnected to C, gets the end of the log: a cancel.
        rest, _ = self.whole(self.c, tid, last=seen[-1][0])
        stream = seen + rest
        self.assertEqual([e[0] for e in stream], list(range(1, len(stream) + 1)), stream)
        self.assertEqual(stream[-1][1], "error", stream[-1])
        st, _, reply2 = http_json("GET", self.c.url + "/v2/tasks/" + tid)
        self.assertEqual(reply2["error"]["code"], stream[-1][2]["code"], reply2)


class SharedTasksWokenTest(SharedTasksTest):
    """Issue 28: a follower on another server is woken by the owner's
    notifications (LISTEN/NOTIFY), its poll set to once an hour: B streams
    the live task whole all the same. On the code before, the option did
    not exist (the servers refused to start)."""
    SERVER_ARGS = FAST + ["--task_follow_poll_ms", "3600000"]

    def _not_here(self):
        self.skipTest("the follow poll plays no part (SharedTasksTest runs it)")

    # A DELETE's waiter reads the row, whose update may commit after the
    # owner's last notification: it relies on its poll.
    test_kill9_owner_another_server_resumes = _not_here
    test_stale_owner_is_fenced = _not_here
    test_delete_from_another_server = _not_here
    test_delete_when_the_owner_is_gone = _not_here


if __name__ == "__main__":
    harness.main()
