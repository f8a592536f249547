#!/usr/bin/env bash
# Step caching on the small model: the held-out prompts of bench/adherence.sh at 49 steps without the cache and
# with it at each threshold, same seeds. Per threshold: the DiT calls made (from generate's report), the
# adherence per attribute (h3-synth check), and each clip's PSNR against the uncached clip (ffmpeg's psnr
# filter, all frames). bench/NOTES.md has the figures.
#
#   bench/cache.sh [N] [THRESHOLD ...]     N: the first N held-out prompts (default 54); thresholds default 0.2 0.1 0.05
#
# H3RUN and H3SYNTH name the programs (default build/h3run, build/h3-synth); OUT keeps the clips (default a new
# temporary folder) and writes cache.json. Needs ffmpeg.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-54}
shift $(($# >= 1 ? 1 : 0))
thresholds=("$@")
[ ${#thresholds[@]} -eq 0 ] && thresholds=(0.2 0.1 0.05)
H3RUN=${H3RUN:-build/h3run}
H3SYNTH=${H3SYNTH:-build/h3-synth}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
json="{"
for t in off "${thresholds[@]}"; do
    dir="$out/$t"
    mkdir -p "$dir"
    c=0 m=0 p=0 q=0 calls=0 made=0 psnr_sum=0 psnr_min=999
    opts=()
    [ "$t" != off ] && opts=(--cache-threshold "$t")
    t0=$(date +%s.%N)
    for k in $(seq 0 $((n - 1))); do
        prompt=$("$H3SYNTH" prompt "$k")
        clip="$dir/heldout-$k.mp4"
        line=$("$H3RUN" generate --prompt "$prompt" --frames 56 --size 128x128 --steps 49 --seed $((k + 1)) \
            --progress none -o "$clip" "${opts[@]}" 2>"$dir/generate-$k.log" | grep '^step cache' || true)
        [ -f "$clip" ] || { echo "cache: generate failed for prompt $k: $(tail -1 "$dir/generate-$k.log")" >&2; exit 1; }
        if [ -n "$line" ]; then
            a=$(sed -n 's/.*: \([0-9]*\) of \([0-9]*\) model calls.*, \([0-9]*\) DiT calls.*/\1 \2 \3/p' <<<"$line")
            read -r _ asked dit <<<"$a"
            calls=$((calls + asked)) made=$((made + dit))
        else
            calls=$((calls + 49)) made=$((made + 49))
        fi
        right=$("$H3SYNTH" check "$clip" --heldout "$k" --json | sed 's/.*"right": {\(.*\)}}/\1/')
        c=$((c + $(sed 's/.*"color": \([01]\).*/\1/' <<<"$right")))
        m=$((m + $(sed 's/.*"motion": \([01]\).*/\1/' <<<"$right")))
        p=$((p + $(sed 's/.*"pitch": \([01]\).*/\1/' <<<"$right")))
        q=$((q + $(sed 's/.*"pan": \([01]\).*/\1/' <<<"$right")))
        if [ "$t" != off ]; then
            ps=$(ffmpeg -nostats -i "$clip" -i "$out/off/heldout-$k.mp4" -lavfi psnr -f null - 2>&1 |
                sed -n 's/.*average:\([0-9.inf]*\).*/\1/p' | tail -1)
            [ "$ps" = inf ] && ps=99
            psnr_sum=$(awk -v a="$psnr_sum" -v b="$ps" 'BEGIN{print a + b}')
            psnr_min=$(awk -v a="$psnr_min" -v b="$ps" 'BEGIN{print (b < a ? b : a)}')
        fi
    done
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
    psnr=$( [ "$t" = off ] && echo "-" || awk -v s="$psnr_sum" -v n="$n" 'BEGIN{printf "%.2f", s / n}')
    echo "cache $t: DiT calls $made of $calls ($(awk -v a="$calls" -v b="$made" 'BEGIN{printf "%.2f", a / b}')x fewer);" \
        "adherence colour $c/$n motion $m/$n pitch $p/$n pan $q/$n; PSNR against off: mean $psnr dB," \
        "min $( [ "$t" = off ] && echo - || echo "$psnr_min") dB; ${secs} s for the $n clips"
    [ "$json" != "{" ] && json+=", "
    json+="\"$t\": {\"calls\": $calls, \"dit_calls\": $made, \"colour\": $c, \"motion\": $m, \"pitch\": $p, \"pan\": $q,"
    json+=" \"n\": $n, \"psnr_mean\": \"$psnr\", \"seconds\": $secs}"
done
echo "$json}" >"$out/cache.json"
