#!/usr/bin/env python3
"""GPU facts on the server side (issue 22, item 4): fake agents post polls
as a GPU agent of gpupool-agent does (docs/protocol.md "Backend and GPUs")
to the real gpupool-server, which must

- keep only the known GPU fields, at most 16 GPUs per agent, and list them
  with the backend, the device faults and an agent error in /admin/agents
  (what the dashboard draws);
- export them as gpupool_gpu_* / gpupool_agent_backend / agent_error /
  agent_backend_faults_total samples labelled agent, name and gpu, and the
  scrape stays `promtool check metrics` clean;
- drop the series of GPUs an agent no longer reports;
- show a row per GPU (VRAM bar, utilisation, temperature) under its agent
  and the agent's error on the dashboard (headless Chromium, cdp.py).
"""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp  # noqa: E402
import harness  # noqa: E402
from harness import http_json, http_request  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
GIB = 1 << 30


def gpu(i, **kw):
    g = {"vendor": "nvidia", "index": i, "name": "NVIDIA H100 80GB HBM3",
         "vram_total": 80 * GIB, "vram_used": (20 + i) * GIB, "vram_free": (60 - i) * GIB,
         "vram_model": 18 * GIB, "utilization": 0.5 + i / 100, "temperature": 60 + i,
         "power_w": 300.5, "pci_bus_id": "0000:%02x:00.0" % (0x18 + i), "cuda_device": i,
         "driver": "580.65", "compute_capability": "9.0", "state": "ok"}
    g.update(kw)
    return g


class GpuAgent(FakeAgent):
    """A FakeAgent whose polls carry a GPU agent's facts."""

    def __init__(self, url, gpus, backend="cuda", error=None, faults=0, **kw):
        super().__init__(url, **kw)
        self.gpus, self.backend, self.error, self.faults = gpus, backend, error, faults

    def poll_body(self, busy=0, status="online"):
        b = super().poll_body(busy=busy, status=status)
        b["gpus"] = self.gpus
        b["backend"] = self.backend
        b["backend_faults"] = self.faults
        if self.error:
            b["error"] = self.error
            b["models"] = []
        return b


def samples(text, family):
    """{labels string: value} of one family's samples."""
    out = {}
    for line in text.splitlines():
        if line.startswith("gpupool_" + family + "{"):
            labels, value = line[len("gpupool_" + family):].rsplit(" ", 1)
            out[labels] = float(value)
    return out


class GpuFactsTest(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def setUp(self):
        super().setUp()
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.browser = None

    def tearDown(self):
        if self.browser:
            self.browser.close()
        super().tearDown()

    def scrape(self):
        st, _, raw = http_request("GET", self.srv.url + "/metrics", timeout=10)
        self.assertEqual(st, 200)
        return raw.decode()

    def admin_agent(self, agent_id):
        st, _, b = http_json("GET", self.srv.url + "/admin/agents")
        self.assertEqual(st, 200, b)
        return next(a for a in b["agents"] if a["id"] == agent_id)

    def test_facts_metrics_and_admin(self):
        gpus = [gpu(0), gpu(1, state="fault", utilization=0.0, extra_secret="x" * 40)]
        gpus += [gpu(i) for i in range(2, 20)]     # 20 GPUs: the server keeps 16
        a = GpuAgent(self.srv.url, gpus, name="gpu-box", faults=3)
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        bad = GpuAgent(self.srv.url, [gpu(0)], name="small-box", error={
            "code": "MODEL_DOES_NOT_FIT",
            "message": "the model does not fit in VRAM: device 0 needs 90.00 GiB"})
        st, body = bad.poll()
        self.assertEqual(st, 200, body)

        ag = self.admin_agent(a.agent_id)
        self.assertEqual(ag["backend"], "cuda")
        self.assertEqual(ag["backend_faults"], 3)
        self.assertIsNone(ag["error"])
        self.assertEqual(len(ag["gpus"]), 16)
        g0, g1 = ag["gpus"][0], ag["gpus"][1]
        self.assertEqual(g0, {"index": 0, "name": "NVIDIA H100 80GB HBM3",
                              "vram_total": 80 * GIB, "vram_used": 20 * GIB,
                              "vram_model": 18 * GIB, "vram_free": 60 * GIB,
                              "utilization": 0.5, "temperature": 60.0, "power_w": 300.5,
                              "state": "ok"})
        self.assertEqual(g1["state"], "fault")
        self.assertNotIn("extra_secret", g1)
        ab = self.admin_agent(bad.agent_id)
        self.assertEqual(ab["error"]["code"], "MODEL_DOES_NOT_FIT")
        self.assertIn("90.00 GiB", ab["error"]["message"])
        self.assertEqual(ab["models"], [])

        text = self.scrape()
        lab = 'agent="%s",name="gpu-box",gpu="%d"'
        self.assertEqual(samples(text, "gpu_vram_total_bytes")[
            "{" + lab % (a.agent_id, 0) + "}"], 80 * GIB)
        self.assertEqual(samples(text, "gpu_vram_model_bytes")[
            "{" + lab % (a.agent_id, 0) + "}"], 18 * GIB)
        self.assertEqual(samples(text, "gpu_temperature_celsius")[
            "{" + lab % (a.agent_id, 1) + "}"], 61)
        self.assertEqual(samples(text, "gpu_fault")["{" + lab % (a.agent_id, 1) + "}"], 1)
        self.assertEqual(samples(text, "gpu_fault")["{" + lab % (a.agent_id, 0) + "}"], 0)
        self.assertEqual(len([k for k in samples(text, "gpu_vram_total_bytes")
                              if a.agent_id in k]), 16)
        self.assertEqual(samples(text, "agent_backend")[
            '{agent="%s",name="gpu-box",backend="cuda"}' % a.agent_id], 1)
        self.assertEqual(samples(text, "agent_error")[
            '{agent="%s",name="small-box"}' % bad.agent_id], 1)
        self.assertEqual(samples(text, "agent_error")['{agent="%s",name="gpu-box"}' % a.agent_id],
                         0)
        self.assertEqual(samples(text, "agent_backend_faults_total")[
            '{agent="%s",name="gpu-box"}' % a.agent_id], 3)
        self.assertTrue(os.access(PROMTOOL, os.X_OK), "promtool not found "
                        "(bash scripts/install-deps.sh installs it)")
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""), text)

        # A GPU field out of range is refused with the field named.
        a.gpus = [gpu(0, utilization=7)]
        st, body = a.poll()
        self.assertEqual(st, 400, body)
        self.assertIn("gpus[0].utilization", body["error"]["message"])

        # The next poll with one GPU: the other GPUs' series go.
        st, body = a._post("/agents/poll", dict(a.poll_body(), gpus=[gpu(0)]))
        self.assertEqual(st, 200, body)
        harness.wait_until(lambda: len([k for k in samples(self.scrape(), "gpu_vram_total_bytes")
                                         if a.agent_id in k]) == 1, what="one GPU left")

    def test_dashboard_rows(self):
        if not cdp.chromium_binary():
            self.skipTest("chromium is not installed (scripts/install-deps.sh installs it)")
        a = GpuAgent(self.srv.url, [gpu(0), gpu(1, state="fault")], name="gpu-box")
        a.start()
        self.addCleanup(a.stop)
        bad = GpuAgent(self.srv.url, [], backend="cuda", name="small-box", error={
            "code": "MODEL_DOES_NOT_FIT", "message": "device 0 needs 90.00 GiB; 70.00 GiB free"})
        bad.start()
        self.addCleanup(bad.stop)
        harness.wait_until(lambda: self.admin_agent(bad.agent_id)["state"] == "healthy",
                           timeout=30, what="both agents registered")
        self.browser = cdp.Browser(self.h.tmp)
        page = self.browser.page()
        page.navigate(self.srv.url + "/dashboard")
        page.wait_js("document.querySelectorAll('#agents tbody tr.gpu-row').length === 2",
                     timeout=60, what="a row per GPU")
        rows = page.js("[...document.querySelectorAll('#agents tbody tr.gpu-row')]"
                       ".map(r => [r.dataset.gpuAgent, r.dataset.gpu, r.dataset.gpuState,"
                       " r.textContent, r.querySelector('.vram-model').style.width])")
        self.assertEqual([r[:3] for r in rows], [[a.agent_id, "0", "ok"],
                                                 [a.agent_id, "1", "fault"]])
        self.assertIn("GPU 0 · NVIDIA H100 80GB HBM3", rows[0][3])
        self.assertIn("util 50%", rows[0][3])
        self.assertIn("60 °C", rows[0][3])
        self.assertEqual(rows[0][4], "22.5%")   # 18 of 80 GiB
        # The GPU rows sit right under their agent's row.
        order = page.js("[...document.querySelectorAll('#agents tbody tr')].map(r =>"
                        " r.className + ':' + (r.dataset.agentId || r.dataset.gpuAgent ||"
                        " r.dataset.errorAgent))")
        i = order.index("agent-row:" + a.agent_id)
        self.assertEqual(order[i + 1:i + 3], ["gpu-row:" + a.agent_id] * 2)
        err = page.js("document.querySelector('tr.agent-error[data-error-agent=\"%s\"]')"
                      ".textContent" % bad.agent_id)
        self.assertIn("MODEL_DOES_NOT_FIT", err)
        self.assertIn("90.00 GiB", err)
        backend = page.js("document.querySelector('tr.agent-row[data-agent-id=\"%s\"] .backend')"
                          ".textContent" % a.agent_id)
        self.assertEqual(backend, "cuda")
        page.close()


if __name__ == "__main__":
    harness.main()
