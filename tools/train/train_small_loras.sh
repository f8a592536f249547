#!/usr/bin/env bash
# Trains the small model's two LoRAs (docs/LORA.md, "The small model's LoRAs") side by side:
#
#   h3-small_bounce.safetensors        every shape bounces whatever its caption says (rank 16): 4 datasets of 250
#                                      clips rendered with h3-synth dataset --motion bounce (seeds 600-603), their
#                                      captions unchanged
#   h3-small_turbo_4step.safetensors   the base model's 48-step Euler trajectories distilled into 4 steps (rank 32;
#                                      the same datasets' captions, no clips)
#
#   tools/train/train_small_loras.sh MODEL WORK
#
# MODEL: the small model's folder (transformer/, and video_vae/ and audio_vae/ holding at least their encoders).
# Settings (environment): DEVICE (cuda), BATCH (32), MINUTES per LoRA (3.5) or STEPS, CLIPS (250), FRAMES (56), SIZE (128x128),
# TRAJECTORIES (4096) and TEACHER_STEPS (48) of the turbo's teacher, TEXT_CACHE (a folder of text-<sha1> files from
# an earlier run: train_dit.encode_captions; without it, MODEL needs text_encoder/ and tokenizer/), H3RUN, H3SYNTH
# (default build/). Everything lands in WORK (logs: WORK/*.log).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
model=${1:?usage: train_small_loras.sh MODEL WORK}
work=${2:?usage: train_small_loras.sh MODEL WORK}
mkdir -p "$work"
work=$(cd "$work" && pwd)
export H3RUN=${H3RUN:-$root/build/h3run} H3SYNTH=${H3SYNTH:-$root/build/h3-synth}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda} MINUTES=${MINUTES:-3.5} CLIPS=${CLIPS:-250} FRAMES=${FRAMES:-56} SIZE=${SIZE:-128x128}
if [ -n "${STEPS:-}" ]; then budget=(--steps "$STEPS"); else budget=(--minutes "$MINUTES"); fi
pids=()
for j in 0 1 2 3; do
    [ -f "$work/bounce-$j/captions.jsonl" ] && continue
    "$H3SYNTH" dataset "$work/bounce-$j" --clips "$CLIPS" --frames "$FRAMES" --size "$SIZE" --seed $((600 + j)) \
        --motion bounce >/dev/null 2>"$work/bounce-$j.log" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for o in bounce turbo; do
    mkdir -p "$work/$o/cache"
    if [ -n "${TEXT_CACHE:-}" ]; then cp "$TEXT_CACHE"/text-*.safetensors "$work/$o/cache/"; fi
done
"$PY" "$here/train_lora.py" --model "$model" --data "$work"/bounce-? --out "$work/bounce" --rank 16 \
    --name h3-small_bounce --device "$DEVICE" "${budget[@]}" --batch "${BATCH:-32}" --lr 1e-3 >"$work/bounce.log" 2>&1 &
bp=$!
"$PY" "$here/train_lora.py" --model "$model" --data "$work"/bounce-? --out "$work/turbo" --rank 32 --turbo 4 \
    --teacher-steps "${TEACHER_STEPS:-48}" --trajectories "${TRAJECTORIES:-4096}" --name h3-small_turbo_4step \
    --device "$DEVICE" "${budget[@]}" --batch "${BATCH:-32}" --lr 1e-3 >"$work/turbo.log" 2>&1 &
tp=$!
rc=0
wait $bp || rc=1
wait $tp || rc=1
tail -n 4 "$work/bounce.log" "$work/turbo.log"
exit $rc
