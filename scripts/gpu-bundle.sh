#!/usr/bin/env bash
# Pack a CUDA build for `scripts/gpu-check.sh --prebuilt DIR` on a GPU
# machine that lacks the build dependencies (libevent, jansson, SQLite,
# libcurl, cmocka dev packages). DIR mirrors the build directory's layout
# for what gpu-check runs (the binaries, the engine's CUDA plugin, the
# device tests and their test plugins, gguf-synth and gguf-random), plus
# lib/: the shared libraries they load that are neither the C library's
# nor CUDA's (found with ldd; the GPU machine's driver and toolkit provide
# CUDA's), and the source and build paths the tests were compiled with
# (they read tests/data and the plugin by absolute path: gpu-check links
# those paths to the checkout and to DIR).
#
#   cmake -S . -B build/cuda -DGPUPOOL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real
#   cmake --build build/cuda -j
#   bash scripts/gpu-bundle.sh build/cuda gpu-bundle
set -euo pipefail

bdir=$(cd "${1:?usage: gpu-bundle.sh BUILD_DIR OUT_DIR}" && pwd)
dst=${2:?usage: gpu-bundle.sh BUILD_DIR OUT_DIR}
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$bdir/CMakeCache.txt")
[ -n "$src" ] || { echo "gpu-bundle: $bdir is not a CMake build directory" >&2; exit 2; }
[ -f "$bdir/src/engine/libgpupool-cuda.so" ] ||
    { echo "gpu-bundle: $bdir has no CUDA plugin (configure with -DGPUPOOL_CUDA=ON)" >&2; exit 2; }

rm -rf "$dst"
mkdir -p "$dst/lib"
files=(src/server/gpupool-server src/agent/gpupool-agent src/run/gpupool-run
       src/engine/libgpupool-cuda.so bench/gguf-random tests/synth/gguf-synth
       tests/unit/engine/test_cuda tests/unit/engine/test_engine_backend
       tests/unit/engine/test_engine_arch tests/unit/engine/test_engine_prefix
       tests/unit/engine/libgpe_test_needs_missing.so tests/unit/engine/libgpe_test_phantom.so)
for f in "${files[@]}"; do
    [ -e "$bdir/$f" ] || { echo "gpu-bundle: $bdir/$f is missing (build it first)" >&2; exit 1; }
    mkdir -p "$dst/$(dirname "$f")"
    cp "$bdir/$f" "$dst/$f"
done
for f in "${files[@]}"; do
    ldd "$bdir/$f" 2>/dev/null | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|ld-linux*) ;;
    libgcc_s.so*|libstdc++.so*|libcuda.so*|libcudart.so*|libcublas*|libnvidia*) ;;
    libgpupool*|libgpe_test*) ;;
    *) cp -L "$lib" "$dst/lib/" ;;
    esac
done
printf 'source=%s\nbuild=%s\n' "$src" "$bdir" >"$dst/paths"
strip --strip-unneeded $(find "$dst" -type f ! -name paths) 2>/dev/null || true
du -sh "$dst"
