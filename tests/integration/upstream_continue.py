#!/usr/bin/env python3
"""upstream.py, continuation-aware (for the failover tests).

A real model given "prompt + text so far" continues the text. upstream.py
derives its tokens from the whole prompt, so a continuation would start a
different text. This wrapper makes it behave like a model:

- completion: the prompt's text after its last "::" is the continuation
  (the tests end their prompts with "::"; generated tokens never hold ':');
- chat: a last message with role "assistant" is the continuation (the
  agent's openai backend appends it so).

With k words of continuation it sends tokens k, k+1, ... of the sequence
upstream.expected_tokens(original prompt, --tokens), so the text before and
after a failover together are exactly that sequence. The request log shows
"x_continued_from": k and "x_continuation" in the record's body. Every
other behaviour (flags, modes, control endpoint) is upstream.py's.
"""

import json
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import upstream as U  # noqa: E402

_tl = threading.local()
_orig_expected = U.expected_tokens
_orig_snapshot = U.State.snapshot
_orig_generate = U.Handler.generate


def _off():
    return getattr(_tl, "off", 0)


def expected_tokens(prompt_text, n):
    off = _off()
    return _orig_expected(prompt_text, off + n)[off:]


def snapshot(self):
    cfg = _orig_snapshot(self)
    if _off():
        cfg["tokens"] = max(0, int(cfg["tokens"]) - _off())
    return cfg


def generate(self, raw, chat):
    _tl.off = 0
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        cont = None
        if chat:
            msgs = body.get("messages")
            if isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict) \
                    and msgs[-1].get("role") == "assistant":
                cont = str(msgs[-1].get("content") or "")
                body["messages"] = msgs[:-1]
        else:
            p = body.get("prompt")
            if isinstance(p, str) and "::" in p:
                i = p.rfind("::") + 2
                if p[i:]:
                    cont = p[i:]
                    body["prompt"] = p[:i]
        if cont is not None:
            _tl.off = len(cont.split())
            body["x_continued_from"] = _tl.off
            body["x_continuation"] = cont
        raw = json.dumps(body).encode()
    try:
        return _orig_generate(self, raw, chat)
    finally:
        _tl.off = 0


U.expected_tokens = expected_tokens
U.State.snapshot = snapshot
U.Handler.generate = generate

if __name__ == "__main__":
    def _term(*_a):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, _term)
    sys.exit(U.main())
