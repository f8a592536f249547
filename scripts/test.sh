#!/usr/bin/env bash
# All tests: a warnings-as-errors build with every test, then an ASan+UBSan build running the same tests.
# Set H3_CUDA_ARCHS (e.g. 90) to compile the CUDA backend for fewer architectures.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
h3_install_deps
jobs=$(nproc)
cuda_args=()
[ -n "${H3_CUDA_ARCHS:-}" ] && cuda_args+=("-DH3_CUDA_ARCHS=${H3_CUDA_ARCHS}")

echo "== build (warnings are errors) and test"
H3_BUILD=build scripts/build.sh -DH3_WERROR=ON "${cuda_args[@]}"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== ASan + UBSan build and test"
H3_BUILD=build-asan scripts/build.sh -DH3_WERROR=ON -DH3_SANITIZE=ON -DH3_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
echo "== all tests passed"
