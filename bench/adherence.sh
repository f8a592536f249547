#!/usr/bin/env bash
# The objective check of prompt adherence (src/synth/world.h): the synthetic world's held-out prompts through
# `h3run generate`, each clip measured by `h3-synth check` (dominant colour, direction of motion, the tone's pitch
# and pan, the shape), accuracy per attribute. The 54 held-out combinations never appear in the training data.
#
#   bench/adherence.sh MODEL [N] [generate options...]      N: the first N held-out prompts (default 54)
#   PROMPTS="0 9 18" bench/adherence.sh MODEL               these held-out prompts instead (N is then ignored)
#
# Clips: 56 frames (2.33 s) at 128x128, seed k+1 for prompt k. H3RUN and H3SYNTH name the programs (default
# build/h3run, build/h3-synth); OUT keeps the clips and writes adherence.json. Prints one line per prompt, then
# "accuracy: colour C/N motion M/N pitch P/N pan Q/N shape S/N". COUNT=ATTRIBUTE=VALUE (e.g. motion=bounce) also
# counts the clips measured so ("measured motion bounce: K/N": what a LoRA that changes it is scored by).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: bench/adherence.sh MODEL [N] [generate options...]}
n=${2:-54}
shift $(( $# >= 2 ? 2 : 1 ))
H3RUN=${H3RUN:-build/h3run}
H3SYNTH=${H3SYNTH:-build/h3-synth}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
c=0 m=0 p=0 q=0 sh=0 seen=0
count=${COUNT:-}
json="["
read -r -a ks <<<"${PROMPTS:-$(seq -s ' ' 0 $((n - 1)))}"
n=${#ks[@]}
first=1
for k in "${ks[@]}"; do
    prompt=$("$H3SYNTH" prompt "$k")
    clip="$out/heldout-$k.mp4"
    "$H3RUN" generate --model "$model" --prompt "$prompt" --frames 56 --size 128x128 --seed $((k + 1)) \
        --progress none -q -o "$clip" "$@" >/dev/null 2>"$out/generate-$k.log" \
        || { echo "adherence: generate failed for prompt $k: $(tail -1 "$out/generate-$k.log")" >&2; exit 1; }
    r=$("$H3SYNTH" check "$clip" --heldout "$k" --json)
    echo "$k: $("$H3SYNTH" check "$clip" --heldout "$k")"
    right=$(sed 's/.*"right": {\(.*\)}}/\1/' <<<"$r")
    c=$((c + $(sed 's/.*"color": \([01]\).*/\1/' <<<"$right")))
    m=$((m + $(sed 's/.*"motion": \([01]\).*/\1/' <<<"$right")))
    p=$((p + $(sed 's/.*"pitch": \([01]\).*/\1/' <<<"$right")))
    q=$((q + $(sed 's/.*"pan": \([01]\).*/\1/' <<<"$right")))
    sh=$((sh + $(sed 's/.*"shape": \([01]\).*/\1/' <<<"$right")))
    if [ -n "$count" ] && grep -q "\"measured\": {[^}]*\"${count%%=*}\": \"${count#*=}\"" <<<"$r"; then
        seen=$((seen + 1))
    fi
    if [ $first = 0 ]; then json+=", "; fi
    first=0
    json+="$r"
done
echo "accuracy: colour $c/$n motion $m/$n pitch $p/$n pan $q/$n shape $sh/$n"
if [ -n "$count" ]; then echo "measured ${count%%=*} ${count#*=}: $seen/$n"; fi
echo "$json]" >"$out/adherence.json"
