#!/usr/bin/env bash
# The main job, from a fresh machine: installs what is missing, builds, starts
# gpupool-server and one gpupool-agent serving the bundled model
# (models/stories260K.gguf) on 127.0.0.1, streams a real answer through the
# OpenAI chat API, and stops both. Everything runs in a temp dir that is
# removed at the end.
#
#   bash scripts/demo.sh ["Your prompt"]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
prompt=${1:-"Tell me a story about a little dog."}

bash scripts/install-deps.sh
build=build/release
if [ ! -x "$build/src/server/gpupool-server" ] || [ -n "$(find src include CMakeLists.txt -newer "$build/src/server/gpupool-server" -print -quit 2>/dev/null)" ]; then
    echo "== building (Release) in $build" >&2
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DGPUPOOL_TESTS=OFF >/dev/null
    cmake --build "$build" -j"$(nproc)" >/dev/null
fi

work=$(mktemp -d /tmp/gpupool-demo.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

"$build/src/server/gpupool-server" --listen 127.0.0.1:0 --port-file "$work/port" \
    --db "$work/gpupool.db" 2>"$work/server.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "server did not start:" >&2; cat "$work/server.log" >&2; exit 1; }
url="http://127.0.0.1:$(cat "$work/port")"
echo "== gpupool-server listening on $url" >&2

"$build/src/agent/gpupool-agent" --server "$url" --state-dir "$work/agent" \
    --model models/stories260K.gguf --alias stories260K --slots 2 2>"$work/agent.log" &
pids+=($!)
for _ in $(seq 200); do
    curl -fsS "$url/v1/models" 2>/dev/null | grep -q '"stories260K"' && break
    kill -0 "${pids[1]}" 2>/dev/null || { echo "agent exited:" >&2; cat "$work/agent.log" >&2; exit 1; }
    sleep 0.1
done
curl -fsS "$url/v1/models" | grep -q '"stories260K"' || { echo "agent did not register:" >&2; cat "$work/agent.log" >&2; exit 1; }
echo "== agent registered; asking: $prompt" >&2
echo >&2

body=$(python3 -c 'import json,sys; print(json.dumps({"model":"stories260K","stream":True,"max_tokens":200,"temperature":0.8,"seed":7,"stream_options":{"include_usage":True},"messages":[{"role":"user","content":sys.argv[1]}]}))' "$prompt")
curl -sN "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" | python3 -c '
import json, sys
usage = None
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("data: "):
        continue
    data = line[6:]
    if data == "[DONE]":
        break
    ev = json.loads(data)
    if "error" in ev:
        sys.exit("error: " + json.dumps(ev["error"]))
    for ch in ev.get("choices", []):
        sys.stdout.write(ch.get("delta", {}).get("content") or "")
        sys.stdout.flush()
    usage = ev.get("usage") or usage
print()
if usage:
    print("\n== %d prompt tokens, %d generated" % (usage["prompt_tokens"], usage["completion_tokens"]), file=sys.stderr)
'
