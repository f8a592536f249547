#!/usr/bin/env bash
# The adherence check end to end, shortened: bench/adherence.sh on the first 8 held-out prompts with a reduced H3 of
# random weights (tools/h3-tinymodel). Generation, reading the clips back and measuring them must work, and random
# weights must score near chance (the check can fail; tests/test_synth.c shows it succeeds on the world's own clips).
# Then the small trained model (models/h3-small, what generate uses without --model) on six held-out prompts, one
# per motion: it must follow them (the full 54-prompt numbers are in docs/SYNTH.md), and generate must find it
# without --model from another working folder; its LoRAs; given first or last frames, it must start or end there. Then h3-synth's command line: bad arguments exit 2, an unreadable
# clip exits 3.
# Usage: cli_adherence.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
BUILD=$(cd "${H3_BUILD_DIR:-$(dirname "$H3RUN")}" && pwd)
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
read -r c m p q s < <(sed 's/accuracy: colour \([0-9]*\)\/8 motion \([0-9]*\)\/8 pitch \([0-9]*\)\/8 pan \([0-9]*\)\/8 shape \([0-9]*\)\/8.*/\1 \2 \3 \4 \5/' <<<"$line")
for v in "$c" "$m" "$p" "$q"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { fail "no accuracy line: $out"; break; }
    [ "$v" -le 5 ] || fail "random weights score $v of 8 on an attribute: $line"
done
[ "$(grep -c '^[0-7]: held-out' <<<"$out")" -eq 8 ] || fail "not 8 measured prompts: $out"
grep -q '"heldout": 7' "$tmp/adh/adherence.json" || fail "adherence.json lacks prompt 7"
# the small trained model: six held-out prompts, one per motion (left, right, up, down, bounce, stay)
out=$(PROMPTS="0 9 18 27 36 45" H3RUN="$H3RUN" H3SYNTH="$SYNTH" OUT="$tmp/small" "$SRC/bench/adherence.sh" \
    "$SRC/models/h3-small" 6 --device cpu 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "adherence.sh on models/h3-small exited $rc: $out"
line=$(grep '^accuracy:' <<<"$out")
echo "small model: $line"
read -r c m p q s < <(sed 's/accuracy: colour \([0-9]*\)\/6 motion \([0-9]*\)\/6 pitch \([0-9]*\)\/6 pan \([0-9]*\)\/6 shape \([0-9]*\)\/6.*/\1 \2 \3 \4 \5/' <<<"$line")
for v in "$c" "$m" "$p"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { fail "no accuracy line: $out"; break; }
    # measured here: 5, 6, 6 (prompt 27's yellow reads as orange); 4 leaves room for another CPU's rounding
    [ "$v" -ge 4 ] || fail "the small model scores $v of 6 on colour, motion or pitch: $line"
done
# without --model, from another folder: the model beside the program, at 56 frames and 128x128
(cd "$tmp" && "$H3RUN" generate --prompt "$("$SYNTH" prompt 20)" --seed 21 --steps 12 --device cpu --progress none \
    -o "$tmp/default.mp4" >"$tmp/default.log" 2>&1) || fail "generate without --model: $(tail -2 "$tmp/default.log")"
grep -q "models/h3-small" "$tmp/default.log" || fail "generate without --model does not name the model it took"
grep -q "56 frames at 128x128" "$tmp/default.log" || fail "generate without --model: not 56 frames at 128x128"
# the small model's LoRAs (docs/LORA.md): the bounce LoRA makes two shapes asked to move left and up bounce (their
# colour and pitch kept); the 4-step turbo LoRA (its preset: 4 calls) follows two prompts
out=$(PROMPTS="0 18" COUNT=motion=bounce H3RUN="$H3RUN" H3SYNTH="$SYNTH" OUT="$tmp/bounce" "$SRC/bench/adherence.sh" \
    "$SRC/models/h3-small" 2 --device cpu --lora "$SRC/models/h3-small/loras/h3-small_bounce.safetensors" 2>&1)
echo "bounce LoRA: $(grep '^measured' <<<"$out")"
grep -q "^measured motion bounce: 2/2" <<<"$out" || fail "the bounce LoRA: $out"
grep -q "colour 2/2 motion 0/2 pitch 2/2" <<<"$out" || fail "the bounce LoRA changed more than the motion: $out"
out=$(PROMPTS="9 27" H3RUN="$H3RUN" H3SYNTH="$SYNTH" OUT="$tmp/turbo" "$SRC/bench/adherence.sh" "$SRC/models/h3-small" 2 \
    --device cpu --lora "$SRC/models/h3-small/loras/h3-small_turbo_4step.safetensors" 2>&1)
echo "turbo LoRA: $(grep '^accuracy' <<<"$out")"
grep -q "motion 2/2 pitch 2/2 pan 2/2" <<<"$out" || fail "the turbo LoRA at 4 steps: $out"
"$H3RUN" generate --model "$SRC/models/h3-small" --prompt "$("$SYNTH" prompt 9)" --frames 22 --size 64x64 --device cpu \
    --progress none --lora "$SRC/models/h3-small/loras/h3-small_turbo_4step.safetensors" -o "$tmp/t.mp4" >"$tmp/t.log" 2>&1 \
    || fail "generate with the turbo LoRA: $(tail -2 "$tmp/t.log")"
grep -q "LoRA preset: .*4 model calls at shift 12:3" "$tmp/t.log" || fail "the turbo LoRA's preset (4 calls) not applied: $(cat "$tmp/t.log")"
# fl2va on the small model (its vision tower and keyframe training; docs/SYNTH.md): given its scene's first frame
# (drawn with a seed, whose places the caption does not say), each of three prompts must start where the frame shows
# and in its colour; given the last frame, end there
out=$(KEYFRAMES=first PROMPTS="1 19 38" H3RUN="$H3RUN" H3SYNTH="$SYNTH" OUT="$tmp/first" "$SRC/bench/adherence.sh" \
    "$SRC/models/h3-small" 3 --device cpu 2>&1)
echo "first frames: $(grep '^keyframes' <<<"$out")"
# measured here: 3 and 3 of 3 (50 and 50 of the 54 prompts); 2 leaves room for another CPU's rounding
read -r a b < <(sed -n 's/^keyframes first: start \([0-9]*\)\/3, first-frame colour \([0-9]*\)\/3$/\1 \2/p' <<<"$out")
[ "${a:-0}" -ge 2 ] && [ "${b:-0}" -ge 2 ] || fail "the small model does not follow its first frames: $out"
out=$(KEYFRAMES=last PROMPTS="2 23 32" H3RUN="$H3RUN" H3SYNTH="$SYNTH" OUT="$tmp/last" "$SRC/bench/adherence.sh" \
    "$SRC/models/h3-small" 3 --device cpu 2>&1)
echo "last frames: $(grep '^keyframes' <<<"$out")"
# measured here: 3 and 3 of 3 (41 and 50 of the 54: every bouncing shape's end misses, its bounces out of step)
read -r a b < <(sed -n 's/^keyframes last: end \([0-9]*\)\/3, last-frame colour \([0-9]*\)\/3$/\1 \2/p' <<<"$out")
[ "${a:-0}" -ge 2 ] && [ "${b:-0}" -ge 2 ] || fail "the small model does not follow its last frames: $out"
# h3-synth's errors
"$SYNTH" check "$tmp/none.mp4" --heldout 1 >/dev/null 2>"$tmp/err"; [ $? -eq 3 ] || fail "unreadable clip: not exit 3"
grep -q "none.mp4" "$tmp/err" || fail "unreadable clip: the message does not name it: $(cat "$tmp/err")"
for bad in "prompt 54" "clip $tmp/x.mp4 --frames 20" "clip $tmp/x.mp4 --size 100x64" "check $tmp/a.mp4" "nope" \
           "dataset $tmp/d --clips 0" "frame $tmp/f.png --at 56" "frame $tmp/f.png --at next" "check $tmp/a.mp4 --heldout 1 --seed -1"; do
    "$SYNTH" $bad >/dev/null 2>&1; rc=$?
    [ $rc -eq 2 ] || fail "h3-synth $bad exited $rc, not 2"
done
[ ! -e "$tmp/x.mp4" ] || fail "a refused clip left a file"
[ $fails -eq 0 ] && echo "cli_adherence: all passed" || { echo "cli_adherence: $fails failures"; exit 1; }
