#!/usr/bin/env python3
"""The operator configuration shipped in conf/: Prometheus alert rules and the
Grafana dashboard, checked against a real server's /metrics.

- conf/prometheus/gpupool-alerts.yml passes `promtool check rules`, and its
  unit tests (tests/prometheus/gpupool-alerts.test.yml: each alert firing on
  the series it is meant for, silent on a near miss, labels and rendered
  annotations) pass `promtool test rules`;
- conf/grafana/gpupool.json is a dashboard Grafana imports: unique panel ids,
  every panel on the data-source variable, grid positions inside 24 columns
  and not overlapping, every query parsed by Prometheus' own parser (each
  expression becomes a recording rule of a scratch file for `promtool check
  rules`, Grafana's variables replaced by values);
- every gpupool_ metric an alert or a panel names is a family a running
  gpupool-server exposes (a renamed metric breaks this test, not a 3 a.m.
  page that never fires).

promtool missing is a failure, not a skip: scripts/install-deps.sh installs it.
"""

import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_request  # noqa: E402

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ALERTS = os.path.join(harness.SOURCE_DIR, "conf", "prometheus", "gpupool-alerts.yml")
ALERT_TESTS = os.path.join(harness.SOURCE_DIR, "tests", "prometheus", "gpupool-alerts.test.yml")
DASHBOARD = os.path.join(harness.SOURCE_DIR, "conf", "grafana", "gpupool.json")
_METRIC = re.compile(r"\bgpupool_[a-z_]+")
_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def promtool(*args):
    if not os.path.exists(PROMTOOL):
        raise AssertionError("promtool not found: install Debian's prometheus package "
                             "(scripts/install-deps.sh does)")
    return subprocess.run([PROMTOOL] + list(args), capture_output=True, text=True, timeout=60)


def dashboard_exprs(dash):
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    for v in dash["templating"]["list"]:
        if v.get("type") == "query":
            out.append(("variable " + v["name"], v["definition"]))
    return out


def alert_exprs():
    # The rules file is YAML; its expressions are the `expr:` values (plain
    # or block scalars), read without a YAML library (none in the suite's deps).
    exprs, cur, block = [], None, False
    for line in open(ALERTS):
        s = line.rstrip("\n")
        m = re.match(r"^\s+- alert: (\S+)", s)
        if m:
            cur = m.group(1)
            block = False
            continue
        m = re.match(r"^(\s+)expr: (.*)$", s)
        if m:
            if m.group(2).strip() == "|":
                block = True
                exprs.append([cur, ""])
            else:
                exprs.append([cur, m.group(2)])
            continue
        if block:
            if re.match(r"^\s{10,}\S", s):
                exprs[-1][1] += " " + s.strip()
            else:
                block = False
    return [(a, e) for a, e in exprs]


def family(name):
    return _SUFFIX.sub("", name)


class OpsConfTest(harness.TestCase):

    def test_alert_rules_and_their_unit_tests(self):
        r = promtool("check", "rules", ALERTS)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = promtool("test", "rules", ALERT_TESTS)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        names = [a for a, _ in alert_exprs()]
        # Every alert has at least one unit test group that evaluates it.
        tests = open(ALERT_TESTS).read()
        for a in names:
            self.assertIn("alertname: %s\n" % a, tests, "alert %s has no unit test" % a)
        for a in ("GpupoolAgentDown", "GpupoolNoAgentForModel", "GpupoolQueueSaturated",
                  "GpupoolErrorRate", "GpupoolSlowFirstToken", "GpupoolStalledStreams"):
            self.assertIn(a, names)

    def test_dashboard_structure(self):
        dash = json.load(open(DASHBOARD))
        self.assertEqual(dash["uid"], "gpupool-overview")
        self.assertIn("datasource", [v["name"] for v in dash["templating"]["list"]])
        # Panels pick their data source through the variable: an __inputs
        # entry would be asked for at import and then used by nothing.
        self.assertNotIn("__inputs", dash)
        req = {(r["type"], r["id"]) for r in dash["__requires"]}
        self.assertIn(("datasource", "prometheus"), req)
        used = {p["type"] for p in dash["panels"] if p["type"] != "row"}
        self.assertEqual(used - {i for t, i in req if t == "panel"}, set())
        ids = [p["id"] for p in dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids repeat")
        cells = set()
        for p in dash["panels"]:
            g = p["gridPos"]
            self.assertTrue(g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"])
            for yy in range(g["y"], g["y"] + g["h"]):
                for xx in range(g["x"], g["x"] + g["w"]):
                    self.assertNotIn((xx, yy), cells, "panel %r overlaps another" % p["title"])
                    cells.add((xx, yy))
            if p["type"] == "row":
                continue
            self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
            self.assertTrue(p["targets"], p["title"])
            for t in p["targets"]:
                self.assertTrue(t["expr"].strip(), p["title"])
                # Per-agent series: legends by the agent's name, not its UUID.
                self.assertNotIn("{{agent}}", t.get("legendFormat", ""), p["title"])

    def test_dashboard_queries_parse(self):
        dash = json.load(open(DASHBOARD))
        rules = ["groups:", "  - name: dashboard", "    rules:"]
        for i, (title, expr) in enumerate(dashboard_exprs(dash)):
            if expr.startswith("label_values("):
                # A Grafana function, not PromQL: its metric is checked below.
                expr = re.match(r"label_values\(([^,]+),", expr).group(1)
            expr = expr.replace("$__rate_interval", "5m").replace('"$instance"', '".*"')
            self.assertNotIn("$", expr, "unreplaced Grafana variable in %r" % title)
            rules.append("      - record: gpupool:panel_%d" % i)
            rules.append("        expr: %s" % json.dumps(expr))
        path = self.h.path("dashboard-rules.yml")
        with open(path, "w") as f:
            f.write("\n".join(rules) + "\n")
        r = promtool("check", "rules", path)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_every_metric_named_is_exposed(self):
        srv = self.h.start_server([])
        st, _, raw = http_request("GET", srv.url + "/metrics", timeout=10)
        self.assertEqual(st, 200, raw)
        exposed = set(re.findall(r"^# TYPE (gpupool_[a-z_]+) ", raw.decode(), re.M))
        self.assertIn("gpupool_model_agents", exposed)
        dash = json.load(open(DASHBOARD))
        named = {}
        for where, expr in dashboard_exprs(dash) + alert_exprs():
            for m in _METRIC.findall(expr):
                named.setdefault(family(m), where)
        self.assertGreater(len(named), 20)
        missing = {m: w for m, w in named.items() if m not in exposed}
        self.assertEqual(missing, {}, "named by the dashboard or an alert, not exposed")


if __name__ == "__main__":
    harness.main()
