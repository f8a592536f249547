#!/usr/bin/env bash
# h3run encode's image paths: --image through the processor to --vision-out (grids from smart_resize), bad images
# (missing, empty, garbage, truncated, a huge size in the header) refused with one line and exit 1 or 2, and
# --vision refused for a text encoder without a whole vision tower. Usage: cli_vision.sh PATH/TO/h3run.
# Images are made with the ffmpeg command when it is installed; without it those checks are skipped.
set -u
H3RUN=$1
SRC=${H3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# exit status and one line naming the file, for each bad input
expect_fail() { # NAME FILE
    "$H3RUN" encode -q --image "$2" --vision-out "$tmp/bad.safetensors" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } || fail "$1: exit $rc (want 1 or 2): $(cat "$tmp/err")"
    [ "$(wc -l <"$tmp/err")" -ge 1 ] || fail "$1: no message"
    grep -qF "$(basename "$2")" "$tmp/err" || fail "$1: the message does not name the file: $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.safetensors" ] || fail "$1: --vision-out was written"
}
expect_fail "missing" "$tmp/absent.png"
: >"$tmp/empty.png"
expect_fail "empty" "$tmp/empty.png"
printf 'not an image at all' >"$tmp/garbage.jpg"
expect_fail "garbage" "$tmp/garbage.jpg"

if command -v ffmpeg >/dev/null; then
    ffmpeg -v error -y -f lavfi -i "testsrc2=size=640x480:rate=1" -frames:v 1 "$tmp/a.png" || fail "ffmpeg png"
    ffmpeg -v error -y -f lavfi -i "testsrc2=size=500x700:rate=1" -frames:v 1 "$tmp/b.jpg" || fail "ffmpeg jpg"
    ffmpeg -v error -y -f lavfi -i "testsrc2=size=48x80:rate=1" -frames:v 1 "$tmp/c.bmp" || fail "ffmpeg bmp"
    out=$("$H3RUN" encode --image "$tmp/a.png,$tmp/b.jpg,$tmp/c.bmp" --vision-out "$tmp/v.safetensors" 2>"$tmp/err")
    rc=$?
    [ $rc -eq 0 ] || fail "--image exited $rc: $(cat "$tmp/err")"
    # smart_resize (factor 32), h x w: 480x640 -> 480x640 (grid 30x40), 700x500 -> 704x512 (44x32), 80x48 -> 352x224 (22x14)
    for want in "image 0: grid [1, 30, 40], 300 image tokens" "image 1: grid [1, 44, 32], 352 image tokens" \
                "image 2: grid [1, 22, 14], 77 image tokens"; do
        grep -qF "$want" <<<"$out" || fail "--image output lacks '$want': $out"
    done
    "$H3RUN" inspect "$tmp/v.safetensors" >"$tmp/insp" 2>&1 || fail "inspect of --vision-out"
    grep -qE "pixel_values +F32 +\[2916, 1536\]" "$tmp/insp" || fail "pixel_values shape: $(cat "$tmp/insp")"
    grep -qE "image_grid_thw +I64 +\[3, 3\]" "$tmp/insp" || fail "image_grid_thw: $(cat "$tmp/insp")"
    # truncated: the first half of a PNG
    head -c $(($(stat -c %s "$tmp/a.png") / 2)) "$tmp/a.png" >"$tmp/trunc.png"
    expect_fail "truncated" "$tmp/trunc.png"
    # a 300000x2 PNG header (refused for its aspect ratio or size, never decoded into memory it cannot hold)
    ffmpeg -v error -y -f lavfi -i "color=c=red:size=8000x2:rate=1" -frames:v 1 "$tmp/wide.png" || fail "ffmpeg wide"
    expect_fail "aspect ratio" "$tmp/wide.png"
    # --vision with a text encoder whose vision tower is incomplete (the fixture's, without config)
    "$H3RUN" encode -q --image "$tmp/a.png" --vision-out "$tmp/v2.safetensors" >/dev/null 2>&1 || fail "second --image"
    "$H3RUN" encode -q --text-encoder "$SRC/tests/fixtures/text_encoder/comfy.safetensors" --token-ids 1,2 \
        --vision "$tmp/v2.safetensors" -o "$tmp/h.safetensors" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 1 ] || fail "--vision with the fixture's partial tower: exit $rc (want 1): $(cat "$tmp/err")"
    grep -qF "ViT stem" "$tmp/err" || fail "--vision message: $(cat "$tmp/err")"
else
    echo "skipped: ffmpeg is not installed (the image checks need it to make images)"
fi
# usage errors
"$H3RUN" encode --vision-out "$tmp/x.safetensors" >/dev/null 2>&1
[ $? -eq 2 ] || fail "--vision-out without --image must exit 2"
"$H3RUN" encode --image a.png --vision b.safetensors --token-ids 1 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--image with --vision must exit 2"
[ $fails -eq 0 ] && echo "cli_vision: all passed"
exit $((fails > 0))
