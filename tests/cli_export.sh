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
# The video VAE's training script end to end, a few steps on a few clips: its decoder exported and decoded by h3run
# must agree with the reference decode the training ran through.
"$BUILD/h3-synth" dataset "$tmp/vv" --clips 12 --frames 22 --size 32x32 --shard 12 >/dev/null 2>&1 || {
    echo "FAIL: h3-synth dataset"; exit 1; }
H3RUN="$H3RUN" "$PY" "$SRC/tools/train/train_video_vae.py" --data "$tmp/vv" --template "$tmp/tiny" --out "$tmp/vv-out" \
    --steps 3 --batch 2 --holdout 2 --threads 2 >"$tmp/train.log" 2>&1 || { echo "FAIL: train_video_vae.py"; cat "$tmp/train.log"; exit 1; }
"$PY" - "$tmp/vv-out/video_vae_train.json" <<'PYEOF' || { cat "$tmp/train.log"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
worst = max(h["h3run_vs_reference_max_abs"] for h in r["held_out"])
ok = len(r["held_out"]) == 2 and worst < 1e-5
print(("ok  " if ok else "FAIL") + f" train_video_vae.py: h3run decodes the trained decoder as the reference does "
      f"(max |diff| {worst:.1e} over {len(r['held_out'])} held-out clips)")
sys.exit(0 if ok else 1)
PYEOF
# The same for the audio VAE's training script.
H3RUN="$H3RUN" "$PY" "$SRC/tools/train/train_audio_vae.py" --data "$tmp/vv" --template "$tmp/tiny" --out "$tmp/av-out" \
    --steps 2 --batch 1 --holdout 2 --threads 2 >"$tmp/train-a.log" 2>&1 || {
    echo "FAIL: train_audio_vae.py"; cat "$tmp/train-a.log"; exit 1; }
"$PY" - "$tmp/av-out/audio_vae_train.json" <<'PYEOF' || { cat "$tmp/train-a.log"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
worst = max(h["h3run_vs_reference_max_abs"] for h in r["held_out"])
ok = len(r["held_out"]) == 2 and worst < 1e-5
print(("ok  " if ok else "FAIL") + f" train_audio_vae.py: h3run decodes the trained decoder as the reference does "
      f"(max |diff| {worst:.1e} over {len(r['held_out'])} held-out clips)")
sys.exit(0 if ok else 1)
PYEOF
# The DiT's training script on those encoders' latents, h3run's text conditioning and layout: h3run dit with the
# exported DiT must give the reference forward's velocities (it exits non-zero otherwise).
H3RUN="$H3RUN" H3SYNTH="$BUILD/h3-synth" "$PY" "$SRC/tools/train/train_dit.py" --data "$tmp/vv" --template "$tmp/tiny" \
    --vae "$tmp/vv-out" --audio-vae "$tmp/av-out" --out "$tmp/dit-out" --steps 2 --batch 1 --threads 2 \
    >"$tmp/train-d.log" 2>&1 || { echo "FAIL: train_dit.py"; cat "$tmp/train-d.log"; exit 1; }
grep "h3run dit with the exported DiT" "$tmp/train-d.log"
echo "cli_export: all passed"
