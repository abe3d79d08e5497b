#!/usr/bin/env bash
# Build the libFuzzer targets (clang, ASan+UBSan, tree build/fuzz) and run
# each for a bounded time on a scratch copy of its checked-in seed corpus
# (tests/fuzz/corpus/NAME), so the source tree stays clean.
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--keep DIR] [TARGET...]
#
#   --seconds N  time per target (default 60)
#   --jobs J     libFuzzer worker processes per target (default 1)
#   --keep DIR   keep the grown corpora and logs in DIR, and start from the
#                corpora already there (default: a temp dir, removed unless
#                something crashed)
#   TARGET       names as in tests/fuzz/part-NAME.cmake with '-' as '_'
#                (openai_chat, tokenizer, ...); default: every target
#
# Prints per target: executions, exec/s, corpus growth (new coverage) and
# crashes; exits 1 when any target crashed, leaked or timed out, naming the
# file that reproduces it (run the binary on that file to see the report).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

seconds=60
jobs=1
keep=""
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --jobs=*) jobs=${1#*=}; shift ;;
    --keep) keep=$2; shift 2 ;;
    --keep=*) keep=${1#*=}; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
    esac
done
case "$seconds$jobs" in *[!0-9]*) echo "fuzz.sh: --seconds and --jobs take numbers" >&2; exit 2 ;; esac

all=()
for p in tests/fuzz/part-*.cmake; do
    n=$(basename "$p" .cmake)
    n=${n#part-}
    case "$n" in 00-*) continue ;; esac
    all+=("${n//-/_}")
done
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
    case " ${all[*]} " in *" $t "*) ;; *) echo "fuzz.sh: no target '$t' (have: ${all[*]})" >&2; exit 2 ;; esac
done

command -v clang >/dev/null || { echo "fuzz.sh: clang is needed (apt-get install clang)" >&2; exit 2; }
build=build/fuzz
echo "=== [fuzz] build in $build (clang, libFuzzer, ASan+UBSan)"
cmake -S . -B "$build" -DGPUPOOL_FUZZ=ON -DGPUPOOL_TESTS=ON -DGPUPOOL_CUDA=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
bins=()
for t in "${targets[@]}"; do bins+=("fuzz_$t"); done
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target "${bins[@]}" >/dev/null

if [ -n "$keep" ]; then
    work=$keep
    mkdir -p "$work"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/gpupool-fuzz.XXXXXX")
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
printf '%-20s %12s %9s %15s %8s  %s\n' target executions exec/s "corpus (new)" crashes result
for t in "${targets[@]}"; do
    bin="$build/tests/fuzz/fuzz_$t"
    corpus="$work/$t/corpus"
    art="$work/$t/artifacts"
    rm -rf "$art" "$work/$t"/fuzz-*.log
    mkdir -p "$corpus" "$art"
    [ -d "tests/fuzz/corpus/$t" ] && cp -r "tests/fuzz/corpus/$t/." "$corpus/"
    seeds=$(find "$corpus" -type f | wc -l)
    dict=()
    case "$t" in
    openai_*|anthropic*|tasks|pool_options|agent_*) dict=(-dict=tests/fuzz/json.dict) ;;
    esac
    log="$work/$t/log"
    # -jobs/-workers run J processes in parallel; each prints its own stats.
    par=()
    [ "$jobs" -gt 1 ] && par=(-jobs="$jobs" -workers="$jobs")
    rc=0
    (cd "$work/$t" && "$root/$bin" "${dict[@]/#-dict=/-dict=$root/}" "${par[@]}" \
        -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -max_len=8192 \
        -print_final_stats=1 -artifact_prefix="$art/" "$corpus") >"$log" 2>&1 || rc=$?
    # with -jobs the output goes to fuzz-N.log files
    cat "$work/$t"/fuzz-*.log >>"$log" 2>/dev/null || true
    execs=$(awk '/stat::number_of_executed_units:/ {s += $2} END {print s+0}' "$log")
    speed=$(awk '/stat::average_exec_per_sec:/ {s += $2} END {print s+0}' "$log")
    now=$(find "$corpus" -type f | wc -l)
    crashes=$(find "$art" -type f | wc -l)
    result=ok
    if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        status=1
        result="FAILED (exit $rc)"
    fi
    printf '%-20s %12s %9s %15s %8s  %s\n' "$t" "$execs" "$speed" "$now (+$((now - seeds)))" \
        "$crashes" "$result"
    if [ "$result" != ok ]; then
        for f in "$art"/*; do [ -e "$f" ] && echo "    reproduce: $bin $f"; done
        echo "    log: $log"
        grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log" \
            | sed 's/^/    /' || true
    fi
done
if [ -z "$keep" ] && [ $status -eq 0 ]; then
    rm -rf "$work"
elif [ $status -ne 0 ]; then
    echo "fuzz.sh: crashes kept in $work" >&2
fi
exit $status
