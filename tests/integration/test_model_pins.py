#!/usr/bin/env python3
"""Model attestation: pins from gpupoolctl, refusals, and x_pool_meta.

A server with an admin key and a gguf agent on models/stories260K.gguf
(alias "tiny"; the agent reports the file's sha256 in its poll facts):

- a completion's x_pool_meta carries model_sha256 = the file's sha256;
- `gpupoolctl models pin tiny OTHER` refuses the agent for that model at its
  next poll: /v1/models stops listing it, a request gets 503, `agents list`
  shows it REFUSED with the reason (JSON: refused_models), the server logs
  model_refused once (not at every poll);
- pinning the right digest brings it back; pins survive a server restart
  (SQLite); bad pins are 400, unpinning an unknown name 404.
"""

import hashlib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
CTL_BIN = os.environ.get("GPUPOOL_CTL_BIN") or os.path.join(harness.BUILD_DIR, "src", "ctl",
                                                            "gpupoolctl")
OTHER = "0" * 63 + "1"


class ModelPins(harness.TestCase):
    NEEDS = (harness.SERVER_BIN, harness.AGENT_BIN, CTL_BIN)

    def setUp(self):
        super().setUp()
        with open(MODEL, "rb") as f:
            self.sha = hashlib.sha256(f.read()).hexdigest()
        self.db = self.h.path("pins.db")
        self.admin = self.h.create_key(self.db, "admin", "ops")
        self.client = self.h.create_key(self.db, "client", "c")
        akey = self.h.create_key(self.db, "agent", "box")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"], db=self.db)
        self.ag = self.h.start_agent(self.srv, slots=1, alias="tiny", token=akey,
                                     args=["--model", MODEL, "--threads", "1"])
        self.srv.wait_model("tiny", key=self.client)
        self.aid = self.ag.agent_id()

    def ctl(self, *args):
        e = self.h.env()
        e["GPUPOOL_SERVER"] = self.srv.url
        e["GPUPOOL_ADMIN_KEY"] = self.admin
        r = subprocess.run([CTL_BIN] + list(args), capture_output=True, text=True, timeout=60,
                           env=e)
        for m in self.h.SANITIZER_MARKS:
            self.assertNotIn(m, r.stderr)
        return r

    def listed(self):
        return "tiny" in self.srv.models(key=self.client)

    def complete(self):
        return http_json("POST", self.srv.url + "/v1/completions",
                         {"model": "tiny", "prompt": "Once", "max_tokens": 3},
                         headers=bearer(self.client), timeout=60)

    def agent_row(self):
        st, _, b = http_json("GET", self.srv.url + "/admin/agents", headers=bearer(self.admin))
        self.assertEqual(st, 200, b)
        return [a for a in b["agents"] if a["id"] == self.aid][0]

    def test_pin_refuse_restore_and_persist(self):
        st, _, b = self.complete()
        self.assertEqual(st, 200, b)
        self.assertEqual(b["x_pool_meta"]["model_sha256"], self.sha)
        self.assertEqual(self.agent_row()["refused_models"], [])

        r = self.ctl("models", "pin", "tiny", OTHER)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("pinned tiny", r.stdout)
        harness.wait_until(lambda: not self.listed(), timeout=30, what="tiny refused")
        st, _, b = self.complete()
        self.assertEqual(st, 503, b)
        row = self.agent_row()
        self.assertEqual([m["id"] for m in row["models"]], [])
        (ref,) = row["refused_models"]
        self.assertEqual((ref["model"], ref["name"], ref["expected"], ref["got"]),
                         ("tiny", "tiny", OTHER, self.sha))
        self.assertIn("does not match", ref["reason"])
        r = self.ctl("agents", "list")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("tiny(REFUSED)", r.stdout)
        # Two more polls later, still one log line for the refusal.
        for _ in range(2):
            seen = self.agent_row()["last_seen"]
            harness.wait_until(lambda: self.agent_row()["last_seen"] > seen, timeout=30,
                               what="another poll")
        self.assertEqual(len(self.srv.log_events("model_refused")), 1)

        r = self.ctl("models", "pin", "tiny", self.sha.upper())
        self.assertEqual(r.returncode, 0, r.stderr)
        harness.wait_until(self.listed, timeout=30, what="tiny served again")
        st, _, b = self.complete()
        self.assertEqual(st, 200, b)
        self.assertEqual(self.agent_row()["refused_models"], [])
        self.assertEqual(len(self.srv.log_events("model_refusal_cleared")), 1)

        r = self.ctl("--json", "models", "pins")
        self.assertEqual(r.returncode, 0, r.stderr)
        pins = json.loads(r.stdout)["pins"]
        self.assertEqual([(p["name"], p["sha256"]) for p in pins], [("tiny", self.sha)])

        # A restart keeps the pin (SQLite); the agent comes back to the new server.
        port = self.srv.port
        self.srv.stop()
        self.srv = self.h.start_server(["--poll_interval_sec", "1"], db=self.db, port=port)
        st, _, b = http_json("GET", self.srv.url + "/admin/models/pins",
                             headers=bearer(self.admin))
        self.assertEqual(st, 200, b)
        self.assertEqual([(p["name"], p["sha256"]) for p in b["pins"]], [("tiny", self.sha)])
        self.srv.wait_model("tiny", key=self.client)

        r = self.ctl("models", "unpin", "tiny")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.ctl("models", "unpin", "tiny")
        self.assertEqual(r.returncode, 1)
        self.assertIn("PIN_NOT_FOUND", r.stderr)

    def test_bad_pins(self):
        for body, param in (({"name": "tiny", "sha256": "abc"}, "sha256"),
                            ({"name": "", "sha256": self.sha}, "name"),
                            ({"name": "a b", "sha256": self.sha}, "name"),
                            ({"sha256": self.sha}, "name")):
            st, _, b = http_json("POST", self.srv.url + "/admin/models/pins", body,
                                 headers=bearer(self.admin))
            self.assertEqual(st, 400, b)
            self.assertEqual(b["error"]["code"], "INVALID_REQUEST")
            self.assertIn(param, json.dumps(b))
        # Clients cannot pin.
        st, _, b = http_json("POST", self.srv.url + "/admin/models/pins",
                             {"name": "tiny", "sha256": self.sha}, headers=bearer(self.client))
        self.assertEqual(st, 403, b)
        r = self.ctl("models", "pin", "tiny")
        self.assertEqual(r.returncode, 2)
        st, _, b = http_json("GET", self.srv.url + "/admin/models/pins",
                             headers=bearer(self.admin))
        self.assertEqual(b["pins"], [])


if __name__ == "__main__":
    harness.main()
