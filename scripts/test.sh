#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs
# (apt-get, npm), builds twice -- a plain optimised build and an
# ASan+UBSan build -- and runs every CTest test (unit, integration, SDK
# conformance) in both. Exit status is non-zero when anything fails.
#
#   bash scripts/test.sh            # both builds
#   GPUPOOL_TEST_VARIANTS=plain bash scripts/test.sh   # just one
#
# Then every libFuzzer target runs for GPUPOOL_TEST_FUZZ_SECONDS (default
# 20; 0 skips the stage) on its checked-in corpus (scripts/fuzz.sh, clang
# tree build/fuzz); a crash, leak or timeout fails the run.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

bash scripts/install-deps.sh
# The SDK conformance tests use the official SDKs from npm, pinned by the
# lock file; `npm ci` is reproducible and leaves the tree clean.
(cd tests/sdk && npm ci --no-audit --no-fund --loglevel=error)

variants=${GPUPOOL_TEST_VARIANTS:-"plain sanitize"}
jobs=$(nproc 2>/dev/null || echo 2)
status=0

# The build scripts/demo.sh (the README's first command) makes: Release, no
# tests. -O3 brings warnings of its own (-Werror), so it is built here too,
# in demo.sh's directory, which a later demo run then reuses.
echo "=== [release] build as scripts/demo.sh does, in build/release"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DGPUPOOL_TESTS=OFF >/dev/null
cmake --build build/release -j"$jobs" >/dev/null
for v in $variants; do
    case "$v" in
    plain) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_SANITIZE=OFF) ;;
    sanitize) flags=(-DCMAKE_BUILD_TYPE=Debug -DGPUPOOL_SANITIZE=ON) ;;
    *) echo "test.sh: unknown variant '$v'" >&2; exit 2 ;;
    esac
    dir="build/test-$v"
    echo "=== [$v] configure and build in $dir"
    cmake -S . -B "$dir" "${flags[@]}" >/dev/null
    cmake --build "$dir" -j"$jobs"
    echo "=== [$v] ctest"
    # Sanitizer reports must fail the run, and leaks count.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    if ! ctest --test-dir "$dir" --output-on-failure -j"$jobs" --timeout 900; then
        status=1
    fi
done

fuzz_seconds=${GPUPOOL_TEST_FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" != 0 ]; then
    echo "=== [fuzz] every target for ${fuzz_seconds} s"
    if ! bash scripts/fuzz.sh --seconds "$fuzz_seconds"; then
        status=1
    fi
fi
exit $status
