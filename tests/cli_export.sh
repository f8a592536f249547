#!/usr/bin/env bash
# The exporters of tools/train (trained weights written in the release's official FL2VA/ layout) round-trip a reduced
# model (tools/h3-tinymodel): every tensor's bytes (the audio VAE's weight-norm pairs to float32 rounding), h3run
# inspect naming every component of the result, and h3run generate giving the same latents from it.
# Needs /usr/bin/python3 with torch and numpy (Debian's python3-torch, which scripts/test.sh installs): without them
# the test is skipped, except under CI, where a missing tool is a failure.
# Usage: cli_export.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
PY=${H3_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import torch, numpy" 2>/dev/null; then
    if [ -n "${CI:-}" ]; then echo "FAIL: $PY cannot import torch and numpy (apt-get install python3-torch)"; exit 1; fi
    echo "cli_export: skipped: $PY cannot import torch and numpy"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BUILD/h3-tinymodel" "$tmp/tiny" >/dev/null || { echo "FAIL: h3-tinymodel"; exit 1; }
H3RUN="$H3RUN" "$PY" "$SRC/tools/train/test_export.py" "$tmp/tiny" "$tmp/out" || exit 1
# The training scripts end to end, a few steps on a few clips: each exits non-zero unless h3run, given the weights it
# exported, computes what the reference computed (the VAEs' decodes; the DiT's velocities with h3run's own text
# conditioning and layout).
"$BUILD/h3-synth" dataset "$tmp/vv" --clips 12 --frames 22 --size 32x32 --shard 12 >/dev/null 2>&1 || {
    echo "FAIL: h3-synth dataset"; exit 1; }
export H3RUN H3SYNTH="$BUILD/h3-synth"
common=(--data "$tmp/vv" --template "$tmp/tiny" --threads 2)
for job in "train_video_vae.py --out $tmp/vv-out --steps 3 --batch 2 --holdout 2" \
           "train_audio_vae.py --out $tmp/av-out --steps 2 --batch 1 --holdout 2" \
           "train_dit.py --out $tmp/dit-out --vae $tmp/vv-out --audio-vae $tmp/av-out --steps 2 --batch 1"; do
    read -r -a args <<<"$job"
    "$PY" "$SRC/tools/train/${args[0]}" "${common[@]}" "${args[@]:1}" >"$tmp/train.log" 2>&1 || {
        echo "FAIL: ${args[0]}"; cat "$tmp/train.log"; exit 1; }
    grep -E "^(ok|FAIL) " "$tmp/train.log"
done
echo "cli_export: all passed"
