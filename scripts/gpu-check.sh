#!/usr/bin/env bash
# One command on a GPU machine: build with CUDA for the local GPU only, run
# every CUDA test, serve a generated TinyLlama-shaped model from the GPU
# through gpupool-server + gpupool-agent (a streamed chat completion and an
# Anthropic message, checked), benchmark the CUDA engine, and print a report.
# Without an NVIDIA GPU it says so, skips everything and exits 0.
#
#   bash scripts/gpu-check.sh                      # build in build/gpu, report in build/gpu-check
#   bash scripts/gpu-check.sh --prebuilt DIR       # use binaries built elsewhere (DIR/bin, DIR/lib)
#   bash scripts/gpu-check.sh --out DIR --quick    # report elsewhere; smaller benchmark
#
# --prebuilt DIR is for GPU machines without the build dependencies: DIR/bin
# holds gpupool-server, gpupool-agent, gpupool-run, gguf-random, gguf-synth,
# test_cuda and test_engine_arch; DIR/lib the shared libraries they need
# (put first on LD_LIBRARY_PATH); DIR/paths the paths the tests were built
# with. scripts/gpu-bundle.sh makes such a DIR.
#
# Exit status: 0 all green (or no GPU), 1 a check failed, 2 bad usage.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

prebuilt="" out="build/gpu-check" quick=0
while [ $# -gt 0 ]; do
    case "$1" in
    --prebuilt) prebuilt=$(cd "${2:?--prebuilt needs a directory}" && pwd) || exit 2; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi finds none): skipped"
    exit 0
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
report="$out/report.md"
log="$out/log.txt"
: >"$log"
t_start=$(date +%s)
failed=0
results=()

note() { echo "== $*" | tee -a "$log" >&2; }
# pass/fail NAME DETAIL: one report row each.
pass() { results+=("| $1 | pass | $2 |"); note "PASS $1: $2"; }
fail() { results+=("| $1 | **FAIL** | $2 |"); note "FAIL $1: $2"; failed=1; }

# ------------------------------------------------------------------ build
if [ -n "$prebuilt" ]; then
    bin="$prebuilt/bin"
    export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    build_s=0
    # The bundle's tests were built elsewhere: they read tests/data at the
    # source path they were built from and the generated models under
    # model_data. Recreate both here (a link to this checkout, and the
    # models written by gguf-synth from the recipes, checked by sha256).
    src_path=$(sed -n 's/^source=//p' "$prebuilt/paths")
    data=$(sed -n 's/^model_data=//p' "$prebuilt/paths")
    if [ -n "$src_path" ] && [ ! -e "$src_path" ]; then
        mkdir -p "$(dirname "$src_path")" && ln -s "$root" "$src_path"
    fi
    for r in tests/data/recipes/*.json; do
        rel=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["file"])' "$r")
        [ -s "$data/$rel" ] && continue
        mkdir -p "$(dirname "$data/$rel")"
        "$bin/gguf-synth" --data tests/data --out "$data/$rel" "$r" >>"$log" 2>&1 ||
            fail test-models "gguf-synth $r failed (see $log)"
    done
else
    bdir=build/gpu
    note "building with CUDA for this GPU only in $bdir"
    [ -x scripts/install-deps.sh ] && [ -z "${GPU_CHECK_NO_DEPS:-}" ] && bash scripts/install-deps.sh >>"$log" 2>&1
    b0=$(date +%s)
    if ! cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DGPUPOOL_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=native >>"$log" 2>&1 ||
       ! cmake --build "$bdir" -j"$(nproc)" --target gpupool-server gpupool-agent gpupool-run \
            gguf-random gguf-synth test_cuda test_engine_arch gp-test-models >>"$log" 2>&1; then
        fail build "cmake failed: see $log"
        tail -30 "$log" >&2
        exit 1
    fi
    build_s=$(( $(date +%s) - b0 ))
    bin="$out/bin"
    mkdir -p "$bin"
    for f in src/server/gpupool-server src/agent/gpupool-agent src/run/gpupool-run \
             bench/gguf-random tests/synth/gguf-synth tests/unit/engine/test_cuda \
             tests/unit/engine/test_engine_arch; do
        [ -e "$bdir/$f" ] && ln -sf "$root/$bdir/$f" "$bin/"
    done
    data="$root/$bdir/tests/data"
    pass build "${build_s} s (CUDA architecture: native)"
fi

gpu_line=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
note "GPU: $gpu_line"

# ---------------------------------------------------------- device tests
run_test() {   # NAME TIMEOUT CMD...: pass when CMD exits 0
    local name=$1 to=$2; shift 2
    local t0=$(date +%s)
    if timeout "$to" "$@" >"$out/$name.txt" 2>&1; then
        pass "$name" "$(( $(date +%s) - t0 )) s; $(grep -E 'checks|PASSED|passed|OK' "$out/$name.txt" | tail -1 | tr '|' '/')"
    else
        fail "$name" "exit $?; see $out/$name.txt"
        tail -20 "$out/$name.txt" >&2
    fi
}
run_test selftest 300 "$bin/gpupool-run" selftest --backend cuda
run_test test_cuda 300 "$bin/test_cuda"
run_test test_engine_arch 300 "$bin/test_engine_arch"
# test_engine_arch skips its CUDA part silently when no device answers: make sure it ran.
if grep -q "CUDA" "$out/test_engine_arch.txt" && ! grep -q "skipped: no CUDA" "$out/test_engine_arch.txt"; then
    pass arch-on-cuda "$(grep -c 'CUDA' "$out/test_engine_arch.txt") CUDA lines; $(grep -E 'CUDA' "$out/test_engine_arch.txt" | tail -1)"
else
    fail arch-on-cuda "the architecture files did not run on CUDA (see $out/test_engine_arch.txt)"
fi

# ------------------------------------------------------------- end to end
model="$out/tinyllama-q4_k_m.gguf"
if [ ! -s "$model" ]; then
    "$bin/gguf-random" --shape tinyllama-1.1b --type q4_k_m --seed 7 -o "$model" >>"$log" 2>&1 ||
        fail gguf-random "could not write $model"
fi

work=$(mktemp -d /tmp/gpupool-gpucheck.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

e2e() {
    "$bin/gpupool-server" --listen 127.0.0.1:0 --port-file "$work/port" --db "$work/db.sqlite" \
        2>"$out/server.log" &
    pids+=($!)
    for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
    [ -s "$work/port" ] || { fail e2e-server "server did not start (see $out/server.log)"; return; }
    url="http://127.0.0.1:$(cat "$work/port")"
    "$bin/gpupool-agent" --server "$url" --state-dir "$work/agent" --model "$model" \
        --alias tinyllama --backend cuda 2>"$out/agent.log" &
    local apid=$!
    pids+=($apid)
    python3 - "$url" "$apid" "$out" <<'PY'
import json, os, sys, time, urllib.request
url, apid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def get(path):
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return r.read().decode()
deadline = time.time() + 180
while time.time() < deadline:
    try:
        os.kill(apid, 0)
    except OSError:
        sys.exit("agent exited before registering (see agent.log)")
    try:
        if '"tinyllama"' in get("/v1/models"):
            break
    except OSError:
        pass
    time.sleep(0.2)
else:
    sys.exit("agent did not register within 180 s")
def post(path, body, headers={}):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    return urllib.request.urlopen(req, timeout=120)
# A streamed chat completion: every chunk parsed, text and usage checked.
t0 = time.time(); ttft = None; text = ""; usage = None; done = False
with post("/v1/chat/completions", {"model": "tinyllama", "stream": True, "max_tokens": 64,
          "temperature": 0, "stream_options": {"include_usage": True},
          "messages": [{"role": "user", "content": "Say something about GPUs."}]}) as r:
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        ev = json.loads(line[6:])
        if "error" in ev:
            sys.exit("chat stream error: " + json.dumps(ev["error"]))
        for ch in ev.get("choices", []):
            piece = (ch.get("delta") or {}).get("content") or ""
            if piece and ttft is None:
                ttft = time.time() - t0
            text += piece
        usage = ev.get("usage") or usage
total = time.time() - t0
if not done or not usage or usage["completion_tokens"] < 1 or not text:
    sys.exit("chat stream incomplete: done=%s usage=%s text=%r" % (done, usage, text[:80]))
print("chat: %d tokens, TTFT %.1f ms, %.1f tokens/s end to end" %
      (usage["completion_tokens"], (ttft or 0) * 1e3, usage["completion_tokens"] / total))
# An Anthropic message (not streamed).
with post("/v1/messages", {"model": "tinyllama", "max_tokens": 32,
          "messages": [{"role": "user", "content": "Hello"}]},
          {"anthropic-version": "2023-06-01"}) as r:
    msg = json.loads(r.read())
if msg.get("type") != "message" or not msg.get("content") or msg["usage"]["output_tokens"] < 1:
    sys.exit("anthropic message malformed: " + json.dumps(msg)[:300])
print("anthropic: %d output tokens, stop_reason %s" % (msg["usage"]["output_tokens"], msg["stop_reason"]))
# The GPU is visible to the operator: agent facts in /metrics.
metrics = get("/metrics")
gpu_lines = [l for l in metrics.splitlines() if l.startswith("gpupool_gpu_")]
open(os.path.join(out, "metrics.txt"), "w").write(metrics)
if not gpu_lines:
    sys.exit("no gpupool_gpu_* series in /metrics")
print("metrics: %d gpupool_gpu_* lines, e.g. %s" % (len(gpu_lines), gpu_lines[0]))
PY
}
if e2e >"$out/e2e.txt" 2>&1; then
    pass e2e "$(tr '\n' ';' <"$out/e2e.txt")"
else
    fail e2e "$(tail -1 "$out/e2e.txt"); see $out/e2e.txt, agent.log, server.log"
fi
if grep -qi "backend.*cuda\|cuda.*device" "$out/agent.log"; then
    pass agent-backend "$(grep -i -m1 'backend' "$out/agent.log")"
else
    fail agent-backend "the agent's log does not say it runs on CUDA (see $out/agent.log)"
fi
cleanup
pids=()
work=$(mktemp -d /tmp/gpupool-gpucheck.XXXXXX)

# -------------------------------------------------------------- benchmark
reps=3; [ "$quick" = 1 ] && reps=1
bench() {   # NAME ARGS...
    local name=$1; shift
    if timeout 300 "$bin/gpupool-run" bench --backend cuda -m "$model" -r "$reps" "$@" \
            >"$out/$name.txt" 2>&1; then
        pass "$name" "$(grep -E '^\|' "$out/$name.txt" | tail -n +3 | tr -s ' ' | tr '|' '/' | tr '\n' ';')"
    else
        fail "$name" "exit $?; see $out/$name.txt"
    fi
}
bench bench-1seq -p 512 -n 128
for s in 8 32; do bench "bench-${s}seq" -p 0 -n 64 --seqs "$s"; done

# ----------------------------------------------------------------- report
{
    echo "# gpu-check report"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- GPU: $gpu_line"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- wall time: $(( $(date +%s) - t_start )) s (build ${build_s} s)"
    echo
    echo "| check | result | detail |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${results[@]}"
} >"$report"
cat "$report"
exit $failed
