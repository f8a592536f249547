#!/usr/bin/env bash
# How close a step-distilled LoRA's short run comes to the base model's long run: for held-out prompts of the
# synthetic world, the relative L2 distance of the final latents (video, audio) from the base's TEACHER-step run, for
# the base at STEPS, the base at 2·STEPS and the base with the LoRA (at its preset's steps), same seed and noise.
#
#   bench/turbo_distance.sh MODEL LORA [STEPS] [TEACHER]      defaults: 4, 48
#   PROMPTS="0 5 10" bench/turbo_distance.sh ...              the held-out prompts (default: 12 spread over the 54)
#
# Prints one line per prompt ("k: base S v a | lora v a | base 2S v a") and the means. H3RUN, H3SYNTH name the
# programs (default build/); OUT keeps the latents. generate runs on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: bench/turbo_distance.sh MODEL LORA [STEPS] [TEACHER]}
lora=${2:?usage: bench/turbo_distance.sh MODEL LORA [STEPS] [TEACHER]}
steps=${3:-4} teacher=${4:-48}
H3RUN=${H3RUN:-build/h3run} H3SYNTH=${H3SYNTH:-build/h3-synth}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
rm -f "$out/lines"
read -r -a ks <<<"${PROMPTS:-0 5 10 15 20 25 30 35 40 45 50 53}"
dist() { /usr/bin/python3 tests/latents_tool.py distance "$1" "$2" | tr '\n' ' '; }
for k in "${ks[@]}"; do
    p=$("$H3SYNTH" prompt "$k")
    for cfg in "t:--steps $teacher" "b:--steps $steps" "l:--lora $lora" "d:--steps $((2 * steps))"; do
        n=${cfg%%:*}
        # shellcheck disable=SC2086
        "$H3RUN" generate --model "$model" --prompt "$p" --frames 56 --size 128x128 --seed $((k + 1)) --device cpu \
            --progress none -q ${cfg#*:} --latents "$out/$n-$k.safetensors" -o "$out/$n-$k.mp4" >/dev/null 2>&1 \
            || { echo "turbo_distance: generate failed for prompt $k ($n)" >&2; exit 1; }
    done
    read -r bv ba <<<"$(dist "$out/t-$k.safetensors" "$out/b-$k.safetensors")"
    read -r lv la <<<"$(dist "$out/t-$k.safetensors" "$out/l-$k.safetensors")"
    read -r dv da <<<"$(dist "$out/t-$k.safetensors" "$out/d-$k.safetensors")"
    echo "$k: base $steps $bv $ba | lora $lv $la | base $((2 * steps)) $dv $da" | tee -a "$out/lines"
done
awk -v s="$steps" -v t="$teacher" '{ b += $4; B += $5; l += $8; L += $9; d += $13; D += $14; n++ }
    END { printf "mean over %d prompts, from the base at %d steps (video, audio): base %d steps %.4f %.4f, with the LoRA %.4f %.4f, base %d steps %.4f %.4f\n", n, t, s, b / n, B / n, l / n, L / n, 2 * s, d / n, D / n }' "$out/lines"
