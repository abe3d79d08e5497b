#!/usr/bin/env python3
"""The gguf agent on a real GPU (issue 22): skipped where the engine sees no
CUDA device (CI), run by a GPU machine's check.

- `--backend auto` picks CUDA and says so in one `backend_choice` line; the
  server sees backend "cuda", the GPU's figures with the model's VRAM
  (`vram_model` > 0, state "ok") in /admin/agents and gpupool_gpu_* in
  /metrics (promtool clean), and a chat completion is served from the GPU;
- `--slots auto` picks slots from free VRAM (logged);
- `--backend cuda` with a model that cannot fit (a huge context and many
  slots) refuses it with the numbers, stays up, registers no model and
  reports MODEL_DOES_NOT_FIT as its error;
- a device fault on the GPU agent (GPUPOOL_ENGINE_FAULT=decode:N) fails a
  streamed greedy chat over to a CPU agent on the same file: the text is
  the uninterrupted one, token-exact (stories260K's greedy text is the same
  on CUDA and the CPU), and the GPU agent recovers after the backoff.
"""

import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "5", "--work_wait_sec", "5"]
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
CHAT = {"model": "tiny", "stream": True, "max_tokens": 48, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me a story about a cat"}]}


def gpu_visible():
    """Whether the agent's engine sees a CUDA device (the agent exits 2 at
    once without one; with one it goes on to load the model)."""
    if not os.access(harness.AGENT_BIN, os.X_OK):
        return False
    try:
        r = subprocess.run([harness.AGENT_BIN, "--server", "http://127.0.0.1:9", "--state-dir",
                            "/nonexistent", "--model", "/nonexistent/x.gguf", "--backend",
                            "cuda"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return True
    return "no usable GPU" not in r.stderr


class GpuTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gpu_visible():
            self.skipTest("no CUDA device visible to the engine")
        self.srv = self.h.start_server(FAST)

    def start_agent(self, args, env_extra=None):
        env = self.h.env()
        env.update(env_extra or {})
        a = self.h.start_agent(self.srv, alias="tiny", env=env, slots=None, args=list(args))
        aid = a.agent_id(timeout=120)
        harness.wait_until(lambda: self.info(aid).get("state") == "healthy", timeout=120,
                           what="agent healthy")
        return a, aid

    def info(self, aid):
        return harness.agent_info(self.srv.url, aid)

    def stream(self, prefer):
        return harness.chat_stream(self, self.srv.url,
                                   dict(CHAT, x_pool_options={"prefer_agent": prefer}))

    def test_auto_runs_on_the_gpu(self):
        a, aid = self.start_agent(["--model", MODEL])
        choice = a.log_events("backend_choice")
        self.assertEqual(len(choice), 1, choice)
        self.assertTrue(choice[0]["msg"].startswith("cuda: "), choice)
        print("backend_choice:", choice[0]["msg"])
        harness.wait_until(lambda: any((g.get("vram_model") or 0) > 0
                                       for g in self.info(aid).get("gpus", [])),
                           timeout=30, what="the model's VRAM in the GPU facts")
        info = self.info(aid)
        self.assertEqual(info["backend"], "cuda")
        used = [g for g in info["gpus"] if g["state"] == "ok"]
        self.assertTrue(used, info["gpus"])
        self.assertGreater(info["slots_total"], 1)   # auto slots from VRAM
        print("gpus:", json.dumps(info["gpus"]))
        st, hdr, body = http_json("POST", self.srv.url + "/v1/chat/completions",
                                  {"model": "tiny", "max_tokens": 16, "temperature": 0,
                                   "messages": [{"role": "user", "content": "Hi"}]}, timeout=120)
        self.assertEqual(st, 200, body)
        self.assertTrue(body["choices"][0]["message"]["content"])
        # Embeddings on the GPU: unit-length vectors of n_embd, distinct inputs apart.
        st, _, emb = http_json("POST", self.srv.url + "/v1/embeddings",
                               {"model": "tiny", "input": ["Once upon a time", "The dog ran"]},
                               timeout=120)
        self.assertEqual(st, 200, emb)
        vecs = [d["embedding"] for d in emb["data"]]
        self.assertEqual(len(vecs), 2)
        for v in vecs:
            self.assertEqual(len(v), 64)   # stories260K's n_embd
            self.assertAlmostEqual(sum(x * x for x in v), 1.0, places=4)
        self.assertLess(sum(x * y for x, y in zip(*vecs)), 0.9999)
        st, _, raw = http_request("GET", self.srv.url + "/metrics")
        text = raw.decode()
        self.assertIn('gpupool_gpu_vram_model_bytes{agent="%s"' % aid, text)
        self.assertRegex(text, r'gpupool_agent_backend\{agent="%s",name="[^"]*",backend="cuda"\} 1'
                         % aid)
        if os.access(PROMTOOL, os.X_OK):
            r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_model_that_does_not_fit_is_refused(self):
        a, aid = self.start_agent(["--model", MODEL, "--backend", "cuda", "--slots", "1024",
                                   "--ctx", "1048576"])
        harness.wait_until(lambda: (self.info(aid).get("error") or {}).get("code")
                           == "MODEL_DOES_NOT_FIT", timeout=30, what="the agent error")
        info = self.info(aid)
        self.assertEqual(info["models"], [])
        self.assertIn("GiB", info["error"]["message"])
        print("refusal:", info["error"]["message"])
        self.assertTrue(a.log_events("model_refused"))
        self.assertTrue(a.alive())

    def test_fault_fails_over_to_the_cpu_token_exact(self):
        file_a, file_b = self.h.path("a.gguf"), self.h.path("b.gguf")
        shutil.copyfile(MODEL, file_a)
        shutil.copyfile(MODEL, file_b)
        a, ida = self.start_agent(["--model", file_a, "--backend", "cuda", "--slots", "1"],
                                  {"GPUPOOL_ENGINE_FAULT": "decode:8"})
        b, idb = self.start_agent(["--model", file_b, "--backend", "cpu", "--slots", "1"])
        self.srv.wait_parked(2)
        base, meta = self.stream(idb)
        self.assertEqual(meta["agent_id"], idb)
        self.srv.wait_parked(2)
        text, meta = self.stream(ida)
        self.assertEqual(meta["attempts"], 2, meta)
        self.assertEqual(meta.get("continuation"), "tokens", meta)
        self.assertEqual(text, base)
        faults = a.log_events("engine_fault")
        self.assertEqual(len(faults), 1, faults)
        print("fault:", faults[0]["msg"])
        harness.wait_until(lambda: a.log_events("engine_recovered"), timeout=30,
                           what="the GPU engine back in service")
        harness.wait_until(lambda: self.info(ida).get("backend_faults") == 1, timeout=30,
                           what="the fault in the facts")


if __name__ == "__main__":
    harness.main()
