"""Token-exact failover with real processes: gpupool-server and gguf agents
on the bundled models/stories260K.gguf (issue 10, item 4).

Two agents serve the same file (two copies: equal by digest, not by path).
A request is run once uninterrupted; then the same request is sent to agent
A, which is killed -9 after the client has read N token chunks, and the
stream goes on on agent B. The final text must be byte-identical to the
uninterrupted one, for a greedy chat and a seeded sampled completion, for
several N, and x_pool_meta says `continuation: "tokens"`.

Killing "after N chunks" is event-based, not timed: agent A runs with the
test hook GPUPOOL_TEST_TOKEN_GATE=FILE (backend_gguf_engine.c), so it samples at
most as many tokens of a job as FILE says and then waits; the test kills it
once the client has read those N chunks, while it waits.

A third agent serving a different file (same model, other bytes: another
digest) gets a text continuation, and the native `failover` event and
x_pool_meta say so.
"""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5"]
OPEN = "999999"   # gate value that never holds anything back


def gguf_built():
    import subprocess
    r = subprocess.run([harness.AGENT_BIN, "--model", "/nonexistent/x.gguf", "--state-dir",
                        "/nonexistent", "--server", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=30)
    return "not built" not in (r.stdout + r.stderr)


class GatedAgent(harness.Agent):
    """An agent whose gguf backend waits at the token count in gate_file."""

    def __init__(self, h, name, server, args, state_dir, gate_file):
        self.state_dir = state_dir
        argv = [harness.AGENT_BIN, "--server", server.url, "--state-dir", state_dir,
                "--name", name] + list(args)
        env = h.env()
        env["GPUPOOL_TEST_TOKEN_GATE"] = gate_file
        harness.Proc.__init__(self, name, argv, os.path.join(h.tmp, name + ".log"), env=env)


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


CHAT = {"model": "tiny", "stream": True, "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me a story about a cat"}]}
SAMPLED = {"model": "tiny", "stream": True, "max_tokens": 60, "temperature": 0.9,
           "top_p": 0.9, "top_k": 40, "seed": 4242, "prompt": "Once upon a time"}


def chunk_text(d, chat):
    out = ""
    for c in d.get("choices") or []:
        out += ((c.get("delta") or {}).get("content") or "") if chat else (c.get("text") or "")
    return out


class TokenFailoverTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.srv = self.h.start_server(FAST)
        # Two copies of one file: the same digest from different paths.
        self.file_a = self.h.path("a.gguf")
        self.file_b = self.h.path("b.gguf")
        shutil.copyfile(MODEL, self.file_a)
        shutil.copyfile(MODEL, self.file_b)
        self.gate = self.h.path("gate")
        write_atomic(self.gate, OPEN)

    def agent(self, path, gated=False):
        # slots 2: a busy agent still has a parked long-poll, whose close
        # marks it suspect at once when it dies.
        args = ["--slots", "2", "--log-level", "debug", "--alias", "tiny",
                "--model", path, "--threads", "1"]
        name = self.h._name("agent")
        if gated:
            a = GatedAgent(self.h, name, self.srv, args, self.h.path(name + ".state"), self.gate)
        else:
            a = harness.Agent(self.h, name, self.srv, args, self.h.path(name + ".state"))
        self.h.procs.append(a)
        aid = a.agent_id()
        harness.wait_until(lambda: self.healthy(aid), timeout=30, what="agent healthy")
        return a, aid

    def healthy(self, aid):
        return any(e.get("agent_id") == aid and e.get("to") == "healthy"
                   for e in self.srv.log_events("agent_state"))

    def wait_parked(self, n):
        self.srv.wait_parked(n)

    def run_stream(self, body, chat, prefer=None, kill=None, n_kill=0, kill_at_len=None,
                   chunks=None):
        """Stream body; with kill, kill -9 that agent once n_kill chunks with
        text were read (or, with kill_at_len, once that many bytes were).
        Returns (text, x_pool_meta of the last chunk); chunks (a list) gets
        each chunk's text and finish_reason."""
        body = dict(body)
        if prefer:
            body["x_pool_options"] = {"prefer_agent": prefer}
        url = self.srv.url + ("/v1/chat/completions" if chat else "/v1/completions")
        s = harness.SSEStream("POST", url, body, timeout=120)
        self.assertEqual(s.status, 200)
        text, n, meta = "", 0, None
        while True:
            e = s.next_event(timeout=60)
            self.assertIsNotNone(e, "stream ended without [DONE]")
            if e["data"] == "[DONE]":
                break
            d = json.loads(e["data"])
            self.assertNotIn("error", d, d)
            t = chunk_text(d, chat)
            if d.get("x_pool_meta"):
                meta = d["x_pool_meta"]
            if chunks is not None:
                chunks += [(t, c.get("finish_reason")) for c in d.get("choices") or []]
            if t:
                text += t
                n += 1
                if kill is not None and kill_at_len is None and n == n_kill:
                    kill.kill9()
                if kill is not None and kill_at_len is not None and \
                        len(text.encode()) == kill_at_len:
                    kill.kill9()
        s.close()
        return text, meta

    def test_same_file_continues_token_exact(self):
        a, ida = self.agent(self.file_a, gated=True)
        b, idb = self.agent(self.file_b)
        digests = [e for e in a.log_events("model_digest")] + \
                  [e for e in b.log_events("model_digest")]
        self.assertEqual(len(digests), 2, digests)
        self.wait_parked(2)
        base_chat, _ = self.run_stream(CHAT, True, prefer=idb)
        base_smp, _ = self.run_stream(SAMPLED, False, prefer=idb)
        # the runs must be long enough for every kill point
        self.assertGreater(len(base_chat), 60)
        self.assertGreater(len(base_smp), 60)
        results = []
        for n in (1, 7, 30):
            for chat, body, base in ((True, CHAT, base_chat), (False, SAMPLED, base_smp)):
                write_atomic(self.gate, str(n))
                self.wait_parked(2)
                text, meta = self.run_stream(body, chat, prefer=ida, kill=a, n_kill=n)
                results.append((n, "chat" if chat else "sampled", text == base,
                                meta.get("continuation")))
                self.assertEqual(meta["attempts"], 2, meta)
                self.assertEqual(meta["agent_id"], idb, meta)
                # a new gated agent for the next case
                write_atomic(self.gate, OPEN)
                a, ida = self.agent(self.file_a, gated=True)
        print("(N, request, byte-identical, continuation):", results)
        self.assertEqual([r[2:] for r in results], [(True, "tokens")] * 6, results)
        fo = self.srv.log_events("job_failover")
        self.assertEqual([e.get("mode") for e in fo], ["continue"] * 6)

    def test_stop_string_straddling_the_junction(self):
        # The stop string starts with the last character of token k's
        # text: agent A emits token k's text but that character, holds it
        # back, and waits at the gate (k tokens). Killed there, agent B must
        # start with that held character in its stop matcher (primed from
        # the ids) to find the stop string across the junction.
        a, ida = self.agent(self.file_a, gated=True)
        b, idb = self.agent(self.file_b)
        self.wait_parked(2)
        body = {"model": "tiny", "stream": True, "max_tokens": 60, "temperature": 0,
                "prompt": "Once upon a time"}
        chunks = []
        base, _ = self.run_stream(body, False, prefer=idb, chunks=chunks)
        pieces = [t for t, _ in chunks if t]
        k = next(i for i in range(8, len(pieces) - 1)
                 if len(pieces[i - 1]) >= 2 and pieces[i].strip())
        at = len("".join(pieces[:k])) - 1           # where the stop string starts
        stop = base[at:at + 1] + pieces[k]
        self.assertEqual(base.find(stop), at, (stop, base))
        body["stop"] = [stop]
        chunks = []
        whole, _ = self.run_stream(body, False, prefer=idb, chunks=chunks)
        self.assertEqual(whole, base[:at])
        write_atomic(self.gate, str(k))
        self.wait_parked(2)
        chunks = []
        text, meta = self.run_stream(body, False, prefer=ida, kill=a,
                                     kill_at_len=len(base[:at].encode()), chunks=chunks)
        self.assertEqual(meta["continuation"], "tokens", meta)
        self.assertEqual(meta["agent_id"], idb, meta)
        self.assertEqual(text, base[:at])
        self.assertEqual([f for _, f in chunks if f], ["stop"])

    def test_other_file_falls_back_to_text(self):
        other = self.h.path("c.gguf")
        shutil.copyfile(MODEL, other)
        with open(other, "ab") as f:
            f.write(b"other bytes, other digest")
        a, ida = self.agent(self.file_a, gated=True)
        c, idc = self.agent(other)
        self.wait_parked(2)
        write_atomic(self.gate, "5")
        st, _, r = http_json("POST", self.srv.url + "/v2/tasks",
                             {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 40,
                              "temperature": 0, "x_pool_options": {"prefer_agent": ida}},
                             timeout=10)
        self.assertEqual(st, 202, r)
        s = harness.SSEStream("GET", self.srv.url + "/v2/tasks/%s/events" % r["job_id"],
                              timeout=120)
        n, evs = 0, []
        while True:
            e = s.next_event(timeout=60)
            self.assertIsNotNone(e)
            evs.append((e["event"], json.loads(e["data"])))
            if e["event"] == "token":
                n += 1
                if n == 5:
                    a.kill9()
            if e["event"] in ("end", "error"):
                break
        s.close()
        types = [t for t, _ in evs]
        self.assertEqual(types[-1], "end", evs)
        fo = [d for t, d in evs if t == "failover"]
        self.assertEqual(len(fo), 1, types)
        self.assertEqual(fo[0]["continuation"], "text")
        st, _, task = http_json("GET", self.srv.url + "/v2/tasks/" + r["job_id"])
        self.assertEqual(task["x_pool_meta"]["continuation"], "text", task)
        self.assertEqual(task["x_pool_meta"]["agent_id"], idc)


if __name__ == "__main__":
    harness.main()
