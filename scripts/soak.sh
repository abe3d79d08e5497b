#!/usr/bin/env bash
# Soak test (bounded; never in CI): a server and 3 gguf agents on the bundled
# models/stories260K.gguf, on 127.0.0.1 ephemeral ports, under mixed greedy
# load from every dialect (OpenAI completions and chat, Anthropic messages,
# native /v2/tasks events), streaming and not, with slow and vanishing
# clients, agents killed -9 and restarted at random. Samples the server's
# RSS and open fds; prints one table at the end (requests, failures by code,
# text mismatches with lost/duplicated words, RSS and fds). Exits non-zero
# when the server crashed.
#
#   scripts/soak.sh [--minutes N] [--build-dir DIR] [--agents N] [--slots N]
#                   [--clients N] [--seed N] [--keep-tmp]
#                   [--server-arg=--KEY=VALUE ...]
#
# Builds the Release tree build/release (as scripts/demo.sh does) unless
# --build-dir names another (e.g. an ASan build). Default 10 minutes.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

build=build/release
prev=""
for a in "$@"; do
    case "$prev" in --build-dir) build=$a ;; esac
    case "$a" in --build-dir=*) build=${a#*=} ;; -h|--help) exec python3 scripts/soak.py --help ;; esac
    prev=$a
done
if [ "$build" = build/release ]; then
    echo "=== [soak] build (Release) in $build"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DGPUPOOL_TESTS=OFF >/dev/null
    cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target gpupool-server gpupool-agent >/dev/null
fi

# The Python side kills every process it started (by PID) on any exit; this
# trap only makes sure the Python side itself goes when we are interrupted.
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
python3 scripts/soak.py "$@" &
pid=$!
rc=0
wait "$pid" || rc=$?
pid=""
exit $rc
