"""One error body for every dialect (issue 11): the same facts in the same
place whichever API a request came through. A refused submit carries
Retry-After and error.retry_after_sec (beside the message) in OpenAI,
Anthropic and native bodies alike; an unknown model names param "model"
(OpenAI and Anthropic: error.param; native: error.details.param).

Before the change Anthropic bodies had no retry_after_sec and no param,
and native ones nested retry_after_sec under details.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from server_fakes import FakeAgent  # noqa: E402

BODIES = {
    "/v1/chat/completions": {"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {"model": "m1", "max_tokens": 8,
                     "messages": [{"role": "user", "content": "hi"}]},
    "/v2/tasks": {"model": "m1", "prompt": "hi", "max_tokens": 8},
}


def param_of(path, body):
    err = body["error"]
    if path == "/v2/tasks":
        return (err.get("details") or {}).get("param")
    return err.get("param")


class ErrorBodies(harness.TestCase):
    NEEDS = (harness.SERVER_BIN,)

    def test_same_fields_in_every_dialect(self):
        srv = self.h.start_server(["--max_queue", "1"])
        a = FakeAgent(srv.url, models=("m1",), slots=1)
        st, body = a.poll()
        self.assertEqual(st, 200, body)
        srv.wait_model("m1")

        for path, req in BODIES.items():
            st, hdr, r = harness.http_json("POST", srv.url + path, dict(req, model="nope"))
            self.assertEqual(st, 404, (path, r))
            self.assertEqual(param_of(path, r), "model", (path, r))

        # One queued task fills the queue (the agent has no parked
        # long-poll): every dialect's next submit is refused with 429.
        st, _, r = harness.http_json("POST", srv.url + "/v2/tasks", BODIES["/v2/tasks"])
        self.assertEqual(st, 202, r)
        for path, req in BODIES.items():
            st, hdr, r = harness.http_json("POST", srv.url + path, req)
            self.assertEqual(st, 429, (path, r))
            ra = int(hdr["retry-after"])
            self.assertGreaterEqual(ra, 1)
            self.assertEqual(r["error"].get("retry_after_sec"), ra, (path, r))
            self.assertNotIn("retry_after_sec", r["error"].get("details") or {}, (path, r))
            self.assertTrue(r["error"]["message"], (path, r))


if __name__ == "__main__":
    unittest.main()
