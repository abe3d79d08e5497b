#!/usr/bin/env python3
"""Models deployed from the server (issue 27): a real server, two real agents
started with neither --model nor --upstream (gguf on the CPU once a model is
given to them), and a local HTTP server (test_model_download.ModelServer)
serving models/stories260K.gguf as the deployment's source.

- a deployment that fits nowhere says, per agent, why it was refused;
- deploy: one agent downloads, loads and serves the model under the
  deployment's name; state and progress show in the admin API and
  `gpupoolctl models list/show`;
- scale to 2: the second agent loads it too; scale to 1: one unloads;
- the agent holding it dies: after the grace its replica moves to the other;
- a server restart keeps the deployment; the agents converge back to it;
- undeploy: the agents unload it and no one serves the name;
- a wrong sha256: the replica fails with the reason on each agent in turn
  and is not retried where it failed;
- an agent started with --model is listed as a local deployment and never
  placed on.

Waits are on states (admin API, /v1/models), never on sleeps.
"""

import hashlib
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp  # noqa: E402
import harness  # noqa: E402
from harness import http_json, wait_until  # noqa: E402
from test_model_download import ModelServer, MODEL  # noqa: E402

CTL_BIN = os.environ.get("GPUPOOL_CTL_BIN") or os.path.join(harness.BUILD_DIR, "src", "ctl",
                                                            "gpupoolctl")
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "3", "--work_wait_sec", "5",
        "--deploy_grace_sec", "1"]


class Deployments(harness.TestCase):
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN, CTL_BIN)

    def setUp(self):
        super().setUp()
        with open(MODEL, "rb") as f:
            self.data = f.read()
        self.sha = hashlib.sha256(self.data).hexdigest()
        self.ms = ModelServer(self.data, "stories260K.gguf")
        self.addCleanup(self.ms.close)
        self.db = self.h.path("deploy.db")
        self.srv = self.h.start_server(FAST, db=self.db)
        self.source = self.ms.url + "/m/stories260K.gguf"

    # -------------------------------------------------------------- helpers
    def deploy_agent(self, name, labels=None, extra=(), state_dir=None):
        args = ["--threads", "1"] + (["--labels", labels] if labels else []) + list(extra)
        a = self.h.start_agent(self.srv, args=args, name=name, state_dir=state_dir)
        a.id = a.agent_id()
        wait_until(lambda: self.agent(a.id) is not None, timeout=30,
                   what="agent %s registered" % name)
        return a

    def api(self, method, path, body=None):
        st, _, b = http_json(method, self.srv.url + path, body, timeout=30)
        return st, b

    def agent(self, agent_id):
        st, b = self.api("GET", "/admin/agents")
        for a in (b or {}).get("agents", []):
            if a["id"] == agent_id:
                return a
        return None

    def serves(self, agent_id, model):
        a = self.agent(agent_id)
        return a is not None and any(m.get("id") == model for m in a.get("models", []))

    def dep(self, name="tiny"):
        st, b = self.api("GET", "/admin/deployments/" + name)
        self.assertEqual(st, 200, b)
        return b

    def wait_dep(self, pred, what, timeout=60, name="tiny"):
        last = {}

        def ok():
            last["d"] = self.dep(name)
            return pred(last["d"])
        try:
            wait_until(ok, timeout=timeout, what=what)
        except AssertionError:
            raise AssertionError("%s; last: %r" % (what, last.get("d")))
        return last["d"]

    @staticmethod
    def ready_on(d):
        return sorted(r["agent_id"] for r in d["placed"] if r["state"] == "ready")

    def complete(self, model="tiny"):
        st, _, b = http_json("POST", self.srv.url + "/v1/completions",
                             {"model": model, "prompt": "Once upon a time", "max_tokens": 4},
                             timeout=60)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["usage"]["completion_tokens"], 4)
        return b

    def check_dashboard(self, holder):
        # The dashboard's deployments table in headless Chromium (auth off:
        # the page needs no key on loopback).
        if not cdp.chromium_binary():
            return  # scripts/install-deps.sh installs it: CI always checks
        browser = cdp.Browser(self.h.tmp)
        try:
            page = browser.page()
            page.navigate(self.srv.url + "/dashboard")
            row = "document.querySelector('#deployments tr[data-deployment=\"tiny\"]')"
            page.wait_js("(() => { const r = %s; return r && r.dataset.state === 'ready'; })()"
                         % row, timeout=60, what="the ready replica on the dashboard")
            self.assertEqual(page.js(row + ".dataset.agentId"), holder)
            self.assertEqual(page.js(row + ".children[1].textContent"), "1 / 1")
            self.assertTrue(page.js("document.getElementById('deployments-empty').hidden"))
            page.close()
        finally:
            browser.close()

    def metrics(self):
        st, _, body = harness.http_request("GET", self.srv.url + "/metrics", timeout=10)
        self.assertEqual(st, 200)
        return body.decode()

    def ctl(self, *args):
        e = self.h.env()
        e["GPUPOOL_SERVER"] = self.srv.url
        r = subprocess.run([CTL_BIN] + list(args), capture_output=True, text=True, timeout=60,
                           env=e)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    # ---------------------------------------------------------------- tests
    def test_deploy_scale_move_restart_undeploy(self):
        a = self.deploy_agent("box-a", "zone=a")
        b = self.deploy_agent("box-b", "zone=b")

        # Fits nowhere: each agent considered says why. gpupoolctl asked the
        # source for its size (HEAD): known before any download.
        out = self.ctl("models", "deploy", self.source, "--name", "eu", "--labels", "zone=eu")
        self.assertIn("deployed eu: 1 replica(s) wanted, 0 placed (see gpupoolctl models show",
                      out)
        d = self.dep("eu")
        self.assertEqual(d["bytes"], len(self.data), d)
        self.assertEqual(d["unplaced"], 1, d)
        why = {r["agent_id"]: r["reason"] for r in d["refusals"]}
        self.assertEqual(set(why), {a.id, b.id}, d)
        self.assertIn("labels do not match: wants zone=eu, has a", why[a.id])
        out = self.ctl("models", "show", "eu")
        self.assertIn("agents considered and refused", out)
        self.assertIn("box-a: labels do not match", out)
        self.assertEqual(self.api("DELETE", "/admin/deployments/eu")[0], 200)
        self.assertEqual(self.api("GET", "/admin/deployments/eu")[0], 404)

        # Deploy one replica: downloaded, loaded, served under its name.
        out = self.ctl("models", "deploy", self.source, "--name", "tiny", "--replicas", "1",
                       "--sha256", self.sha)
        self.assertIn("deployed tiny: 1 replica(s) wanted, 1 placed", out)
        d = self.wait_dep(lambda d: len(self.ready_on(d)) == 1, "one replica ready")
        holder = self.ready_on(d)[0]
        self.assertEqual(d["bytes"], len(self.data), d)
        self.assertEqual(d["placed"][0]["total"], len(self.data), d)
        self.srv.wait_model("tiny", timeout=30)
        self.complete()
        self.assertEqual(len(self.ms.requests), 1, self.ms.requests)
        out = self.ctl("models", "list")
        self.assertRegex(out, r"tiny\s+1/1\s+box-[ab]\s+ready")
        metrics = self.metrics()
        self.assertIn('gpupool_deployment_replicas{deployment="tiny",state="ready"} 1', metrics)
        self.assertIn('gpupool_deployment_replicas_wanted{deployment="tiny"} 1', metrics)
        self.check_dashboard(holder)

        # Scale to 2: the other agent too. Then back to 1: one unloads.
        self.assertIn("scaled tiny: 2", self.ctl("models", "scale", "tiny", "--replicas", "2"))
        d = self.wait_dep(lambda d: len(self.ready_on(d)) == 2, "two replicas ready")
        self.assertEqual(self.ready_on(d), sorted([a.id, b.id]))
        st, d = self.api("PATCH", "/admin/deployments/tiny", {"replicas": 1})
        self.assertEqual(st, 200, d)
        self.assertEqual(len(d["placed"]), 1, d)
        kept = d["placed"][0]["agent_id"]
        dropped = b.id if kept == a.id else a.id
        wait_until(lambda: not self.serves(dropped, "tiny") and self.serves(kept, "tiny"),
                   timeout=30, what="the dropped replica unloaded")

        # The agent holding it dies: after the grace the replica moves.
        dead, alive = (a, b) if kept == a.id else (b, a)
        dead.kill9()
        d = self.wait_dep(lambda d: self.ready_on(d) == [alive.id], "replica moved", timeout=90)
        self.assertTrue(self.srv.log_events("deploy_replica_moved"), self.srv.log_text()[-3000:])
        self.complete()

        # A server restart keeps the deployment; the agent converges back.
        port, db = self.srv.port, self.srv.db
        unloads = len(alive.log_events("deploy_unload"))
        self.srv.stop()
        self.srv = self.h.start_server(FAST, db=db, port=port)
        d = self.wait_dep(lambda d: self.ready_on(d) == [alive.id], "ready after restart",
                          timeout=90)
        self.assertEqual(d["replicas"], 1)
        self.assertEqual(d["sha256"], self.sha)
        self.srv.wait_model("tiny", timeout=60)
        self.complete()
        # It kept the model through the restart (no unload, no second fetch).
        self.assertEqual(len(alive.log_events("deploy_unload")), unloads, alive.log_text()[-3000:])

        # Undeploy: the agent unloads, nobody serves the name.
        self.assertIn("undeployed tiny", self.ctl("models", "undeploy", "tiny"))
        wait_until(lambda: not self.serves(alive.id, "tiny"), timeout=30, what="unloaded")
        self.assertNotIn("tiny", self.srv.models())
        st, body = self.api("GET", "/admin/deployments")
        self.assertEqual(body["deployments"], [], body)
        self.assertNotIn('deployment="tiny"', self.metrics())

    def test_wrong_sha256_fails_with_reason_and_local_agents_are_listed(self):
        a = self.deploy_agent("box-a")
        b = self.deploy_agent("box-b")
        local = self.h.start_agent(self.srv, args=["--model", MODEL, "--threads", "1",
                                                   "--alias", "loc"], name="box-local")
        self.srv.wait_model("loc", timeout=60)
        st, d = self.api("POST", "/admin/deployments",
                         {"name": "bad", "source": self.source, "sha256": "0" * 64})
        self.assertEqual(st, 201, d)
        # Fails on one agent, is placed on the other, fails there too; then
        # it fits nowhere, and says why for each agent.
        d = self.wait_dep(lambda d: sum(r["state"] == "failed" for r in d["placed"]) == 2,
                          "failed on both agents", name="bad")
        for r in d["placed"]:
            self.assertIn("sha256 mismatch", r["reason"], d)
        self.assertEqual(d["unplaced"], 1, d)
        why = {r["agent_id"]: r["reason"] for r in d["refusals"]}
        self.assertIn("failed this deployment: ", why[a.id])
        self.assertIn("failed this deployment: ", why[b.id])
        local_id = local.agent_id()
        self.assertIn("not offered to deployments", why[local_id])
        st, body = self.api("GET", "/admin/deployments")
        self.assertIn({"model": "loc", "agent_id": local_id, "agent": "box-local",
                       "agent_state": "healthy"}, body["local"])
        self.assertNotIn("bad", self.srv.models())

    def test_source_down_is_retried_by_the_agent(self):
        # The source answers 503: a failure a later try may fix. The agent
        # keeps the replica ("downloading", the reason says it retries)
        # instead of failing it, and succeeds once the source is back.
        self.ms.mode = "busy"
        a = self.deploy_agent("box-a", extra=["--model-download-attempts", "1"])
        st, d = self.api("POST", "/admin/deployments", {"name": "tiny", "source": self.source})
        self.assertEqual(st, 201, d)
        d = self.wait_dep(lambda d: d["placed"] and "retrying in" in (d["placed"][0]["reason"]
                                                                       or ""),
                          "the agent retries")
        self.assertEqual(d["placed"][0]["state"], "downloading", d)
        self.assertEqual(d["placed"][0]["agent_id"], a.id)
        self.ms.mode = "ok"
        self.wait_dep(lambda d: self.ready_on(d) == [a.id], "ready after the retry")
        self.complete()

    def test_one_agent_holds_several_models(self):
        # --deploy-capacity 2: two deployments on one agent, each its own
        # engine and slot; undeploying one leaves the other serving; a third
        # is refused for the capacity.
        a = self.deploy_agent("box-a", extra=["--deploy-capacity", "2"])
        for name in ("tiny", "tiny2"):
            st, d = self.api("POST", "/admin/deployments", {"name": name, "source": self.source})
            self.assertEqual(st, 201, d)
        for name in ("tiny", "tiny2"):
            self.wait_dep(lambda d: self.ready_on(d) == [a.id], name + " ready", name=name)
            self.srv.wait_model(name, timeout=30)
            self.complete(name)
        self.assertEqual(self.agent(a.id)["slots_total"], 2)
        st, d = self.api("POST", "/admin/deployments", {"name": "tiny3", "source": self.source})
        self.assertEqual(d["unplaced"], 1, d)
        self.assertEqual(d["refusals"][0]["reason"], "holds 2 deployed model(s), its capacity")
        self.assertEqual(self.api("DELETE", "/admin/deployments/tiny3")[0], 200)
        self.assertEqual(self.api("DELETE", "/admin/deployments/tiny")[0], 200)
        wait_until(lambda: not self.serves(a.id, "tiny"), timeout=30, what="tiny unloaded")
        self.assertTrue(self.serves(a.id, "tiny2"))
        self.complete("tiny2")
        self.assertEqual(len(a.log_events("deploy_unload")), 1, a.log_text()[-3000:])

    def test_restarted_agent_serves_again_from_its_cache(self):
        a = self.deploy_agent("box-a")
        st, d = self.api("POST", "/admin/deployments", {"name": "tiny", "source": self.source})
        self.assertEqual(st, 201, d)
        self.wait_dep(lambda d: self.ready_on(d) == [a.id], "ready")
        self.assertEqual(len(self.ms.requests), 1)
        a.kill9()
        # The same box again (same state dir, so the same agent_id and
        # models directory): whether or not the replica moved meanwhile (it
        # has nowhere else to go), the agent loads it from its cache.
        b = self.deploy_agent("box-a-again", state_dir=a.state_dir)
        self.assertEqual(b.id, a.id)
        self.wait_dep(lambda d: b.log_events("deploy_ready") and self.ready_on(d) == [a.id],
                      "ready again after the restart")
        self.assertEqual(len(self.ms.requests), 1, self.ms.requests)
        self.assertTrue(b.log_events("model_cached"), b.log_text()[-3000:])
        self.complete()


if __name__ == "__main__":
    harness.main()
