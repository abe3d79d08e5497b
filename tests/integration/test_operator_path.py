"""The whole operator path of docs/operations.md, on real processes:

1. start the server with TLS (HTTPS listener, throwaway CA made with the
   openssl command) and `auth = on`, so it generates admin.key (0600) at its
   first start, as it does on a public address;
2. `gpupoolctl` (over HTTPS, trusting the CA) makes an enrollment token;
3. a real gpupool-agent enrolls with it over HTTPS (verifying the server's
   certificate), keeps its agent key 0600 and serves its model (openai
   backend on the scripted upstream);
4. `gpupoolctl keys create` makes a client key with rpm = 3; requests over
   HTTPS go through until the limit, then 429 with Retry-After;
5. `gpupoolctl keys revoke` revokes it: the next request is 401;
6. `gpupoolctl agents drain` drains the agent: no new job goes to it (503),
   `agents list` and `status` show it, and `jobs list` has the served jobs.

Everything binds 127.0.0.1; every wait is bounded.
"""

import json
import os
import stat
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_tls  # noqa: E402  (its throwaway PKI and HTTPS client)

CTL_BIN = os.path.join(harness.BUILD_DIR, "src", "ctl", "gpupoolctl")


class OperatorPath(harness.TestCase):
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN, CTL_BIN)

    def ctl(self, *args, check=True):
        env = self.h.env()
        env["GPUPOOL_STATE_DIR"] = self.h.tmp   # where the server wrote admin.key
        r = subprocess.run([CTL_BIN, "--server", self.https, "--ca-file", self.ca] + list(args),
                           capture_output=True, text=True, timeout=60, env=env)
        if check:
            self.assertEqual(r.returncode, 0, "gpupoolctl %s: %s" % (" ".join(args), r.stderr))
        return r

    def ctl_json(self, *args):
        return json.loads(self.ctl("--json", *args).stdout)

    def request(self, key, prompt="the operator path"):
        return test_tls.https_request(self.tls_port, "POST", "/v1/completions",
                                      {"model": "m1", "prompt": prompt, "max_tokens": 3},
                                      headers={"Authorization": "Bearer " + key},
                                      cafile=self.ca)

    def test_operator_path(self):
        p = test_tls.pki()
        self.ca = p["good_crt"]
        port_file = self.h.path("tls.port")
        srv = self.h.start_server(["--poll_interval_sec", "1", "--work_wait_sec", "5",
                                   "--auth", "on", "--listen_tls", "127.0.0.1:0",
                                   "--tls_cert", p["server_crt"], "--tls_key", p["server_key"],
                                   "--tls-port-file", port_file])
        self.tls_port = harness.read_port_file(port_file, srv.p)
        self.https = "https://127.0.0.1:%d" % self.tls_port

        # 1. The generated admin key.
        admin_path = self.h.path("admin.key")
        harness.wait_until(lambda: os.path.exists(admin_path), timeout=20,
                           what="admin.key written at first start")
        self.assertEqual(stat.S_IMODE(os.stat(admin_path).st_mode), 0o600)
        self.assertTrue(srv.log_events("admin_key_generated"))
        st, _, _ = test_tls.https_request(self.tls_port, "GET", "/v1/models", cafile=self.ca)
        self.assertEqual(st, 401)  # auth is on

        # 2. An enrollment token.
        token = self.ctl("tokens", "create", "--name", "rack-1", "--max-uses", "1",
                         "--expires-in", "10m").stdout.strip()
        self.assertTrue(token.startswith("gpk_"), token)

        # 3. The agent enrolls over HTTPS and serves.
        up = self.h.start_upstream(["--tokens", "3"])
        state = self.h.path("agent.state")
        ag = self.h.start_agent(test_tls._Target(self.https), upstream=up, model="m1",
                                token=token, state_dir=state, args=["--ca-file", self.ca])
        harness.wait_until(lambda: os.path.exists(os.path.join(state, "agent.key")),
                           timeout=30, what="agent.key after enrollment")
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(state, "agent.key")).st_mode), 0o600)
        agent_id = ag.agent_id()
        harness.wait_until(
            lambda: any(a["id"] == agent_id and a["state"] == "healthy"
                        for a in self.ctl_json("agents", "list")["agents"]),
            timeout=30, what="enrolled agent healthy in `gpupoolctl agents list`")

        # 4. A client key with a limit; requests through the limit.
        client = self.ctl("keys", "create", "--role", "client", "--name", "alice",
                          "--rpm", "3").stdout.strip()
        for i in range(3):
            st, _, body = self.request(client, "request %d" % i)
            self.assertEqual(st, 200, body)
            self.assertEqual(body["x_pool_meta"]["agent_id"], agent_id)
        st, hdr, body = self.request(client)
        self.assertEqual(st, 429, body)
        self.assertGreaterEqual(int(hdr["retry-after"]), 1)
        keys = self.ctl_json("keys", "list", "--role", "client")["keys"]
        alice = [k for k in keys if k["name"] == "alice"]
        self.assertEqual(len(alice), 1, keys)
        self.assertEqual(alice[0]["limits"]["rpm"], 3)
        self.assertEqual(alice[0]["usage_today"]["requests"], 3)
        self.assertEqual(alice[0]["usage_today"]["rate_limited"], 1)
        table = self.ctl("keys", "list").stdout
        self.assertIn("alice", table)

        # 5. Revoke: the key stops working at once.
        self.ctl("keys", "revoke", alice[0]["id"])
        st, _, body = self.request(client)
        self.assertEqual(st, 401, body)

        # 6. Drain the agent: new work finds no agent; the logs tell the story.
        other = self.ctl("keys", "create", "--role", "client", "--name", "bob").stdout.strip()
        self.ctl("agents", "drain", agent_id)
        harness.wait_until(
            lambda: [a["state"] for a in self.ctl_json("agents", "list")["agents"]
                     if a["id"] == agent_id] == ["draining"],
            timeout=20, what="agent draining")
        st, hdr, body = self.request(other)
        self.assertEqual(st, 503, body)
        self.assertIn("retry-after", hdr)
        status = self.ctl_json("status")
        self.assertEqual(status["agents"]["draining"], 1)
        jobs = self.ctl_json("jobs", "list", "--key-id", alice[0]["id"])["jobs"]
        self.assertEqual(sorted(j["status"] for j in jobs), ["done", "done", "done"])
        self.assertTrue(all(j["agent_id"] == agent_id for j in jobs))
        self.assertIn("done", self.ctl("jobs", "list").stdout)


if __name__ == "__main__":
    harness.main()
