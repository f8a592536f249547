#!/usr/bin/env bash
# The adherence check end to end, shortened: bench/adherence.sh on the first 8 held-out prompts with a reduced H3 of
# random weights (tools/h3-tinymodel). Generation, reading the clips back and measuring them must work, and random
# weights must score near chance (the check can fail; tests/test_synth.c shows it succeeds on the world's own clips).
# Then h3-synth's command line: bad arguments exit 2, an unreadable clip exits 3.
# Usage: cli_adherence.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
SYNTH=$BUILD/h3-synth
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BUILD/h3-tinymodel" "$tmp/tiny" >/dev/null || fail "h3-tinymodel"
out=$(H3RUN="$H3RUN" H3SYNTH="$SYNTH" OUT="$tmp/adh" "$SRC/bench/adherence.sh" "$tmp/tiny" 8 --device cpu 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "adherence.sh exited $rc: $out"
line=$(grep '^accuracy:' <<<"$out")
echo "random weights: $line"
read -r c m p q < <(sed 's/accuracy: colour \([0-9]*\)\/8 motion \([0-9]*\)\/8 pitch \([0-9]*\)\/8 pan \([0-9]*\)\/8/\1 \2 \3 \4/' <<<"$line")
for v in "$c" "$m" "$p" "$q"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { fail "no accuracy line: $out"; break; }
    [ "$v" -le 5 ] || fail "random weights score $v of 8 on an attribute: $line"
done
[ "$(grep -c '^[0-7]: held-out' <<<"$out")" -eq 8 ] || fail "not 8 measured prompts: $out"
grep -q '"heldout": 7' "$tmp/adh/adherence.json" || fail "adherence.json lacks prompt 7"
# h3-synth's errors
"$SYNTH" check "$tmp/none.mp4" --heldout 1 >/dev/null 2>"$tmp/err"; [ $? -eq 3 ] || fail "unreadable clip: not exit 3"
grep -q "none.mp4" "$tmp/err" || fail "unreadable clip: the message does not name it: $(cat "$tmp/err")"
for bad in "prompt 54" "clip $tmp/x.mp4 --frames 20" "clip $tmp/x.mp4 --size 100x64" "check $tmp/a.mp4" "nope" \
           "dataset $tmp/d --clips 0"; do
    "$SYNTH" $bad >/dev/null 2>&1; rc=$?
    [ $rc -eq 2 ] || fail "h3-synth $bad exited $rc, not 2"
done
[ ! -e "$tmp/x.mp4" ] || fail "a refused clip left a file"
[ $fails -eq 0 ] && echo "cli_adherence: all passed" || { echo "cli_adherence: $fails failures"; exit 1; }
