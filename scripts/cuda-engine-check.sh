#!/usr/bin/env bash
# The engine's CUDA checks (issue 22: plugin, layer split, F16 KV, prefix
# cache, preflight) as one short run on a GPU machine, for machines that
# cannot build the whole project (no libevent/jansson/cmocka dev packages)
# but have the NVIDIA driver and the CUDA 13 runtime + cuBLAS.
#
#   here (any machine with nvcc, the project's deps and a CUDA build dir):
#     scripts/cuda-engine-check.sh bundle BUILD DIR
#       copies the engine's CUDA test binaries, gpupool-run, the plugin and
#       the non-CUDA shared libraries they need into DIR (about 20 MB), and
#       records the source directory the binaries were built from.
#   on the GPU machine, from a checkout of the same commit:
#     scripts/cuda-engine-check.sh run DIR
#       points the recorded source path at this checkout (a symlink; the
#       tests read models and tests/data by absolute path), then runs each
#       check, printing one line per check and a summary; exit 1 when one
#       failed.
#
# With a full CUDA build on the GPU machine instead, the same checks are:
#   ctest --test-dir BUILD -R 'test_cuda|test_engine_backend|test_engine_arch|test_engine_prefix' --output-on-failure
#   BUILD/src/run/gpupool-run selftest --backend cuda
set -u

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

bundle() {
    local build=$1 dir=$2
    local src
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
    [ -n "$src" ] || { echo "cuda-engine-check: $build is not a CMake build dir" >&2; exit 2; }
    [ -f "$build/src/engine/libgpupool-cuda.so" ] ||
        { echo "cuda-engine-check: $build has no CUDA plugin (configure with -DGPUPOOL_CUDA=ON)" >&2; exit 2; }
    mkdir -p "$dir/lib" "$dir/src/engine" "$dir/src/run" "$dir/tests/unit/engine"
    cp "$build/src/engine/libgpupool-cuda.so" "$dir/src/engine/"
    cp "$build/src/run/gpupool-run" "$dir/src/run/"
    for t in test_cuda test_engine_backend test_engine_arch test_engine_prefix \
             libgpe_test_needs_missing.so libgpe_test_phantom.so; do
        cp "$build/tests/unit/engine/$t" "$dir/tests/unit/engine/"
    done
    # shared libraries that are not CUDA's nor the C library's
    for b in "$dir"/src/run/gpupool-run "$dir"/tests/unit/engine/test_*; do
        ldd "$b" | awk '/=> \// {print $3}'
    done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcuda[^/]*|libcublas[^/]*)\.so' |
        while read -r l; do cp -L "$l" "$dir/lib/"; done
    echo "$src" > "$dir/source_dir"
    echo "$build" > "$dir/build_dir"
    du -sh "$dir"
}

run_checks() {
    local dir
    dir=$(cd "$1" && pwd)
    local src build here
    src=$(cat "$dir/source_dir")
    build=$(cat "$dir/build_dir")
    here=$(pwd)
    if [ "$src" != "$here" ] && [ ! -e "$src" ]; then
        mkdir -p "$(dirname "$src")" && ln -s "$here" "$src" ||
            { echo "cuda-engine-check: cannot link $src to $here" >&2; exit 1; }
    fi
    # the build path compiled into the tests (plugin, test plugins)
    if [ ! -e "$build" ]; then
        mkdir -p "$(dirname "$build")" && ln -s "$dir" "$build" 2>/dev/null || true
    fi
    export LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    export GPUPOOL_CUDA_PLUGIN="$dir/src/engine/libgpupool-cuda.so"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader || true
    local fails=0 n=0
    check() {
        local name=$1; shift
        n=$((n + 1))
        echo "=== $name: $*"
        if "$@"; then echo "--- $name: ok"; else echo "--- $name: FAILED ($?)"; fails=$((fails + 1)); fi
    }
    local r="$dir/src/run/gpupool-run" m="$here/models/stories260K.gguf"
    check selftest "$r" selftest --backend cuda
    check test_cuda "$dir/tests/unit/engine/test_cuda"
    check test_engine_backend "$dir/tests/unit/engine/test_engine_backend"
    check test_engine_arch "$dir/tests/unit/engine/test_engine_arch"
    check test_engine_prefix "$dir/tests/unit/engine/test_engine_prefix"
    same_text() {   # greedy text on CUDA (args) == on the CPU
        local a b
        a=$("$r" generate -m "$m" -p "Once upon a time" -n 48 --temp 0 2>/dev/null) || return 1
        b=$("$r" generate -m "$m" -p "Once upon a time" -n 48 --temp 0 "$@" 2>/dev/null) || return 1
        [ "$a" = "$b" ] || { printf 'cpu:  %s\ncuda: %s\n' "$a" "$b"; return 1; }
    }
    check greedy-cuda-eq-cpu same_text --backend cuda
    check greedy-split-eq-cpu same_text --backend cuda --devices 0,0
    check generate-split-f16 "$r" generate -m "$m" -p "Once upon a time" -n 48 --temp 0 \
        --backend cuda --devices 0,0 --kv-f16
    check generate-cpu "$r" generate -m "$m" -p "Once upon a time" -n 48 --temp 0
    check bench-cuda "$r" bench -m "$m" -p 128 -n 32 -r 2 --backend cuda
    check bench-cuda-split-f16 "$r" bench -m "$m" -p 128 -n 32 -r 2 --seqs 4 --backend cuda \
        --devices 0,0 --kv-f16
    echo "=== summary: $((n - fails)) of $n checks passed"
    [ "$fails" -eq 0 ]
}

case "${1:-}" in
bundle) [ $# -eq 3 ] || usage; bundle "$2" "$3" ;;
run) [ $# -eq 2 ] || usage; run_checks "$2" ;;
*) usage ;;
esac
