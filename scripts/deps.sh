#!/usr/bin/env bash
# The Debian packages h3run builds and tests with. Sourced by the other scripts; installs only what is missing.
H3_DEB_PACKAGES=(build-essential cmake pkg-config libopenblas-dev libjansson-dev
                 libavformat-dev libavcodec-dev libavutil-dev libswscale-dev ffmpeg)

h3_install_deps() {
    local missing=()
    for p in "${H3_DEB_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}
