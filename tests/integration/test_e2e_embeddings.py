"""POST /v1/embeddings end to end (issue 26 item 2): gpupool-server +
gpupool-agent --model models/stories260K.gguf (gguf backend), plain HTTP.
A string, an array of strings, token ids and arrays of token ids give one
unit-length vector per input in order, the same input the same vector,
different inputs different vectors; base64 decodes to the float vector;
usage counts the prompt tokens; errors are OpenAI's shape naming the
parameter (input, encoding_format, dimensions), including an input longer
than the model's context. Skipped when the agent has no gguf backend.
PassThroughTest / ChatOnlyUpstreamTest: an openai-backend agent passes
the job to its upstream's /v1/embeddings (upstream.py --embeddings-dim),
and only when that upstream answered its start-up probe.
"""

import base64
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import http_json, http_request  # noqa: E402
from test_e2e_gguf import MODEL, gguf_built  # noqa: E402
from upstream import embedding_vector  # noqa: E402


def norm(v):
    return math.sqrt(sum(x * x for x in v))


class EmbeddingsE2ETest(harness.TestCase):

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.agent = self.h.start_agent(self.srv, upstream=None, slots=2, alias="tiny",
                                        args=["--model", MODEL, "--threads", "1",
                                              "--ctx", "256"])
        self.srv.wait_model("tiny")

    def embed(self, body, want=200):
        st, _, out = http_json("POST", self.srv.url + "/v1/embeddings", body, timeout=120)
        self.assertEqual(st, want, out)
        return out

    def test_string_array_tokens(self):
        one = self.embed({"model": "tiny", "input": "Once upon a time"})
        self.assertEqual(one["object"], "list")
        self.assertEqual(one["model"], "tiny")
        self.assertEqual(len(one["data"]), 1)
        d = one["data"][0]
        self.assertEqual((d["object"], d["index"]), ("embedding", 0))
        vec = d["embedding"]
        self.assertEqual(len(vec), 64)  # stories260K's n_embd
        self.assertAlmostEqual(norm(vec), 1.0, places=4)
        self.assertGreater(one["usage"]["prompt_tokens"], 0)
        self.assertEqual(one["usage"]["total_tokens"], one["usage"]["prompt_tokens"])

        texts = ["The cat sat", "Once upon a time", "A big red apple"]
        many = self.embed({"model": "tiny", "input": texts, "user": "u1"})
        self.assertEqual([x["index"] for x in many["data"]], [0, 1, 2])
        vecs = [x["embedding"] for x in many["data"]]
        for a, b in zip(vecs[1], vec):
            self.assertAlmostEqual(a, b, places=5)   # same input, same vector
        self.assertGreater(max(abs(a - b) for a, b in zip(vecs[0], vecs[2])), 1e-3)
        self.assertGreater(many["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"])

        toks = self.embed({"model": "tiny", "input": [1, 400, 30, 9]})
        self.assertEqual(len(toks["data"]), 1)
        self.assertEqual(toks["usage"]["prompt_tokens"], 4)
        arrs = self.embed({"model": "tiny", "input": [[1, 400, 30, 9], [1, 50]]})
        self.assertEqual(len(arrs["data"]), 2)
        for a, b in zip(arrs["data"][0]["embedding"], toks["data"][0]["embedding"]):
            self.assertAlmostEqual(a, b, places=5)
        # its own api label in the request metrics
        st, _, raw = http_request("GET", self.srv.url + "/metrics", None, timeout=30)
        self.assertEqual(st, 200)
        self.assertIn('requests_total{api="embeddings",outcome="ok"} 4', raw.decode())

    def test_base64(self):
        f = self.embed({"model": "tiny", "input": "She was happy"})["data"][0]["embedding"]
        b = self.embed({"model": "tiny", "input": "She was happy",
                        "encoding_format": "base64"})["data"][0]["embedding"]
        self.assertIsInstance(b, str)
        raw = base64.b64decode(b)
        dec = struct.unpack("<%df" % (len(raw) // 4), raw)
        self.assertEqual(len(dec), len(f))
        for x, y in zip(dec, f):
            self.assertAlmostEqual(x, y, places=6)
        self.embed({"model": "tiny", "input": "x", "dimensions": 64})

    def test_errors_name_the_param(self):
        cases = [
            ({"model": "tiny"}, "input"),
            ({"model": "tiny", "input": ""}, "input"),
            ({"model": "tiny", "input": []}, "input"),
            ({"model": "tiny", "input": ["a", 3]}, "input"),
            ({"model": "tiny", "input": ["a"] * 2049}, "input"),
            ({"model": "tiny", "input": "a", "encoding_format": "int8"}, "encoding_format"),
            ({"model": "tiny", "input": "a", "dimensions": 0}, "dimensions"),
        ]
        for body, param in cases:
            out = self.embed(body, want=400)
            self.assertEqual(out["error"]["param"], param, out)
        # token ids beyond the context: refused by the server before a job
        out = self.embed({"model": "tiny", "input": [[1] * 300]}, want=400)
        self.assertIn("input[0]", out["error"]["message"])
        # a string beyond the context: the agent counts it
        out = self.embed({"model": "tiny", "input": ["hi", "word " * 400]}, want=400)
        self.assertIn("input[1]", out["error"]["message"])
        # dimensions other than the model's
        out = self.embed({"model": "tiny", "input": "a", "dimensions": 32}, want=400)
        self.assertIn("dimensions", out["error"]["message"])
        st, _, _ = http_json("POST", self.srv.url + "/v1/embeddings",
                             {"model": "nope", "input": "a"}, timeout=60)
        self.assertEqual(st, 404)


class LongInputsTest(harness.TestCase):
    """An agent whose context (1024) is longer than the short embeddings
    context (512 positions, 8 sequences): inputs over 512 tokens run one by
    one on a second context, the others together; the vectors come back in
    the request's order."""

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.agent = self.h.start_agent(self.srv, upstream=None, slots=1, alias="tiny",
                                        args=["--model", MODEL, "--threads", "1",
                                              "--ctx", "1024"])
        self.srv.wait_model("tiny")

    def embed(self, inp):
        st, _, out = http_json("POST", self.srv.url + "/v1/embeddings",
                               {"model": "tiny", "input": inp}, timeout=120)
        self.assertEqual(st, 200, out)
        return [d["embedding"] for d in out["data"]], out["usage"]["prompt_tokens"]

    def test_mixed_lengths_keep_order(self):
        a, b = [1, 400, 30, 9], [1, 50, 60]
        long_in = [1] + [(i * 7) % 500 + 10 for i in range(700)]
        (va,), _ = self.embed([a])
        (vb,), _ = self.embed([b])
        vecs, pt = self.embed([a, long_in, b])
        self.assertEqual(pt, len(a) + len(long_in) + len(b))
        self.assertEqual(len(vecs), 3)
        for x, y in zip(vecs[0], va):
            self.assertAlmostEqual(x, y, places=5)
        for x, y in zip(vecs[2], vb):
            self.assertAlmostEqual(x, y, places=5)
        self.assertAlmostEqual(norm(vecs[1]), 1.0, places=4)
        self.assertGreater(max(abs(x - y) for x, y in zip(vecs[1], va)), 1e-3)


class MixedFleetTest(harness.TestCase):
    """One model served by an openai-backend agent (no embeddings) and a
    gguf agent: embeddings jobs go only to the agent whose model facts say
    supports_embeddings; with only the openai agent left, the request is a
    400 naming model, not a queue until a timeout."""

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        self.up = self.h.start_upstream(["--tokens", "4"])
        self.srv = self.h.start_server(["--poll_interval_sec", "1", "--work_wait_sec", "5"])
        self.oa = self.h.start_agent(self.srv, upstream=self.up, model="m1", slots=2)
        self.ga = self.h.start_agent(self.srv, upstream=None, slots=2, alias="m1",
                                     args=["--model", MODEL, "--threads", "1"])
        for aid in (self.oa.agent_id(), self.ga.agent_id()):
            harness.wait_until(lambda aid=aid: any(
                e.get("agent_id") == aid and e.get("to") == "healthy"
                for e in self.srv.log_events("agent_state")),
                timeout=harness.START_TIMEOUT, what="agent %s healthy" % aid)

    def post(self):
        return http_json("POST", self.srv.url + "/v1/embeddings",
                         {"model": "m1", "input": ["a", "b"]}, timeout=60)

    def test_only_capable_agents(self):
        for _ in range(8):
            st, _, out = self.post()
            self.assertEqual(st, 200, out)
            self.assertEqual(len(out["data"][1]["embedding"]), 64)
        self.assertEqual(self.ga.stop(grace=30), 0)
        gid = self.ga.agent_id()
        harness.wait_until(lambda: any(
            e.get("agent_id") == gid and e.get("to") != "healthy"
            for e in self.srv.log_events("agent_state")),
            timeout=harness.START_TIMEOUT, what="gguf agent gone")
        st, _, out = self.post()
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["param"], "model")
        self.assertIn("supports_embeddings", out["error"]["message"])


class PassThroughTest(harness.TestCase):
    """An openai-backend agent whose upstream serves /v1/embeddings: the
    request goes there (upstream model, input as given, float), the
    upstream's vectors come back by index, usage passes through, base64 is
    the server's encoding of them, an upstream error is the job's error."""

    DIM = 8

    def setUp(self):
        super().setUp()
        self.up = self.h.start_upstream(["--embeddings-dim", str(self.DIM)])
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.agent = self.h.start_agent(self.srv, upstream=self.up, model="up-emb",
                                        alias="emb", slots=2)
        self.srv.wait_model("emb")

    def embed(self, body, want=200):
        st, _, out = http_json("POST", self.srv.url + "/v1/embeddings", body, timeout=60)
        self.assertEqual(st, want, out)
        return out

    def assertVec(self, got, want):
        self.assertEqual(len(got), len(want))
        for x, y in zip(got, want):
            self.assertAlmostEqual(x, y, places=5)

    def test_vectors_and_usage(self):
        texts = ["The cat sat", "Once upon a time", "A big red apple"]
        out = self.embed({"model": "emb", "input": texts})
        self.assertEqual(out["model"], "emb")
        self.assertEqual([d["index"] for d in out["data"]], [0, 1, 2])
        for d, t in zip(out["data"], texts):
            self.assertVec(d["embedding"], embedding_vector(t, self.DIM))
        self.assertEqual(out["usage"]["prompt_tokens"], 3 + 4 + 4)
        sent = [r for r in self.up.log_entries() if r["path"] == "/v1/embeddings"]
        self.assertEqual(len(sent), 1)
        self.assertEqual(sent[0]["body"], {"model": "up-emb", "input": texts,
                                           "encoding_format": "float"})
        one = self.embed({"model": "emb", "input": [5, 6, 7]})
        self.assertVec(one["data"][0]["embedding"], embedding_vector([5, 6, 7], self.DIM))
        self.assertEqual(one["usage"]["prompt_tokens"], 3)

    def test_base64(self):
        out = self.embed({"model": "emb", "input": "She was happy",
                          "encoding_format": "base64"})
        raw = base64.b64decode(out["data"][0]["embedding"])
        self.assertVec(struct.unpack("<%df" % (len(raw) // 4), raw),
                       embedding_vector("She was happy", self.DIM))

    def test_upstream_error(self):
        self.up.control(embeddings_mode="http500")
        st, _, out = http_json("POST", self.srv.url + "/v1/embeddings",
                               {"model": "emb", "input": "x"}, timeout=60)
        self.assertGreaterEqual(st, 500, out)
        self.assertIn("embedding model crashed", out["error"]["message"])


class ChatOnlyUpstreamTest(harness.TestCase):
    """Two openai-backend agents in one pool: the one whose upstream has
    no /v1/embeddings fails its probe, its facts do not say
    supports_embeddings, and a request for its model is a 400 naming model
    that never reaches that upstream; the other one's model is served."""

    def test_only_probed_upstreams_advertised(self):
        chat = self.h.start_upstream([])
        emb = self.h.start_upstream(["--embeddings-dim", "4"])
        srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.h.start_agent(srv, upstream=chat, model="chat-only", slots=1)
        self.h.start_agent(srv, upstream=emb, model="emb-too", slots=1)
        srv.wait_model("chat-only")
        srv.wait_model("emb-too")
        st, _, out = http_json("POST", srv.url + "/v1/embeddings",
                               {"model": "chat-only", "input": "x"}, timeout=60)
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["param"], "model")
        self.assertIn("supports_embeddings", out["error"]["message"])
        self.assertEqual([r for r in chat.log_entries() if "embeddings" in r["path"]], [])
        st, _, out = http_json("POST", srv.url + "/v1/embeddings",
                               {"model": "emb-too", "input": "x"}, timeout=60)
        self.assertEqual(st, 200, out)
        self.assertEqual(len(out["data"][0]["embedding"]), 4)


class LateUpstreamTest(harness.TestCase):
    """An upstream still loading at the agent's start (503 to the probe):
    not advertised then; the agent asks again (after 10 s) and once the
    upstream answers, the model's embeddings are served."""

    def test_probe_again(self):
        up = self.h.start_upstream(["--embeddings-dim", "4", "--embeddings-mode", "http503"])
        srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.h.start_agent(srv, upstream=up, model="late", slots=1)
        srv.wait_model("late")

        def post():
            return http_json("POST", srv.url + "/v1/embeddings",
                             {"model": "late", "input": "x"}, timeout=60)
        st, _, out = post()
        self.assertEqual(st, 400, out)
        self.assertEqual(out["error"]["param"], "model")
        up.control(embeddings_mode="normal")
        harness.wait_until(lambda: post()[0] == 200, timeout=60,
                           what="embeddings served after the second probe")
        st, _, out = post()
        self.assertEqual(len(out["data"][0]["embedding"]), 4)


class EncoderTest(harness.TestCase):
    """A gguf agent serving a BERT encoder (the generated
    tests/data/arch/tiny-random-bert-f16.gguf): /v1/embeddings answers with
    unit vectors of 64 that match llama.cpp's (the .embd.json reference);
    /v1/models lists it; every text-generation dialect (chat, completions,
    Responses, Anthropic Messages) refuses it with a 400 naming `model` in
    its own error shape, before any job is queued."""

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        path = os.path.join(harness.BUILD_DIR, "tests", "data", "arch",
                            "tiny-random-bert-f16.gguf")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.agent = self.h.start_agent(self.srv, upstream=None, slots=1, alias="minibert",
                                        args=["--model", path, "--threads", "1"])
        self.srv.wait_model("minibert")

    def test_embeddings_match_llama_cpp(self):
        import json
        with open(os.path.join(harness.SOURCE_DIR, "tests", "data", "arch",
                               "tiny-random-bert-f16.embd.json")) as f:
            ref = json.load(f)
        texts = [x["text"] for x in ref["inputs"]]
        st, _, out = http_json("POST", self.srv.url + "/v1/embeddings",
                               {"model": "minibert", "input": texts}, timeout=120)
        self.assertEqual(st, 200, out)
        self.assertEqual(out["usage"]["prompt_tokens"], sum(len(x["ids"]) for x in ref["inputs"]))
        for d, want in zip(out["data"], ref["inputs"]):
            v, w = d["embedding"], want["embedding"]
            self.assertEqual(len(v), 64)
            cos = sum(a * b for a, b in zip(v, w)) / (norm(v) * norm(w))
            self.assertGreaterEqual(cos, 0.9999)

    def test_generation_refused(self):
        cases = [
            ("/v1/chat/completions", {"model": "minibert",
                                      "messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/completions", {"model": "minibert", "prompt": "hi"}),
            ("/v1/responses", {"model": "minibert", "input": "hi"}),
        ]
        for path, body in cases:
            st, _, out = http_json("POST", self.srv.url + path, body, timeout=60)
            self.assertEqual(st, 400, (path, out))
            self.assertEqual(out["error"]["type"], "invalid_request_error", path)
            self.assertEqual(out["error"]["param"], "model", path)
            self.assertIn("embeddings model", out["error"]["message"], path)
        st, _, out = http_json("POST", self.srv.url + "/v1/messages",
                               {"model": "minibert", "max_tokens": 8,
                                "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
        self.assertEqual(st, 400, out)
        self.assertEqual(out["type"], "error")
        self.assertEqual(out["error"]["type"], "invalid_request_error")



class MixedEncoderDecoderTest(harness.TestCase):
    """One name served by an encoder agent (BERT) and a decoder agent
    (stories260K): text jobs go only to the decoder, never to the encoder
    (which would refuse them: before, round robin sent every other chat
    there and the client got an error), and embeddings still work."""

    def setUp(self):
        super().setUp()
        if not gguf_built():
            self.skipTest("gpupool-agent built without the gguf backend")
        bert = os.path.join(harness.BUILD_DIR, "tests", "data", "arch",
                            "tiny-random-bert-f16.gguf")
        self.srv = self.h.start_server(["--poll_interval_sec", "1"])
        self.enc = self.h.start_agent(self.srv, upstream=None, slots=2, alias="mix",
                                      args=["--model", bert, "--threads", "1"])
        self.dec = self.h.start_agent(self.srv, upstream=None, slots=2, alias="mix",
                                      args=["--model", MODEL, "--threads", "1"])
        ids = [self.enc.agent_id(), self.dec.agent_id()]
        harness.wait_until(lambda: all(harness.agent_info(self.srv.url, i).get("state") ==
                                       "healthy" for i in ids),
                           timeout=60, what="both agents healthy")

    def test_text_jobs_skip_the_encoder(self):
        for i in range(8):
            st, _, out = http_json("POST", self.srv.url + "/v1/chat/completions",
                                   {"model": "mix", "max_tokens": 4,
                                    "messages": [{"role": "user", "content": "hi %d" % i}]},
                                   timeout=120)
            self.assertEqual(st, 200, out)
            self.assertEqual(out["x_pool_meta"]["agent_id"], self.dec.agent_id())
            st, _, out = http_json("POST", self.srv.url + "/v1/completions",
                                   {"model": "mix", "max_tokens": 4, "prompt": "Once"},
                                   timeout=120)
            self.assertEqual(st, 200, out)
        st, _, out = http_json("POST", self.srv.url + "/v1/embeddings",
                               {"model": "mix", "input": "hello"}, timeout=120)
        self.assertEqual(st, 200, out)


if __name__ == "__main__":
    harness.main()
