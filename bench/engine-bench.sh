#!/usr/bin/env bash
# engine-bench.sh: the engine's speed, per weight type, beside llama.cpp's.
#
#   bench/engine-bench.sh BUILD_DIR
#   LLAMA_BENCH=/path/to/llama-bench bench/engine-bench.sh BUILD_DIR
#
# Builds nothing: BUILD_DIR must hold gpupool-run, gguf-random and membw
# (cmake --build BUILD_DIR --target gpupool-run gguf-random membw).
# Writes random TinyLlama-1.1B-shaped models, one per type (0.6-2.2 GB
# each), into a temporary directory (each removed after use), and runs
# `gpupool-run bench` (ppP and tgN) on each. With LLAMA_BENCH set, llama.cpp's
# llama-bench runs on the same file, alternating with ours repetition by
# repetition (so that the host's load, which varies, hits both alike), and
# the table gets a ratio column (gpupool / llama.cpp, medians). Then
# multi-sequence decode: aggregate tokens/s of S sequences decoded together,
# relative to one. Decode is also shown as a fraction of the bandwidth
# bound (membw read GB/s / weight bytes read per token). Figures are
# printed, never asserted.
#
# Environment (defaults in brackets):
#   TYPES ["q4_0 q8_0 q4_k_m q6_k f16"]   also: q4_k q5_k bf16 f32
#   PP [512] TG [128] REPS [3] THREADS [2]
#   SEQS ["1 4 8"] SEQS_TYPE [q4_0] SEQS_TG [32]   multi-sequence decode
#   LLAMA_BENCH                  llama-bench binary (optional)
#   KEEP                         directory to keep / reuse the models in
#   TMPDIR                       where the temporary models go
set -euo pipefail

if [[ $# -ne 1 || ! -d "$1" ]]; then
    echo "usage: $0 BUILD_DIR" >&2
    exit 2
fi
BUILD=$(cd "$1" && pwd)
RUN="$BUILD/src/run/gpupool-run"
RND="$BUILD/bench/gguf-random"
MEMBW="$BUILD/bench/membw"
for b in "$RUN" "$RND" "$MEMBW"; do
    [[ -x "$b" ]] || { echo "$0: $b not built (cmake --build $BUILD --target gpupool-run gguf-random membw)" >&2; exit 1; }
done
TYPES=${TYPES:-"q4_0 q8_0 q4_k_m q6_k f16"}
PP=${PP:-512} TG=${TG:-128} REPS=${REPS:-3} THREADS=${THREADS:-2}
SEQS=${SEQS:-"1 4 8"} SEQS_TYPE=${SEQS_TYPE:-q4_0} SEQS_TG=${SEQS_TG:-32}
LB=${LLAMA_BENCH:-}
if [[ -n "$LB" && ! -x "$LB" ]]; then
    echo "$0: LLAMA_BENCH=$LB is not executable" >&2
    exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpe-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
MODELS=${KEEP:-$WORK}
mkdir -p "$MODELS"
RES="$WORK/results.jsonl"
: > "$RES"

# model TYPE: path of the random model of that type (written if missing)
model() {
    local f="$MODELS/tinyllama-1.1b-random-$1.gguf"
    if [[ ! -s "$f" ]]; then
        echo "# writing $f ..." >&2
        "$RND" --shape tinyllama-1.1b --type "$1" --seed 1 -o "$f.part" > /dev/null
        mv "$f.part" "$f"
    fi
    echo "$f"
}
# done_with PATH: remove a model unless KEEP holds it
done_with() { [[ -n "${KEEP:-}" ]] || rm -f "$1"; }

# one TYPE FILE TEST: one repetition of each side for pp or tg
ours() {
    local args=(-p 0 -n "$TG")
    [[ $3 == pp ]] && args=(-p "$PP" -n 0)
    "$RUN" bench -m "$2" "${args[@]}" -r 1 -t "$THREADS" --json |
        python3 -c 'import json,sys
for l in sys.stdin:
    if l.strip():
        r = json.loads(l); r["side"] = "gpupool"; r["type"] = sys.argv[1]; print(json.dumps(r))' "$1" >> "$RES"
}
theirs() {
    local args=(-p 0 -n "$TG")
    [[ $3 == pp ]] && args=(-p "$PP" -n 0)
    "$LB" -m "$2" "${args[@]}" -r 1 -t "$THREADS" -o jsonl 2> /dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    if l.strip():
        r = json.loads(l)
        test = ("pp%d" % r["n_prompt"]) if r["n_gen"] == 0 else ("tg%d" % r["n_gen"])
        print(json.dumps({"side": "llama.cpp", "type": sys.argv[1], "test": test,
                          "threads": r["n_threads"], "tokens_per_s": r["avg_ts"]}))' "$1" >> "$RES"
}

echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$MEMBW" --mib 1024 --passes 6 --threads "$THREADS" --json > "$WORK/membw.jsonl"
cat "$WORK/membw.jsonl"
for t in $TYPES; do
    f=$(model "$t")
    echo "# benchmarking $t (load $(cut -d' ' -f1 /proc/loadavg)) ..." >&2
    for r in $(seq "$REPS"); do
        for test in pp tg; do
            ours "$t" "$f" "$test"
            [[ -z "$LB" ]] || theirs "$t" "$f" "$test"
        done
    done
    [[ "$t" == "$SEQS_TYPE" ]] || done_with "$f"
done
f=$(model "$SEQS_TYPE")
echo "# multi-sequence decode, $SEQS_TYPE ..." >&2
for r in $(seq "$REPS"); do
    for s in $SEQS; do
        "$RUN" bench -m "$f" -p 0 -n "$SEQS_TG" -r 1 -t "$THREADS" --seqs "$s" --json |
            python3 -c 'import json,sys
for l in sys.stdin:
    if l.strip():
        r = json.loads(l); r["side"] = "seqs"; r["seqs"] = int(sys.argv[1]); print(json.dumps(r))' "$s" >> "$RES"
    done
done
done_with "$f"
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$RES" "$WORK/membw.jsonl" <<'PY'
import json, statistics, sys
res = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bw = {j["threads"]: j["read_GBps"] for j in (json.loads(l) for l in open(sys.argv[2]) if l.strip())}
med = lambda v: statistics.median(v) if v else None
keys = []
for r in res:
    if r["side"] != "seqs" and (r["type"], r["test"]) not in keys:
        keys.append((r["type"], r["test"]))
have_lb = any(r["side"] == "llama.cpp" for r in res)
print()
print("| type | test | gpupool t/s (median) | llama.cpp t/s (median) | ratio | % of membw bound |")
print("|---|---|---|---|---|---|")
for t, test in keys:
    ours = [r for r in res if r["side"] == "gpupool" and r["type"] == t and r["test"] == test]
    lc = [r["tokens_per_s"] for r in res if r["side"] == "llama.cpp" and r["type"] == t and r["test"] == test]
    o = med([r["tokens_per_s"] for r in ours])
    l = med(lc)
    pct = "-"
    if test.startswith("tg") and ours:
        b = bw.get(ours[0]["threads"])
        if b:
            pct = "%.0f%%" % (100 * o * ours[0]["bytes"] / 1e9 / b)
    print("| %s | %s | %.2f | %s | %s | %s |" % (t, test, o, "%.2f" % l if l else "-",
                                                "%.2fx" % (o / l) if l else "-", pct))
seqs = sorted({r["seqs"] for r in res if r["side"] == "seqs"})
if seqs:
    base = med([r["tokens_per_s"] for r in res if r["side"] == "seqs" and r["seqs"] == seqs[0]])
    print()
    print("| sequences | aggregate t/s (median) | vs %d |" % seqs[0])
    print("|---|---|---|")
    for s in seqs:
        v = med([r["tokens_per_s"] for r in res if r["side"] == "seqs" and r["seqs"] == s])
        print("| %d | %.2f | %.2fx |" % (s, v, v / base))
print()
print("membw read GB/s: " + ", ".join("%d thread(s) %.2f" % (k, v) for k, v in sorted(bw.items())))
print("'% of membw bound' = tg tokens/s x weight bytes (each weight read once per token) / membw.")
if have_lb:
    print("ratio = gpupool / llama.cpp; the two ran alternately, repetition by repetition.")
PY
