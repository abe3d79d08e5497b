#!/usr/bin/env bash
# Pack a CUDA build for `scripts/gpu-check.sh --prebuilt DIR` on a GPU
# machine that lacks the build dependencies (libevent, jansson, SQLite,
# libcurl, cmocka): the binaries gpu-check runs, the shared libraries they
# load that are not part of the CUDA driver/toolkit (found with ldd), and
# the paths the tests were built with (`paths`). The CUDA runtime libraries
# are NOT packed: the GPU machine's toolkit provides them.
#
#   cmake -S . -B build/cuda -DGPUPOOL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real
#   cmake --build build/cuda -j
#   bash scripts/gpu-bundle.sh build/cuda gpu-bundle
set -euo pipefail

bdir=${1:?usage: gpu-bundle.sh BUILD_DIR OUT_DIR}
dst=${2:?usage: gpu-bundle.sh BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

rm -rf "$dst"
mkdir -p "$dst/bin" "$dst/lib"
bins=(src/server/gpupool-server src/agent/gpupool-agent src/run/gpupool-run bench/gguf-random
      tests/synth/gguf-synth tests/unit/engine/test_cuda tests/unit/engine/test_engine_arch)
for f in "${bins[@]}"; do
    [ -x "$bdir/$f" ] || { echo "gpu-bundle: $bdir/$f is missing (build it first)" >&2; exit 1; }
    cp "$bdir/$f" "$dst/bin/"
done
# Shared objects built by the project (the engine, the CUDA plugin) and
# every system library the binaries need, except libc/ld.so and CUDA's.
find "$bdir" -name '*.so*' -type f -path '*src*' -exec cp {} "$dst/lib/" \;
for f in "$dst"/bin/* "$dst"/lib/*; do
    ldd "$f" 2>/dev/null | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so*|libm.so*|libresolv.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    libcuda.so*|libcudart.so*|libcublas*|libnvidia*) ;;
    *) [ -e "$dst/lib/$(basename "$lib")" ] || cp -L "$lib" "$dst/lib/" ;;
    esac
done
# The test binaries read the source tree's tests/data and the generated
# models at the absolute paths of this build: gpu-check recreates them.
{
    echo "source=$root"
    echo "model_data=$(cd "$bdir" && pwd)/tests/data"
} >"$dst/paths"
strip --strip-unneeded "$dst"/bin/* "$dst"/lib/* 2>/dev/null || true
du -sh "$dst"
