#!/usr/bin/env bash
# engine-bench.sh: the engine's speed next to llama.cpp's on this machine.
#
#   bench/engine-bench.sh BUILD_DIR
#
# Builds nothing: BUILD_DIR must hold gpupool-run, gguf-random and membw
# (cmake --build BUILD_DIR --target gpupool-run gguf-random membw).
# Writes random TinyLlama-1.1B-shaped models (Q8_0, Q4_K; about 1.8 GB in
# all) into a temporary directory (removed at exit), then runs
# `gpupool-run bench` on stories260K and on them, at 1 and 2 threads, and
# prints one table with llama.cpp's figures from
# bench/llamacpp-cpu-anchors.json beside ours, plus this machine's read
# bandwidth (membw) and generation speed as a fraction of
# bandwidth / bytes read per token. Figures are printed, never asserted.
#
# Environment (defaults in brackets):
#   PP [512] TG [128]            test sizes for stories260K
#   PP_BIG [512] TG_BIG [128]    test sizes for the TinyLlama-shaped models
#   REPS [3] REPS_BIG [2]        timed repetitions
#   THREADS [1,2]                thread counts
#   TYPES ["q8_0 q4_k"]          random model types
#   TMPDIR                       where the random models go
set -euo pipefail

if [[ $# -ne 1 || ! -d "$1" ]]; then
    echo "usage: $0 BUILD_DIR" >&2
    exit 2
fi
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
RUN="$BUILD/src/run/gpupool-run"
RND="$BUILD/bench/gguf-random"
MEMBW="$BUILD/bench/membw"
for b in "$RUN" "$RND" "$MEMBW"; do
    [[ -x "$b" ]] || { echo "$0: $b not built (cmake --build $BUILD --target gpupool-run gguf-random membw)" >&2; exit 1; }
done
PP=${PP:-512} TG=${TG:-128} PP_BIG=${PP_BIG:-512} TG_BIG=${TG_BIG:-128}
REPS=${REPS:-3} REPS_BIG=${REPS_BIG:-2} THREADS=${THREADS:-1,2} TYPES=${TYPES:-"q8_0 q4_k"}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpe-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RES="$WORK/results.jsonl"
: > "$RES"

echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "# memory bandwidth (membw) ..."
"$MEMBW" --mib 1024 --passes 6 --threads "$THREADS" --json > "$WORK/membw.jsonl"
cat "$WORK/membw.jsonl"

echo "# stories260K ..."
"$RUN" bench -m "$SRC/models/stories260K.gguf" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --json \
    | sed 's/^{/{"file":"stories260K.gguf",/' >> "$RES"
for t in $TYPES; do
    f="$WORK/tinyllama-1.1b-random-$t.gguf"
    echo "# writing $f ..."
    "$RND" --shape tinyllama-1.1b --type "$t" --seed 1 -o "$f" > /dev/null
    echo "# benchmarking $t ..."
    "$RUN" bench -m "$f" -p "$PP_BIG" -n "$TG_BIG" -r "$REPS_BIG" -t "$THREADS" --json \
        | sed "s/^{/{\"file\":\"tinyllama-1.1b-random-$t.gguf\",/" >> "$RES"
    rm -f "$f"
done

python3 - "$RES" "$WORK/membw.jsonl" "$SRC/bench/llamacpp-cpu-anchors.json" <<'PY'
import json, sys
res = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bw = {j["threads"]: j["read_GBps"] for j in (json.loads(l) for l in open(sys.argv[2]) if l.strip())}
anchors = json.load(open(sys.argv[3]))
amodels = anchors["models"]
# Our random Q4_K file is all Q4_K; llama.cpp's anchor is Q4_K_M (mixes in Q6_K).
alias = {"tinyllama-1.1b-random-q4_k.gguf": "tinyllama-1.1b-random-q4_k_m.gguf"}

def anchor(file, test, threads):
    m = amodels.get(alias.get(file, file))
    if not m:
        return None
    kind = "pp" if test.startswith("pp") else "tg"
    r = m["results"].get(kind + ("512" if kind == "pp" else "128"), {})
    if threads == 2:
        for k in ("median_2_threads", "median_excluding_contended_run"):
            if k in r:
                return r[k]
    if threads == 1 and "median_1_thread" in r:
        return r["median_1_thread"]
    return None

print()
print("| model | type | threads | test | gpupool t/s | llama.cpp t/s (anchor, 2 threads unless noted) | ratio | GB/s read | % of membw |")
print("|---|---|---|---|---|---|---|---|---|")
for r in res:
    a = anchor(r["file"], r["test"], r["threads"])
    tps = r["tokens_per_s"]
    ratio = "%.2f" % (tps / a) if a else "-"
    eff = pct = "-"
    if r["test"].startswith("tg") and r["bytes"] < 64 << 20:
        eff, pct = "-", "(fits in cache)"
    elif r["test"].startswith("tg"):
        gbs = tps * r["bytes"] / 1e9
        eff = "%.1f" % gbs
        b = bw.get(r["threads"])
        if b:
            pct = "%.0f%%" % (100 * gbs / b)
    print("| %s | %s | %d | %s | %.2f ± %.2f | %s | %s | %s | %s |" % (
        r["file"], r["quant"], r["threads"], r["test"], tps, r["stddev"],
        "%.1f" % a if a else "-", ratio, eff, pct))
print()
print("membw read GB/s: " + ", ".join("%d thread(s) %.2f" % (k, v) for k, v in sorted(bw.items())))
print("llama.cpp anchor bandwidth (2 threads, typical): %s GB/s" %
      anchors["memory_bandwidth_GBps"]["read_only_2_threads"]["typical"])
print("'GB/s read' = tg tokens/s x weight bytes (each weight read once per token).")
PY
