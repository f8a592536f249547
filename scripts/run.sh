#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what is missing, build, and generate a clip with sound from a
# prompt with h3run's small trained model (models/h3-small, in this repository: what `h3run generate` uses without
# --model): out/h3-small.mp4, 56 frames (2.33 s) at 128x128, H.264 + AAC 32 kHz stereo. The prompt is one the model
# never saw in training; `h3-synth check` then measures the clip (colour, motion, pitch, pan) against it.
#
#   scripts/run.sh                              the small model: out/h3-small.mp4
#   H3_PROMPT=7 scripts/run.sh                  another of the 54 held-out prompts (0-53; build/h3-synth prompts)
#   H3_MODEL=~/MiniMax-H3/FL2VA scripts/run.sh  the release at its defaults (124 frames, 1344x768): out/h3.mp4
# Extra arguments go to h3run generate (e.g. --steps 20 --seed 7).
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
if [ -n "${H3_MODEL:-}" ]; then
    prompt="integrated_multimodal_description: [Shot 1] A quiet harbor at sunrise; fishing boats rock on the water \
and gulls circle the masts. overall_soundscape: soft waves, distant gulls, a light wind."
    build/h3run generate --model "$H3_MODEL" --prompt "$prompt" -o out/h3.mp4 "$@"
else
    k=${H3_PROMPT:-0}
    prompt=$(build/h3-synth prompt "$k")
    echo "prompt: $prompt"
    build/h3run generate --prompt "$prompt" --seed 1 -o out/h3-small.mp4 "$@"
    build/h3-synth check out/h3-small.mp4 --heldout "$k"
fi
