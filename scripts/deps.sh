#!/usr/bin/env bash
# The Debian packages h3run builds and tests with. Sourced by the other scripts; installs only what is missing.
H3_DEB_PACKAGES=(build-essential cmake pkg-config libopenblas-dev libjansson-dev
                 libavformat-dev libavcodec-dev libavutil-dev libswscale-dev libswresample-dev ffmpeg
                 libmicrohttpd-dev libsqlite3-dev)
# libmicrohttpd and SQLite: h3run serve's HTTP server and job store.
# What the tests add (scripts/test.sh, .ci/run): Python 3 for the layer check (tools/check_layers.py); clang with
# its sanitizer and libFuzzer runtimes, and llvm's symbolizer for readable stacks, for the fuzz targets
# (scripts/fuzz.sh, fuzz/README.md); Chromium for the web page of h3run serve (tests/cli_serve_page.sh, driven by
# tests/js's puppeteer-core).
H3_TEST_DEB_PACKAGES=(python3 clang libclang-rt-14-dev llvm-14 chromium)

# h3_install_deps [EXTRA_PACKAGE...]: the build's packages and the extra ones.
h3_install_deps() {
    local missing=()
    for p in "${H3_DEB_PACKAGES[@]}" "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}
