#!/usr/bin/env python3
"""Stored Responses (issue 26, "Responses state"): store true (the default)
keeps a response per key so that previous_response_id and item_reference
resolve, GET / DELETE /v1/responses/{id} work, store false keeps nothing,
and another key's responses are 404 exactly like missing ones. A server
restart on the same DB keeps them. The scripted upstream's request log shows
the conversation the agent was really sent."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--work_wait_sec", "5"]


class ResponsesStateTest(harness.TestCase):

    def setUp(self):
        super().setUp()
        self.db = self.h.path("state.db")
        self.key_a = self.h.create_key(self.db, "client", "a")
        self.key_b = self.h.create_key(self.db, "client", "b")
        agent_key = self.h.create_key(self.db, "agent", "agent")
        self.up = self.h.start_upstream(["--tokens", "4", "--tool-call", "lookup"])
        self.srv = self.h.start_server(FAST, db=self.db)
        self.h.start_agent(self.srv, upstream=self.up, model="m1", token=agent_key)
        self.srv.wait_model("m1", key=self.key_a)

    def create(self, key, body):
        return http_json("POST", self.srv.url + "/v1/responses", dict({"model": "m1"}, **body),
                         headers=bearer(key), timeout=60)

    def sent(self):
        """Messages of the upstream's last chat request."""
        st, _, log = http_json("GET", self.up.url + "/_control/log")
        self.assertEqual(st, 200)
        return log["requests"][-1]["messages"]

    def test_previous_response_id_continues_the_conversation(self):
        st, _, r1 = self.create(self.key_a, {"instructions": "Be brief.", "input": "alpha beta"})
        self.assertEqual(st, 200, r1)
        self.assertTrue(r1["store"])
        text1 = r1["output"][0]["content"][0]["text"]
        st, _, r2 = self.create(self.key_a, {"previous_response_id": r1["id"],
                                             "input": "gamma delta"})
        self.assertEqual(st, 200, r2)
        self.assertEqual(r2["previous_response_id"], r1["id"])
        # The earlier turn and its answer, then the new input; the earlier
        # instructions are not carried over (as OpenAI does).
        self.assertEqual(self.sent(), [
            {"role": "user", "content": "alpha beta"},
            {"role": "assistant", "content": text1},
            {"role": "user", "content": "gamma delta"}])
        # A chain: the third turn sees both earlier ones.
        text2 = r2["output"][0]["content"][0]["text"]
        st, _, r3 = self.create(self.key_a, {"previous_response_id": r2["id"], "input": "eps",
                                             "instructions": "Now longer."})
        self.assertEqual(st, 200, r3)
        self.assertEqual(self.sent(), [
            {"role": "system", "content": "Now longer."},
            {"role": "user", "content": "alpha beta"},
            {"role": "assistant", "content": text1},
            {"role": "user", "content": "gamma delta"},
            {"role": "assistant", "content": text2},
            {"role": "user", "content": "eps"}])

    def test_item_reference_resolves_messages_and_calls(self):
        tools = [{"type": "function", "name": "lookup",
                  "parameters": {"type": "object", "properties": {}}}]
        st, _, r1 = self.create(self.key_a, {"input": "find it", "tools": tools})
        self.assertEqual(st, 200, r1)
        call = next(o for o in r1["output"] if o["type"] == "function_call")
        # What the AI SDK sends with store on: the call by reference, then
        # its output.
        st, _, r2 = self.create(self.key_a, {"tools": tools, "input": [
            {"role": "user", "content": "find it"},
            {"type": "item_reference", "id": call["id"]},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}]})
        self.assertEqual(st, 200, r2)
        sent = self.sent()
        self.assertEqual(sent[0], {"role": "user", "content": "find it"})
        self.assertEqual(sent[1]["role"], "assistant")
        self.assertEqual([c["id"] for c in sent[1]["tool_calls"]], [call["call_id"]])
        self.assertEqual(sent[1]["tool_calls"][0]["function"]["arguments"], call["arguments"])
        self.assertEqual(sent[2], {"role": "tool", "tool_call_id": call["call_id"],
                                   "content": "42"})
        # A text item by reference is the assistant's message.
        msg = next(o for o in r2["output"] if o["type"] == "message")
        st, _, r3 = self.create(self.key_a, {"input": [
            {"type": "item_reference", "id": msg["id"]}, {"role": "user", "content": "more"}]})
        self.assertEqual(st, 200, r3)
        self.assertEqual(self.sent()[0], {"role": "assistant",
                                          "content": msg["content"][0]["text"]})

    def test_get_delete_store_false_and_other_keys(self):
        st, _, r1 = self.create(self.key_a, {"input": "one two"})
        self.assertEqual(st, 200, r1)
        url = self.srv.url + "/v1/responses/" + r1["id"]
        st, _, got = http_json("GET", url, headers=bearer(self.key_a))
        self.assertEqual(st, 200, got)
        self.assertEqual(got["id"], r1["id"])
        self.assertEqual(got["output"], r1["output"])
        self.assertEqual(got["usage"], r1["usage"])
        # Another key sees nothing: the same 404 as for an unknown id.
        st, _, other = http_json("GET", url, headers=bearer(self.key_b))
        self.assertEqual(st, 404, other)
        st, _, unknown = http_json("GET", self.srv.url + "/v1/responses/resp_nope",
                                   headers=bearer(self.key_a))
        self.assertEqual(st, 404, unknown)
        self.assertEqual(other["error"]["type"], unknown["error"]["type"])
        st, _, e = self.create(self.key_b, {"previous_response_id": r1["id"], "input": "x"})
        self.assertEqual(st, 400, e)
        self.assertEqual(e["error"]["param"], "previous_response_id")
        msg_id = r1["output"][0]["id"]
        st, _, e = self.create(self.key_b, {"input": [{"type": "item_reference", "id": msg_id}]})
        self.assertEqual(st, 400, e)
        self.assertIn(msg_id, e["error"]["message"])
        self.assertEqual(http_json("DELETE", url, headers=bearer(self.key_b))[0], 404)
        # store false: answered, never kept.
        st, _, r2 = self.create(self.key_a, {"input": "three", "store": False})
        self.assertEqual(st, 200, r2)
        self.assertFalse(r2["store"])
        st, _, _ = http_json("GET", self.srv.url + "/v1/responses/" + r2["id"],
                             headers=bearer(self.key_a))
        self.assertEqual(st, 404)
        st, _, r3 = self.create(self.key_a, {"input": "four"})
        self.assertEqual(st, 200, r3)
        # Kept across a restart on the same DB; then deleted by its owner.
        self.srv.stop()
        # A stored row that does not load is the server's failure (500),
        # not a response that does not exist (404).
        self.h.execute(self.db, "UPDATE responses SET object = '{\"id\": ' WHERE id = ?",
                       (r3["id"],))
        self.srv = self.h.start_server(FAST, db=self.db, port=self.srv.port)
        st, _, got = http_json("GET", url, headers=bearer(self.key_a))
        self.assertEqual(st, 200, got)
        st, _, e = http_json("GET", self.srv.url + "/v1/responses/" + r3["id"],
                             headers=bearer(self.key_a))
        self.assertEqual(st, 500, e)
        self.assertEqual(e["error"]["type"], "server_error")
        st, _, d = http_json("DELETE", url, headers=bearer(self.key_a))
        self.assertEqual(st, 200, d)
        self.assertEqual(d, {"id": r1["id"], "object": "response", "deleted": True})
        self.assertEqual(http_json("GET", url, headers=bearer(self.key_a))[0], 404)
        self.assertEqual(http_json("DELETE", url, headers=bearer(self.key_a))[0], 404)
        st, _, e = self.create(self.key_a, {"previous_response_id": r1["id"], "input": "x"})
        self.assertEqual(st, 400, e)
        self.assertEqual(e["error"]["code"], "previous_response_not_found")

    def test_streamed_response_is_stored(self):
        s = harness.SSEStream("POST", self.srv.url + "/v1/responses",
                              {"model": "m1", "input": "stream me", "stream": True},
                              headers=bearer(self.key_a), timeout=60)
        self.assertEqual(s.status, 200)
        done = None
        while done is None:
            e = s.next_event(timeout=30)
            self.assertIsNotNone(e, "stream ended before response.completed")
            if e.get("event") in ("response.completed", "response.incomplete"):
                done = harness.json.loads(e["data"])["response"]
        s.close()
        st, _, got = http_json("GET", self.srv.url + "/v1/responses/" + done["id"],
                               headers=bearer(self.key_a))
        self.assertEqual(st, 200, got)
        self.assertEqual(got["output"], done["output"])
        self.assertNotIn("x_pool_meta", got)


if __name__ == "__main__":
    harness.main()
