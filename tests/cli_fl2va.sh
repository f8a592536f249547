#!/usr/bin/env bash
# fl2va on the reduced random model (h3-tinymodel: a vision tower and a video VAE encoder of the release's
# structure), on the CPU:
#  - --first-frame, --last-frame and --keyframe IMG@FRAME write a clip; the latents file holds what the DiT was given
#    for them and tests/latents_tool.py checks it against the rules of pipeline/keyframe.h and layout.h (the rows are
#    0.999·latents + 0.001·noise, the DiT's first call saw them first, at t = 0.999, at their frames' rotary times,
#    the presentation's vision blocks tagged video);
#  - without --size the canvas takes the first keyframe's aspect ratio (a 9:16 image: 768x1344 on the plan line);
#  - bad input exits 2 (or 1 for a broken file) naming the problem, and leaves no output: a missing, empty,
#    garbage or truncated image, a keyframe outside the clip, two on one frame, a bad IMG@FRAME, an aspect ratio
#    beyond 4:1, --refine with keyframes; a model without a vision tower exits 1 naming it.
# Usage: cli_fl2va.sh PATH/TO/h3run (CTest passes it). Needs ffmpeg (the images) and python3.
set -u
H3RUN=$1
BUILD=$(cd "${H3_BUILD_DIR:-$(dirname "$H3RUN")}" && pwd)
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for tool in ffmpeg python3; do
    command -v $tool >/dev/null || { echo "FAIL: $tool is needed"; exit 1; }
done
"$BUILD/h3-tinymodel" "$tmp/m" >/dev/null 2>&1 || { echo "FAIL: h3-tinymodel"; exit 1; }
img() { ffmpeg -v error -y -f lavfi -i "testsrc2=size=$1:rate=1" -frames:v 1 "$2" || fail "ffmpeg $2"; }
img 320x180 "$tmp/a.png"
img 200x300 "$tmp/b.jpg"
img 90x160 "$tmp/tall.png"
gen() { "$H3RUN" generate --model "$tmp/m" --prompt "a red ball rolls" --frames 22 --steps 2 --seed 3 --device cpu \
    --progress none "$@"; }

# A clip with three keyframes; the latents and the DiT's first inputs checked
gen --size 128x64 --first-frame "$tmp/a.png" --last-frame "$tmp/b.jpg" --keyframe "$tmp/a.png@10" \
    --latents "$tmp/l.safetensors" --dump-dit-inputs "$tmp/d.safetensors" -o "$tmp/o.mp4" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] || fail "three keyframes: exit $rc: $(cat "$tmp/err")"
[ -s "$tmp/o.mp4" ] || fail "three keyframes: no MP4"
grep -q "keyframes: 3 (24 rows held at t = 0.999)" "$tmp/out" || fail "the summary: $(cat "$tmp/out")"
python3 "$SRC/tests/latents_tool.py" keyframes "$tmp/l.safetensors" "$tmp/d.safetensors" || fail "latents_tool keyframes"
# the dumped inputs are what `h3run dit` reads
"$H3RUN" dit --model "$tmp/m/transformer" --inputs "$tmp/d.safetensors" -o "$tmp/v.safetensors" --device cpu \
    >/dev/null 2>"$tmp/err" || fail "h3run dit on the dumped inputs: $(cat "$tmp/err")"

# The canvas from the first keyframe's aspect ratio (9:16: 768x1344), seen in the request line of the log
gen --first-frame "$tmp/tall.png" --steps 1 --frames 5 -o "$tmp/tall.mp4" -v >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] || fail "tall keyframe: exit $rc: $(tail -3 "$tmp/err")"
grep -q "canvas 768x1344, from the aspect ratio of" "$tmp/err" || fail "no canvas from the aspect ratio: $(grep -i canvas "$tmp/err")"

# Bad input: exit status, a message naming the problem, no output left
expect() { # WANT_RC WHAT GREP ARGS...
    local want=$1 what=$2 pat=$3
    shift 3
    rm -f "$tmp/bad.mp4"
    gen --size 128x64 -o "$tmp/bad.mp4" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ $rc -eq "$want" ] || fail "$what: exit $rc, want $want: $(cat "$tmp/err")"
    grep -q -- "$pat" "$tmp/err" || fail "$what: the message lacks '$pat': $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.mp4" ] && [ ! -e "$tmp/bad.mp4.partial" ] || fail "$what: an output was left"
}
: >"$tmp/empty.png"
printf 'not an image' >"$tmp/garbage.jpg"
head -c $(($(stat -c %s "$tmp/a.png") / 2)) "$tmp/a.png" >"$tmp/trunc.png"
ffmpeg -v error -y -f lavfi -i "color=c=red:size=900x100:rate=1" -frames:v 1 "$tmp/wide.png" || fail "ffmpeg wide"
expect 2 "missing image" "absent.png" --first-frame "$tmp/absent.png"
for f in empty.png garbage.jpg trunc.png; do
    gen --size 128x64 -o "$tmp/bad.mp4" --first-frame "$tmp/$f" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } || fail "$f: exit $rc: $(cat "$tmp/err")"
    grep -q "$f" "$tmp/err" || fail "$f: the message does not name the file: $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.mp4" ] || fail "$f: an output was left"
done
expect 2 "frame outside the clip" "outside the clip" --keyframe "$tmp/a.png@22"
expect 2 "two on one frame" "at frame 0" --first-frame "$tmp/a.png" --keyframe "$tmp/b.jpg@0"
expect 2 "bad IMG@FRAME" "IMG@FRAME" --keyframe "$tmp/a.png"
expect 2 "bad IMG@FRAME" "IMG@FRAME" --keyframe "$tmp/a.png@x"
expect 2 "refine" "--refine with keyframes" --first-frame "$tmp/a.png" --refine 256x128
rm -f "$tmp/bad.mp4"
gen --first-frame "$tmp/wide.png" -o "$tmp/bad.mp4" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] || fail "aspect 9:1: exit $rc: $(cat "$tmp/err")"
grep -q "1:4 to 4:1" "$tmp/err" || fail "aspect 9:1: $(cat "$tmp/err")"
# a model whose text encoder has no vision tower (the small model's language weights alone, as it was before its
# tower was added): exit 1 naming it
if [ -f "$SRC/models/h3-small/text_encoder/model-00001-of-00002.safetensors" ]; then
    cp -r "$SRC/models/h3-small" "$tmp/notower"
    rm "$tmp"/notower/text_encoder/model-0000[12]-of-00002.safetensors "$tmp/notower/text_encoder/model.safetensors.index.json"
    ln -s "$SRC/models/h3-small/text_encoder/model-00001-of-00002.safetensors" "$tmp/notower/text_encoder/model.safetensors"
    "$H3RUN" generate --model "$tmp/notower" --prompt x --frames 22 --steps 1 --device cpu --progress none \
        --size 128x128 --first-frame "$tmp/a.png" -o "$tmp/bad.mp4" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 1 ] || fail "no vision tower: exit $rc: $(cat "$tmp/err")"
    grep -q "vision tower" "$tmp/err" || fail "no vision tower: $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.mp4" ] || fail "no vision tower: an output was left"
fi
[ $fails -eq 0 ] && echo "cli_fl2va: all passed"
exit $((fails > 0))
