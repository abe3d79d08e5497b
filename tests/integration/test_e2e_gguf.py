"""End to end with the embedded engine: gpupool-server + gpupool-agent
--model models/stories260K.gguf (gguf backend). Greedy output through the
whole relay must equal llama.cpp's reference continuation
(tests/data/stories260K.greedy.json); streaming chat works; SIGTERM drains
and exits 0. Skipped when the agent was built without the gguf backend.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request, parse_sse, sse_data_json  # noqa: E402

MODEL = os.path.join(harness.SOURCE_DIR, "models", "stories260K.gguf")
GREEDY = os.path.join(harness.SOURCE_DIR, "tests", "data", "stories260K.greedy.json")


def gguf_built():
    if not os.access(harness.AGENT_BIN, os.X_OK):
        return False
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    r = subprocess.run([harness.AGENT_BIN, "--model", "/nonexistent/x.gguf", "--state-dir",
                        "/nonexistent/state"], capture_output=True, text=True, timeout=30, env=env)
    return "not built" not in r.stderr


class GgufE2ETest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.agent = self.h.start_agent(self.srv, upstream=None, slots=2, alias="tiny",
                                        args=["--model", MODEL, "--threads", "1"])
        self.srv.wait_model("tiny")

    def test_greedy_completion_matches_reference(self):
        with open(GREEDY) as f:
            cases = json.load(f)["cases"]
        case = cases[0]
        st, _, body = http_json("POST", self.srv.url + "/v1/completions",
                                {"model": "tiny", "prompt": case["prompt"], "temperature": 0,
                                 "max_tokens": case["n_generated"]}, timeout=120)
        self.assertEqual(st, 200, body)
        self.assertEqual(body["choices"][0]["text"], case["generated_text"])
        self.assertEqual(body["usage"]["completion_tokens"], case["n_generated"])

    def test_streaming_chat_and_drain(self):
        st, hdr, raw = http_request("POST", self.srv.url + "/v1/chat/completions",
                                    {"model": "tiny", "stream": True, "max_tokens": 12,
                                     "temperature": 0,
                                     "messages": [{"role": "user", "content": "Tell a story"}]},
                                    timeout=120)
        self.assertEqual(st, 200, raw)
        evs = parse_sse(raw)
        self.assertEqual(evs[-1]["data"], "[DONE]")
        chunks = sse_data_json(evs)
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        self.assertTrue(text)
        self.assertEqual(self.agent.stop(grace=30), 0)


if __name__ == "__main__":
    harness.main()
