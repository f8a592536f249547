#!/usr/bin/env bash
# ref2va on the reduced random model (h3-tinymodel: a vision tower, the video VAE's and the audio VAE's encoders),
# on the CPU, at small reference sizes (--ref-image-size / --ref-video-size 64):
#  - an image, a video with sound and a sound as references write a clip; the first DiT call's inputs are checked by
#    tests/latents_tool.py against its own implementation of diffusers' ref2va layout (positions, tags, index sets,
#    the references' rows at t = 0.999 and 1) for the blocks this script works out from the files; the same
#    references in another order give another layout; `h3run dit` reads the dump;
#  - a 30 fps video comes onto 24 fps as ffmpeg's fps filter puts it (the source frame behind each frame);
#  - bad input exits 2 naming the problem and leaves no output: sounds alone, a missing or garbage file, a video
#    shorter than 22 frames, an image beyond 4:1, references with keyframes or --refine, more than 9 images; a model
#    without a vision tower exits 1 naming it.
# Usage: cli_ref2va.sh PATH/TO/h3run (CTest passes it). Needs ffmpeg (the media) and python3.
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
ffmpeg -v error -y -f lavfi -i "testsrc2=size=320x180:rate=1" -frames:v 1 "$tmp/a.png" || fail "ffmpeg a.png"
ffmpeg -v error -y -f lavfi -i "testsrc2=size=500x100:rate=1" -frames:v 1 "$tmp/wide.png" || fail "ffmpeg wide.png"
ffmpeg -v error -y -f lavfi -i "testsrc2=size=160x96:rate=30" -f lavfi -i "sine=frequency=440:sample_rate=44100" \
    -t 1.5 -c:v libx264 -pix_fmt yuv420p -c:a aac "$tmp/v.mp4" || fail "ffmpeg v.mp4"
ffmpeg -v error -y -f lavfi -i "testsrc2=size=160x96:rate=24" -t 0.5 -c:v libx264 -pix_fmt yuv420p "$tmp/short.mp4" ||
    fail "ffmpeg short.mp4"
ffmpeg -v error -y -f lavfi -i "sine=frequency=660:sample_rate=22050" -t 1.2 "$tmp/s.wav" || fail "ffmpeg s.wav"
head -c 3000 /dev/urandom >"$tmp/garbage.png"
gen() { "$H3RUN" generate --model "$tmp/m" --prompt "a red ball rolls" --frames 22 --steps 2 --seed 3 --device cpu \
    --progress none --size 128x64 --ref-image-size 64 --ref-video-size 64 "$@"; }

# Three references. The blocks, worked out here: the image 320x180 at a short edge of 64 -> 128x64 (latent 4x8, one
# frame); the 30 fps video 160x96 on the 64-short canvas of its aspect -> 96x64 (latent 4x6), 22 frames at 24 fps ->
# 7 latent frames, its sound cut to the clip's 22/24 s -> 29333 samples -> 37 latents; the 1.2 s sound -> 37.
gen --ref-image "$tmp/a.png" --ref-video "$tmp/v.mp4" --ref-audio "$tmp/s.wav" --dump-dit-inputs "$tmp/d.safetensors" \
    -o "$tmp/o.mp4" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] || fail "three references: exit $rc: $(cat "$tmp/err")"
[ -s "$tmp/o.mp4" ] || fail "three references: no MP4"
grep -q "references: 3 (50 video rows held at t = 0.999, 148 audio rows held clean)" "$tmp/out" ||
    fail "the summary: $(cat "$tmp/out")"
python3 "$SRC/tests/latents_tool.py" ref2va "$tmp/d.safetensors" "image:1:4:8:0,video:7:4:6:37,audio:0:0:0:37" 22 128 64 ||
    fail "latents_tool ref2va"
"$H3RUN" dit --model "$tmp/m/transformer" --inputs "$tmp/d.safetensors" -o "$tmp/v.safetensors" --device cpu \
    >/dev/null 2>"$tmp/err" || fail "h3run dit on the dumped inputs: $(cat "$tmp/err")"
# The order is the request's: the sound first, then the image
gen --ref-audio "$tmp/s.wav" --ref-image "$tmp/a.png" --steps 1 --dump-dit-inputs "$tmp/d2.safetensors" \
    -o "$tmp/o2.mp4" >/dev/null 2>"$tmp/err" || fail "sound then image: $(cat "$tmp/err")"
python3 "$SRC/tests/latents_tool.py" ref2va "$tmp/d2.safetensors" "audio:0:0:0:37,image:1:4:8:0" 22 128 64 ||
    fail "latents_tool ref2va (sound, image)"

# Onto 24 fps as ffmpeg's fps filter does: a 30 fps video whose frame i is grey level 30 + 4·i; the source frame behind each
# of the reference's 24 fps frames (h3run's, from --latents) against ffmpeg's -vf fps=24 of the same file
ffmpeg -v error -y -f lavfi -i "nullsrc=size=96x64:rate=30,geq=lum='30+4*N':cb=128:cr=128" -frames:v 45 -c:v libx264 \
    -qp 0 -pix_fmt yuv420p "$tmp/g30.mp4" || fail "ffmpeg g30.mp4"
gen --ref-video "$tmp/g30.mp4" --steps 1 --latents "$tmp/lg.safetensors" -o "$tmp/g.mp4" >/dev/null 2>"$tmp/err" ||
    fail "the grey video: $(cat "$tmp/err")"
python3 "$SRC/tests/latents_tool.py" frame-means "$tmp/lg.safetensors" ref0_pixels >"$tmp/ours" || fail "frame-means"
python3 "$SRC/tests/latents_tool.py" frame-means "$tmp/lg.safetensors" ref0_source >"$tmp/src" || fail "frame-means source"
ffmpeg -v error -i "$tmp/g30.mp4" -f rawvideo -pix_fmt gray "$tmp/src.gray" || fail "ffmpeg src.gray"
ffmpeg -v error -i "$tmp/g30.mp4" -vf fps=24 -frames:v 22 -f rawvideo -pix_fmt gray "$tmp/f24.gray" || fail "ffmpeg fps"
python3 - "$tmp" <<'PY' || fail "24 fps frames differ from ffmpeg's fps filter"
import sys
d = sys.argv[1]
def idx(means, table):  # the source frame each mean is nearest to
    return [min(range(len(table)), key=lambda i: abs(table[i] - m)) for m in means]
ours = [int(x) for x in open(d + "/ours")]
src = [int(x) for x in open(d + "/src")]
def gray_means(path, n=96 * 64):
    b = open(path, "rb").read()
    return [sum(b[i:i + n]) / n for i in range(0, len(b), n)]
fsrc, f24 = gray_means(d + "/src.gray"), gray_means(d + "/f24.gray")
a, b = idx(ours, src), idx(f24, fsrc)
print("24 fps from 30: h3run's source frames", a)
print("               ffmpeg's fps filter  ", b)
sys.exit(0 if a == b and len(a) == 22 else 1)
PY

# Bad input: exit status, a message naming the problem, no output left
expect() { # WANT_RC WHAT GREP ARGS...
    local want=$1 what=$2 pat=$3
    shift 3
    rm -f "$tmp/bad.mp4"
    gen -o "$tmp/bad.mp4" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ $rc -eq "$want" ] || fail "$what: exit $rc, want $want: $(cat "$tmp/err")"
    grep -q -- "$pat" "$tmp/err" || fail "$what: the message lacks '$pat': $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.mp4" ] && [ ! -e "$tmp/bad.mp4.partial" ] || fail "$what: an output was left"
}
expect 2 "sounds alone" "need at least one image or video reference" --ref-audio "$tmp/s.wav"
expect 2 "a missing image" "no-such.png" --ref-image "$tmp/no-such.png"
expect 2 "a garbage image" "garbage.png" --ref-image "$tmp/garbage.png"
expect 2 "a short video" "at least 22" --ref-video "$tmp/short.mp4"
expect 2 "a 5:1 image" "1:4 to 4:1" --ref-image "$tmp/wide.png"
expect 2 "with keyframes" "two modes" --ref-image "$tmp/a.png" --first-frame "$tmp/a.png"
expect 2 "with --refine" "refine" --ref-image "$tmp/a.png" --refine 256x128
ten=()
for i in $(seq 10); do ten+=(--ref-image "$tmp/a.png"); done
expect 2 "ten images" "ref-image" "${ten[@]}"
# A model without a vision tower cannot take references: exit 1, naming it
"$BUILD/h3-tinymodel" --no-keyframes "$tmp/nk" >/dev/null 2>&1 || fail "h3-tinymodel --no-keyframes"
"$H3RUN" generate --model "$tmp/nk" --prompt "a red ball" --frames 22 --steps 1 --device cpu --progress none \
    --size 128x64 --ref-image "$tmp/a.png" --ref-image-size 64 -o "$tmp/bad.mp4" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "no tower: exit $rc, want 1: $(cat "$tmp/err")"
grep -q "references need the vision tower" "$tmp/err" || fail "no tower: $(cat "$tmp/err")"
[ ! -e "$tmp/bad.mp4" ] || fail "no tower: an output was left"

[ $fails -eq 0 ] && echo "cli_ref2va: ok" || { echo "cli_ref2va: $fails failure(s)"; exit 1; }
