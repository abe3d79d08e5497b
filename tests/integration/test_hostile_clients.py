"""Hostile and careless clients (issue 9, findings 5, 10-13): a real server
on 127.0.0.1:0 with a real SQLite file and fake agents (server_fakes.py).

- outcome labels: an error code an agent invents does not become a
  requests_total{outcome} label value (one closed table, "agent_error");
- validation: limits named in the message (prefer_agent), Anthropic
  tool_choice, OpenAI empty stop sequences, control bytes in query values,
  admin key names with control characters;
- tasks made while auth was off are admin-only once auth is on (restart
  between, the task restored in memory and one read from the store);
- SSE backpressure: see test_backpressure.py.
"""

import os
import re
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
ANTH = {"model": "m1", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}



in_thread = harness.in_thread


CTL_BIN = os.environ.get("GPUPOOL_CTL_BIN") or os.path.join(harness.BUILD_DIR, "src", "ctl",
                                                             "gpupoolctl")


class HostileClients(harness.TestCase):
    NEEDS = (harness.SERVER_BIN, CTL_BIN)

    def agent(self, srv, key=None):
        a = FakeAgent(srv.url, key=key)
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        srv.wait_model("m1", key=srv.key)
        return a

    def post(self, srv, path, body, headers=None):
        return harness.post_json(srv.url, path, body, headers)

    # -- finding 13 ------------------------------------------------------
    def test_agent_error_codes_do_not_grow_metrics_labels(self):
        srv = self.h.start_server()
        a = self.agent(srv)
        codes = []
        for path, body in (("/v1/chat/completions", CHAT),
                           ("/v1/chat/completions", dict(CHAT, stream=True)),
                           ("/v1/messages", ANTH)):
            code = "X_%s" % uuid.uuid4().hex[:12]
            codes.append(code)
            get = in_thread(harness.http_request, "POST", srv.url + path, body)
            st, jobs = a.work(1, timeout=30)
            self.assertEqual((st, len(jobs)), (200, 1))
            a.events(jobs[0]["job_id"], [{"type": "started"},
                                         {"type": "error", "code": code, "message": "boom"}])
            st, _, raw = get(60)
            self.assertIn(b"boom", raw)
            if path.startswith("/v1/chat"):
                # The client still sees the agent's code: only the label is closed.
                self.assertIn(code.lower(), raw.decode().lower())
        # A submit refusal keeps its own (server-defined) code.
        st, _, _ = self.post(srv, "/v1/chat/completions", dict(CHAT, model="nope"))
        self.assertEqual(st, 404)
        st, _, text = harness.http_request("GET", srv.url + "/metrics")
        text = text.decode()
        self.assertEqual(st, 200)
        for code in codes:
            self.assertNotIn(code.lower(), text.lower())
        outcomes = set(re.findall(r'gpupool_requests_total\{[^}]*outcome="([^"]*)"', text))
        self.assertIn("agent_error", outcomes)
        self.assertIn("model_not_found", outcomes)
        self.assertTrue(outcomes <= {"ok", "agent_error", "model_not_found"}, outcomes)

    # -- finding 12 ------------------------------------------------------
    def test_validation_names_the_field_and_the_limit(self):
        srv = self.h.start_server()
        self.agent(srv)
        st, _, b = self.post(srv, "/v1/chat/completions",
                             dict(CHAT, x_pool_options={"prefer_agent": "a" * 100000}))
        self.assertEqual(st, 400, b)
        self.assertEqual(b["error"]["param"], "x_pool_options.prefer_agent")
        self.assertIn("256 bytes", b["error"]["message"])
        # OpenAI: an empty stop sequence (alone or in an array) is refused.
        for stop in ("", ["a", ""], "s" * 5000):
            st, _, b = self.post(srv, "/v1/chat/completions", dict(CHAT, stop=stop))
            self.assertEqual(st, 400, (stop if len(stop) < 10 else "long", b))
            self.assertEqual(b["error"]["param"], "stop")
            self.assertEqual(b["error"]["type"], "invalid_request_error")
        st, _, b = self.post(srv, "/v1/completions", {"model": "m1", "prompt": "x", "stop": ""})
        self.assertEqual((st, b["error"]["param"]), (400, "stop"))
        # Native tasks: the same for stop.
        st, _, b = self.post(srv, "/v2/tasks", {"model": "m1", "prompt": "x", "max_tokens": 4,
                                                "stop": ""})
        self.assertEqual(st, 400, b)
        # Anthropic tool_choice: unknown type, or a tool choice without a name.
        tools = [{"name": "f", "input_schema": {"type": "object"}}]
        for tc in ({"type": "bogus"}, {"type": "tool"}, {"type": "tool", "name": ""}, {}):
            st, _, b = self.post(srv, "/v1/messages", dict(ANTH, tools=tools, tool_choice=tc))
            self.assertEqual(st, 400, (tc, b))
            self.assertEqual(b["type"], "error")
            self.assertEqual(b["error"]["type"], "invalid_request_error")
            self.assertIn("tool_choice", b["error"]["message"])
        # ... also without tools: the field is still validated.
        st, _, b = self.post(srv, "/v1/messages", dict(ANTH, tool_choice={"type": "bogus"}))
        self.assertEqual(st, 400, b)
        # Control bytes in query values: no silent cut at %00.
        for path in ("/admin/jobs?model=x%00y", "/admin/jobs?status=done%0a",
                     "/admin/keys?role=client%00x"):
            st, _, b = harness.http_json("GET", srv.url + path)
            self.assertEqual(st, 400, (path, b))
            self.assertIn("control characters", b["error"]["message"])
        st, _, b = harness.http_json("GET", srv.url + "/admin/jobs?model=x")
        self.assertEqual(st, 200, b)
        # Key names: printable UTF-8 only, the field named.
        for name in ("\x1b[2J\x1b[31mowned", "a\nb", "\u0085x", "ok\x7f"):
            st, _, b = self.post(srv, "/admin/keys", {"role": "client", "name": name})
            self.assertEqual(st, 400, (name, b))
            self.assertIn("'name'", b["error"]["message"])
        st, _, b = self.post(srv, "/admin/keys", {"role": "client", "name": "caf\u00e9 \u2713"})
        self.assertEqual(st, 201, b)

    def test_last_event_id_query_with_control_bytes(self):
        srv = self.h.start_server()
        st, _, b = harness.http_json("GET", srv.url + "/v2/tasks/job_x/events?last_event_id=1%00")
        self.assertEqual(st, 400, b)

    # -- finding 11 ------------------------------------------------------
    def test_tasks_made_with_auth_off_are_admin_only_after(self):
        db = self.h.path("ownerless.db")
        srv = self.h.start_server([], db=db)
        a = self.agent(srv)
        # A: finished before the restart (read back from the store).
        st, _, ta = self.post(srv, "/v2/tasks", {"model": "m1", "prompt": "secret A",
                                                 "max_tokens": 4})
        self.assertEqual(st, 202, ta)
        st, jobs = a.work(1, timeout=30)
        self.assertEqual(st, 200)
        a.run_job(jobs[0], tokens=["x"])
        harness.wait_until(lambda: harness.http_json("GET", srv.url + "/v2/tasks/" +
                                                     ta["job_id"])[2]["status"] == "done",
                           timeout=30, what="task A done")
        # B: still queued at the restart (restored into memory).
        st, _, tb = self.post(srv, "/v2/tasks", {"model": "m1", "prompt": "secret B",
                                                 "max_tokens": 4})
        self.assertEqual(st, 202, tb)
        srv.stop()
        client = self.h.create_key(db, "client", "c")
        admin = self.h.create_key(db, "admin", "ops")
        srv2 = self.h.start_server([], db=db, name="server2", key=client)
        for tid in (ta["job_id"], tb["job_id"]):
            for method, suffix in (("GET", ""), ("GET", "/events"), ("DELETE", "")):
                st, _, body = harness.http_request(method, srv2.url + "/v2/tasks/" + tid + suffix,
                                                   headers=harness.bearer(client))
                self.assertEqual(st, 404, (tid, method, suffix, body))
                self.assertIn(b"JOB_NOT_FOUND", body)
            st, _, s = harness.http_json("GET", srv2.url + "/v2/tasks/" + tid,
                                         headers=harness.bearer(admin))
            self.assertEqual(st, 200, s)
        # The client's DELETE did not cancel B.
        st, _, s = harness.http_json("GET", srv2.url + "/v2/tasks/" + tb["job_id"],
                                     headers=harness.bearer(admin))
        self.assertEqual(s["status"], "queued", s)


    # -- finding 10 ------------------------------------------------------
    def test_ctl_escapes_names_on_output(self):
        # A name with terminal controls that got into the database (an old
        # server, or a path that did not validate): every gpupoolctl text
        # output shows it escaped, never a raw ESC/BEL/C1 byte.
        db = self.h.path("ctl.db")
        admin = self.h.create_key(db, "admin", "ops")
        self.h.create_key(db, "client", "placeholder")
        evil = "x\x1b]0;pwned\x07\x1b[2J\u009b31m"
        self.h.execute(db, "UPDATE api_keys SET name = ? WHERE name = 'placeholder'", (evil,))
        srv = self.h.start_server([], db=db, key=admin)
        env = dict(self.h.env(), GPUPOOL_SERVER=srv.url, GPUPOOL_ADMIN_KEY=admin)
        outs = []
        for args in (["keys", "list"], ["keys", "list", "--json"]):
            r = subprocess.run([CTL_BIN] + args, capture_output=True, timeout=60, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            outs.append(r.stdout)
            for bad in (b"\x1b", b"\x07", b"\xc2\x9b"):
                self.assertNotIn(bad, r.stdout + r.stderr, args)
        self.assertIn(b"x\\x1B]0;pwned\\x07\\x1B[2J\\xC2\\x9B31m", outs[0])
        self.assertIn(b"x\\u001B]0;pwned\\u0007", outs[1])


if __name__ == "__main__":
    harness.main()
