#!/usr/bin/env bash
# The objective check of prompt adherence (src/synth/world.h): the synthetic world's held-out prompts through
# `h3run generate`, each clip measured by `h3-synth check` (dominant colour, direction of motion, the tone's pitch
# and pan, the shape), accuracy per attribute. The 54 held-out combinations never appear in the training data.
#
#   bench/adherence.sh MODEL [N] [generate options...]      N: the first N held-out prompts (default 54)
#   PROMPTS="0 9 18" bench/adherence.sh MODEL               these held-out prompts instead (N is then ignored)
#
# Clips: 56 frames (2.33 s) at 128x128, seed k+1 for prompt k (k+1+SEED_OFFSET: other draws of the same prompts).
# H3RUN and H3SYNTH name the programs (default build/h3run, build/h3-synth); OUT keeps the clips and writes
# adherence.json. Prints one line per prompt, then
# "accuracy: colour C/N motion M/N pitch P/N pan Q/N shape S/N". COUNT=ATTRIBUTE=VALUE (e.g. motion=bounce) also
# counts the clips measured so ("measured motion bounce: K/N": what a LoRA that changes it is scored by).
# KEYFRAMES=first|last|both gives each prompt keyframes (fl2va): the first and/or last frame of its scene drawn with
# seed 1000+k (`h3-synth frame`: the free size and places of that seed, which the caption does not say), and also
# scores where the clip starts / ends (the shape's centroid within 0.05 of the keyframe's place) and in which colour
# ("keyframes first: start S/N, first-frame colour C/N").
# REFERENCE=image gives each prompt in its ref2va form (`h3-synth prompt K --reference`: "the triangle from
# <Picture 1>", its colour and its tone's pitch unsaid) and its scene's middle frame (frame 28, seed 1000+k) as
# --ref-image at 128: the colour and the pitch can only come from the picture ("reference: colour C/N, pitch P/N").
# REFERENCE=none: the same prompts with no picture (the control: colour and pitch at chance).
# SOUNDTRACK=1 gives each prompt its scene's sound (`h3-synth clip`, seed 1000+k) as --audio: the clip is made to
# that soundtrack and carries it, so its measured pitch and pan must be the given sound's ("soundtrack: pitch P/N,
# pan Q/N"); colour and motion still score the video against the prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: bench/adherence.sh MODEL [N] [generate options...]}
n=${2:-54}
shift $(( $# >= 2 ? 2 : 1 ))
H3RUN=${H3RUN:-build/h3run}
H3SYNTH=${H3SYNTH:-build/h3-synth}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
c=0 m=0 p=0 q=0 sh=0 seen=0 ks_=0 ke=0 kcs=0 kce=0
kf=${KEYFRAMES:-}
case $kf in "" | first | last | both) ;; *) echo "adherence: KEYFRAMES takes first, last or both" >&2; exit 2 ;; esac
ref=${REFERENCE:-}
case $ref in "" | image | none) ;; *) echo "adherence: REFERENCE takes image or none" >&2; exit 2 ;; esac
[ -n "$ref" ] && [ -n "$kf" ] && { echo "adherence: REFERENCE and KEYFRAMES do not go together" >&2; exit 2; }
snd=${SOUNDTRACK:-}
case $snd in "" | 1) ;; *) echo "adherence: SOUNDTRACK takes 1" >&2; exit 2 ;; esac
count=${COUNT:-}
json="["
read -r -a ks <<<"${PROMPTS:-$(seq -s ' ' 0 $((n - 1)))}"
n=${#ks[@]}
first=1
for k in "${ks[@]}"; do
    prompt=$("$H3SYNTH" prompt "$k" ${ref:+--reference})
    clip="$out/heldout-$k.mp4"
    kfo=() seed=()
    if [ -n "$snd" ]; then
        "$H3SYNTH" clip "$out/sound-$k.mp4" --heldout "$k" --seed $((1000 + k)) --frames 56 --size 128x128 >/dev/null
        kfo+=(--audio "$out/sound-$k.mp4")
    fi
    if [ "$ref" = image ]; then
        "$H3SYNTH" frame "$out/ref-$k.png" --heldout "$k" --seed $((1000 + k)) --at 28 --frames 56 --size 128x128 >/dev/null
        kfo+=(--ref-image "$out/ref-$k.png" --ref-image-size 128)
    fi
    if [ -n "$kf" ]; then
        seed=(--seed $((1000 + k)))
        for at in first last; do
            [ "$kf" = "$at" ] || [ "$kf" = both ] || continue
            "$H3SYNTH" frame "$out/key-$k-$at.png" --heldout "$k" "${seed[@]}" \
                --at "$([ $at = first ] && echo 0 || echo last)" --frames 56 --size 128x128 >/dev/null
            kfo+=("--$at-frame" "$out/key-$k-$at.png")
        done
    fi
    "$H3RUN" generate --model "$model" --prompt "$prompt" --frames 56 --size 128x128 --seed $((k + 1 + ${SEED_OFFSET:-0})) \
        --progress none -q -o "$clip" "${kfo[@]}" "$@" >/dev/null 2>"$out/generate-$k.log" \
        || { echo "adherence: generate failed for prompt $k: $(tail -1 "$out/generate-$k.log")" >&2; exit 1; }
    r=$("$H3SYNTH" check "$clip" --heldout "$k" "${seed[@]}" --json)
    echo "$k: $("$H3SYNTH" check "$clip" --heldout "$k" "${seed[@]}")"
    right=$(sed 's/.*"right": {\(.*\)}}/\1/' <<<"$r")
    c=$((c + $(sed 's/.*"color": \([01]\).*/\1/' <<<"$right")))
    m=$((m + $(sed 's/.*"motion": \([01]\).*/\1/' <<<"$right")))
    p=$((p + $(sed 's/.*"pitch": \([01]\).*/\1/' <<<"$right")))
    q=$((q + $(sed 's/.*"pan": \([01]\).*/\1/' <<<"$right")))
    sh=$((sh + $(sed 's/.*"shape": \([01]\).*/\1/' <<<"$right")))
    ks_=$((ks_ + $(sed 's/.*"start": \([01]\).*/\1/' <<<"$right")))
    ke=$((ke + $(sed 's/.*"end": \([01]\).*/\1/' <<<"$right")))
    kcs=$((kcs + $(sed 's/.*"first_color": \([01]\).*/\1/' <<<"$right")))
    kce=$((kce + $(sed 's/.*"last_color": \([01]\).*/\1/' <<<"$right")))
    if [ -n "$count" ] && grep -q "\"measured\": {[^}]*\"${count%%=*}\": \"${count#*=}\"" <<<"$r"; then
        seen=$((seen + 1))
    fi
    if [ $first = 0 ]; then json+=", "; fi
    first=0
    json+="$r"
done
echo "accuracy: colour $c/$n motion $m/$n pitch $p/$n pan $q/$n shape $sh/$n"
if [ -n "$count" ]; then echo "measured ${count%%=*} ${count#*=}: $seen/$n"; fi
if [ -n "$ref" ]; then echo "reference ($ref): colour $c/$n, pitch $p/$n"; fi
if [ -n "$snd" ]; then echo "soundtrack: pitch $p/$n, pan $q/$n"; fi
case $kf in
    first) echo "keyframes first: start $ks_/$n, first-frame colour $kcs/$n" ;;
    last) echo "keyframes last: end $ke/$n, last-frame colour $kce/$n" ;;
    both) echo "keyframes both: start $ks_/$n, end $ke/$n, first-frame colour $kcs/$n, last-frame colour $kce/$n" ;;
esac
echo "$json]" >"$out/adherence.json"
