#!/usr/bin/env bash
# Delivery size and two-pass refine with the small trained model (models/h3-small, generate's default model, at its
# 128x128 canvas), on the CPU:
#  - --output-size 1920x1080: ffprobe reads a 1920x1080 yuv420p stream with every frame, the PNG frames are
#    1920x1080, and the peak RSS (/usr/bin/time -v) of a 124-frame clip is within 48 MiB of a 39-frame clip's (the
#    124 frames at 1080p would take 771 MB as 8-bit RGB: the frames are scaled one at a time);
#  - bad sizes and refine values exit 2 with the fix named, leaving no output;
#  - --refine 256x256 (twice the canvas) writes a 256x256 clip, and with --output-size 512x512 a 512x512 one;
#  - the refine pass keeps the first pass's audio latents byte for byte;
#  - at denoise 0.02 (one model call from sigma 0.2) the refined video latents stay within 0.22 (relative L2) of the
#    first pass's upscaled (tests/latents_tool.py upscales them on its own), closer than a refine at denoise 1 comes
#    to its first pass; at denoise 1 the refine pass is a plain generation at the refine canvas from the same noise
#    but for the audio it sees (the first pass's, held), so its video latents are within 0.01 of one.
# Usage: cli_refine.sh PATH/TO/h3run (CTest passes it). Needs ffprobe, python3 and /usr/bin/time.
set -u
H3RUN=$1
BUILD=$(cd "${H3_BUILD_DIR:-$(dirname "$H3RUN")}" && pwd)
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for tool in ffprobe python3 /usr/bin/time; do
    command -v $tool >/dev/null || { echo "FAIL: $tool is needed"; exit 1; }
done
TOOL="python3 $SRC/tests/latents_tool.py"
P=$("$BUILD/h3-synth" prompt 9)
gen() { "$H3RUN" generate --prompt "$P" --seed 10 --device cpu --progress none "$@"; }
vinfo() { ffprobe -v error -select_streams v:0 -count_frames -show_entries stream=width,height,pix_fmt,nb_read_frames \
    -of csv=p=0 "$1"; }

# ---- --output-size 1920x1080: the stream, the frames, memory independent of the length ---------------------------
declare -A rss
for n in 39 124; do
    png=""; [ $n = 39 ] && png="--png-dir $tmp/png"
    /usr/bin/time -v -o "$tmp/time$n" "$H3RUN" generate --prompt "$P" --seed 10 --device cpu --progress none \
        --frames $n --steps 4 --x264-preset ultrafast --output-size 1920x1080 $png -o "$tmp/hd$n.mp4" \
        >"$tmp/log$n" 2>&1 || fail "--output-size 1920x1080, $n frames: $(tail -2 "$tmp/log$n")"
    [ "$(vinfo "$tmp/hd$n.mp4")" = "1920,1080,yuv420p,$n" ] || fail "$n frames at 1920x1080: ffprobe reads $(vinfo "$tmp/hd$n.mp4")"
    grep -q "rendered at 128x128, scaled to 1920x1080" "$tmp/log$n" || fail "$n frames: no render and delivery sizes in the report"
    rss[$n]=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$tmp/time$n")
done
echo "peak RSS at 1920x1080: 39 frames ${rss[39]} kB, 124 frames ${rss[124]} kB"
[ $(( ${rss[124]:-999999999} - ${rss[39]:-0} )) -le $((48 * 1024)) ] \
    || fail "peak RSS grows with the length: ${rss[39]} kB at 39 frames, ${rss[124]} kB at 124"
[ "$(ls "$tmp/png" | wc -l)" = 39 ] || fail "--png-dir: not 39 frames"
[ "$(ffprobe -v error -show_entries stream=width,height -of csv=p=0 "$tmp/png/frame_00038.png")" = "1920,1080" ] \
    || fail "the PNG frames are not 1920x1080"

# ---- bad values: exit 2, the fix named, nothing written ----------------------------------------------------------
while IFS='|' read -r args want; do
    gen --steps 2 $args -o "$tmp/bad.mp4" >"$tmp/bad.log" 2>&1; rc=$?
    [ $rc -eq 2 ] || fail "$args: exit $rc, not 2"
    grep -q -- "$want" "$tmp/bad.log" || fail "$args: the message lacks '$want': $(tail -1 "$tmp/bad.log")"
    [ ! -e "$tmp/bad.mp4" ] && [ ! -e "$tmp/bad.mp4.partial" ] || fail "$args: left an output"
done <<'CASES'
--output-size 1919x1080|use 1918x1080 or 1920x1080
--output-size 0x0|even number from 2
--output-size 1920|WIDTHxHEIGHT
--refine 250x256|multiples of 32
--refine 96x96|smaller than the first pass's 128x128
--refine 256x256:0|in (0, 1]
--refine 256x256:1.5|in (0, 1]
--refine 256x256:x|WIDTHxHEIGHT:DENOISE
CASES

# ---- --refine 256x256: the size, and with a delivery size ---------------------------------------------------------
gen --steps 8 --refine 256x256 -o "$tmp/r.mp4" >"$tmp/r.log" 2>&1 || fail "--refine 256x256: $(tail -2 "$tmp/r.log")"
[ "$(vinfo "$tmp/r.mp4")" = "256,256,yuv420p,56" ] || fail "--refine 256x256: ffprobe reads $(vinfo "$tmp/r.mp4")"
grep -q "refine: sampled at 128x128, then 4 model calls at 256x256" "$tmp/r.log" || fail "--refine: no report line: $(cat "$tmp/r.log")"
gen --steps 8 --refine 256x256 --output-size 512x512 -o "$tmp/r5.mp4" >"$tmp/r5.log" 2>&1 \
    || fail "--refine with --output-size: $(tail -2 "$tmp/r5.log")"
[ "$(vinfo "$tmp/r5.mp4")" = "512,512,yuv420p,56" ] || fail "refine then 512x512: ffprobe reads $(vinfo "$tmp/r5.mp4")"

# ---- the latents: audio kept, tiny denoise near the upscaled first pass, denoise 1 near a plain generation ----------
g22() { gen --frames 22 "$@"; }
g22 --steps 49 --latents "$tmp/p49.st" -o "$tmp/p49.mp4" >/dev/null 2>&1 || fail "plain 49 steps"
g22 --steps 49 --refine 256x256:0.02 --latents "$tmp/t.st" -o "$tmp/t.mp4" >/dev/null 2>&1 || fail "refine 0.02"
$TOOL same-audio "$tmp/p49.st" "$tmp/t.st" || fail "the refine pass changed the first pass's audio latents"
tiny=$($TOOL near-upscaled "$tmp/p49.st" "$tmp/t.st")
g22 --steps 8 --latents "$tmp/p8.st" -o "$tmp/p8.mp4" >/dev/null 2>&1 || fail "plain 8 steps"
g22 --steps 8 --refine 256x256:1 --latents "$tmp/one.st" -o "$tmp/one.mp4" >/dev/null 2>&1 || fail "refine 1"
g22 --steps 8 --size 256x256 --latents "$tmp/p256.st" -o "$tmp/p256.mp4" >/dev/null 2>&1 || fail "plain 256x256"
full=$($TOOL near-upscaled "$tmp/p8.st" "$tmp/one.st")
plain=$($TOOL near-upscaled "$tmp/p256.st" "$tmp/one.st")
echo "relative L2 from the upscaled first pass: denoise 0.02 $tiny, denoise 1 $full; denoise 1 from a plain 256x256 run: $plain"
python3 -c "import sys; t, f, p = map(float, sys.argv[1:]); sys.exit(0 if t <= 0.22 and t < 0.75 * f else 1)" \
    "$tiny" "$full" "0" || fail "denoise 0.02 is $tiny from the upscaled first pass (bound 0.22, and below 0.75 x $full)"
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 0.01 else 1)" "$plain" \
    || fail "denoise 1 is $plain from a plain generation at 256x256 (bound 0.01)"

[ $fails -eq 0 ] && echo "cli_refine: all passed" || { echo "cli_refine: $fails failures"; exit 1; }
