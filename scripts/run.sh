#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what is missing, build, and run h3run on the default model.
# For now the default is a header-only copy of the official DiT's shapes (the data area is a sparse hole), which
# `h3run inspect` reads as it reads the real 66 GB checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
h3_install_deps
scripts/build.sh
mkdir -p out
build/h3-testdata dit-official out/dit-official-shapes.safetensors
build/h3run inspect --summary out/dit-official-shapes.safetensors
