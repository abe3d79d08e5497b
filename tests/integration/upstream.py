#!/usr/bin/env python3
"""A scripted OpenAI-compatible server for tests and benchmarks.

Serves POST /v1/completions, POST /v1/chat/completions (stream or not),
GET /v1/models, POST /tokenize (one token per word) and POST /apply-template
like llama-server / vLLM would, with behaviour chosen by flags
and changeable at run time through a control endpoint:

  --pace-ms MS        delay between tokens (default 0)
  --first-delay-ms MS delay before the first token (default 0)
  --tokens N          tokens per reply (default 8; a request's max_tokens caps it,
                      finish_reason "length" then, else "stop")
  --mode MODE         normal | stall | die | malformed | wrong_ctype | http500 | http400
                      stall:     stop sending after --after tokens, keep the socket open
                      die:       close the socket after --after tokens
                      malformed: send a chunk that is not JSON after --after tokens
                      wrong_ctype: 200 with text/html
                      http500 / http400: an error status with an OpenAI error body
  --after K           tokens sent before a stall/die/malformed (default 2)
  --models a,b        ids listed by /v1/models (default "m1")
  --honor-stop        stop before the first of the request's stop strings (vLLM-like:
                      finish_reason "stop", "stop_reason": the string in the last choice)
  --no-tokenize       POST /tokenize and /apply-template answer 404 (a server
                      without a count endpoint)
  --embeddings-dim N  serve POST /v1/embeddings with vectors of N floats
                      (embedding_vector(); usage: one token per word or id);
                      0 (the default, a chat-only server) answers 404.
  --embeddings-mode M normal | http500 (an error) | http503 (a server still
                      loading: its probes too); setting embeddings_mode.
                      The agent's start-up probe (input ["gpupool probe"]) is
                      not recorded in the log (tests count the log).

The "chat template" is the last message's content: a chat's usage counts
its words. POST /apply-template (llama-server) answers {"prompt": that text};
POST /tokenize counts the words of "content" (llama-server), or with the
setting tokenize_messages, of a body's "messages" through the template
(vLLM). Settings apply_template (default true) and tokenize_messages
(default false) choose which server it plays.
  --tool-call NAME    when a chat request offers a function tool NAME (in
                      "tools") and no message has role "tool" yet, answer with tool calls instead of text:
                      --tool-calls N calls (default 1) to NAME, call k with
                      arguments tool_arguments(k), id "call_up<req>_<k>",
                      streamed in pieces of 7 characters (after --tool-text
                      N text tokens, default 0), finish_reason "tool_calls".
                      A request that holds tool results gets text as usual
                      (derived from its last message's content).
  --port P --port-file F   listen on 127.0.0.1:P (0 = ephemeral), write the port to F
  --tls-cert C --tls-key K  serve HTTPS

A chat request with response_format json_object / json_schema gets a JSON
value for the schema (schema_example) in 5-character pieces, finish "stop";
with the setting structured_text (control only), that text instead (an
upstream that does not honour the schema). The setting tool_arguments_text
replaces the arguments of every scripted tool call likewise.

Control (JSON):
  POST /_control/config {"pace_ms":..,"mode":..,...}  change settings (returns all)
  POST /_control/reset                                 clear the request log
  GET  /_control/log  {"requests":[{id, path, model, stream, prompt, messages,
        tools, tool_choice, tool_calls_sent, headers, body, tokens_sent,
        started, ended, outcome, disconnected, disconnect_mono, disconnect_wall}]}
  (settings tool_call, tool_calls, tool_text are the --tool-* flags;
   name_stop (default true): with honor_stop, say which string stopped the
   reply; false answers as llama-server's OpenAI-compatible replies do,
   finish_reason "stop" and nothing else;
   hostile ones, control only: usage_prompt_tokens (reported instead of the
   count), x_pool_meta_bytes (an x_pool_meta of about that size on the last
   chunk/object), first_token_bytes (the first token is that many 'x'),
   done_gap_ms (the body's last chunk that long after [DONE], a write apart))
     outcome: "complete" | "stall" | "die" | "malformed" | "error_status" |
              "client_gone" | "running".  *_mono is time.monotonic() (the same
              CLOCK_MONOTONIC as the test process), *_wall is time.time().

Generated text is deterministic, see expected_tokens(): token i is
" " + word_i + str(i) where word_i cycles through the words of the prompt
(completion) or of the last message's content (chat), so a test can check
exactly what came back. A client that goes away is noticed within one pace
step (or 50 ms while stalled) through a readability check on the socket,
and recorded as "client_gone" with its time.
"""

import argparse
import json
import os
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def embedding_vector(item, dim):
    """The deterministic vector of one input (a string or a list of ids)."""
    text = item if isinstance(item, str) else " ".join(str(t) for t in item)
    seed = sum((i + 1) * ord(c) for i, c in enumerate(text)) + len(text)
    return [((seed * (k + 1) * 7919) % 2001) / 1000.0 - 1.0 for k in range(dim)]


MODES = ("normal", "stall", "die", "malformed", "wrong_ctype", "http500", "http400")


def prompt_text_of(body, chat):
    """The text the generated tokens are derived from."""
    if chat:
        msgs = body.get("messages") or []
        if msgs and isinstance(msgs[-1], dict):
            c = msgs[-1].get("content")
            if isinstance(c, str):
                return c
            if isinstance(c, list):
                return " ".join(p.get("text", "") for p in c if isinstance(p, dict))
        return ""
    p = body.get("prompt", "")
    if isinstance(p, list):
        p = " ".join(x for x in p if isinstance(x, str))
    return p if isinstance(p, str) else ""


def tool_arguments(k):
    """The arguments object of scripted tool call k."""
    return {"path": "/tmp/dir%d" % k, "depth": k + 1, "note": "say \"hi\" caf\u00e9"}


def offers_tool(body, name):
    tools = body.get("tools")
    if not name or not isinstance(tools, list):
        return False
    msgs = body.get("messages") or []
    if any(isinstance(m, dict) and m.get("role") == "tool" for m in msgs):
        return False  # the tools were called already: answer with text
    return any(isinstance(t, dict) and isinstance(t.get("function"), dict)
               and t["function"].get("name") == name for t in tools)


def expected_tokens(prompt_text, n):
    """The n tokens this upstream generates for prompt_text."""
    words = [w for w in prompt_text.split() if w] or ["tok"]
    # Keep tokens short and JSON-friendly whatever the prompt holds.
    words = ["".join(ch for ch in w if ch.isalnum())[:12] or "w" for w in words]
    return [" %s%d" % (words[i % len(words)], i) for i in range(n)]


def schema_value(schema, words, defs):
    """A JSON value valid for the simple schemas the tests send."""
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        return schema_value(defs.get(schema["$ref"].split("/")[-1], {}), words, defs)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for alt in ("anyOf", "oneOf"):
        if schema.get(alt):
            return schema_value(schema[alt][0], words, defs)
    t = schema.get("type")
    t = t[0] if isinstance(t, list) else t
    if t == "object" or "properties" in schema:
        return {k: schema_value(v, words, defs)
                for k, v in (schema.get("properties") or {}).items()}
    if t == "array":
        n = max(int(schema.get("minItems", 1)), 1)
        return [schema_value(schema.get("items", {"type": "string"}), words, defs)
                for _ in range(n)]
    if t == "string":
        return "".join(words).strip()[:int(schema.get("maxLength", 40))]
    if t == "integer":
        return int(schema.get("minimum", 1))
    if t == "number":
        return float(schema.get("minimum", 1.5))
    if t == "boolean":
        return True
    return None


def schema_example(rf, toks):
    if rf.get("type") == "json_object":
        return {"answer": "".join(toks).strip()}
    schema = (rf.get("json_schema") or {}).get("schema") or {}
    return schema_value(schema, toks, schema.get("$defs") or schema.get("definitions") or {})


class State:
    def __init__(self, args):
        self.lock = threading.Lock()
        self.cfg = {
            "pace_ms": args.pace_ms,
            "first_delay_ms": args.first_delay_ms,
            "tokens": args.tokens,
            "mode": args.mode,
            "after": args.after,
            "models": [m for m in args.models.split(",") if m],
            "tool_call": args.tool_call,
            "tool_calls": args.tool_calls,
            "tool_text": args.tool_text,
            "tokenize": not args.no_tokenize,
            "apply_template": True,
            "tokenize_messages": False,
            "honor_stop": args.honor_stop,
            "name_stop": True,
            "usage_prompt_tokens": None,
            "x_pool_meta_bytes": 0,
            "first_token_bytes": 0,
            "embeddings_dim": args.embeddings_dim,
            "embeddings_mode": args.embeddings_mode,
            "structured_text": None,
            "tool_arguments_text": None,
            "done_gap_ms": 0,
        }
        self.log = []
        self.next_id = 0

    def snapshot(self):
        with self.lock:
            return dict(self.cfg)

    def new_record(self, rec):
        with self.lock:
            self.next_id += 1
            rec["id"] = self.next_id
            self.log.append(rec)
            return rec


class ClientGone(Exception):
    pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scripted-upstream/1"
    # A reply is written in several small writes (head, then chunks): with
    # Nagle on, the second waits for the peer's delayed ACK (~40 ms on
    # Linux), which made every keep-alive request to this upstream ~44 ms.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # quiet unless asked
        if self.server.verbose:
            sys.stderr.write("upstream: " + (fmt % args) + "\n")

    # -- small helpers ----------------------------------------------------
    def send_json(self, status, obj, ctype="application/json"):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def client_gone(self):
        """True when the peer closed its side (EOF readable on the socket)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def wait(self, seconds, setting=None):
        """Sleep, watching for the client going away (raises ClientGone).
        With setting (a *_ms key of the config), a /_control/config change
        of that setting applies to sleeps already under way, so a test can
        let a held request go on."""
        start = time.monotonic()
        deadline = start + seconds
        while True:
            if self.client_gone():
                raise ClientGone()
            if setting:
                deadline = start + self.server.state.snapshot()[setting] / 1000.0
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def chunk(self, data):
        if isinstance(data, str):
            data = data.encode()
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            raise ClientGone()

    def mark_gone(self, rec):
        rec["disconnected"] = True
        rec["disconnect_mono"] = time.monotonic()
        rec["disconnect_wall"] = time.time()
        rec["outcome"] = "client_gone"
        rec["ended"] = time.time()

    # -- routes ------------------------------------------------------------
    def do_GET(self):
        st = self.server.state
        if self.path == "/_control/log":
            with st.lock:
                self.send_json(200, {"requests": list(st.log)})
            return
        if self.path == "/_control/config":
            self.send_json(200, st.snapshot())
            return
        if self.path in ("/v1/models", "/models"):
            cfg = st.snapshot()
            self.send_json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "upstream"} for m in cfg["models"]]})
            return
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
            return
        self.send_json(404, {"error": {"message": "no route", "type": "invalid_request_error"}})

    def do_POST(self):
        st = self.server.state
        raw = self.read_body()
        if self.path.startswith("/_control/"):
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self.send_json(400, {"error": "bad json"})
                return
            if self.path == "/_control/config":
                with st.lock:
                    for k, v in body.items():
                        if k not in st.cfg:
                            self.send_json(400, {"error": "unknown setting " + k})
                            return
                        if k == "mode" and v not in MODES:
                            self.send_json(400, {"error": "unknown mode " + str(v)})
                            return
                        st.cfg[k] = v
                    out = dict(st.cfg)
                self.send_json(200, out)
                return
            if self.path == "/_control/reset":
                with st.lock:
                    st.log.clear()
                self.send_json(200, {"ok": True})
                return
            self.send_json(404, {"error": "no route"})
            return
        cfg = st.snapshot()
        if self.path in ("/tokenize", "/apply-template") and \
                (not cfg["tokenize"] or (self.path == "/apply-template" and
                                         not cfg["apply_template"])):
            st.new_record({"path": self.path, "started": time.time(), "ended": time.time(),
                           "outcome": "error_status", "tokens_sent": 0, "disconnected": False,
                           "headers": {}})
            self.send_json(404, {"error": {"message": "no route", "type": "invalid_request_error"}})
            return
        if self.path in ("/tokenize", "/apply-template"):
            try:
                body = json.loads(raw)
            except ValueError:
                body = {}
            st.new_record({"path": self.path, "body": body, "started": time.time(),
                           "ended": time.time(), "outcome": "complete", "tokens_sent": 0,
                           "disconnected": False, "headers": {}})
            if self.path == "/apply-template":  # llama-server: the rendered chat
                self.send_json(200, {"prompt": prompt_text_of(body, True)})
            elif cfg["tokenize_messages"] and isinstance(body.get("messages"), list):
                # vLLM: the chat through its template
                n = len(prompt_text_of(body, True).split())
                self.send_json(200, {"count": n, "max_model_len": 4096, "tokens": list(range(n))})
            else:
                # llama-server reads "content", vLLM "prompt": one token per word.
                text = body.get("content", body.get("prompt", ""))
                toks = list(range(len(text.split()))) if isinstance(text, str) else []
                self.send_json(200, {"tokens": toks})
            return
        if self.path in ("/v1/embeddings", "/embeddings"):
            self.embeddings(raw, cfg)
            return
        if self.path in ("/v1/completions", "/completions"):
            self.generate(raw, chat=False)
            return
        if self.path in ("/v1/chat/completions", "/chat/completions"):
            self.generate(raw, chat=True)
            return
        st.new_record({"path": self.path, "started": time.time(), "ended": time.time(),
                       "outcome": "error_status", "tokens_sent": 0, "disconnected": False,
                       "headers": {}})
        self.send_json(404, {"error": {"message": "no route", "type": "invalid_request_error"}})

    def embeddings(self, raw, cfg):
        st = self.server.state
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        inputs = body.get("input")
        if not cfg["embeddings_dim"] or not isinstance(inputs, list):
            status, out = 404, {"error": {"message": "no route",
                                          "type": "invalid_request_error"}}
        elif cfg["embeddings_mode"] == "http500":
            status, out = 500, {"error": {"message": "embedding model crashed",
                                          "type": "server_error"}}
        elif cfg["embeddings_mode"] == "http503":
            status, out = 503, {"error": {"message": "Loading model", "type": "unavailable_error"}}
        else:
            dim = cfg["embeddings_dim"]
            ntok = sum(len(x.split()) if isinstance(x, str) else len(x) for x in inputs)
            # listed in reverse: the agent must place them by index
            data = [{"object": "embedding", "index": i,
                     "embedding": embedding_vector(x, dim)} for i, x in enumerate(inputs)]
            status, out = 200, {"object": "list", "model": body.get("model"),
                                "data": data[::-1],
                                "usage": {"prompt_tokens": ntok, "total_tokens": ntok}}
        if inputs != ["gpupool probe"]:
            st.new_record({"path": self.path, "body": body, "model": body.get("model"),
                           "started": time.time(), "ended": time.time(),
                           "outcome": "complete" if status == 200 else "error_status",
                           "tokens_sent": 0, "disconnected": False,
                           "headers": dict(self.headers)})
        self.send_json(status, out)

    def generate(self, raw, chat):
        st = self.server.state
        cfg = st.snapshot()
        rec = st.new_record({
            "path": self.path, "started": time.time(), "ended": None, "outcome": "running",
            "tokens_sent": 0, "disconnected": False, "disconnect_mono": None,
            "disconnect_wall": None,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "peer_port": self.client_address[1],  # the same for requests on one connection
        })
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            rec["outcome"] = "error_status"
            self.send_json(400, {"error": {"message": "invalid JSON body", "type": "invalid_request_error"}})
            return
        rec["body"] = body
        rec["model"] = body.get("model")
        rec["stream"] = bool(body.get("stream"))
        rec["prompt"] = body.get("prompt")
        rec["messages"] = body.get("messages")
        rec["tools"] = body.get("tools")
        rec["tool_choice"] = body.get("tool_choice")
        mode = cfg["mode"]
        if mode in ("http500", "http400"):
            rec["outcome"] = "error_status"
            rec["ended"] = time.time()
            code = 500 if mode == "http500" else 400
            self.send_json(code, {"error": {"message": "scripted failure %d" % code,
                                            "type": "server_error" if code == 500 else "invalid_request_error"}})
            return
        if mode == "wrong_ctype":
            rec["outcome"] = "error_status"
            rec["ended"] = time.time()
            data = b"<html><body>not an API</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return

        n = int(cfg["tokens"])
        max_tokens = body.get("max_tokens")
        finish = "stop"
        if isinstance(max_tokens, int) and 0 <= max_tokens < n:
            n = max_tokens
            finish = "length"
        toks = expected_tokens(prompt_text_of(body, chat), n)
        rec["response_format"] = body.get("response_format")
        if chat and isinstance(body.get("response_format"), dict) and \
                body["response_format"].get("type") in ("json_object", "json_schema"):
            # Structured output, as llama-server / vLLM honour it: a JSON
            # value for the schema, streamed in pieces of 5 characters.
            text = json.dumps(schema_example(body["response_format"], toks),
                              separators=(",", ":"))
            if cfg["structured_text"] is not None:
                text = cfg["structured_text"]
            toks = [text[i:i + 5] for i in range(0, len(text), 5)]
            finish = "stop"
        self.stop_word = None
        stops = body.get("stop")
        stops = [stops] if isinstance(stops, str) else stops if isinstance(stops, list) else []
        if cfg["honor_stop"] and stops:
            # Cut at the earliest stop string; tokens after it are never sent.
            text = "".join(toks)
            hits = [(text.find(w), w) for w in stops if isinstance(w, str) and w and w in text]
            if hits:
                at, self.stop_word = min(hits)
                rec["stopped_on"] = self.stop_word
                if not cfg["name_stop"]:
                    self.stop_word = None
                kept, used = [], 0
                for t in toks:
                    if used + len(t) <= at:
                        kept.append(t)
                        used += len(t)
                    else:
                        if at > used:
                            kept.append(t[:at - used])
                        break
                toks = kept
                finish = "stop"
        prompt_tokens = len(prompt_text_of(body, chat).split())
        if cfg.get("usage_prompt_tokens") is not None:
            prompt_tokens = int(cfg["usage_prompt_tokens"])
        if cfg.get("first_token_bytes") and toks:
            toks = ["x" * int(cfg["first_token_bytes"])] + toks[1:]
        # A continuation (upstream_continue.py took it out of the body) is
        # prompt the model reads, as with a real server: count it.
        if isinstance(body.get("x_continued_from"), int):
            prompt_tokens += body["x_continued_from"]
        cid = ("chatcmpl-" if chat else "cmpl-") + "%d" % rec["id"]
        created = int(time.time())
        model = body.get("model") or "m1"
        calls = []
        if chat and mode == "normal" and offers_tool(body, cfg["tool_call"]):
            toks = toks[:int(cfg["tool_text"])]
            calls = [{"id": "call_up%d_%d" % (rec["id"], k), "type": "function",
                      "function": {"name": cfg["tool_call"],
                                   "arguments": json.dumps(tool_arguments(k))
                                   if cfg["tool_arguments_text"] is None
                                   else cfg["tool_arguments_text"]}}
                     for k in range(int(cfg["tool_calls"]))]
            finish = "tool_calls"
        rec["tool_calls_sent"] = calls
        self.calls = calls
        try:
            if rec["stream"]:
                self.stream(rec, cfg, chat, toks, finish, cid, created, model, prompt_tokens, body)
            else:
                self.whole(rec, cfg, chat, toks, finish, cid, created, model, prompt_tokens)
        except ClientGone:
            self.mark_gone(rec)
            self.close_connection = True

    def whole(self, rec, cfg, chat, toks, finish, cid, created, model, prompt_tokens):
        mode = cfg["mode"]
        self.wait(cfg["first_delay_ms"] / 1000.0, "first_delay_ms")
        k = min(int(cfg["after"]), len(toks)) if mode in ("stall", "die", "malformed") else len(toks)
        for _ in range(k):
            self.wait(cfg["pace_ms"] / 1000.0)
            rec["tokens_sent"] += 1
        if mode == "stall":
            rec["outcome"] = "stall"
            self.wait(3600)
            return
        if mode == "die":
            rec["outcome"] = "die"
            rec["ended"] = time.time()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "malformed":
            rec["outcome"] = "malformed"
            rec["ended"] = time.time()
            data = b'{"id": "x", "choices": [ this is not json'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        text = "".join(toks)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(toks),
                 "total_tokens": prompt_tokens + len(toks)}
        if chat:
            message = {"role": "assistant", "content": text}
            if self.calls:
                message["tool_calls"] = self.calls
                message["content"] = text or None
            obj = {"id": cid, "object": "chat.completion", "created": created, "model": model,
                   "choices": [{"index": 0, "message": message,
                                "finish_reason": finish}], "usage": usage}
            if self.stop_word is not None:
                obj["choices"][0]["stop_reason"] = self.stop_word
        else:
            obj = {"id": cid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                   "usage": usage}
        if cfg.get("x_pool_meta_bytes"):
            obj["x_pool_meta"] = {"pad": "x" * int(cfg["x_pool_meta_bytes"])}
        rec["outcome"] = "complete"
        rec["ended"] = time.time()
        self.send_json(200, obj)

    def stream(self, rec, cfg, chat, toks, finish, cid, created, model, prompt_tokens, body):
        mode = cfg["mode"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

        def piece(delta_text, fin):
            if chat:
                delta = {} if delta_text is None else {"content": delta_text}
                return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]}
            return {"id": cid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": delta_text or "", "logprobs": None,
                                 "finish_reason": fin}]}

        if chat:
            first = piece(None, None)
            first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            self.chunk("data: %s\n\n" % json.dumps(first))
        self.wait(cfg["first_delay_ms"] / 1000.0, "first_delay_ms")
        for i, t in enumerate(toks):
            if mode in ("stall", "die", "malformed") and i >= int(cfg["after"]):
                break
            if i > 0 or cfg["pace_ms"]:
                self.wait(cfg["pace_ms"] / 1000.0)
            self.chunk("data: %s\n\n" % json.dumps(piece(t, None)))
            rec["tokens_sent"] += 1
        if mode == "stall":
            rec["outcome"] = "stall"
            self.wait(3600)
            return
        if mode == "die":
            rec["outcome"] = "die"
            rec["ended"] = time.time()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if mode == "malformed":
            rec["outcome"] = "malformed"
            self.chunk("data: {\"choices\": [ this is not json\n\n")
            # Then behave: a correct client must already have given up.
            self.chunk("data: [DONE]\n\n")
            self.chunk(b"")
            rec["ended"] = time.time()
            return
        for k, c in enumerate(self.calls):
            args = c["function"]["arguments"]
            for off in range(0, len(args), 7):
                tc = {"index": k, "function": {"arguments": args[off:off + 7]}}
                if off == 0:
                    tc["id"] = c["id"]
                    tc["type"] = "function"
                    tc["function"]["name"] = c["function"]["name"]
                    tc["function"]["arguments"] = ""
                    d = piece(None, None)
                    d["choices"][0]["delta"] = {"tool_calls": [dict(tc)]}
                    self.chunk("data: %s\n\n" % json.dumps(d))
                    tc = {"index": k, "function": {"arguments": args[off:off + 7]}}
                d = piece(None, None)
                d["choices"][0]["delta"] = {"tool_calls": [tc]}
                self.chunk("data: %s\n\n" % json.dumps(d))
        last = piece(None if chat else "", finish)
        if self.stop_word is not None:
            last["choices"][0]["stop_reason"] = self.stop_word
        if cfg.get("x_pool_meta_bytes"):
            last["x_pool_meta"] = {"pad": "x" * int(cfg["x_pool_meta_bytes"])}
        self.chunk("data: %s\n\n" % json.dumps(last))
        so = body.get("stream_options")
        if isinstance(so, dict) and so.get("include_usage"):
            u = piece(None, None)
            u["choices"] = []
            u["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": len(toks),
                          "total_tokens": prompt_tokens + len(toks)}
            self.chunk("data: %s\n\n" % json.dumps(u))
        self.chunk("data: [DONE]\n\n")
        if cfg.get("done_gap_ms"):  # the body's end apart from [DONE], as read
            time.sleep(cfg["done_gap_ms"] / 1000.0)
        self.chunk(b"")  # last chunk
        rec["outcome"] = "complete"
        rec["ended"] = time.time()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--pace-ms", type=float, default=0)
    ap.add_argument("--first-delay-ms", type=float, default=0)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--mode", choices=MODES, default="normal")
    ap.add_argument("--after", type=int, default=2)
    ap.add_argument("--models", default="m1")
    ap.add_argument("--tool-call", default=None)
    ap.add_argument("--tool-calls", type=int, default=1)
    ap.add_argument("--tool-text", type=int, default=0)
    ap.add_argument("--honor-stop", action="store_true",
                    help="end a reply before the first of the request's stop strings, as vLLM "
                         "does (finish_reason stop, the string in the choice's stop_reason)")
    ap.add_argument("--no-tokenize", action="store_true",
                    help="answer POST /tokenize with 404 (a server without a count endpoint)")
    ap.add_argument("--embeddings-dim", type=int, default=0,
                    help="serve POST /v1/embeddings with vectors of this length (0: 404)")
    ap.add_argument("--embeddings-mode", choices=("normal", "http500", "http503"),
                    default="normal")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate")
    ap.add_argument("--tls-key", help="private key of --tls-cert")
    args = ap.parse_args(argv)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 1024

    srv = Server(("127.0.0.1", args.port), Handler)
    if args.tls_cert:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.state = State(args)
    srv.verbose = args.verbose
    port = srv.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, args.port_file)
    sys.stderr.write("upstream: listening on 127.0.0.1:%d\n" % port)
    sys.stderr.flush()
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    import signal

    def _term(*_a):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, _term)
    sys.exit(main())
