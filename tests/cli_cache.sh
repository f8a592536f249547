#!/usr/bin/env bash
# generate --cache (step caching, sample/cache.h) with the small model, 49 steps of euler on the h3 schedule on the
# CPU:
#  - at the default threshold at least 1.8x fewer DiT calls than model calls, reported in the summary; the latents
#    within 5% (video) and 25% (audio) relative L2 of the uncached run's; a lower threshold skips fewer calls and
#    lands closer;
#  - a threshold out of range is refused with exit 2 and a message, writing nothing.
# Usage: cli_cache.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
A=(--prompt "a red circle moves from left to right, a rising tone" --steps 49 --seed 3 --device cpu --threads 2
   --progress none)
"$H3RUN" generate "${A[@]}" -q -o "$tmp/off.mp4" --latents "$tmp/off.st" || { fail "the uncached run"; exit 1; }
declare -A made dist
for t in default 0.05; do
    opt=(--cache)
    [ $t != default ] && opt=(--cache-threshold $t)
    "$H3RUN" generate "${A[@]}" "${opt[@]}" -o "$tmp/$t.mp4" --latents "$tmp/$t.st" >"$tmp/out" 2>"$tmp/err" ||
        { fail "--cache $t: $(tail -2 "$tmp/err")"; continue; }
    line=$(grep '^step cache' "$tmp/out")
    n=$(sed -n 's/.*answered from the cache, \([0-9]*\) DiT calls.*/\1/p' <<<"$line")
    [ -n "$n" ] || { fail "--cache $t: no summary line: $(cat "$tmp/out")"; continue; }
    made[$t]=$n
    dist[$t]=$(python3 "$SRC/tests/latents_tool.py" distance "$tmp/off.st" "$tmp/$t.st")
    echo "cache $t: $n DiT calls of 49; relative L2 off the uncached latents (video, audio): ${dist[$t]}"
done
if [ -n "${made[default]:-}" ]; then
    awk -v n="${made[default]}" 'BEGIN{exit !(49 / n >= 1.8)}' || fail "the default threshold made ${made[default]} DiT calls of 49 (< 1.8x fewer)"
    read -r dv da <<<"${dist[default]}"
    awk -v v="$dv" -v a="$da" 'BEGIN{exit !(v <= 0.05 && a <= 0.25)}' || fail "the default threshold's latents are off: $dv $da"
fi
if [ -n "${made[0.05]:-}" ] && [ -n "${made[default]:-}" ]; then
    [ "${made[0.05]}" -gt "${made[default]}" ] || fail "threshold 0.05 made ${made[0.05]} calls, not more than the default's ${made[default]}"
    read -r lv la <<<"${dist[0.05]}"
    read -r dv da <<<"${dist[default]}"
    awk -v a="$lv" -v b="$dv" 'BEGIN{exit !(a < b)}' || fail "threshold 0.05 is not closer than the default ($lv vs $dv)"
fi
for bad in 0 -1 11 x; do
    "$H3RUN" generate "${A[@]}" --cache-threshold "$bad" -o "$tmp/bad.mp4" >/dev/null 2>"$tmp/err"; rc=$?
    [ $rc = 2 ] && grep -q "cache-threshold" "$tmp/err" && [ ! -e "$tmp/bad.mp4" ] ||
        fail "--cache-threshold $bad: exit $rc, $(cat "$tmp/err")"
done
[ $fails = 0 ] && echo "cli_cache: all passed"
exit $((fails > 0))
