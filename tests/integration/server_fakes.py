"""Fake agents for the server integration tests (test_server_*.py).

A FakeAgent speaks the agent protocol (docs/protocol.md) directly over HTTP
with the standard library, so the server can be tested without the real
agent: register/heartbeat, park a long-poll, upload events, drop a
connection on purpose. Every network call has a timeout; every loop is
bounded.
"""

import http.client
import json
import threading
import time
import uuid


class FakeAgent:
    def __init__(self, url, models=("m1",), slots=1, key=None, name=None, agent_id=None,
                 labels=None):
        host, port = url.replace("http://", "").split(":")
        self.host, self.port = host, int(port)
        self.models = list(models)
        self.slots = slots
        self.key = key
        self.labels = dict(labels or {})
        self.agent_id = agent_id or str(uuid.uuid4())
        self.name = name or ("fake-" + self.agent_id[:8])
        self.work_conn = None
        self.seq = {}          # job_id -> events sent
        self.stop_flag = threading.Event()
        self.thread = None
        self.jobs_seen = []    # job objects received (thread mode)
        self.cancelled = []    # job ids told cancel:true
        self.lock = threading.Lock()

    # -- raw protocol ------------------------------------------------------
    def _headers(self):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = "Bearer " + self.key
        return h

    def _post(self, path, body, timeout=10.0, conn=None):
        own = conn is None
        c = conn or http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request("POST", path, body=json.dumps(body), headers=self._headers())
            r = c.getresponse()
            data = r.read()
            try:
                parsed = json.loads(data) if data else None
            except ValueError:
                parsed = data
            return r.status, parsed
        finally:
            if own:
                c.close()

    def poll_body(self, busy=0, status="online"):
        return {
            "agent_id": self.agent_id, "name": self.name, "version": "0.0-fake",
            "platform": "test", "gpus": [],
            "models": [{"id": m, "aliases": [], "loaded": True, "context_length": 512}
                       for m in self.models],
            "slots": {"total": self.slots, "busy": busy}, "queue_depth": 0,
            "kv_cache_utilization": 0.0, "labels": self.labels, "status": status,
        }

    def poll(self, **kw):
        return self._post("/agents/poll", self.poll_body(**kw))

    def work(self, free_slots=1, timeout=30.0):
        """Blocking long-poll on a dedicated connection (kept in
        self.work_conn so a test can drop it). Returns (status, jobs)."""
        self.work_conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            st, body = self._post("/agents/work", {"agent_id": self.agent_id,
                                                    "free_slots": free_slots},
                                  conn=self.work_conn)
        finally:
            try:
                self.work_conn.close()
            except Exception:
                pass
        return st, (body or {}).get("jobs", []) if isinstance(body, dict) else []

    def start_work_async(self, free_slots=1):
        """Send a long-poll request and return without reading the reply:
        the request is parked on the server. drop_work() then closes it."""
        self.work_conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        self.work_conn.request("POST", "/agents/work",
                               body=json.dumps({"agent_id": self.agent_id,
                                                "free_slots": free_slots}),
                               headers=self._headers())

    def finish_work_async(self):
        r = self.work_conn.getresponse()
        data = r.read()
        self.work_conn.close()
        body = json.loads(data) if data else {}
        return r.status, body.get("jobs", [])

    def drop_work(self):
        self.work_conn.sock.close() if self.work_conn.sock else None
        self.work_conn.close()

    def events(self, job_id, events, seq=None):
        s = self.seq.get(job_id, 0) if seq is None else seq
        st, body = self._post("/agents/jobs/%s/events" % job_id,
                              {"agent_id": self.agent_id, "seq": s, "events": events})
        if st == 200 and seq is None:
            self.seq[job_id] = s + len(events)
        return st, body

    def run_job(self, job, tokens=("Hello", " world"), finish="stop", delay=0.0):
        """Stream a whole job: started, tokens, end. Returns the last reply."""
        st, body = self.events(job["job_id"], [{"type": "started"}])
        for t in tokens:
            if delay:
                time.sleep(delay)
            st, body = self.events(job["job_id"], [{"type": "token", "text": t}])
            if st != 200 or body.get("cancel"):
                return st, body
        return self.events(job["job_id"], [{"type": "end", "finish_reason": finish,
                                            "usage": {"prompt_tokens": 3,
                                                      "completion_tokens": len(tokens)}}])

    # -- background mode ---------------------------------------------------
    def start(self, tokens=("Hello", " world"), delay=0.0, work_timeout=30.0):
        """Poll once, then loop: long-poll, run each job, repeat (thread)."""
        st, _ = self.poll()
        assert st == 200, "poll failed: %s" % st

        def loop():
            last_poll = time.time()
            deadline = time.time() + 300
            while not self.stop_flag.is_set() and time.time() < deadline:
                if time.time() - last_poll > 0.5:
                    try:
                        self.poll()
                    except OSError:
                        pass
                    last_poll = time.time()
                try:
                    st, jobs = self.work(self.slots, timeout=work_timeout)
                except OSError:
                    if self.stop_flag.is_set():
                        return
                    time.sleep(0.1)
                    continue
                for j in jobs:
                    with self.lock:
                        self.jobs_seen.append(j)
                    st, body = self.run_job(j, tokens=tokens, delay=delay)
                    if isinstance(body, dict) and body.get("cancel"):
                        with self.lock:
                            self.cancelled.append(j["job_id"])
                if st not in (200, 204):
                    time.sleep(0.1)
        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.stop_flag.set()
        try:
            if self.work_conn is not None and self.work_conn.sock is not None:
                self.work_conn.sock.shutdown(2)
        except OSError:
            pass
        if self.thread:
            self.thread.join(timeout=10)
