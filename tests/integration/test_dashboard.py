#!/usr/bin/env python3
"""The operator dashboard (docs/operations.md "Dashboard") in a real browser:
Debian's headless Chromium driven over the DevTools protocol (cdp.py)
against a server with auth on and two agents.

- /dashboard and its script and style are served without a key (they hold
  no data) with a strict Content-Security-Policy; /admin/events wants an
  admin key (401 without, 403 with a client key) and streams `snapshot`
  events;
- the page, given the admin key in its URL fragment (dropped from the
  address bar at once), shows both agents, the finished job of a request
  made before, the model with its slots, and the sparklines;
- clicking "drain" on one agent drains it (the admin API says so) and the
  page shows it draining with an "undrain" button;
- a screenshot is saved as <build>/tests/integration/output/dashboard.png.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp  # noqa: E402
import harness  # noqa: E402
from harness import bearer, http_json, http_request  # noqa: E402

OUT_DIR = os.path.join(os.environ.get("GPUPOOL_BUILD_DIR", "."), "tests", "integration", "output")


class DashboardTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not cdp.chromium_binary():
            # scripts/install-deps.sh installs it: CI never takes this path.
            self.skipTest("chromium is not installed (scripts/install-deps.sh installs it)")
        db = self.h.path("dash.db")
        self.admin = self.h.create_key(db, "admin", "ops")
        self.client = self.h.create_key(db, "client", "app")
        akeys = [self.h.create_key(db, "agent", "a%d" % i) for i in range(2)]
        self.srv = self.h.start_server(["--poll_interval_sec", "1"], db=db)
        self.up = self.h.start_upstream(["--tokens", "6"])
        self.agents = [self.h.start_agent(self.srv, upstream=self.up, model="m1", token=k,
                                          name="gpu-box-%d" % i)
                       for i, k in enumerate(akeys)]
        self.srv.wait_model("m1", key=self.client)
        self.ids = [a.agent_id() for a in self.agents]
        # wait_model needs one agent; the snapshots must list both: each
        # has polled once it is parked (the first one's model alone let
        # a loaded CI machine snapshot before the second registered).
        self.srv.wait_parked(2)
        self.browser = None

    def tearDown(self):
        if self.browser:
            self.browser.close()
        super().tearDown()

    def test_static_files_and_event_stream_auth(self):
        st, hdr, body = http_request("GET", self.srv.url + "/dashboard")
        self.assertEqual(st, 200)
        self.assertTrue(hdr["content-type"].startswith("text/html"))
        self.assertIn("default-src 'self'", hdr["content-security-policy"])
        self.assertIn(b"/dashboard/app.js", body)
        st, hdr, body = http_request("GET", self.srv.url + "/dashboard/app.js")
        self.assertEqual(st, 200)
        self.assertTrue(hdr["content-type"].startswith("text/javascript"))
        self.assertIn(b"/admin/events", body)
        st, hdr, _ = http_request("GET", self.srv.url + "/dashboard/app.css")
        self.assertEqual((st, hdr["content-type"].split(";")[0]), (200, "text/css"))
        st, _, b = http_json("GET", self.srv.url + "/admin/events")
        self.assertEqual(st, 401, b)
        st, _, b = http_json("GET", self.srv.url + "/admin/events", headers=bearer(self.client))
        self.assertEqual(st, 403, b)
        s = harness.SSEStream("GET", self.srv.url + "/admin/events", headers=bearer(self.admin),
                              timeout=30)
        self.assertEqual(s.status, 200)
        self.assertTrue(s.headers["content-type"].startswith("text/event-stream"))
        first = s.next_event(timeout=10)
        second = s.next_event(timeout=10)
        s.close()
        for e in (first, second):
            self.assertEqual(e["event"], "snapshot")
            snap = json.loads(e["data"])
            self.assertEqual(sorted(a["id"] for a in snap["agents"]), sorted(self.ids))
            self.assertEqual(len(snap["history"]), 60)
            self.assertIn("slots", snap["status"])

    def test_page_in_chromium(self):
        # A finished job for the page to list.
        st, hdr, b = http_json("POST", self.srv.url + "/v1/chat/completions",
                               {"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
                               headers=bearer(self.client), timeout=60)
        self.assertEqual(st, 200, b)
        job_id = hdr.get("x-pool-job-id") or b["id"]

        self.browser = cdp.Browser(self.h.tmp)
        page = self.browser.page()
        page.navigate(self.srv.url + "/dashboard#key=" + self.admin)
        page.wait_js("document.querySelectorAll('#agents tbody tr.agent-row').length === 2", timeout=60,
                     what="both agents on the page")
        # The key left the address bar (it never went to the server).
        self.assertEqual(page.js("location.hash"), "")
        self.assertEqual(page.js("document.getElementById('conn').dataset.state"), "live")
        names = page.js("[...document.querySelectorAll('#agents tbody tr.agent-row')]"
                        ".map(r => r.querySelector('strong').textContent).sort()")
        self.assertEqual(names, ["gpu-box-0", "gpu-box-1"])
        page.wait_js("document.querySelectorAll('#jobs tbody tr[data-status=\"done\"]').length >= 1",
                     timeout=30, what="the finished job in the list")
        jobs = page.js("[...document.querySelectorAll('#jobs tbody tr')].map(r => r.dataset.jobId)")
        st, _, listed = http_json("GET", self.srv.url + "/admin/jobs?limit=5",
                                  headers=bearer(self.admin))
        self.assertIn(listed["jobs"][0]["id"], jobs)
        self.assertTrue(job_id)
        model = page.js("document.querySelector('#models tr[data-model=\"m1\"] td:nth-child(2)')"
                        ".textContent")
        self.assertEqual(model, "2")
        self.assertEqual(page.js("document.querySelectorAll('#spark-req polyline').length"), 1)
        self.assertGreaterEqual(
            page.wait_js("Number(document.getElementById('t-rpm').textContent) >= 0 && "
                         "document.querySelectorAll('#keys tbody tr').length", timeout=30,
                         what="the key list"), 4)

        # Drain agent 0 from the page.
        target = self.ids[0]
        page.js("document.querySelector('button[data-drain=\"%s\"]').click()" % target)

        def drained():
            st, _, b = http_json("GET", self.srv.url + "/admin/agents", headers=bearer(self.admin))
            return any(a["id"] == target and a["admin_drain"] for a in b["agents"])
        harness.wait_until(drained, timeout=30, what="the server to drain the agent")
        page.wait_js("(() => { const r = document.querySelector('tr[data-agent-id=\"%s\"]');"
                     " return r && r.dataset.state === 'draining' &&"
                     " r.querySelector('button').textContent === 'undrain'; })()" % target,
                     timeout=30, what="the page to show the agent draining")
        other = page.js("document.querySelector('tr[data-agent-id=\"%s\"]').dataset.state"
                        % self.ids[1])
        self.assertEqual(other, "healthy")

        os.makedirs(OUT_DIR, exist_ok=True)
        shot = os.path.join(OUT_DIR, "dashboard.png")
        page.screenshot(shot)
        with open(shot, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        page.close()

    def test_page_without_a_key_asks_for_one(self):
        self.browser = cdp.Browser(self.h.tmp)
        page = self.browser.page()
        page.navigate(self.srv.url + "/dashboard")
        page.wait_js("!document.getElementById('login').hidden", timeout=30,
                     what="the login form")
        self.assertTrue(page.js("document.getElementById('main').hidden"))
        # A wrong key is refused with the server's message; the right one opens it.
        page.js("document.getElementById('login-key').value = 'gpk_wrong';"
                "document.getElementById('login-form').requestSubmit()")
        page.wait_js("document.getElementById('login-error').textContent.length > 0",
                     timeout=30, what="the refusal")
        page.js("document.getElementById('login-key').value = %s;"
                "document.getElementById('login-form').requestSubmit()" % json.dumps(self.admin))
        page.wait_js("document.querySelectorAll('#agents tbody tr.agent-row').length === 2", timeout=60,
                     what="the agents after signing in")
        page.close()


class HomeModeDashboard(harness.TestCase):
    """Issue 25: with auth off the server refuses foreign Host and Origin
    values and non-JSON bodies; its own dashboard (same origin, JSON) keeps
    working, drain button included, under 127.0.0.1 and localhost."""

    def setUp(self):
        super().setUp()
        if not cdp.chromium_binary():
            self.skipTest("chromium is not installed (scripts/install-deps.sh installs it)")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.up = self.h.start_upstream(["--tokens", "6"])
        self.agent = self.h.start_agent(self.srv, upstream=self.up, model="m1", name="home-box")
        self.srv.wait_model("m1")
        self.id = self.agent.agent_id()
        self.browser = None

    def tearDown(self):
        if self.browser:
            self.browser.close()
        super().tearDown()

    def test_dashboard_works_in_home_mode(self):
        self.browser = cdp.Browser(self.h.tmp)
        for host in ("127.0.0.1", "localhost"):
            with self.subTest(host=host):
                page = self.browser.page()
                page.navigate("http://%s:%d/dashboard" % (host, self.srv.port))
                page.wait_js("document.querySelectorAll('#agents tbody tr').length === 1",
                             timeout=60, what="the agent on the page")
                self.assertEqual(page.js("document.getElementById('conn').dataset.state"), "live")
                button = "document.querySelector('button[data-drain=\"%s\"]')" % self.id
                page.js(button + ".click()")
                want = host == "127.0.0.1"  # the first click drains, the second undrains

                def state():
                    st, _, b = http_json("GET", self.srv.url + "/admin/agents")
                    return [a["admin_drain"] for a in b["agents"] if a["id"] == self.id]
                harness.wait_until(lambda: state() == [want], timeout=30,
                                   what="the page's drain button to reach the server")
                page.close()


if __name__ == "__main__":
    harness.main()
