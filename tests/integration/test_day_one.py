"""An operator's first day (issue 27), on real processes:

- the first key of a loopback server with auth off turns auth on: the reply
  and gpupoolctl say so, an admin key is left 0600 next to the DB, and it
  works with --key-file and from gpupoolctl's config file; a tokenless
  agent is refused and told exactly what to do (exit 2);
- a clean agent stop (SIGTERM) deregisters it: `offline`, not `dead`
  (GpupoolAgentDown counts only dead agents);
- gpupool_model_agents drops a name no agent lists any more (an alias
  renamed) but keeps a model whose last agent stopped at 0.

Everything binds 127.0.0.1; every wait is bounded.
"""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402

CTL_BIN = os.path.join(harness.BUILD_DIR, "src", "ctl", "gpupoolctl")


def model_agents(text):
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^gpupool_model_agents\{model="([^"]*)"\} (\S+)$', text, re.M)}


class DayOne(harness.TestCase):
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN, CTL_BIN)

    def ctl(self, *args, env_extra=None, check=True):
        env = self.h.env()
        env["HOME"] = self.h.tmp  # no operator's own ~/.config/gpupool/ctl.conf
        env.update(env_extra or {})
        r = subprocess.run([CTL_BIN, "--server", self.srv.url] + list(args),
                           capture_output=True, text=True, timeout=60, env=env)
        if check:
            self.assertEqual(r.returncode, 0, "gpupoolctl %s: %s" % (" ".join(args), r.stderr))
        return r

    def scrape(self):
        return harness.http_request("GET", self.srv.url + "/metrics", timeout=10)[2].decode()

    def test_first_key_leaves_the_operator_in_control(self):
        self.srv = self.h.start_server(["--poll_interval_sec", "1", "--work_wait_sec", "2"])
        up = self.h.start_upstream(["--tokens", "3"])
        ag = self.h.start_agent(self.srv, upstream=up, model="m1")  # no key: auth is off
        self.srv.wait_model("m1")

        r = self.ctl("keys", "create", "--role", "client", "--name", "first")
        self.assertTrue(r.stdout.strip().startswith("gpk_"), r.stdout)
        admin_path = os.path.join(self.h.tmp, "admin.key")
        self.assertIn("auth is now on", r.stderr)
        self.assertIn(admin_path, r.stderr)
        self.assertEqual(stat.S_IMODE(os.stat(admin_path).st_mode), 0o600)
        self.assertTrue(self.srv.log_events("admin_key_generated"))

        # Without a key the admin API is closed now; with the file it is open.
        self.assertEqual(self.ctl("keys", "list", check=False).returncode, 1)
        listed = json.loads(self.ctl("--json", "--key-file", admin_path, "keys", "list").stdout)
        self.assertIn("first", [k["name"] for k in listed["keys"]])
        # The same through gpupoolctl's config file.
        conf = self.h.path("ctl.conf")
        with open(conf, "w") as f:
            f.write("# gpupoolctl settings\nserver = %s\nkey_file = %s\n" % (self.srv.url,
                                                                          admin_path))
        env = self.h.env()
        env["GPUPOOL_CTL_CONFIG"] = conf
        r = subprocess.run([CTL_BIN, "status"], capture_output=True, text=True, timeout=60,
                           env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(conf, "a") as f:
            f.write("colour = blue\n")
        r = subprocess.run([CTL_BIN, "status"], capture_output=True, text=True, timeout=60,
                           env=env)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown setting 'colour'", r.stderr)
        r = self.ctl("--key-file", self.h.path("nope"), "status", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read an admin key", r.stderr)

        # The keyless agent is refused and says what to do; no restart loop.
        self.assertEqual(ag.wait(timeout=60), 2)
        lines = ag.log_events("auth_required")
        self.assertTrue(lines, ag.log_text()[-3000:])
        self.assertIn("--token", lines[0]["msg"])
        self.assertIn("tokens create", lines[0]["msg"])

    def test_client_address_in_auth_failures(self):
        bad = {"Authorization": "Bearer gpk_" + "2" * 64}

        def clients(srv, xff):
            n = len(srv.log_events("auth_failed"))
            st, _, _ = harness.http_request("GET", srv.url + "/v1/models",
                                            headers=dict(bad, **{"X-Forwarded-For": xff}))
            self.assertEqual(st, 401)
            return [e["client"] for e in srv.log_events("auth_failed")[n:]]
        # No trusted proxy: the peer is the client, whatever the header says.
        plain = self.h.start_server(["--auth", "on"])
        self.assertEqual(clients(plain, "203.0.113.9"), ["127.0.0.1"])
        # Behind a trusted proxy: the nearest address it did not add itself.
        self.srv = self.h.start_server(["--auth", "on", "--trusted_proxies",
                                        "10.0.0.1, 127.0.0.1"])
        self.assertEqual(clients(self.srv, "198.51.100.1, 203.0.113.7, 10.0.0.1"),
                         ["203.0.113.7"])
        self.assertEqual(clients(self.srv, "10.0.0.1"), ["10.0.0.1"])

    def test_key_added_offline_then_reload(self):
        self.srv = self.h.start_server([])
        self.h.create_key(self.srv.db, "client", "offline")
        self.srv.signal(signal.SIGHUP)
        admin_path = os.path.join(self.h.tmp, "admin.key")
        harness.wait_until(lambda: os.path.exists(admin_path), timeout=20,
                           what="admin.key after the reload turned auth on")
        self.assertEqual(stat.S_IMODE(os.stat(admin_path).st_mode), 0o600)
        self.ctl("--key-file", admin_path, "keys", "list")

    def test_admin_key_first_needs_no_file(self):
        self.srv = self.h.start_server([])
        r = self.ctl("--json", "keys", "create", "--role", "admin", "--name", "ops")
        out = json.loads(r.stdout)
        self.assertIsNone(out["auth_turned_on"]["admin_key_file"])
        self.assertFalse(os.path.exists(os.path.join(self.h.tmp, "admin.key")))
        self.ctl("--key", out["key"], "keys", "list")
        # Once auth is on, further keys say nothing about it.
        r = self.ctl("--json", "--key", out["key"], "keys", "create", "--role", "client")
        self.assertNotIn("auth_turned_on", json.loads(r.stdout))

    def test_clean_stop_is_offline_not_dead(self):
        self.srv = self.h.start_server(["--poll_interval_sec", "1", "--work_wait_sec", "2"])
        up = self.h.start_upstream(["--tokens", "3"])
        ag = self.h.start_agent(self.srv, upstream=up, model="m1", name="box-a")
        aid = ag.agent_id()
        self.srv.wait_model("m1")
        ag.signal(signal.SIGTERM)
        self.assertEqual(ag.wait(timeout=60), 0)
        self.assertTrue(ag.log_events("deregistered"), ag.log_text()[-3000:])
        agents = json.loads(self.ctl("--json", "agents", "list").stdout)["agents"]
        self.assertEqual([a["state"] for a in agents if a["id"] == aid], ["offline"])
        ev = self.srv.log_events("agent_deregistered")
        self.assertEqual([e["name"] for e in ev], ["box-a"])
        text = self.scrape()
        self.assertRegex(text, r'(?m)^gpupool_agents\{state="offline"\} 1$')
        self.assertRegex(text, r'(?m)^gpupool_agents\{state="dead"\} 0$')
        # Its model has no live agent now: shown at 0 (the alert is right).
        self.assertEqual(model_agents(text).get("m1"), 0)

        # A restarted agent (same state dir) comes back healthy.
        ag2 = self.h.start_agent(self.srv, upstream=up, model="m1", name="box-a",
                                 state_dir=ag.state_dir)
        self.assertEqual(ag2.agent_id(), aid)
        harness.wait_until(
            lambda: [a["state"] for a in json.loads(self.ctl("--json", "agents", "list").stdout)
                     ["agents"] if a["id"] == aid] == ["healthy"],
            timeout=30, what="the restarted agent healthy")

    def test_deregister_route(self):
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        fa = FakeAgent(self.srv.url, models=("m1",))
        self.assertEqual(fa.poll()[0], 200)
        st, body = fa._post("/agents/deregister", {"agent_id": fa.agent_id})
        self.assertEqual((st, body["state"]), (200, "offline"), body)
        st, body = fa._post("/agents/deregister", {"agent_id": fa.agent_id})
        self.assertEqual((st, body["state"]), (200, "offline"), body)  # idempotent
        st, body = fa._post("/agents/deregister", {"agent_id": "not-a-uuid"})
        self.assertEqual(st, 400, body)
        st, body = fa._post("/agents/deregister",
                            {"agent_id": "00000000-0000-4000-8000-000000000000"})
        self.assertEqual((st, body["error"]["code"]), (404, "AGENT_NOT_FOUND"), body)
        # A poll brings it back.
        st, body = fa.poll()
        self.assertEqual((st, body["state"]), (200, "healthy"), body)

    def test_agents_by_name_or_prefix(self):
        # A long heartbeat: the fake agents poll once, and the states read
        # below must not turn suspect while a loaded machine runs the CLI.
        self.srv = self.h.start_server(["--poll_interval_sec", "30"])
        a = FakeAgent(self.srv.url, name="box-1", agent_id="2c0f7e5e-0000-4000-8000-000000000001")
        b = FakeAgent(self.srv.url, name="box-2", agent_id="2c0f7e5e-0000-4000-8000-000000000002")
        c = FakeAgent(self.srv.url, name="box-2", agent_id="9a9a9a9a-0000-4000-8000-000000000003")
        for f in (a, b, c):
            self.assertEqual(f.poll()[0], 200)
        # The second box-2 is warned about, once, naming the first.
        dup = self.srv.log_events("agent_name_duplicate")
        self.assertEqual([(d["agent_id"], d["other_id"]) for d in dup],
                         [(c.agent_id, b.agent_id)])

        def state(f):
            return [x["state"] for x in json.loads(self.ctl("--json", "agents", "list").stdout)
                    ["agents"] if x["id"] == f.agent_id][0]
        r = self.ctl("agents", "drain", "box-1")
        self.assertIn(a.agent_id, r.stdout)
        self.assertEqual(state(a), "draining")
        self.ctl("agents", "drain", "9a9")
        self.assertEqual(state(c), "draining")
        r = self.ctl("agents", "drain", "box-2", check=False)  # two agents share the name
        self.assertEqual(r.returncode, 1)
        self.assertIn(b.agent_id, r.stderr)
        self.assertIn(c.agent_id, r.stderr)
        r = self.ctl("agents", "drain", "2c0f", check=False)  # prefix of two ids
        self.assertEqual(r.returncode, 1)
        r = self.ctl("agents", "remove", "nobody", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no agent has", r.stderr)
        self.ctl("agents", "remove", b.agent_id)
        self.assertEqual(state(a), "draining")

    def test_renamed_model_series_disappears(self):
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        fa = FakeAgent(self.srv.url, models=("old-name",), name="renamer")
        keep = FakeAgent(self.srv.url, models=("kept",), name="stopper")
        self.assertEqual(fa.poll()[0], 200)
        self.assertEqual(keep.poll()[0], 200)
        self.assertEqual(model_agents(self.scrape()), {"old-name": 1, "kept": 1})
        # The same agent now calls its model by a new alias.
        fa.models = ["new-name"]
        self.assertEqual(fa.poll()[0], 200)
        # The other stops: its model stays, at 0 (nothing serves it).
        self.assertEqual(keep._post("/agents/deregister", {"agent_id": keep.agent_id})[0], 200)
        self.assertEqual(model_agents(self.scrape()), {"new-name": 1, "kept": 0})
        # Forgotten agent: its model goes too.
        r = harness.http_request("DELETE", self.srv.url + "/admin/agents/" + keep.agent_id)
        self.assertEqual(r[0], 200, r)
        self.assertEqual(model_agents(self.scrape()), {"new-name": 1})

    def test_version_root_redirect_and_metrics_key(self):
        r = subprocess.run([harness.SERVER_BIN, "--version"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        mkey = "scrape-secret-0123456789"
        self.srv = self.h.start_server(["--metrics_key", mkey])
        st, _, health = harness.http_json("GET", self.srv.url + "/health")
        self.assertEqual(r.stdout, "gpupool-server %s\n" % health["version"])
        # A browser opening the address lands on the dashboard.
        st, hdr, _ = harness.http_request("GET", self.srv.url + "/")
        self.assertEqual(st, 302)
        self.assertEqual({k.lower(): v for k, v in hdr.items()}["location"], "/dashboard")
        # /metrics wants its key; a wrong one is counted and logged.
        st, _, _ = harness.http_request("GET", self.srv.url + "/metrics")
        self.assertEqual(st, 401)
        st, _, _ = harness.http_request("GET", self.srv.url + "/metrics",
                                        headers={"Authorization": "Bearer " + mkey[:-1] + "x"})
        self.assertEqual(st, 401)
        st, _, raw = harness.http_request("GET", self.srv.url + "/metrics",
                                          headers={"Authorization": "Bearer " + mkey})
        self.assertEqual(st, 200)
        self.assertIn('gpupool_auth_failures_total{reason="metrics_key"} 2', raw.decode())
        # The key is never printed back; a short one is refused at start.
        r = subprocess.run([harness.SERVER_BIN, "--metrics_key", mkey, "--print-config"],
                           capture_output=True, text=True, timeout=30, env=self.h.env())
        self.assertNotIn(mkey, r.stdout)
        r = subprocess.run([harness.SERVER_BIN, "--metrics_key", "short"],
                           capture_output=True, text=True, timeout=30, env=self.h.env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("metrics_key", r.stderr)


    def test_metrics_on_their_own_listener(self):
        mport_file = os.path.join(self.h.tmp, "metrics.port")
        self.srv = self.h.start_server(["--metrics_listen", "127.0.0.1:0",
                                        "--metrics-port-file", mport_file])
        murl = "http://127.0.0.1:%d" % harness.read_port_file(mport_file, self.srv.p)
        # The scraper's listener: metrics and health, nothing else.
        st, _, raw = harness.http_request("GET", murl + "/metrics")
        self.assertEqual(st, 200)
        self.assertIn("gpupool_process_resident_bytes", raw.decode())
        self.assertEqual(harness.http_request("GET", murl + "/health")[0], 200)
        for path in ("/v1/models", "/admin/keys", "/dashboard"):
            self.assertEqual(harness.http_request("GET", murl + path)[0], 404, path)
        # The API listener no longer answers /metrics.
        self.assertEqual(harness.http_request("GET", self.srv.url + "/metrics")[0], 404)
        self.assertEqual(harness.http_request("GET", self.srv.url + "/health")[0], 200)
        # A bad address is a configuration error, said at start.
        r = subprocess.run([harness.SERVER_BIN, "--metrics_listen", "nowhere"],
                           capture_output=True, text=True, timeout=30, env=self.h.env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("metrics_listen", r.stderr)

if __name__ == "__main__":
    unittest.main()
