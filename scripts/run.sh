#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what is missing, build, write the reduced H3 model if it is absent
# (random weights in the release's FL2VA/ layout, made by build/h3-tinymodel: no download, no Python), and generate a
# clip with sound from a prompt: out/h3-tiny.mp4 (22 frames at 128x128, H.264 + AAC 32 kHz stereo).
#
#   scripts/run.sh                              the reduced model: out/h3-tiny.mp4
#   H3_MODEL=~/MiniMax-H3/FL2VA scripts/run.sh  the release at its defaults (124 frames, 1344x768): out/h3.mp4
# Extra arguments go to h3run generate (e.g. --steps 8 --seed 7).
#
# The build is for this machine: CPU only where no NVIDIA GPU is visible, else CUDA for that GPU's architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
h3_install_deps

cuda_args=(-DH3_CUDA=OFF)
if command -v nvidia-smi >/dev/null && cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null); then
    cap=$(echo "$cap" | head -1 | tr -d ' .')
    [ -n "$cap" ] && cuda_args=(-DH3_CUDA=AUTO "-DH3_CUDA_ARCHS=$cap")
fi
scripts/build.sh "${cuda_args[@]}"

mkdir -p out
prompt="integrated_multimodal_description: [Shot 1] A quiet harbor at sunrise; fishing boats rock on the water and \
gulls circle the masts. overall_soundscape: soft waves, distant gulls, a light wind."
if [ -n "${H3_MODEL:-}" ]; then
    build/h3run generate --model "$H3_MODEL" --prompt "$prompt" -o out/h3.mp4 "$@"
else
    [ -d out/h3-tiny ] || build/h3-tinymodel out/h3-tiny
    build/h3run generate --model out/h3-tiny --prompt "$prompt" --frames 22 --size 128x128 --seed 1 \
        -o out/h3-tiny.mp4 "$@"
fi
