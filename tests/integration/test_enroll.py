"""Agent enrollment (POST /agents/enroll) and revoked agent keys.

An operator makes an enrollment token with POST /admin/keys (role
enrollment, max_uses, expires_in_sec); `gpupool-agent --token TOKEN` trades
it once for its own agent key, kept in STATE_DIR/agent.key (0600) and used
from then on.

Covered: an agent enrolls, keeps agent.key 0600 and serves a real request;
restarted without --token it uses agent.key (and with the spent token it
ignores --token); a second agent with a used-up max_uses=1 token exits
non-zero naming the reason; an expired token is refused; the enroll
endpoint's errors (missing, unknown, wrong role, bad body) and the 409 of a
server with auth off (where an agent with --token just goes on); an agent
key bound to its agent_id cannot poll, ask for work or upload as another;
revoking a key (DELETE /admin/keys/{id}) answers the parked long-poll made
with it 401 KEY_REVOKED at once, takes the agent offline, and the real
agent logs auth_revoked and exits non-zero.

Everything runs on 127.0.0.1 ephemeral ports; every wait is bounded.
"""

import os
import stat
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402

COMPLETION = {"model": "m1", "prompt": "alpha beta", "max_tokens": 4}


class EnrollBase(harness.TestCase):
    def setUp(self):
        super().setUp()
        self.db = self.h.path("enroll.db")
        self.admin_key = self.h.create_key(self.db, "admin", "ops")
        self.client_key = self.h.create_key(self.db, "client", "c")
        self.up = self.h.start_upstream(["--tokens", "4"])
        self.srv = self.h.start_server(["--poll_interval_sec", "2", "--work_wait_sec", "20"],
                                       db=self.db, key=self.client_key)

    # -- admin API ---------------------------------------------------------
    def admin(self, method, path, body=None):
        return http_json(method, self.srv.url + path, body, headers=bearer(self.admin_key),
                         timeout=10)

    def make_token(self, max_uses=1, expires_in_sec=600):
        st, _, b = self.admin("POST", "/admin/keys", {"role": "enrollment", "name": "t",
                                                      "max_uses": max_uses,
                                                      "expires_in_sec": expires_in_sec})
        self.assertEqual(st, 201, b)
        return b["key"], b["id"]

    def keys(self, role):
        st, _, b = self.admin("GET", "/admin/keys?role=" + role)
        self.assertEqual(st, 200, b)
        return b["keys"]

    def enroll(self, token, agent_id=None, name="box", body=None):
        if body is None:
            body = {"agent_id": agent_id or str(uuid.uuid4()), "name": name}
        return http_json("POST", self.srv.url + "/agents/enroll", body, headers=bearer(token),
                         timeout=10)

    def metrics(self):
        st, _, data = harness.http_request("GET", self.srv.url + "/metrics", timeout=5)
        self.assertEqual(st, 200)
        return data.decode()

    def parked(self):
        for line in self.metrics().splitlines():
            if line.startswith("gpupool_agents_parked "):
                return float(line.split()[1])
        return 0.0

    # -- agents ------------------------------------------------------------
    def start_agent(self, token=None, state_dir=None, model="m1"):
        return self.h.start_agent(self.srv, upstream=self.up, model=model, token=token,
                                  state_dir=state_dir)

    def key_file(self, ag):
        return os.path.join(ag.state_dir, "agent.key")

    def wait_exit(self, ag, timeout=30):
        harness.wait_until(lambda: not ag.alive(), timeout=timeout, what=ag.name + " exits")
        return ag.p.returncode

    def complete(self):
        return http_json("POST", self.srv.url + "/v1/completions", COMPLETION,
                         headers=bearer(self.client_key), timeout=30)


class TestEnrollAgent(EnrollBase):
    def test_enroll_keep_key_serve_and_restart(self):
        tok, tok_id = self.make_token(max_uses=1)
        sd = self.h.path("a1.state")
        ag = self.start_agent(token=tok, state_dir=sd)
        path = self.key_file(ag)
        harness.wait_until(lambda: os.path.exists(path), timeout=harness.START_TIMEOUT,
                           what="agent.key written")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        with open(path) as f:
            key = f.read().strip()
        self.assertTrue(key.startswith("gpk_"), key[:8])
        self.assertNotEqual(key, tok)
        self.srv.wait_model("m1")
        st, _, b = self.complete()
        self.assertEqual(st, 200, b)
        self.assertTrue(b["choices"][0]["text"])
        self.assertTrue(ag.log_events("enrolled"))
        # The token is spent, the new agent key is bound to this agent.
        agent_id = ag.agent_id()
        bound = [k for k in self.keys("agent") if k.get("agent_id") == agent_id]
        self.assertEqual(len(bound), 1, bound)
        toks = [k for k in self.keys("enrollment") if k["id"] == tok_id]
        self.assertEqual(toks[0]["uses"], 1)
        self.assertEqual(ag.stop(), 0)

        # Restart without --token: agent.key is used.
        ag2 = self.start_agent(state_dir=sd)
        harness.wait_until(lambda: ag2.log_events("registered"), timeout=harness.START_TIMEOUT,
                           what="restarted agent registers with agent.key")
        self.assertFalse(ag2.log_events("enrolled"))
        self.srv.wait_model("m1")
        st, _, b = self.complete()
        self.assertEqual(st, 200, b)
        self.assertEqual(ag2.stop(), 0)

        # Restart with the spent token: agent.key wins, --token is ignored.
        ag3 = self.start_agent(token=tok, state_dir=sd)
        harness.wait_until(lambda: ag3.log_events("registered"), timeout=harness.START_TIMEOUT,
                           what="agent registers with agent.key despite --token")
        self.assertTrue(ag3.log_events("token_ignored"))
        self.assertFalse(ag3.log_events("enroll_rejected"))
        with open(path) as f:
            self.assertEqual(f.read().strip(), key)

    def test_used_up_token_refused(self):
        tok, tid = self.make_token(max_uses=1)
        self.assertEqual([k["state"] for k in self.keys("enrollment") if k["id"] == tid],
                         ["active"])
        a1 = self.start_agent(token=tok)
        harness.wait_until(lambda: os.path.exists(self.key_file(a1)),
                           timeout=harness.START_TIMEOUT, what="first agent enrolls")
        # Shown as used up, not active, once its one use is spent.
        self.assertEqual([k["state"] for k in self.keys("enrollment") if k["id"] == tid],
                         ["used_up"])
        a2 = self.start_agent(token=tok)
        rc = self.wait_exit(a2)
        self.assertNotEqual(rc, 0)
        rej = a2.log_events("enroll_rejected")
        self.assertTrue(rej, a2.log_text()[-2000:])
        self.assertIn("TOKEN_EXHAUSTED", rej[0]["msg"])
        self.assertIn("used up", rej[0]["msg"])
        self.assertFalse(os.path.exists(self.key_file(a2)))
        self.assertIn('gpupool_auth_failures_total{reason="exhausted"}', self.metrics())

    def test_check_route(self):
        # POST /agents/check answers for any credential and spends nothing.
        def check(cred):
            return http_json("POST", self.srv.url + "/agents/check", {},
                             headers=bearer(cred) if cred else None, timeout=10)
        tok, tid = self.make_token(max_uses=1)
        st, _, b = check(tok)
        self.assertEqual((st, b), (200, {"role": "enrollment"}))
        self.assertEqual([k["uses"] for k in self.keys("enrollment") if k["id"] == tid], [0])
        st, _, b = self.enroll(tok)
        self.assertEqual(st, 200, b)
        st, _, b = check(b["agent_key"])
        self.assertEqual((st, b), (200, {"role": "agent"}))
        st, _, b = check(tok)
        self.assertEqual((st, b["error"]["code"]), (403, "TOKEN_EXHAUSTED"), b)
        st, _, b = check("gpk_" + "1" * 64)
        self.assertEqual((st, b["error"]["code"]), (401, "INVALID_API_KEY"), b)
        st, _, b = check(None)
        self.assertEqual((st, b["error"]["code"]), (401, "UNAUTHORIZED"), b)
        st, _, b = check(self.client_key)
        self.assertEqual((st, b["error"]["code"]), (403, "WRONG_ROLE"), b)

    def test_expired_token_refused(self):
        tok, _ = self.make_token(max_uses=0, expires_in_sec=1)
        # A bad body after a valid token is a 400 that spends nothing; once
        # the token has expired the check answers first.
        harness.wait_until(lambda: self.enroll(tok, body={})[0] == 401, timeout=15,
                           what="token expires")
        st, _, b = self.enroll(tok)
        self.assertEqual(st, 401, b)
        self.assertEqual(b["error"]["code"], "KEY_EXPIRED")
        ag = self.start_agent(token=tok)
        rc = self.wait_exit(ag)
        self.assertNotEqual(rc, 0)
        rej = ag.log_events("enroll_rejected")
        self.assertTrue(rej, ag.log_text()[-2000:])
        self.assertIn("expired", rej[0]["msg"])

    def test_agent_key_as_token_still_works(self):
        # Back-compat: --token AGENTKEY (not an enrollment token) is used as is.
        st, _, b = self.admin("POST", "/admin/keys", {"role": "agent", "name": "direct"})
        self.assertEqual(st, 201, b)
        agent_key = b["key"]
        ag = self.start_agent(token=agent_key)
        self.srv.wait_model("m1")
        self.assertTrue(ag.log_events("enroll_skipped"))
        self.assertFalse(os.path.exists(self.key_file(ag)))
        st, _, b = self.complete()
        self.assertEqual(st, 200, b)


class TestEnrollEndpoint(EnrollBase):
    def test_errors(self):
        tok, _ = self.make_token(max_uses=5)
        st, _, b = http_json("POST", self.srv.url + "/agents/enroll",
                             {"agent_id": str(uuid.uuid4())}, timeout=10)
        self.assertEqual((st, b["error"]["code"]), (401, "UNAUTHORIZED"), b)
        st, _, b = self.enroll("gpk_" + "0" * 64)
        self.assertEqual((st, b["error"]["code"]), (401, "INVALID_API_KEY"), b)
        st, _, b = self.enroll(self.admin_key)
        self.assertEqual((st, b["error"]["code"]), (403, "WRONG_ROLE"), b)
        self.assertIn("correlation_id", b["error"])
        st, _, b = self.enroll(tok, body={"agent_id": "not-a-uuid"})
        self.assertEqual((st, b["error"]["code"]), (400, "INVALID_REQUEST"), b)
        self.assertIn("agent_id", b["error"]["message"])
        st, _, b = self.enroll(tok, body={"name": "x"})
        self.assertEqual(st, 400, b)
        # None of the refusals spent a use.
        toks = [k for k in self.keys("enrollment")]
        self.assertEqual(toks[0]["uses"], 0)
        # The token itself is no agent key.
        self.assertEqual(FakeAgent(self.srv.url, key=tok).poll()[0], 403)
        # Revoked token.
        st, _, b = self.admin("DELETE", "/admin/keys/" + toks[0]["id"])
        self.assertEqual(st, 200, b)
        st, _, b = self.enroll(tok)
        self.assertEqual((st, b["error"]["code"]), (401, "KEY_REVOKED"), b)

    def test_key_bound_to_its_agent_id(self):
        tok, _ = self.make_token(max_uses=2)
        aid = str(uuid.uuid4())
        st, hdr, b = self.enroll(tok, agent_id=aid)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["agent_id"], aid)
        self.assertTrue(b["agent_key"].startswith("gpk_"))
        self.assertTrue(b["key_id"].startswith("key_"))
        self.assertEqual(hdr.get("cache-control"), "no-store")
        key = b["agent_key"]
        other = FakeAgent(self.srv.url, key=key)  # another agent_id
        st, b = other.poll()
        self.assertEqual(st, 403, b)
        self.assertEqual(b["error"]["code"], "KEY_BOUND_TO_OTHER_AGENT")
        me = FakeAgent(self.srv.url, key=key, agent_id=aid)
        self.assertEqual(me.poll()[0], 200)
        # work and events as another agent are refused too.
        st, b = me._post("/agents/work", {"agent_id": other.agent_id, "free_slots": 1})
        self.assertEqual((st, b["error"]["code"]), (403, "KEY_BOUND_TO_OTHER_AGENT"), b)
        st, b = me._post("/agents/jobs/job_x/events",
                         {"agent_id": other.agent_id, "seq": 0, "events": []})
        self.assertEqual((st, b["error"]["code"]), (403, "KEY_BOUND_TO_OTHER_AGENT"), b)
        # ...while its own agent_id reaches the handler (unknown job: 404).
        st, b = me._post("/agents/jobs/job_x/events", {"agent_id": aid, "seq": 0, "events": []})
        self.assertEqual(st, 404, b)


class TestEnrollAuthOff(harness.TestCase):
    def test_enrollment_not_needed(self):
        up = self.h.start_upstream(["--tokens", "3"])
        srv = self.h.start_server()  # fresh DB, no key, loopback: auth off
        st, _, b = http_json("POST", srv.url + "/agents/enroll",
                             {"agent_id": str(uuid.uuid4())}, headers=bearer("gpk_whatever"),
                             timeout=10)
        self.assertEqual((st, b["error"]["code"]), (409, "ENROLLMENT_NOT_NEEDED"), b)
        self.assertIn("without a token", b["error"]["message"])
        ag = self.h.start_agent(srv, upstream=up, model="m1", token="gpk_whatever")
        srv.wait_model("m1")
        self.assertTrue(ag.log_events("enroll_skipped"))
        self.assertFalse(os.path.exists(os.path.join(ag.state_dir, "agent.key")))


class TestRevoke(EnrollBase):
    def test_revoke_ends_parked_poll_of_fake_agent(self):
        tok, _ = self.make_token(max_uses=1)
        aid = str(uuid.uuid4())
        st, _, b = self.enroll(tok, agent_id=aid)
        self.assertEqual(st, 200, b)
        key, key_id = b["agent_key"], b["key_id"]
        fa = FakeAgent(self.srv.url, key=key, agent_id=aid)
        self.assertEqual(fa.poll()[0], 200)
        result = {}

        def work():  # the raw reply: FakeAgent.work keeps only the jobs
            result["r"] = fa._post("/agents/work", {"agent_id": aid, "free_slots": 1},
                                   timeout=60)
        t = threading.Thread(target=work, daemon=True)
        t.start()
        harness.wait_until(lambda: self.parked() >= 1, timeout=10, what="long-poll parked")
        st, _, b = self.admin("DELETE", "/admin/keys/" + key_id)
        self.assertEqual(st, 200, b)
        t.join(15)  # generous bound; work_wait_sec is 20, revocation answers at once
        self.assertFalse(t.is_alive(), "parked long-poll still open after revocation")
        st, body = result["r"]
        self.assertEqual(st, 401, body)
        self.assertEqual(body["error"]["code"], "KEY_REVOKED")
        self.assertEqual(self.parked(), 0)
        # The key fails everywhere now, and the agent is out of scheduling.
        self.assertEqual(fa.poll()[0], 401)
        st, _, b = self.admin("GET", "/admin/agents")
        self.assertEqual(st, 200, b)
        mine = [a for a in b["agents"] if a["id"] == aid]
        self.assertEqual(mine[0]["state"], "offline", mine)

    def test_revoked_real_agent_exits(self):
        tok, _ = self.make_token(max_uses=1)
        ag = self.start_agent(token=tok)
        self.srv.wait_model("m1")
        agent_id = ag.agent_id()
        harness.wait_until(lambda: self.parked() >= 1, timeout=20, what="agent parks a long-poll")
        bound = [k for k in self.keys("agent") if k.get("agent_id") == agent_id]
        self.assertEqual(len(bound), 1, bound)
        st, _, b = self.admin("DELETE", "/admin/keys/" + bound[0]["id"])
        self.assertEqual(st, 200, b)
        rc = self.wait_exit(ag, timeout=20)
        self.assertNotEqual(rc, 0)
        ev = ag.log_events("auth_revoked")
        self.assertTrue(ev, ag.log_text()[-3000:])
        self.assertIn("KEY_REVOKED", ev[0]["msg"])
        self.assertIn("agent.key", ev[0]["msg"])
        # The model is gone from the pool with its only agent.
        harness.wait_until(lambda: "m1" not in self.srv.models(), timeout=10,
                           what="model leaves /v1/models")


if __name__ == "__main__":
    unittest.main()
