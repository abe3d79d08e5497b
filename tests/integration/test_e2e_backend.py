#!/usr/bin/env python3
"""The gguf agent's backend choice and device faults with real processes
(issue 22, items 1 and 6), on any machine: the GPUs are hidden
(CUDA_VISIBLE_DEVICES=""), and a device fault is the engine's test hook
GPUPOOL_ENGINE_FAULT=decode:N (the N-th gpe_decode of each context fails
with GPE_ERR_BACKEND and leaves the context unusable, as a lost GPU does).

- `--backend cuda` without a usable GPU exits 2 with one line saying why;
- `--backend auto` runs on the CPU and logs one `backend_choice` line
  saying so and why; the server sees backend "cpu";
- agent A (fault at its 8th decode) and agent B serve the same file: a
  streamed greedy chat sent to A fails over to B when A's decode fails,
  and the client's text is byte-identical to an uninterrupted run (token
  continuation); A logs the fault, reports it (backend_faults 1 in
  /admin/agents), re-initialises its engine after the backoff and serves
  a request again;
- with fake GPUs (the engine loads fakegpu/fake_gpu_plugin.c as its CUDA
  plugin: GPUs of 4 GiB that compute nothing, and a model budgeted at
  8 GiB): `--backend cuda` refuses the model with the numbers per device
  (one GPU, then split over both), stays up, registers no model and
  reports MODEL_DOES_NOT_FIT to the server; `--backend auto` falls back
  to the CPU with the numbers in its one line; `--devices` naming a device
  that does not exist exits 2;
- with GPUPOOL_TEST_ENGINES=2 (tests only) the CPU slots run as two
  engines, as on two GPUs: two requests at once are each as run alone,
  and the prompt-prefix cache still finds its prefixes.
"""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
FAKEGPU = os.path.join(harness.BUILD_DIR, "tests", "integration", "libgpupool_fakegpu.so")
FAST = ["--poll_interval_sec", "1", "--agent_timeout_sec", "5", "--work_wait_sec", "5"]
FAULT_AT = 8   # decodes: the prompt's prefill is one, then one per token
SYSTEM = {"role": "system", "content": "You are a storyteller for small children. Your "
          "stories are short, kind and simple, with a happy ending."}
CHAT = {"model": "tiny", "stream": True, "max_tokens": 48, "temperature": 0,
        "messages": [SYSTEM, {"role": "user", "content": "Tell me a story about a cat"}]}


def gguf_built():
    r = subprocess.run([harness.AGENT_BIN, "--model", "/nonexistent/x.gguf", "--state-dir",
                        "/nonexistent", "--server", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=30)
    return "not built" not in (r.stdout + r.stderr)


def no_gpu_env(h, fault=None):
    env = h.env()
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("GPUPOOL_ENGINE_FAULT", None)
    if fault:
        env["GPUPOOL_ENGINE_FAULT"] = fault
    return env


class BackendTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")

    def start_agent(self, path, fault=None, args=(), engines=None, env_extra=None):
        env = no_gpu_env(self.h, fault)
        if engines:
            env["GPUPOOL_TEST_ENGINES"] = str(engines)
        env.update(env_extra or {})
        a = self.h.start_agent(self.srv, alias="tiny", env=env,
                               args=["--model", path, "--threads", "1"] + list(args))
        aid = a.agent_id(timeout=60)
        harness.wait_until(lambda: self.agent_info(aid).get("state") == "healthy", timeout=60,
                           what="agent healthy")
        return a, aid

    def agent_info(self, aid):
        return harness.agent_info(self.srv.url, aid)

    def stream(self, prefer, req=CHAT):
        return harness.chat_stream(self, self.srv.url,
                                   dict(req, x_pool_options={"prefer_agent": prefer}))

    def test_cuda_without_gpu_exits_2_with_one_line(self):
        r = subprocess.run([harness.AGENT_BIN, "--server", "http://127.0.0.1:9", "--state-dir",
                            self.h.path("st"), "--model", MODEL, "--backend", "cuda"],
                           capture_output=True, text=True, timeout=60, env=no_gpu_env(self.h))
        self.assertEqual(r.returncode, 2, r.stderr)
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].startswith("gpupool-agent: backend cuda: no usable GPU: "),
                        lines)

    def test_auto_logs_the_cpu_choice(self):
        self.srv = self.h.start_server(FAST)
        a, aid = self.start_agent(MODEL)
        choice = a.log_events("backend_choice")
        self.assertEqual(len(choice), 1, choice)
        self.assertTrue(choice[0]["msg"].startswith("cpu: no usable GPU ("), choice)
        harness.wait_until(lambda: self.agent_info(aid).get("backend") == "cpu", timeout=30,
                           what="backend cpu in /admin/agents")
        info = self.agent_info(aid)
        self.assertIsNone(info["error"])
        self.assertEqual(info["backend_faults"], 0)
        self.assertEqual(info["slots_total"], 1)

    def test_device_fault_fails_over_token_exact_and_recovers(self):
        self.srv = self.h.start_server(FAST)
        file_a, file_b = self.h.path("a.gguf"), self.h.path("b.gguf")
        shutil.copyfile(MODEL, file_a)
        shutil.copyfile(MODEL, file_b)
        a, ida = self.start_agent(file_a, fault="decode:%d" % FAULT_AT)
        b, idb = self.start_agent(file_b)
        self.srv.wait_parked(2)
        base, meta = self.stream(idb)
        self.assertEqual(meta["agent_id"], idb, meta)
        self.assertGreater(len(base), 40, base)

        self.srv.wait_parked(2)
        text, meta = self.stream(ida)
        self.assertEqual(text, base)
        self.assertEqual(meta["attempts"], 2, meta)
        self.assertEqual(meta["agent_id"], idb, meta)
        self.assertEqual(meta.get("continuation"), "tokens", meta)
        fo = self.srv.log_events("job_failover")
        self.assertEqual(len(fo), 1, fo)

        faults = a.log_events("engine_fault")
        self.assertEqual(len(faults), 1, faults)
        self.assertIn("injected fault", faults[0]["msg"])
        self.assertIn("re-initialises it in 1 s", faults[0]["msg"])
        harness.wait_until(lambda: self.agent_info(ida).get("backend_faults") == 1, timeout=30,
                           what="the fault in A's facts")
        harness.wait_until(lambda: a.log_events("engine_recovered"), timeout=30,
                           what="A's engine back in service")

        # A serves again: a short request (fewer decodes than FAULT_AT).
        self.srv.wait_parked(2)
        st, hdr, body = http_json("POST", self.srv.url + "/v1/chat/completions",
                                  {"model": "tiny", "max_tokens": 4, "temperature": 0,
                                   "messages": [{"role": "user", "content": "Hi"}],
                                   "x_pool_options": {"prefer_agent": ida}}, timeout=120)
        self.assertEqual(st, 200, body)
        self.assertEqual(hdr.get("x-pool-agent"), ida, body)
        self.assertTrue(a.alive() and b.alive())

    def test_slots_spread_over_engines(self):
        # GPUPOOL_TEST_ENGINES=2: the CPU slots run as two engines (two
        # contexts, two decode threads), as on two GPUs.
        self.srv = self.h.start_server(FAST)
        a, ida = self.start_agent(MODEL, args=["--slots", "2"], engines=2)
        ready = a.log_events("engine_ready")
        self.assertEqual([e["msg"].split(":")[0] for e in ready], ["engine 0 on the CPU engine",
                                                                  "engine 1 on the CPU engine"])
        self.srv.wait_parked(1)
        base, _ = self.stream(ida)
        other = dict(CHAT, messages=[SYSTEM, {"role": "user", "content": "Tell me about a dog"}])
        base2, _ = self.stream(ida, other)
        # Both at once: each engine runs one; the texts are as run alone.
        t1 = harness.in_thread(self.stream, ida)
        t2 = harness.in_thread(self.stream, ida, other)
        (text1, m1), (text2, m2) = t1(120), t2(120)
        self.assertEqual((text1, text2), (base, base2))
        self.assertEqual((m1["agent_id"], m2["agent_id"]), (ida, ida))
        # The same conversation again reuses its prefix, on whichever
        # engine holds it (the slot choice looks at every engine's slots).
        self.assertEqual(self.stream(ida)[0], base)
        harness.wait_until(lambda: self.hits(ida) >= 3, timeout=30, what="prefix hits")

    # -- fake GPUs (fakegpu/fake_gpu_plugin.c): 4 GiB each, a model of 8 GiB
    def fake_env(self, count=1, vram_mib=4096):
        if not os.path.exists(FAKEGPU):
            self.skipTest("the fake GPU plugin is not built")
        return {"GPUPOOL_CUDA_PLUGIN": FAKEGPU, "FAKEGPU_COUNT": str(count),
                "FAKEGPU_VRAM_MIB": str(vram_mib), "FAKEGPU_WEIGHTS_MIB": "8192"}

    def test_cuda_model_that_does_not_fit_is_an_agent_error(self):
        self.srv = self.h.start_server(FAST)
        a, aid = self.start_agent(MODEL, args=["--backend", "cuda"], env_extra=self.fake_env(2))
        harness.wait_until(lambda: (self.agent_info(aid).get("error") or {}).get("code")
                           == "MODEL_DOES_NOT_FIT", timeout=30, what="the agent error")
        info = self.agent_info(aid)
        self.assertEqual(info["models"], [])
        self.assertEqual(info["backend"], "cuda")
        msg = info["error"]["message"]
        # the numbers, per device, of one GPU and of the split over both
        self.assertIn("device 0 (Fake GPU 0) needs 8.31 GiB (weights 8.00, KV 0.00 for 1 slot(s) "
                      "of 512 positions, scratch 0.06, reserve 0.25) plus a margin of 0.25 GiB; "
                      "3.60 GiB free; device 1 (Fake GPU 1) needs 8.31 GiB", msg)
        self.assertIn("3.60 GiB free", msg)
        self.assertIn("split over 2 devices: device 0 (Fake GPU 0) needs 4.31 GiB", msg)
        refused = a.log_events("model_refused")
        self.assertEqual(len(refused), 1, refused)
        self.assertIn("Fake GPU", refused[0]["msg"])
        self.assertFalse(a.log_events("backend_choice"))
        # It takes no work and stays up; the server routes nothing to it.
        st, _, body = http_json("POST", self.srv.url + "/v1/chat/completions",
                                {"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(st, 404, body)
        self.assertTrue(a.alive())
        text = harness.http_request("GET", self.srv.url + "/metrics")[2].decode()
        self.assertRegex(text, r'gpupool_agent_error\{agent="%s",name="[^"]*"\} 1' % aid)

    def test_auto_falls_back_to_the_cpu_with_the_numbers(self):
        self.srv = self.h.start_server(FAST)
        a, aid = self.start_agent(MODEL, env_extra=self.fake_env(1))
        choice = a.log_events("backend_choice")
        self.assertEqual(len(choice), 1, choice)
        self.assertTrue(choice[0]["msg"].startswith(
            "cpu: the model does not fit in VRAM (device 0 (Fake GPU 0) needs 8.31 GiB"), choice)
        harness.wait_until(lambda: self.agent_info(aid).get("backend") == "cpu", timeout=30,
                           what="backend cpu")
        st, _, body = http_json("POST", self.srv.url + "/v1/chat/completions",
                                {"model": "tiny", "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "Hi"}]}, timeout=60)
        self.assertEqual(st, 200, body)

    def test_split_planned_then_cpu_when_the_contexts_fail(self):
        # 6 GiB GPUs: the model fits on neither alone but split over both;
        # the fake GPUs then refuse the context: auto takes the CPU.
        self.srv = self.h.start_server(FAST)
        a, aid = self.start_agent(MODEL, env_extra=self.fake_env(2, vram_mib=6144))
        choice = a.log_events("backend_choice")
        self.assertEqual(len(choice), 1, choice)
        self.assertEqual(choice[0]["msg"], "cpu: the CUDA context failed (CUDA devices 0,1: "
                         "CUDA device 0: the fake GPU plugin computes nothing "
                         "(INSUFFICIENT_VRAM))")
        harness.wait_until(lambda: self.agent_info(aid).get("backend") == "cpu", timeout=30,
                           what="backend cpu")

    def test_auto_slots_from_free_vram(self):
        # 16 GiB GPUs (14.4 free), 8 GiB of weights, 512 MiB of K/V per
        # slot of 512 positions: (14.4 - 0.72 margin - 8.81 for one slot)
        # / 0.5 + 1 = 10 slots per GPU, F16 K/V by default on CUDA.
        self.srv = self.h.start_server(FAST)
        env = self.fake_env(2, vram_mib=16384)
        env["FAKEGPU_KV_BYTES"] = str(1 << 20)
        a, aid = self.start_agent(MODEL, args=["--slots", "auto"], env_extra=env)
        plan = a.log_events("backend_plan")
        self.assertEqual([p["msg"] for p in plan],
                         ["cuda: one engine on each of device(s) 0,1; 20 slot(s) of 512 "
                          "positions, F16 KV cache"])

    def test_devices_that_do_not_exist_exit_2(self):
        env = no_gpu_env(self.h)
        env.update(self.fake_env(2))
        r = subprocess.run([harness.AGENT_BIN, "--server", "http://127.0.0.1:9", "--state-dir",
                            self.h.path("st"), "--model", MODEL, "--devices", "1,3"],
                           capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr.strip().splitlines(),
                         ["gpupool-agent: devices: CUDA device 3 does not exist (2 visible: "
                          "0..1)"])

    def hits(self, aid):
        text = harness.http_request("GET", self.srv.url + "/metrics")[2].decode()
        for ln in text.splitlines():
            if ln.startswith('gpupool_agent_prefix_cache_hits_total{agent="%s",' % aid):
                return float(ln.split()[-1])
        return 0


if __name__ == "__main__":
    harness.main()
