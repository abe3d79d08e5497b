"""gpupool-agent against a fake server written here, and the scripted upstream.

The fake server speaks docs/protocol.md from the server side and records
everything, so these tests pin the agent's half of the contract without
depending on gpupool-server: registration facts, agent_id persistence, event
batching and seq numbers, SEQ_GAP resends, cancel (events reply and poll
command) closing the upstream stream, upstream failures as stable error
codes, reconnect after the server was away, SIGTERM drain.
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import upstream as upstream_mod  # noqa: E402


class FakeServer:
    """The server side of the agent protocol, in this process."""

    def __init__(self, port=0, poll_interval=1, work_wait=2):
        self.lock = threading.Condition()
        self.polls = []            # poll bodies, in order
        self.work_calls = 0
        self.works = []            # work request bodies, in order
        self.work_times = []       # time.monotonic() at each work request's arrival
        self.deliveries = 0        # work replies with jobs so far
        self.upload_instances = set()  # `instance` of every events upload
        self.jobs_to_give = []     # job objects waiting for a /agents/work
        self.uploads = {}          # job_id -> list of (seq, n events)
        self.events = {}           # job_id -> applied events (exactly once)
        self.cancel_jobs = set()   # reply cancel:true to these
        self.unknown_jobs = set()  # reply 404 to these
        self.gap_once = set()      # job ids: claim to have lost the last batch once
        self.fail_uploads = {}     # job_id -> uploads still to answer 503
        self.poll_commands = []    # sent with the next poll reply
        self.poll_status = 200     # e.g. 503 to simulate trouble
        self.poll_interval = poll_interval
        self.work_wait = work_wait
        self.refuse_free_slots_0 = False  # answer as a server before the liveness protocol
        self.events_batch = False  # announce and take POST /agents/events
        self.hold_batches = False  # leave batched uploads unanswered while set
        self.batches = []          # job ids of every batched upload, in arrival order
        self.batches_held = 0      # batched uploads waiting for hold_batches to clear
        self.closed = False
        self.heads = []            # (path, {lower-case header name: value}) of every request
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def reply(self, status, obj=None):
                data = json.dumps(obj).encode() if obj is not None else b""
                self.send_response(status)
                if obj is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                with fake.lock:
                    fake.heads.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                fake.handle(self, body)

        class Srv(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address):
                pass  # agents hanging up mid-reply are part of the tests

        self.httpd = Srv(("127.0.0.1", port), H)
        self.port = self.httpd.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.th = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                   daemon=True)
        self.th.start()

    def close(self):
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- protocol --------------------------------------------------------
    def handle(self, h, body):
        path = h.path
        if path == "/agents/poll":
            with self.lock:
                self.polls.append(body)
                self.lock.notify_all()
                st = self.poll_status
                cmds, self.poll_commands = self.poll_commands, []
            if st != 200:
                h.reply(st, {"error": {"code": "UNAVAILABLE", "message": "scripted"}})
                return
            h.reply(200, {"agent_id": body.get("agent_id"), "state": "healthy",
                          "poll_interval_sec": self.poll_interval,
                          "work_wait_sec": self.work_wait, "commands": cmds,
                          "features": ["events_batch"] if self.events_batch else []})
            return
        if path == "/agents/events" and self.events_batch:
            with self.lock:
                self.batches.append([e["job_id"] for e in body["jobs"]])
                self.batches_held += 1
                self.lock.notify_all()
                while self.hold_batches and not self.closed:
                    self.lock.wait(0.05)
                self.batches_held -= 1
                out = []
                for e in body["jobs"]:
                    st, obj = self.apply_upload(e["job_id"], e)
                    out.append(dict(obj, job_id=e["job_id"], status=st))
                self.lock.notify_all()
            h.reply(200, {"jobs": out})
            return
        if path == "/agents/work":
            deadline = time.monotonic() + self.work_wait
            with self.lock:
                self.work_calls += 1
                self.works.append(body)
                self.work_times.append(time.monotonic())
                self.lock.notify_all()
                refuse = self.refuse_free_slots_0 and body.get("free_slots") == 0
            if refuse:
                h.reply(400, {"error": {"code": "INVALID_REQUEST",
                                        "message": "'free_slots' must be an integer in 1..1024"}})
                return
            with self.lock:
                k = int(body.get("free_slots", 1))
                # free_slots 0: a busy agent's liveness long-poll, never given jobs
                while (k == 0 or not self.jobs_to_give) and not self.closed and \
                        time.monotonic() < deadline:
                    self.lock.wait(0.05)
                give, self.jobs_to_give = self.jobs_to_give[:k], self.jobs_to_give[k:]
                if give:
                    self.deliveries += 1
                    token = "fake.%d" % self.deliveries
            if not give:
                h.reply(204)
                return
            h.reply(200, {"jobs": give, "delivery": token})
            return
        if path.startswith("/agents/jobs/") and path.endswith("/events"):
            jid = path[len("/agents/jobs/"):-len("/events")]
            with self.lock:
                if "instance" in body:
                    self.upload_instances.add(body.get("instance"))
                st, obj = self.apply_upload(jid, body)
                self.lock.notify_all()
            h.reply(st, obj)
            return
        h.reply(404, {"error": {"code": "NOT_FOUND", "message": path}})

    def apply_upload(self, jid, body):
        """One job's events upload (self.lock held): (status, reply object)."""
        if jid in self.unknown_jobs:
            return 404, {"error": {"code": "JOB_NOT_FOUND", "message": "no such job"}}
        if self.fail_uploads.get(jid, 0) > 0:
            self.fail_uploads[jid] -= 1
            self.uploads.setdefault(jid, []).append((body["seq"], None))
            return 503, {"error": {"code": "UNAVAILABLE", "message": "scripted"}}
        seq = body["seq"]
        evs = body["events"]
        have = self.events.setdefault(jid, [])
        self.uploads.setdefault(jid, []).append((seq, len(evs)))
        if seq > len(have):
            return 409, {"error": {"code": "SEQ_GAP", "message": "gap",
                                   "details": {"expected_seq": len(have)}}}
        have.extend(evs[len(have) - seq:])
        if jid in self.gap_once and len(have) > 1 and not any(
                e["type"] in ("end", "error") for e in have):
            # Pretend the batch just applied was lost: the agent must resend it.
            self.gap_once.discard(jid)
            del have[seq:]
            return 409, {"error": {"code": "SEQ_GAP", "message": "gap",
                                   "details": {"expected_seq": seq}}}
        return 200, {"cancel": jid in self.cancel_jobs}

    # -- test helpers ----------------------------------------------------
    def give(self, job):
        with self.lock:
            self.jobs_to_give.append(job)
            self.lock.notify_all()

    def wait(self, pred, timeout=15, what="condition"):
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                v = pred()
                if v:
                    return v
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("timed out waiting for " + what)
                self.lock.wait(min(left, 0.1))

    def job_events(self, jid):
        with self.lock:
            return list(self.events.get(jid, []))

    def wait_terminal(self, jid, timeout=15):
        def done():
            evs = self.events.get(jid, [])
            return evs and evs[-1]["type"] in ("end", "error")
        self.wait(done, timeout, "terminal event of " + jid)
        return self.job_events(jid)


def job(jid, kind="completion", prompt="alpha beta", messages=None, max_tokens=None, **extra):
    j = {"job_id": jid, "kind": kind, "model": "pub", "prompt": prompt if kind == "completion" else None,
         "messages": messages, "params": {"temperature": 0.5}, "continuation": "", "attempt": 1,
         "correlation_id": "corr-" + jid, "deadline_ms": 600000}
    if max_tokens is not None:
        j["params"]["max_tokens"] = max_tokens
    j.update(extra)
    return j


class AgentProtocolTest(harness.TestCase):
    NEEDS = (harness.AGENT_BIN,)

    def setUp(self):
        super().setUp()
        self.fake = FakeServer()
        self.addCleanup(self.fake.close)

    def start_agent(self, up, extra=(), name="a1", state_dir=None, slots=1, alias="pub", server_url=None):
        class S:
            url = server_url or self.fake.url
        return self.h.start_agent(S, upstream=up, model="m1", alias=alias, name=name,
                                  state_dir=state_dir, slots=slots,
                                  args=["--request-timeout-sec", "5"] + list(extra))

    def run_job(self, up, j, extra=()):
        self.start_agent(up, extra)
        self.fake.give(j)
        return self.fake.wait_terminal(j["job_id"])

    # ------------------------------------------------------------------
    def test_register_facts_and_persistent_id(self):
        up = self.h.start_upstream()
        sd = self.h.path("state")
        a = self.start_agent(up, ["--labels", "region=eu, tier=gold"], state_dir=sd, slots=3)
        self.fake.wait(lambda: self.fake.polls, what="first poll")
        p = self.fake.polls[0]
        aid = a.agent_id()
        self.assertEqual(p["agent_id"], aid)
        self.assertEqual(p["name"], "a1")
        self.assertEqual(p["status"], "online")
        self.assertEqual(p["slots"], {"total": 3, "busy": 0})
        self.assertEqual(p["labels"], {"region": "eu", "tier": "gold"})
        self.assertIsInstance(p["gpus"], list)
        self.assertEqual(p["backend"], "openai")
        self.assertEqual(p["cpu"]["vendor"], "cpu")
        self.assertGreaterEqual(p["cpu"]["cores"], 1)
        self.assertEqual([m["id"] for m in p["models"]], ["pub"])
        self.assertTrue(p["models"][0]["loaded"])
        self.assertEqual(stat.S_IMODE(os.stat(sd).st_mode), 0o700)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(sd, "agent_id")).st_mode), 0o600)
        # The agent parks a long-poll once registered.
        self.fake.wait(lambda: self.fake.work_calls >= 1, what="work long-poll")
        self.assertEqual(a.stop(), 0)
        # A restart keeps the id.
        n = len(self.fake.polls)
        self.start_agent(up, state_dir=sd, name="a1b")
        self.fake.wait(lambda: len(self.fake.polls) > n and self.fake.polls[-1]["name"] == "a1b",
                       what="poll after restart")
        self.assertEqual(self.fake.polls[-1]["agent_id"], aid)
        # ... but it is a new process: a new instance id.
        self.assertRegex(p["instance"], "^[0-9a-f]{32}$")
        self.assertNotEqual(self.fake.polls[-1]["instance"], p["instance"])

    def test_liveness_long_poll_while_busy(self):
        # A one-slot agent busy with a job keeps a free_slots 0 long-poll
        # parked, and polls and long-polls list the job with the delivery
        # token of the reply that brought it.
        up = self.h.start_upstream(["--tokens", "8", "--pace-ms", "300"])
        self.start_agent(up)
        self.fake.wait(lambda: self.fake.works, what="first long-poll")
        inst = self.fake.works[0]["instance"]
        self.assertEqual(self.fake.works[0]["free_slots"], 1)
        self.assertEqual(self.fake.works[0]["running_jobs"], [])
        self.assertNotIn("delivery_seen", self.fake.works[0])
        self.fake.give(job("job_l1"))
        busy = self.fake.wait(lambda: [w for w in self.fake.works if w["free_slots"] == 0],
                              what="liveness long-poll")[0]
        self.assertEqual((busy["instance"], busy["running_jobs"], busy["delivery_seen"]),
                         (inst, ["job_l1"], "fake.1"))
        p = self.fake.wait(lambda: [p for p in self.fake.polls if p.get("running_jobs")],
                           what="a poll listing the job")[0]
        self.assertEqual((p["instance"], p["running_jobs"], p["delivery_seen"]),
                         (inst, ["job_l1"], "fake.1"))
        self.fake.wait_terminal("job_l1")
        # The slot is free again: a long-poll asking for work, with nothing listed.
        n = len(self.fake.works)
        again = self.fake.wait(lambda: [w for w in self.fake.works[n:] if w["free_slots"] == 1
                                        and w["running_jobs"] == []], what="work again")[0]
        self.assertEqual(again["delivery_seen"], "fake.1")
        self.assertEqual(self.fake.upload_instances, {inst})

    def test_long_job_lists_at_most_once_a_second(self):
        # An agent holding more than 16 jobs lists them (running_jobs, with
        # delivery_seen) on a long-poll at most once a second: a busy agent
        # re-parks after every reply, and a list on each was most of the
        # server's cost of a long-poll at 1,000 streams. /agents/poll still
        # lists every job, and a long-poll once the second has passed does.
        # (jobs of ~100 s: they outlive the test on a slow machine)
        up = self.h.start_upstream(["--tokens", "20", "--pace-ms", "5000"])
        self.start_agent(up, slots=40)
        self.fake.wait(lambda: self.fake.works, what="first long-poll")
        ids = ["job_m%02d" % i for i in range(30)]
        for i, jid in enumerate(ids):
            n = len(self.fake.works)
            self.fake.give(job(jid))
            # each delivery answers the parked long-poll; the agent parks again
            self.fake.wait(lambda: len(self.fake.works) > n and not self.fake.jobs_to_give,
                           what="long-poll after job %d" % i)
        with self.fake.lock:
            works = list(zip(self.fake.work_times, self.fake.works))
        # The long-polls made while the agent held more than 16 jobs: after
        # the 17th delivery (the first long-poll is the one before any).
        busy = works[18:]
        self.assertGreaterEqual(len(busy), 10)
        listed = [t for t, w in busy if "running_jobs" in w]
        span = busy[-1][0] - busy[0][0]
        # At most one a second (arrival times jitter: 0.9 s), plus the first.
        self.assertLessEqual(len(listed), int(span / 0.9) + 2, (len(listed), span))
        for _, w in busy:
            self.assertEqual("running_jobs" in w, "delivery_seen" in w, w)
        # /agents/poll lists every job; so does a long-poll a second on.
        p = self.fake.wait(lambda: [p for p in self.fake.polls
                                    if len(p.get("running_jobs") or []) == 30],
                           timeout=30, what="a poll listing the 30 jobs")[0]
        self.assertEqual(sorted(p["running_jobs"]), ids)
        n = len(self.fake.works)
        w = self.fake.wait(lambda: [w for w in self.fake.works[n:] if "running_jobs" in w],
                           timeout=30, what="a long-poll listing the jobs")[0]
        self.assertEqual(sorted(w["running_jobs"]), ids)
        self.assertEqual(w["delivery_seen"], "fake.30")

    def test_older_server_without_liveness(self):
        # A server that refuses free_slots 0: the agent stops asking (one
        # refusal), stays registered and runs its job as before.
        self.fake.refuse_free_slots_0 = True
        up = self.h.start_upstream(["--tokens", "6", "--pace-ms", "200"])
        a = self.start_agent(up)
        self.fake.wait(lambda: self.fake.works, what="first long-poll")
        self.fake.give(job("job_o1"))
        evs = self.fake.wait_terminal("job_o1")
        self.assertEqual(evs[-1]["type"], "end")
        self.fake.wait(lambda: a.log_events("liveness_unsupported"), what="fallback logged")
        self.assertEqual(len([w for w in self.fake.works if w["free_slots"] == 0]), 1)
        self.assertEqual(a.log_events("work_rejected"), [])

    def test_completion_stream_relayed_in_order_with_seq(self):
        up = self.h.start_upstream(["--tokens", "6", "--pace-ms", "20"])
        evs = self.run_job(up, job("job_c1", prompt="red green blue"))
        types = [e["type"] for e in evs]
        self.assertEqual(types[0], "started")
        self.assertEqual(types[-1], "end")
        text = "".join(e["text"] for e in evs if e["type"] == "token")
        self.assertEqual(text, "".join(upstream_mod.expected_tokens("red green blue", 6)))
        end = evs[-1]
        self.assertEqual(end["finish_reason"], "stop")
        self.assertEqual(end["usage"]["completion_tokens"], 6)
        self.assertEqual(end["usage"]["prompt_tokens"], 3)
        # seq of each upload == events before it; no upload repeats applied events.
        ups = self.fake.uploads["job_c1"]
        total = 0
        for seq, n in ups:
            self.assertEqual(seq, total)
            total += n
        self.assertEqual(total, len(evs))
        # What went upstream.
        rec = up.log_entries()[-1]
        self.assertEqual(rec["model"], "m1")
        self.assertTrue(rec["stream"])
        self.assertEqual(rec["prompt"], "red green blue")
        self.assertEqual(rec["body"]["temperature"], 0.5)
        self.assertEqual(rec["headers"].get("x-correlation-id"), "corr-job_c1")

    def test_request_headers_to_the_server(self):
        """What the agent's requests to the server carry (issue 24: a shared
        header list, handles kept configured between requests, long-poll URLs
        parsed once): the JSON type on each, and X-Correlation-Id on a job's
        own upload only; no User-Agent or Accept line on the long-polls and
        uploads of every relayed request, a User-Agent on the heartbeat."""
        up = self.h.start_upstream(["--tokens", "3"])
        self.start_agent(up)
        self.fake.give(job("job_h1"))
        self.assertEqual(self.fake.wait_terminal("job_h1")[-1]["type"], "end")
        self.fake.give(job("job_h2", correlation_id=None))
        self.assertEqual(self.fake.wait_terminal("job_h2")[-1]["type"], "end")
        n = len(self.fake.works)
        self.fake.wait(lambda: len(self.fake.works) > n, what="long-poll after the jobs")
        with self.fake.lock:
            heads = list(self.fake.heads)
        kinds = {}
        for path, hd in heads:
            kinds.setdefault(path, []).append(hd)
        self.assertIn("/agents/poll", kinds)
        self.assertGreaterEqual(len(kinds["/agents/work"]), 3)
        for path, hd in heads:
            self.assertEqual(hd.get("content-type"), "application/json", (path, hd))
            self.assertNotIn("expect", hd, (path, hd))
            self.assertIn("host", hd, (path, hd))
            if path == "/agents/poll":
                self.assertTrue(hd.get("user-agent", "").startswith("gpupool-agent/"), hd)
            else:
                self.assertNotIn("user-agent", hd, (path, hd))
                self.assertNotIn("accept", hd, (path, hd))
        for jid, corr in (("job_h1", "corr-job_h1"), ("job_h2", None)):
            ups = kinds["/agents/jobs/%s/events" % jid]
            self.assertTrue(ups)
            for hd in ups:
                self.assertEqual(hd.get("x-correlation-id"), corr, hd)
        for hd in kinds["/agents/work"] + kinds["/agents/poll"]:
            self.assertNotIn("x-correlation-id", hd)

    def test_reused_handle_carries_nothing_of_the_previous_job(self):
        """The openai backend runs one job after another on the same libcurl
        handle, not reset between them (issue 24): each request has its own
        URL, headers and body, whatever the job before it had, a cancelled
        one included, and the backend's own headers (key, user agent)."""
        up = self.h.start_upstream(["--tokens", "3"])
        self.start_agent(up, ["--upstream-key", "k-up"])
        long_msgs = [{"role": "user", "content": "x " * 3000}]
        a = job("job_ra", kind="chat", messages=long_msgs, session="s-a", pool_via="ab12",
                priority="batch")
        self.fake.give(a)
        self.assertEqual(self.fake.wait_terminal("job_ra")[-1]["type"], "end")
        b = job("job_rb", prompt="short one", correlation_id=None)
        self.fake.give(b)
        self.assertEqual(self.fake.wait_terminal("job_rb")[-1]["type"], "end")
        # A job dropped mid-stream, then one more on its handle.
        up.control(pace_ms=50, tokens=200)
        self.fake.cancel_jobs.add("job_rc")
        self.fake.give(job("job_rc", kind="chat", messages=[{"role": "user", "content": "c"}]))
        self._assert_upstream_closed(up, "upstream sees the cancel")
        up.control(pace_ms=0, tokens=3)
        self.fake.give(job("job_rd", kind="chat", messages=[{"role": "user", "content": "d"}],
                           correlation_id=None))
        self.assertEqual(self.fake.wait_terminal("job_rd")[-1]["type"], "end")
        recs = {r["headers"].get("x-gpupool-job-id"): r for r in up.log_entries()}
        ra, rb, rd = recs["job_ra"], recs["job_rb"], recs["job_rd"]
        self.assertEqual(ra["path"], "/v1/chat/completions")
        self.assertEqual(ra["headers"].get("x-correlation-id"), "corr-job_ra")
        self.assertEqual(ra["headers"].get("x-pool-via"), "ab12")
        self.assertEqual(json.loads(ra["headers"]["x-pool-options"]),
                         {"session": "s-a", "priority": "batch"})
        self.assertEqual(ra["messages"], long_msgs)
        self.assertEqual(rb["path"], "/v1/completions")
        self.assertEqual(rb["prompt"], "short one")
        self.assertNotIn("messages", rb["body"])
        self.assertEqual(rd["path"], "/v1/chat/completions")
        self.assertEqual(rd["messages"], [{"role": "user", "content": "d"}])
        for r in (rb, rd):
            for h in ("x-correlation-id", "x-pool-via", "x-pool-options"):
                self.assertNotIn(h, r["headers"], (r["headers"], h))
        for r in (ra, rb, rd):
            self.assertEqual(r["headers"].get("authorization"), "Bearer k-up")
            self.assertTrue(r["headers"].get("user-agent", "").startswith("gpupool-agent/"))
            self.assertEqual(r["headers"].get("accept"), "text/event-stream")
            self.assertEqual(r["headers"].get("content-type"), "application/json")

    def test_new_jobs_start_while_a_stream_relays_and_reuse_its_connection(self):
        """While one stream relays, new jobs are started and answered, each
        whole, one after the other on one kept-alive upstream connection
        (issue 24: a transfer's socket is watched ahead of the relaying
        streams until its reply begins, then moved back among them)."""
        up = self.h.start_upstream(["--tokens", "400", "--pace-ms", "25"])
        # The body's last chunk comes 30 ms after [DONE], as an upstream's
        # separate write: the connection is kept only if the agent reads
        # it rather than hang up at [DONE].
        up.control(done_gap_ms=30)
        self.start_agent(up, slots=4)
        self.fake.give(job("job_pa", prompt="long one"))
        self.fake.wait(lambda: any(e["type"] == "token" for e in self.fake.events.get("job_pa", [])),
                       what="job_pa relaying")
        for jid in ("job_pb", "job_pc", "job_pd"):
            self.fake.give(job(jid, prompt="short " + jid, max_tokens=3))
            evs = self.fake.wait_terminal(jid)
            self.assertEqual(evs[-1]["type"], "end", evs)
            text = "".join(e["text"] for e in evs if e["type"] == "token")
            self.assertEqual(text, "".join(upstream_mod.expected_tokens("short " + jid, 3)))
            self.fake.wait(lambda: any(r["headers"].get("x-gpupool-job-id") == jid and
                                       r["outcome"] != "running" for r in up.log_entries()),
                           what="the upstream done with " + jid)
        recs = {r["headers"].get("x-gpupool-job-id"): r for r in up.log_entries()}
        self.assertEqual(recs["job_pa"]["outcome"], "running")  # 400 x 25 ms: 10 s
        ports = {recs[j]["peer_port"] for j in ("job_pb", "job_pc", "job_pd")}
        self.assertEqual(len(ports), 1, ports)
        self.assertNotIn(recs["job_pa"]["peer_port"], ports)
        # The long stream, its socket moved back among the relaying ones
        # long ago, still relays in order up to its cancel.
        self.fake.cancel_jobs.add("job_pa")
        harness.wait_until(lambda: any(r["headers"].get("x-gpupool-job-id") == "job_pa" and
                                       r["outcome"] == "client_gone" for r in up.log_entries()),
                           timeout=10, what="upstream sees the cancel of job_pa")
        evs = self.fake.job_events("job_pa")
        text = "".join(e["text"] for e in evs if e["type"] == "token")
        self.assertTrue(text and "".join(upstream_mod.expected_tokens("long one", 400)).startswith(text),
                        text)

    def test_chat_forwards_messages_and_max_tokens(self):
        up = self.h.start_upstream(["--tokens", "10"])
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two"}]
        evs = self.run_job(up, job("job_ch", kind="chat", messages=msgs, max_tokens=4))
        text = "".join(e["text"] for e in evs if e["type"] == "token")
        self.assertEqual(text, "".join(upstream_mod.expected_tokens("one two", 4)))
        self.assertEqual(evs[-1]["finish_reason"], "length")
        rec = up.log_entries()[-1]
        self.assertEqual(rec["path"], "/v1/chat/completions")
        self.assertEqual(rec["messages"], msgs)
        self.assertEqual(rec["body"]["max_tokens"], 4)

    def test_completion_continuation_appended(self):
        up = self.h.start_upstream(["--tokens", "2"])
        evs = self.run_job(up, job("job_co", prompt="x y", continuation=" z"))
        self.assertEqual(evs[-1]["type"], "end")
        self.assertEqual(up.log_entries()[-1]["prompt"], "x y z")

    def test_seq_gap_resend_applies_every_event_once(self):
        up = self.h.start_upstream(["--tokens", "12", "--pace-ms", "30"])
        self.fake.gap_once.add("job_gap")
        evs = self.run_job(up, job("job_gap", prompt="p q"))
        text = "".join(e["text"] for e in evs if e["type"] == "token")
        self.assertEqual(text, "".join(upstream_mod.expected_tokens("p q", 12)))
        self.assertNotIn("job_gap", self.fake.gap_once)  # the gap was exercised
        self.assertEqual([e["type"] for e in evs].count("started"), 1)

    def test_failed_uploads_are_retried_until_delivered(self):
        # 503s: the same events again after a backoff (the agent's retry
        # timers), every event applied once, in order.
        up = self.h.start_upstream(["--tokens", "6", "--pace-ms", "20"])
        self.fake.fail_uploads["job_r"] = 3
        evs = self.run_job(up, job("job_r"))
        self.assertEqual(evs[-1]["type"], "end", evs)
        self.assertEqual("".join(e["text"] for e in evs if e["type"] == "token"),
                         "".join(upstream_mod.expected_tokens("alpha beta", 6)))
        failed = [u for u in self.fake.uploads["job_r"] if u[1] is None]
        self.assertEqual(len(failed), 3)

    def test_deadline_stops_job(self):
        # A job past its deadline_ms is stopped by the agent (its deadline
        # timer), reported as TIMEOUT, and its upstream stream closed.
        up = self.h.start_upstream(["--tokens", "500", "--pace-ms", "50"])
        evs = self.run_job(up, job("job_dl", deadline_ms=400))
        self.assertEqual(evs[-1]["type"], "error", evs)
        self.assertEqual(evs[-1]["code"], "TIMEOUT")
        self._assert_upstream_closed(up, "upstream closed at the deadline")

    def test_deadlines_of_many_jobs_in_any_order(self):
        # Deadlines given out of order fire each for its own job; a job
        # with a far deadline runs to its end meanwhile.
        up = self.h.start_upstream(["--tokens", "200", "--pace-ms", "50"])
        self.start_agent(up, slots=5)
        for i, dl in enumerate([1500, 300, 900, 600]):
            self.fake.give(job("job_m%d" % i, deadline_ms=dl))
        self.fake.give(job("job_far", max_tokens=5))
        for i in range(4):
            evs = self.fake.wait_terminal("job_m%d" % i, timeout=30)
            self.assertEqual((evs[-1]["type"], evs[-1].get("code")), ("error", "TIMEOUT"))
        evs = self.fake.wait_terminal("job_far", timeout=30)
        self.assertEqual(evs[-1]["type"], "end", evs)

    def _assert_upstream_closed(self, up, what):
        def gone():
            recs = up.log_entries()
            return recs and recs[-1]["outcome"] == "client_gone"
        harness.wait_until(gone, timeout=10, what=what)
        rec = up.log_entries()[-1]
        self.assertLess(rec["tokens_sent"], 200)
        return rec

    def test_cancel_from_events_reply_closes_upstream(self):
        up = self.h.start_upstream(["--tokens", "200", "--pace-ms", "50"])
        self.fake.cancel_jobs.add("job_x")
        self.start_agent(up)
        t0 = time.monotonic()
        self.fake.give(job("job_x"))
        self.fake.wait(lambda: self.fake.events.get("job_x"), what="first upload")
        t_cancel = time.monotonic()
        rec = self._assert_upstream_closed(up, "upstream sees the cancel")
        sys.stderr.write("cancel -> upstream disconnect: %.0f ms\n" % ((rec["disconnect_mono"] - t_cancel) * 1000))
        # Nothing is uploaded after cancel:true except what was already in flight.
        time.sleep(0.3)  # let a stray upload arrive if the agent misbehaved
        self.assertLessEqual(len(self.fake.uploads["job_x"]), 2)
        self.assertLess(t_cancel - t0, 30)

    def test_cancel_from_poll_command(self):
        up = self.h.start_upstream(["--tokens", "200", "--pace-ms", "50"])
        self.start_agent(up)
        self.fake.give(job("job_p"))
        self.fake.wait(lambda: self.fake.events.get("job_p"), what="first upload")
        with self.fake.lock:
            self.fake.poll_commands.append({"type": "cancel", "job_id": "job_p"})
        self._assert_upstream_closed(up, "upstream sees the poll cancel")

    def test_unknown_job_stops_generation(self):
        up = self.h.start_upstream(["--tokens", "200", "--pace-ms", "50"])
        self.fake.unknown_jobs.add("job_u")
        self.start_agent(up)
        self.fake.give(job("job_u"))
        self._assert_upstream_closed(up, "upstream closed after 404")

    def _error_of(self, up_args, jid, extra=()):
        up = self.h.start_upstream(up_args)
        evs = self.run_job(up, job(jid), extra)
        self.assertEqual(evs[-1]["type"], "error", evs)
        self.assertEqual(sum(1 for e in evs if e["type"] in ("end", "error")), 1)
        return evs[-1]

    def test_upstream_http_500(self):
        e = self._error_of(["--mode", "http500"], "job_500")
        self.assertEqual(e["code"], "UPSTREAM_ERROR")
        self.assertIn("500", e["message"])

    def test_upstream_malformed_chunk(self):
        e = self._error_of(["--mode", "malformed", "--after", "2"], "job_mal")
        self.assertEqual(e["code"], "UPSTREAM_MALFORMED")

    def test_upstream_wrong_content_type(self):
        e = self._error_of(["--mode", "wrong_ctype"], "job_ct")
        self.assertEqual(e["code"], "UPSTREAM_MALFORMED")

    def test_upstream_dies_mid_stream(self):
        up = self.h.start_upstream(["--mode", "die", "--after", "3", "--pace-ms", "10"])
        evs = self.run_job(up, job("job_die"))
        self.assertEqual(evs[-1]["type"], "error")
        self.assertEqual(evs[-1]["code"], "UPSTREAM_ERROR")
        self.assertEqual(sum(1 for e in evs if e["type"] == "token"), 3)

    def test_upstream_stall_times_out(self):
        e = self._error_of(["--mode", "stall", "--after", "1"], "job_st", ["--upstream-timeout-sec", "1"])
        self.assertEqual(e["code"], "UPSTREAM_TIMEOUT")

    def test_upstream_unreachable(self):
        port = harness.free_port()

        class Dead:
            url = "http://127.0.0.1:%d" % port
        evs = self.run_job(Dead, job("job_dead"))
        self.assertEqual(evs[-1]["type"], "error")
        self.assertEqual(evs[-1]["code"], "UPSTREAM_ERROR")

    def test_count_tokens_through_upstream_tokenize(self):
        up = self.h.start_upstream()
        j = job("job_cnt", kind="count_tokens")
        j["prompt"] = "one two three four"
        evs = self.run_job(up, j)
        self.assertEqual(evs[-1]["type"], "end", evs)
        self.assertEqual(evs[-1]["usage"]["prompt_tokens"], 4)
        self.assertFalse([e for e in evs if e["type"] == "token"])
        self.assertEqual(up.log_entries()[-1]["path"], "/tokenize")

    def make_cert(self):
        """A self-signed certificate for 127.0.0.1 (skips without openssl)."""
        cert, key = self.h.path("up.crt"), self.h.path("up.key")
        try:
            r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                                "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                                "-addext", "subjectAltName=IP:127.0.0.1"],
                               capture_output=True, timeout=60)
        except FileNotFoundError:
            self.skipTest("no openssl command")
        if r.returncode != 0:
            self.skipTest("openssl could not make a certificate")
        return cert, key

    def test_https_upstream_with_ca_file(self):
        cert, key = self.make_cert()
        up = self.h.start_upstream(["--tokens", "3", "--tls-cert", cert, "--tls-key", key])

        class Tls:
            url = up.url.replace("http://", "https://")
        # Trusted through --ca-file: works.
        self.start_agent(Tls, ["--ca-file", cert], name="tls1")
        self.fake.give(job("job_tls"))
        evs = self.fake.wait_terminal("job_tls")
        self.assertEqual(evs[-1]["type"], "end", evs)
        self.assertEqual("".join(e["text"] for e in evs if e["type"] == "token"),
                         "".join(upstream_mod.expected_tokens("alpha beta", 3)))

    def test_https_upstream_untrusted_is_a_clean_error(self):
        cert, key = self.make_cert()
        up = self.h.start_upstream(["--tls-cert", cert, "--tls-key", key])

        class Tls:
            url = up.url.replace("http://", "https://")
        evs = self.run_job(Tls, job("job_tls_bad"))
        self.assertEqual(evs[-1]["type"], "error")
        self.assertEqual(evs[-1]["code"], "UPSTREAM_ERROR")

    def test_bad_job_kind_is_a_clean_error(self):
        up = self.h.start_upstream()
        evs = self.run_job(up, job("job_k", kind="embedding"))
        self.assertEqual(evs[-1]["type"], "error")
        self.assertEqual(evs[-1]["code"], "INVALID_REQUEST")

    def test_two_slots_run_concurrently(self):
        # The upstream holds every request before its first token until
        # released: both requests in flight at once is then a state the
        # test observes, not an overlap of timestamps that load can undo.
        up = self.h.start_upstream(["--tokens", "3", "--first-delay-ms", "600000"])
        self.start_agent(up, slots=2)
        self.fake.give(job("job_s1"))
        self.fake.give(job("job_s2"))
        harness.wait_until(lambda: [r["outcome"] for r in up.log_entries()] ==
                           ["running", "running"], timeout=60,
                           what="both jobs in flight at the upstream together")
        up.control(first_delay_ms=0)
        self.fake.wait_terminal("job_s1", timeout=60)
        self.fake.wait_terminal("job_s2", timeout=60)
        recs = up.log_entries()
        self.assertEqual([r["outcome"] for r in recs], ["complete", "complete"])

    def test_first_output_not_held_behind_a_batch_in_flight(self):
        # A batched upload the server has not answered yet holds only its
        # own jobs: another job's first output goes in a second request at
        # once (issue 24: under load it waited for the round trip), and
        # every job's events still arrive whole and in order.
        self.fake.events_batch = True
        up = self.h.start_upstream(["--tokens", "5"])
        self.start_agent(up, slots=2, extra=["--request-timeout-sec", "120"])
        self.fake.wait(lambda: self.fake.polls, what="a poll")
        self.fake.hold_batches = True
        self.fake.give(job("job_h1"))
        self.fake.wait(lambda: self.fake.batches_held == 1, timeout=60,
                       what="job_h1's batch held by the server")
        self.fake.give(job("job_h2"))
        self.fake.wait(lambda: any("job_h2" in b for b in self.fake.batches), timeout=60,
                       what="job_h2's first output while job_h1's batch is in flight")
        with self.fake.lock:
            self.assertGreaterEqual(self.fake.batches_held, 1)
            self.assertNotIn("job_h1", [j for b in self.fake.batches[1:] for j in b])
            self.fake.hold_batches = False
            self.fake.lock.notify_all()
        for jid in ("job_h1", "job_h2"):
            evs = self.fake.wait_terminal(jid, timeout=60)
            self.assertEqual(evs[-1]["type"], "end")
            self.assertEqual(sum(1 for e in evs if e["type"] == "end"), 1)

    def test_reconnects_when_server_comes_back(self):
        up = self.h.start_upstream()
        port = self.fake.port
        self.fake.close()
        # Agent starts while nothing listens.
        self.start_agent(up, server_url="http://127.0.0.1:%d" % port)
        time.sleep(1.0)
        self.fake = FakeServer(port=port)
        self.addCleanup(self.fake.close)
        self.fake.wait(lambda: self.fake.polls, timeout=20, what="registration after server start")
        self.fake.give(job("job_back"))
        self.assertEqual(self.fake.wait_terminal("job_back")[-1]["type"], "end")

    def test_poll_503_then_recovers(self):
        up = self.h.start_upstream()
        self.fake.poll_status = 503
        self.start_agent(up)
        self.fake.wait(lambda: len(self.fake.polls) >= 2, what="retried polls")
        self.assertEqual(self.fake.work_calls, 0)  # no long-poll before registration
        with self.fake.lock:
            self.fake.poll_status = 200
        self.fake.wait(lambda: self.fake.work_calls >= 1, timeout=20, what="long-poll after recovery")

    def test_sigterm_drains_running_job_then_exits_0(self):
        up = self.h.start_upstream(["--tokens", "20", "--pace-ms", "50"])
        a = self.start_agent(up)
        self.fake.give(job("job_dr"))
        self.fake.wait(lambda: self.fake.events.get("job_dr"), what="job running")
        a.signal(signal.SIGTERM)
        self.fake.wait(lambda: any(p["status"] == "draining" for p in self.fake.polls),
                       what="draining poll")
        evs = self.fake.wait_terminal("job_dr")
        self.assertEqual(evs[-1]["type"], "end")
        self.assertEqual(sum(1 for e in evs if e["type"] == "token"), 20)
        self.assertEqual(a.wait(timeout=15), 0)

    def test_drain_timeout_stops_job(self):
        up = self.h.start_upstream(["--tokens", "500", "--pace-ms", "50"])
        a = self.start_agent(up, ["--drain-timeout-sec", "1"])
        self.fake.give(job("job_dt"))
        self.fake.wait(lambda: self.fake.events.get("job_dt"), what="job running")
        a.signal(signal.SIGTERM)
        evs = self.fake.wait_terminal("job_dt")
        self.assertEqual(evs[-1]["type"], "error")
        self.assertEqual(evs[-1]["code"], "AGENT_SHUTDOWN")
        self.assertEqual(a.wait(timeout=15), 0)


class AgentCliTest(unittest.TestCase):
    """Start-up errors are clear messages and exit code 2."""

    def run_agent(self, *args):
        if not os.access(harness.AGENT_BIN, os.X_OK):
            self.skipTest("agent not built")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        return subprocess.run([harness.AGENT_BIN] + list(args), capture_output=True, text=True,
                              timeout=20, env=env)

    def test_no_backend_offers_itself_to_deployments(self):
        # Issue 27: neither --model nor --upstream is no longer a usage
        # error; the agent waits for the server's deployments
        # (test_deployments.py covers the rest).
        if not os.access(harness.AGENT_BIN, os.X_OK):
            self.skipTest("agent not built")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        sd = tempfile.mkdtemp(prefix="gp-nobackend-")
        p = subprocess.Popen([harness.AGENT_BIN, "--server", "http://127.0.0.1:1",
                              "--state-dir", sd], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=env)
        try:
            for line in p.stderr:
                if '"deploy_mode"' in line:
                    break
            else:
                self.fail("the agent exited (%s) without entering deploy mode" % p.wait())
            self.assertIsNone(p.poll())
        finally:
            p.terminate()
            p.wait(timeout=20)
            shutil.rmtree(sd, ignore_errors=True)

    def test_bad_labels(self):
        r = self.run_agent("--upstream", "http://127.0.0.1:1", "--upstream-model", "m",
                           "--labels", "a=b,c")
        self.assertEqual(r.returncode, 2)
        self.assertIn("labels", r.stderr)

    def test_bad_server_url(self):
        r = self.run_agent("--server", "ftp://x", "--upstream", "http://127.0.0.1:1",
                           "--upstream-model", "m")
        self.assertEqual(r.returncode, 2)
        self.assertIn("server", r.stderr)

    def test_env_beats_flag_in_print_config(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env["GPUPOOL_SLOTS"] = "7"
        if not os.access(harness.AGENT_BIN, os.X_OK):
            self.skipTest("agent not built")
        r = subprocess.run([harness.AGENT_BIN, "--slots", "2", "--print-config"], capture_output=True,
                           text=True, timeout=20, env=env)
        self.assertEqual(r.returncode, 0)
        line = [l for l in r.stdout.splitlines() if l.startswith("slots")][0]
        self.assertIn("7", line)
        self.assertIn("env", line)

    def test_gguf_without_engine_backend_says_so(self):
        r = self.run_agent("--model", "/nonexistent.gguf", "--state-dir", "/tmp/gp-a1-never")
        self.assertEqual(r.returncode, 2)
        self.assertTrue("gguf" in r.stderr or "model" in r.stderr, r.stderr)


if __name__ == "__main__":
    harness.main()
