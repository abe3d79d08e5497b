#!/usr/bin/env python3
"""Record llama.cpp's pooled embeddings and token ids for the tiny random
encoder files (tests/data/arch/tiny-random-{bert,nomic-bert}-f16.gguf) as
tests/data/arch/X.embd.json, the references test_engine_encoder checks.

llama.cpp is only the measuring instrument: its llama-embedding binary is
run on the very file the build generates, and what it prints is stored.

    scripts/bert-embd-refs.py LLAMA_EMBEDDING BUILD/tests/data/arch/X.gguf OUT.json COMMIT

Two runs per file, 1 thread, flash attention off (the CPU flash path
rounds K/V to F16): --embd-output-format json for the vectors (normalised,
the file's pooling), --verbose-prompt for the token ids.
"""
import json
import re
import subprocess
import sys

# WordPiece cases: plain words, ## continuations, punctuation split off,
# upper case folded, accents stripped, CJK split per character, an unknown.
INPUTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "unaffable tokenization, with punctuation! And UPPER case...",
    "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u65e5\u672c\u8a9e",
    "retrieval-augmented generation (RAG) with embeddings \u2603",
]
SEP = "<#sep#>"


def run(exe, model, extra):
    cmd = [exe, "-m", model, "-t", "1", "-fa", "off", "--embd-separator", SEP,
           "-p", SEP.join(INPUTS)] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return cmd, out.stdout


def main():
    exe, model, out_path, commit = sys.argv[1:5]
    cmd, text = run(exe, model, ["--embd-output-format", "json"])
    vecs = [d["embedding"] for d in json.loads(text[text.index("{"):])["data"]]
    _, text = run(exe, model, ["--verbose-prompt", "--embd-output-format", "raw"])
    ids, cur = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+) -> '", line)
        if m:
            if cur is None:
                cur = []
                ids.append(cur)
            cur.append(int(m.group(1)))
        elif cur is not None and not line.strip():
            cur = None
    assert len(ids) == len(INPUTS) == len(vecs), (len(ids), len(vecs))
    name = model.rsplit("/", 1)[-1]
    ref = {
        "file": name,
        "llama_cpp_commit": commit,
        "command": "llama-embedding -m %s -t 1 -fa off --embd-separator '%s' "
                   "-p '<the inputs joined by the separator>' --embd-output-format json "
                   "(vectors); the same with --verbose-prompt --embd-output-format raw "
                   "(token ids)" % (name, SEP),
        "inputs": [{"text": t, "ids": i, "embedding": v}
                   for t, i, v in zip(INPUTS, ids, vecs)],
    }
    with open(out_path, "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
