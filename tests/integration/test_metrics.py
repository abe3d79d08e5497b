"""GET /metrics after real traffic, validated by a real Prometheus parser.

A server with auth on (a client and an agent key) and one gpupool-agent
(gguf backend on models/stories260K.gguf when the agent has it, else the
openai backend on tests/integration/upstream.py) serve a handful of
requests: OpenAI chat (plain and streamed), an OpenAI completion, an
Anthropic message, an invalid body, an unknown model and two refused keys.
Then the scrape must

- pass `promtool check metrics` (Debian's prometheus package; exit status 0,
  no parse error, and no lint problem other than the ones listed in
  ALLOWED_LINT with the reason they are accepted);
- have every family docs/operations.md lists, with its TYPE;
- have well-formed histograms (cumulative buckets ending in +Inf, +Inf ==
  _count) whose _count matches the requests made;
- count exactly the requests, tokens and auth failures of the traffic.

promtool missing is a failure, not a skip: scripts/install-deps.sh (run by
scripts/test.sh) installs it.
"""

import math
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json, http_request, parse_sse, sse_data_json  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

# Every family of docs/operations.md (without the gpupool_ prefix) and its type.
FAMILIES = {
    "requests_total": "counter",
    "request_duration_seconds": "histogram",
    "time_to_first_token_seconds": "histogram",
    "scheduling_latency_seconds": "histogram",
    "tokens_generated_total": "counter",
    "queue_depth": "gauge",
    "jobs_running": "gauge",
    "agents": "gauge",
    "agents_parked": "gauge",
    "agents_liveness_parked": "gauge",
    "slots_busy": "gauge",
    "slots_capacity": "gauge",
    "agent_queue_depth": "gauge",
    "agent_kv_cache_utilization": "gauge",
    "agent_prefix_cache_lookups_total": "counter",
    "agent_prefix_cache_hits_total": "counter",
    "agent_prefix_cache_tokens_saved_total": "counter",
    "agent_prefix_cache_tokens_computed_total": "counter",
    "agent_prefix_cache_tokens_held": "gauge",
    "agent_backend": "gauge",
    "agent_error": "gauge",
    "agent_backend_faults_total": "counter",
    "gpu_vram_total_bytes": "gauge",
    "gpu_vram_used_bytes": "gauge",
    "gpu_vram_model_bytes": "gauge",
    "gpu_vram_free_bytes": "gauge",
    "gpu_utilization_ratio": "gauge",
    "gpu_temperature_celsius": "gauge",
    "gpu_power_watts": "gauge",
    "gpu_fault": "gauge",
    "failovers_total": "counter",
    "attempts_lost_total": "counter",
    "model_agents": "gauge",
    "auth_failures_total": "counter",
    "rate_limited_total": "counter",
    "db_writes_total": "counter",
    "db_errors_total": "counter",
    "db_ops_committed_total": "counter",
    "db_ops_failed_total": "counter",
    "db_drops_total": "counter",
    "db_commits_total": "counter",
    "db_statements_total": "counter",
    "db_queue_depth": "gauge",
}

# Lint findings of `promtool check metrics` that are accepted, and why. None
# so far: every other finding fails the test.
ALLOWED_LINT = ()

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def gguf_built():
    if not os.access(harness.AGENT_BIN, os.X_OK):
        return False
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    r = subprocess.run([harness.AGENT_BIN, "--model", "/nonexistent/x.gguf", "--state-dir",
                        "/nonexistent/state"], capture_output=True, text=True, timeout=30, env=env)
    return "not built" not in r.stderr


def parse_exposition(text):
    """Text format 0.0.4 into ({family: type}, {family: help},
    [(name, {labels}, value)]). Strict: an unknown line raises."""
    types, helps, samples = {}, {}, []
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            name, _, h = line[7:].partition(" ")
            helps[name] = h
            continue
        if line.startswith("# TYPE "):
            name, _, t = line[7:].partition(" ")
            assert name not in types, "family %s typed twice" % name
            assert name in helps, "TYPE before HELP for %s" % name
            types[name] = t
            continue
        m = _SAMPLE.match(line)
        assert m, "bad sample line: %r" % line
        labels = dict(_LABEL.findall(m.group(2) or ""))
        samples.append((m.group(1), labels, float(m.group(3))))
    return types, helps, samples


class MetricsTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        self.gguf = gguf_built()
        db = self.h.path("metrics.db")
        self.ckey = self.h.create_key(db, "client", "c")
        akey = self.h.create_key(db, "agent", "a")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"], db=db, key=self.ckey)
        if self.gguf:
            self.agent = self.h.start_agent(self.srv, upstream=None, slots=2, alias="tiny",
                                            token=akey,
                                            args=["--model", MODEL, "--threads", "1"])
        else:
            self.up = self.h.start_upstream(["--tokens", "6"])
            self.agent = self.h.start_agent(self.srv, upstream=self.up, model="tiny", slots=2,
                                            token=akey)
        self.srv.wait_model("tiny")

    def scrape(self):
        st, hdr, raw = http_request("GET", self.srv.url + "/metrics", timeout=10)
        self.assertEqual(st, 200, raw)
        self.assertTrue(hdr.get("content-type", "").startswith("text/plain; version=0.0.4"), hdr)
        return raw.decode()

    def promtool(self, text):
        self.assertTrue(os.access(PROMTOOL, os.X_OK),
                        "promtool not found: install Debian's prometheus package "
                        "(bash scripts/install-deps.sh does)")
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
        findings = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        bad = [ln for ln in findings if not any(a in ln for a in ALLOWED_LINT)]
        self.assertEqual(r.returncode, 0, "promtool check metrics failed:\n%s\n--- scrape\n%s"
                         % ("\n".join(findings), text))
        self.assertEqual(bad, [], "promtool findings:\n%s\n--- scrape\n%s" % ("\n".join(bad), text))

    def post(self, path, body, key=None):
        return http_json("POST", self.srv.url + path, body, headers=bearer(key or self.ckey),
                         timeout=120)

    def test_scrape_after_traffic(self):
        # Before any request: already valid, and the closed label sets are there.
        self.promtool(self.scrape())

        tokens = 0
        msgs = [{"role": "user", "content": "Tell a story"}]
        st, _, b = self.post("/v1/chat/completions",
                             {"model": "tiny", "messages": msgs, "max_tokens": 8})
        self.assertEqual(st, 200, b)
        tokens += b["usage"]["completion_tokens"]
        st, _, raw = http_request("POST", self.srv.url + "/v1/chat/completions",
                                  {"model": "tiny", "messages": msgs, "max_tokens": 8,
                                   "stream": True, "stream_options": {"include_usage": True}},
                                  headers=bearer(self.ckey), timeout=120)
        self.assertEqual(st, 200, raw)
        chunks = sse_data_json(parse_sse(raw))
        tokens += [c for c in chunks if c.get("usage")][-1]["usage"]["completion_tokens"]
        st, _, b = self.post("/v1/completions", {"model": "tiny", "prompt": "Once", "max_tokens": 5})
        self.assertEqual(st, 200, b)
        tokens += b["usage"]["completion_tokens"]
        st, _, b = self.post("/v1/messages", {"model": "tiny", "max_tokens": 6, "messages": msgs})
        self.assertEqual(st, 200, b)
        tokens += b["usage"]["output_tokens"]
        st, _, raw = http_request("POST", self.srv.url + "/v1/responses",
                                  {"model": "tiny", "input": "Once", "max_output_tokens": 4,
                                   "stream": True}, headers=bearer(self.ckey), timeout=120)
        self.assertEqual(st, 200, raw)
        done = [c for c in sse_data_json(parse_sse(raw))
                if c.get("type") in ("response.completed", "response.incomplete")]
        tokens += done[-1]["response"]["usage"]["output_tokens"]
        # Errors: a body that fails validation, a model nobody serves.
        st, _, b = self.post("/v1/chat/completions", {"model": "tiny", "messages": "nope"})
        self.assertEqual(st, 400, b)
        st, _, b = self.post("/v1/chat/completions", {"model": "no-such-model", "messages": msgs})
        self.assertEqual(st, 404, b)
        # Auth failures: a bad key and none at all.
        st, _, b = http_json("POST", self.srv.url + "/v1/completions",
                             {"model": "tiny", "prompt": "x"}, headers=bearer("gp-wrong"))
        self.assertEqual(st, 401, b)
        st, _, b = http_json("POST", self.srv.url + "/v1/completions", {"model": "tiny", "prompt": "x"})
        self.assertEqual(st, 401, b)
        self.assertGreater(tokens, 0)

        text = self.scrape()
        self.promtool(text)
        types, helps, samples = parse_exposition(text)

        # Families and types; counters end in _total.
        for fam, t in FAMILIES.items():
            self.assertEqual(types.get("gpupool_" + fam), t, "family gpupool_%s" % fam)
            self.assertTrue(helps.get("gpupool_" + fam), "HELP of gpupool_%s" % fam)
        for fam, t in types.items():
            self.assertTrue(fam.startswith("gpupool_"), fam)
            if t == "counter":
                self.assertTrue(fam.endswith("_total"), fam)
        # Bounded labels: never an id of a job or a key.
        for name, labels, _ in samples:
            for k, v in labels.items():
                self.assertNotIn(k, ("job", "job_id", "key", "key_id", "correlation_id"), name)
                self.assertFalse(v.startswith(("job_", "gp-")), (name, labels))

        def value(family, **labels):
            got = [v for n, ls, v in samples if n == "gpupool_" + family and ls == labels]
            self.assertEqual(len(got), 1, "one sample %s%r in:\n%s" % (family, labels, text))
            return got[0]

        self.check_histograms(types, samples)

        ok = {"api": "openai", "outcome": "ok"}
        self.assertEqual(value("requests_total", **ok), 3)
        self.assertEqual(value("request_duration_seconds_count", **ok), 3)
        self.assertEqual(value("request_duration_seconds_count", api="anthropic", outcome="ok"), 1)
        self.assertEqual(value("requests_total", api="openai", outcome="invalid_request"), 1)
        self.assertEqual(value("request_duration_seconds_count", api="openai",
                               outcome="model_not_found"), 1)
        self.assertEqual(value("time_to_first_token_seconds_count", api="openai", model="tiny"), 3)
        self.assertEqual(value("time_to_first_token_seconds_count", api="anthropic", model="tiny"), 1)
        # Responses under its own label, not OpenAI's.
        self.assertEqual(value("requests_total", api="responses", outcome="ok"), 1)
        self.assertEqual(value("time_to_first_token_seconds_count", api="responses", model="tiny"), 1)
        self.assertEqual(value("scheduling_latency_seconds_count", model="tiny",
                               priority="interactive"), 5)
        self.assertEqual(value("tokens_generated_total"), tokens)
        self.assertEqual(value("auth_failures_total", reason="invalid"), 1)
        self.assertEqual(value("auth_failures_total", reason="missing"), 1)
        for reason in ("rpm", "tokens_per_day", "queue_full"):
            self.assertEqual(value("rate_limited_total", reason=reason), 0)
        for mode in ("requeue", "continue", "error", "exhausted"):
            self.assertEqual(value("failovers_total", mode=mode), 0)
        for reason in ("agent_dead", "agent_offline", "agent_disconnected", "agent_restarted",
                       "agent_removed", "agent_dropped_job", "stalled", "agent_shutdown",
                       "upstream_error", "agent_error"):
            self.assertEqual(value("attempts_lost_total", reason=reason), 0)
        # The served model has its live agent; an unknown name never becomes a label.
        self.assertEqual(value("model_agents", model="tiny"), 1)
        self.assertFalse([s for s in samples if s[0] == "gpupool_model_agents"
                          and s[1].get("model") == "no-such-model"])
        self.assertEqual(value("agents", state="healthy"), 1)
        self.assertEqual(value("slots_capacity"), 2)
        self.assertEqual(value("jobs_running"), 0)
        aid = self.agent.agent_id()
        # Per-agent series carry the agent's name next to its id (legends).
        self.assertEqual(value("agent_queue_depth", agent=aid, name=self.agent.name), 0)
        if self.gguf:
            # The gguf backend reports its KV-cache use on every poll.
            kv = value("agent_kv_cache_utilization", agent=aid, name=self.agent.name)
            self.assertTrue(0 <= kv <= 1, kv)
        else:
            # The openai backend does not know it: no series rather than a fake 0.
            self.assertFalse([s for s in samples if s[0] == "gpupool_agent_kv_cache_utilization"])

    def check_histograms(self, types, samples):
        for fam, t in types.items():
            if t != "histogram":
                continue
            series = {}
            for name, labels, v in samples:
                if not name.startswith(fam + "_"):
                    continue
                suffix = name[len(fam) + 1:]
                self.assertIn(suffix, ("bucket", "sum", "count"), name)
                key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
                s = series.setdefault(key, {"bucket": [], "sum": None, "count": None})
                if suffix == "bucket":
                    s["bucket"].append((float(labels["le"]), v))
                else:
                    s[suffix] = v
            for key, s in series.items():
                what = "%s%r" % (fam, key)
                les = [le for le, _ in s["bucket"]]
                self.assertEqual(les, sorted(les), what)
                self.assertEqual(les[-1], math.inf, what)
                counts = [c for _, c in s["bucket"]]
                self.assertEqual(counts, sorted(counts), "buckets not cumulative: " + what)
                self.assertEqual(counts[-1], s["count"], "+Inf != _count: " + what)
                self.assertIsNotNone(s["sum"], what)
                self.assertGreaterEqual(s["sum"], 0, what)


if __name__ == "__main__":
    harness.main()
