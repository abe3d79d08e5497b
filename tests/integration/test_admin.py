"""The admin API (/admin/*) and gpupoolctl against a real server and agent.

Keys: create (limits, enrollment tokens), list (never a hash), PATCH limits,
revoke (idempotent; the revoked key then gets 401); a client key gets 403 on
/admin/*. Agents: list with models and slots, drain/undrain, remove (409
AGENT_BUSY while a job runs). Jobs: list with filters and show, from the
store. Status. Bad input gets the native error shape. Then the same through
the gpupoolctl binary: tables, --json, the key from the state dir, exit codes.
"""

import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CTL_BIN = os.environ.get("GPUPOOL_CTL_BIN") or os.path.join(harness.BUILD_DIR, "src", "ctl",
                                                            "gpupoolctl")
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Admin(harness.TestCase):
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN, CTL_BIN)

    def setUp(self):
        super().setUp()
        self.db = self.h.path("admin.db")
        self.admin = self.h.create_key(self.db, "admin", "ops")
        self.agent_key = self.h.create_key(self.db, "agent", "box")

    # -------------------------------------------------------------- helpers
    def start(self, upstream_args=()):
        self.srv = self.h.start_server(["--poll_interval_sec", "1"], db=self.db)
        self.up = self.h.start_upstream(list(upstream_args))
        self.ag = self.h.start_agent(self.srv, upstream=self.up, model="m1",
                                     token=self.agent_key)
        self.agent_id = self.ag.agent_id()

    def api(self, method, path, body=None, key=None, raw=None):
        hdr = harness.bearer(self.admin if key is None else key)
        if raw is not None:
            hdr["Content-Type"] = "application/json"
            return harness.http_json(method, self.srv.url + path, raw, hdr, timeout=30)[::2]
        return harness.http_json(method, self.srv.url + path, body, hdr, timeout=30)[::2]

    def assert_error(self, st_body, status, code, param=None):
        st, body = st_body
        self.assertEqual(st, status, body)
        self.assertIsInstance(body, dict, body)
        err = body["error"]
        self.assertEqual(err["code"], code, body)
        self.assertTrue(err["message"])
        self.assertTrue(err["correlation_id"])
        if param:
            self.assertIn(param, err["message"] + json.dumps(err.get("details", {})))

    def agent(self, agent_id):
        st, body = self.api("GET", "/admin/agents")
        self.assertEqual(st, 200, body)
        for a in body["agents"]:
            if a["id"] == agent_id:
                return a
        return None

    def ctl(self, *args, env=None, key=True):
        e = self.h.env()
        e["GPUPOOL_SERVER"] = self.srv.url
        if key:
            e["GPUPOOL_ADMIN_KEY"] = self.admin
        e.update(env or {})
        r = subprocess.run([CTL_BIN] + list(args), capture_output=True, text=True, timeout=60,
                           env=e)
        for m in self.h.SANITIZER_MARKS:
            self.assertNotIn(m, r.stderr)
        return r

    # ---------------------------------------------------------------- keys
    def test_keys_api(self):
        self.srv = self.h.start_server(db=self.db)
        st, body = self.api("POST", "/admin/keys",
                            {"role": "client", "name": "ci", "rpm": 100, "tokens_per_day": 5000,
                             "max_concurrent": 3, "expires_in_sec": 3600})
        self.assertEqual(st, 201, body)
        kid, key = body["id"], body["key"]
        self.assertTrue(key.startswith("gpk_") and len(key) == 68)
        self.assertEqual(body["limits"], {"rpm": 100, "tokens_per_day": 5000,
                                          "max_concurrent": 3})
        self.assertIsInstance(body["expires_at"], int)

        st, body = self.api("GET", "/admin/keys")
        self.assertEqual(st, 200, body)
        self.assertNotIn("hash", json.dumps(body))
        self.assertNotIn(key, json.dumps(body))
        mine = [k for k in body["keys"] if k["id"] == kid][0]
        self.assertEqual(mine["role"], "client")
        self.assertEqual(mine["name"], "ci")
        self.assertIsNone(mine["revoked_at"])
        self.assertEqual(mine["limits"]["max_concurrent"], 3)
        self.assertIn("requests", mine["usage_today"])
        st, body = self.api("GET", "/admin/keys?role=admin")
        self.assertEqual([k["role"] for k in body["keys"]], ["admin"])
        self.assert_error(self.api("GET", "/admin/keys?role=root"), 400, "INVALID_REQUEST",
                          "role")

        # The client key works on client routes and is refused on /admin/*.
        st, _ = self.api("GET", "/v1/models", key=key)
        self.assertEqual(st, 200)
        for path in ("/admin/keys", "/admin/status", "/admin/agents", "/admin/jobs"):
            st, body = self.api("GET", path, key=key)
            self.assertEqual(st, 403, (path, body))
            self.assertTrue(body["error"]["code"] and body["error"]["correlation_id"])
        self.assertEqual(self.api("GET", "/admin/status", key="")[0], 401)

        st, body = self.api("PATCH", "/admin/keys/" + kid, {"rpm": 7})
        self.assertEqual(st, 200, body)
        self.assertEqual(body["limits"], {"rpm": 7, "tokens_per_day": 5000, "max_concurrent": 3})

        st, body = self.api("DELETE", "/admin/keys/" + kid)
        self.assertEqual((st, body), (200, {"id": kid, "revoked": True}))
        st, body = self.api("DELETE", "/admin/keys/" + kid)       # idempotent
        self.assertEqual((st, body), (200, {"id": kid, "revoked": True}))
        self.assertEqual(self.api("GET", "/v1/models", key=key)[0], 401)
        st, body = self.api("GET", "/admin/keys")
        self.assertIsInstance([k for k in body["keys"] if k["id"] == kid][0]["revoked_at"], int)

        # Enrollment tokens carry max_uses.
        st, body = self.api("POST", "/admin/keys", {"role": "enrollment", "max_uses": 2})
        self.assertEqual(st, 201, body)
        self.assertEqual(body["max_uses"], 2)

    def test_bad_input(self):
        self.srv = self.h.start_server(db=self.db)
        self.assert_error(self.api("POST", "/admin/keys", raw="{not json"), 400,
                          "INVALID_REQUEST")
        self.assert_error(self.api("POST", "/admin/keys", raw="[1,2]"), 400, "INVALID_REQUEST")
        self.assert_error(self.api("POST", "/admin/keys", {"role": "root"}), 400,
                          "INVALID_REQUEST", "role")
        self.assert_error(self.api("POST", "/admin/keys", {"name": "x"}), 400,
                          "INVALID_REQUEST", "role")
        for field, value in (("rpm", "10"), ("rpm", -1), ("tokens_per_day", 1.5),
                             ("max_concurrent", True), ("expires_in_sec", -5), ("name", 3)):
            self.assert_error(self.api("POST", "/admin/keys", {"role": "client", field: value}),
                              400, "INVALID_REQUEST", field)
        self.assert_error(self.api("PATCH", "/admin/keys/key_000000000000000000000000",
                                   {"rpm": 1}), 404, "KEY_NOT_FOUND")
        self.assert_error(self.api("DELETE", "/admin/keys/key_000000000000000000000000"), 404,
                          "KEY_NOT_FOUND")
        st, body = self.api("POST", "/admin/keys", {"role": "client"})
        self.assert_error(self.api("PATCH", "/admin/keys/" + body["id"], {}), 400,
                          "INVALID_REQUEST")
        self.assert_error(self.api("PATCH", "/admin/keys/" + body["id"], {"rpm": "fast"}), 400,
                          "INVALID_REQUEST", "rpm")
        self.assert_error(self.api("POST", "/admin/agents/nope/drain"), 404, "AGENT_NOT_FOUND")
        self.assert_error(self.api("DELETE", "/admin/agents/nope"), 404, "AGENT_NOT_FOUND")
        self.assert_error(self.api("GET", "/admin/jobs/job_nope"), 404, "JOB_NOT_FOUND")
        self.assert_error(self.api("GET", "/admin/jobs?limit=0"), 400, "INVALID_REQUEST",
                          "limit")
        self.assert_error(self.api("GET", "/admin/jobs?limit=1001"), 400, "INVALID_REQUEST",
                          "limit")
        self.assert_error(self.api("GET", "/admin/jobs?before=x"), 400, "INVALID_REQUEST",
                          "before")
        self.assertEqual(self.api("PUT", "/admin/keys")[0], 405)

    # ---------------------------------------------------- agents, jobs, status
    def test_agents_jobs_status(self):
        self.start(["--first-delay-ms", "4000"])
        self.srv.wait_model("m1", key=self.admin)
        a = harness.wait_until(lambda: (self.agent(self.agent_id) or {}).get("state") ==
                               "healthy" and self.agent(self.agent_id), timeout=20,
                               what="agent healthy")
        self.assertEqual([m["id"] for m in a["models"]], ["m1"])
        self.assertGreaterEqual(a["slots_total"], 1)
        self.assertIsInstance(a["last_seen"], int)
        self.assertIsInstance(a["gpus"], list)

        # A job in flight: the agent cannot be removed without force.
        out = {}

        def chat():
            out["r"] = harness.http_json("POST", self.srv.url + "/v1/chat/completions", CHAT,
                                         harness.bearer(self.admin), timeout=60)
        t = threading.Thread(target=chat, daemon=True)
        t.start()
        harness.wait_until(lambda: self.agent(self.agent_id)["jobs_running"] == 1, timeout=20,
                           what="job running on the agent")
        self.assert_error(self.api("DELETE", "/admin/agents/" + self.agent_id), 409,
                          "AGENT_BUSY")
        st, body = self.api("GET", "/admin/status")
        self.assertEqual(st, 200, body)
        self.assertEqual(body["jobs_active"], 1)
        t.join(60)
        self.assertFalse(t.is_alive())
        st, _, reply = out["r"]
        self.assertEqual(st, 200, reply)

        # The request log: list (async store read) and show.
        def listed():
            st, body = self.api("GET", "/admin/jobs?status=done&model=m1&agent=" + self.agent_id)
            return st == 200 and body["jobs"] and body
        body = harness.wait_until(listed, timeout=10, what="job in the request log")
        j = body["jobs"][0]
        self.assertEqual(j["model"], "m1")
        self.assertEqual(j["agent_id"], self.agent_id)
        self.assertEqual(j["status"], "done")
        st, one = self.api("GET", "/admin/jobs/" + j["id"])
        self.assertEqual(st, 200, one)
        self.assertEqual(one["id"], j["id"])
        self.assertEqual(one["status"], "done")
        st, body = self.api("GET", "/admin/jobs?model=other")
        self.assertEqual((st, body["jobs"]), (200, []))
        st, body = self.api("GET", "/admin/jobs?limit=1")
        self.assertEqual(len(body["jobs"]), 1)
        self.assertEqual(body["next_before"], body["jobs"][0]["created_at"])
        st, body = self.api("GET", "/admin/jobs?before=%d" % body["next_before"])
        self.assertEqual(body["jobs"], [])

        st, body = self.api("GET", "/admin/status")
        self.assertEqual(st, 200, body)
        self.assertEqual(body["agents"]["healthy"], 1)
        self.assertGreaterEqual(body["slots"]["total"], 1)
        self.assertTrue(body["auth"])
        self.assertIn("requests_per_min", body["throughput"])
        harness.wait_until(lambda: self.api("GET", "/admin/status")[1]["throughput"]
                           ["requests_per_min"] > 0, timeout=10, what="throughput counted")

        # Drain and undrain.
        st, body = self.api("POST", "/admin/agents/%s/drain" % self.agent_id)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["state"], "draining")
        self.assertTrue(body["admin_drain"])
        # The agent has been told (its next poll reply carried the command):
        # an undrain must still take effect (the agent used to keep
        # reporting "draining" from then on, so it stayed drained forever).
        harness.wait_until(lambda: self.ag.log_events("drain"), timeout=60,
                           what="agent told to drain")
        st, body = self.api("POST", "/admin/agents/%s/drain" % self.agent_id, {"on": False})
        self.assertEqual(st, 200, body)
        self.assertFalse(body["admin_drain"])
        # Healthy at once, or after the agent's next poll when it had meanwhile
        # reported the drain it was told (a loaded machine): waited for, not
        # assumed.
        harness.wait_until(lambda: self.agent(self.agent_id)["state"] == "healthy", timeout=60,
                           what="agent healthy after undrain")
        self.assert_error(self.api("POST", "/admin/agents/%s/drain" % self.agent_id,
                                   {"on": "no"}), 400, "INVALID_REQUEST", "on")

        # Remove: stop the agent first (a live one registers again at its next poll).
        self.ag.stop()
        st, body = self.api("DELETE", "/admin/agents/" + self.agent_id)
        self.assertEqual((st, body), (200, {"id": self.agent_id, "removed": True}))
        self.assertIsNone(self.agent(self.agent_id))
        self.assert_error(self.api("DELETE", "/admin/agents/" + self.agent_id), 404,
                          "AGENT_NOT_FOUND")

    # ------------------------------------------------------------ gpupoolctl
    def test_ctl(self):
        self.start()
        self.srv.wait_model("m1", key=self.admin)

        r = self.ctl("keys", "create", "--role", "client", "--name", "bob", "--rpm", "5",
                     "--expires-in", "30d")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 1, r.stdout)
        client_key = lines[0]
        self.assertTrue(client_key.startswith("gpk_"))
        self.assertIn("created client key", r.stderr)

        r = self.ctl("keys", "list")
        self.assertEqual(r.returncode, 0, r.stderr)
        head = r.stdout.splitlines()[0].split()
        self.assertEqual(head[:4], ["ID", "ROLE", "NAME", "STATE"])
        bob = [ln for ln in r.stdout.splitlines() if " bob " in ln]
        self.assertEqual(len(bob), 1, r.stdout)
        bob_id = bob[0].split()[0]
        r = self.ctl("--json", "keys", "list", "--role", "client")
        self.assertEqual(r.returncode, 0, r.stderr)
        keys = json.loads(r.stdout)["keys"]
        self.assertEqual([k["id"] for k in keys], [bob_id])
        self.assertEqual(keys[0]["limits"]["rpm"], 5)

        r = self.ctl("keys", "limits", bob_id, "--max-concurrent", "2", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["limits"]["max_concurrent"], 2)

        # A request so that jobs and status have something to show.
        st, _, reply = harness.http_json("POST", self.srv.url + "/v1/chat/completions", CHAT,
                                         harness.bearer(client_key), timeout=60)
        self.assertEqual(st, 200, reply)
        r = self.ctl("keys", "revoke", bob_id)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "revoked " + bob_id), r.stderr)
        st, _, _ = harness.http_json("GET", self.srv.url + "/v1/models",
                                     headers=harness.bearer(client_key), timeout=10)
        self.assertEqual(st, 401)

        r = self.ctl("tokens", "create", "--name", "rack1", "--max-uses", "3",
                     "--expires-in", "12h")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip().startswith("gpk_"))
        r = self.ctl("tokens", "list")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("rack1", r.stdout)
        self.assertIn("0/3", r.stdout)

        r = self.ctl("agents", "list")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(self.agent_id, r.stdout)
        self.assertIn("m1", r.stdout)
        r = self.ctl("--json", "agents", "list")
        self.assertEqual(json.loads(r.stdout)["agents"][0]["id"], self.agent_id)
        r = self.ctl("agents", "drain", self.agent_id)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("draining", r.stdout)
        r = self.ctl("agents", "drain", self.agent_id, "--undo")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("undrained", r.stdout)
        # As above: the state follows at the agent's next poll at the latest.
        harness.wait_until(lambda: self.agent(self.agent_id)["state"] == "healthy", timeout=60,
                           what="agent healthy after undrain")
        r = self.ctl("agents", "list")
        self.assertIn("healthy", r.stdout)

        def jobs():
            r = self.ctl("--json", "jobs", "list", "--status", "done", "--limit", "5")
            return r.returncode == 0 and json.loads(r.stdout)["jobs"]
        job = harness.wait_until(jobs, timeout=10, what="job listed")[0]
        r = self.ctl("jobs", "list", "--model", "m1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(job["id"], r.stdout)
        r = self.ctl("jobs", "show", job["id"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("done", r.stdout)
        r = self.ctl("jobs", "show", "job_nope")
        self.assertEqual(r.returncode, 1)
        self.assertIn("JOB_NOT_FOUND", r.stderr)

        r = self.ctl("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("1 healthy", r.stdout)
        r = self.ctl("status", "--json")
        self.assertEqual(json.loads(r.stdout)["agents"]["healthy"], 1)

        # The key from $GPUPOOL_STATE_DIR/admin.key.
        sd = self.h.path("state")
        os.makedirs(sd, exist_ok=True)
        with open(os.path.join(sd, "admin.key"), "w") as f:
            f.write(self.admin + "\n")
        os.chmod(os.path.join(sd, "admin.key"), 0o600)
        r = self.ctl("status", key=False, env={"GPUPOOL_STATE_DIR": sd})
        self.assertEqual(r.returncode, 0, r.stderr)
        # No key at all: 401, exit 1.
        r = self.ctl("status", key=False, env={"GPUPOOL_STATE_DIR": self.h.path("none")})
        self.assertEqual(r.returncode, 1)
        self.assertIn("HTTP 401", r.stderr)

        # Errors: server refusals exit 1 with message and code; usage exits 2.
        r = self.ctl("keys", "revoke", "key_000000000000000000000000")
        self.assertEqual(r.returncode, 1)
        self.assertIn("KEY_NOT_FOUND", r.stderr)
        r = self.ctl("keys", "create", "--role", "root")
        self.assertEqual(r.returncode, 1)
        self.assertIn("INVALID_REQUEST", r.stderr)
        for bad in (["keys"], ["keys", "create"], ["bogus"], ["keys", "create", "--role",
                    "client", "--rpm", "-1"], ["tokens", "create", "--expires-in", "soon"],
                    ["jobs", "list", "--nope", "1"], ["agents", "drain"]):
            r = self.ctl(*bad)
            self.assertEqual(r.returncode, 2, (bad, r.stderr))
        port = harness.free_port()
        r = self.ctl("status", env={"GPUPOOL_SERVER": "http://127.0.0.1:%d" % port})
        self.assertEqual(r.returncode, 1)
        self.assertIn("http://127.0.0.1:%d" % port, r.stderr)
        r = self.ctl("--server", "http://127.0.0.1:%d" % port, "status")
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot reach", r.stderr)

        # Remove the agent with force while it is alive (no jobs running now).
        r = self.ctl("agents", "remove", self.agent_id, "--force")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("removed agent", r.stdout)


if __name__ == "__main__":
    harness.main()
