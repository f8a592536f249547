#!/usr/bin/env bash
# h3run decode: the fixtures' latents through the command, in every layout, to tensors (compared with the reference),
# PNG frames and a WAV file (read back by ffmpeg and compared level by level); malformed latents and usage errors get
# one line on stderr and a non-zero status. Usage: cli_decode.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=${H3_SOURCE_DIR:-$(dirname "$0")/..}
V=$SRC/tests/fixtures/video_vae
A=$SRC/tests/fixtures/audio_vae
TV=$BUILD/test_video_vae
TA=$BUILD/test_audio_vae
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
have_ffmpeg=1
command -v ffmpeg >/dev/null && command -v ffprobe >/dev/null || have_ffmpeg=0

# ---- video: every layout, tensors compared with the reference's (1e-4 relative L2) -------------------------------
run_video() { # case model [extra options]
    local c=$1 m=$2
    shift 2
    "$H3RUN" decode --model "$m" --latents "$V/case_$c.safetensors" --tensors-out "$tmp/$c.safetensors" --threads 2 \
        "$@" >"$tmp/out" 2>"$tmp/err" || { fail "decode $c exited $?: $(cat "$tmp/err")"; return; }
    "$TV" --compare "$tmp/$c.safetensors" "$V/case_$c.safetensors" frames 1e-4 || fail "decode $c: frames differ"
}
run_video official_tiles "$V/official"
run_video official_chunks "$V/official"
run_video diffusers_pad "$V/diffusers"
run_video comfy_fp16 "$V/comfy.safetensors" --heads 2
run_video comfy_image "$V/comfy.safetensors" --heads 2
grep -q "decode memory: peak" "$tmp/out" || fail "no memory report: $(cat "$tmp/out")"

# A model folder holding video_vae/ works too (the official FL2VA/ layout).
mkdir -p "$tmp/FL2VA" && ln -s "$V/official" "$tmp/FL2VA/video_vae"
run_video official_tiles "$tmp/FL2VA"

# ---- --output-size: the PNG frames scaled (Lanczos) to it; an odd size refused with exit 2 -----------------------
"$H3RUN" decode --model "$V/official" --latents "$V/case_official_chunks.safetensors" --out "$tmp/scaled" \
    --output-size 64x20 -q 2>"$tmp/err" || fail "decode --output-size 64x20 exited $?: $(cat "$tmp/err")"
[ "$(ls "$tmp/scaled" 2>/dev/null | wc -l)" = 39 ] || fail "decode --output-size: not 39 frames"
if command -v ffprobe >/dev/null; then
    info=$(ffprobe -v error -show_entries stream=width,height -of csv=p=0 "$tmp/scaled/frame_00038.png")
    [ "$info" = "64,20" ] || fail "decode --output-size 64x20 wrote $info frames"
fi
"$H3RUN" decode --model "$V/official" --latents "$V/case_official_chunks.safetensors" --out "$tmp/odd" \
    --output-size 63x20 -q 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "use 62x20 or 64x20" "$tmp/err" && [ ! -e "$tmp/odd" ] \
    || fail "decode --output-size 63x20: exit $rc, $(cat "$tmp/err")"

# ---- PNG frames, read back by ffmpeg ----------------------------------------------------------------------------
"$H3RUN" decode --model "$V/official" --latents "$V/case_official_chunks.safetensors" --out "$tmp/frames" -q \
    2>"$tmp/err" || fail "decode to PNG exited $?: $(cat "$tmp/err")"
n=$(ls "$tmp/frames" 2>/dev/null | grep -c '^frame_[0-9]\{5\}\.png$')
[ "$n" = 39 ] || fail "$n PNG frames written, expected 39"
if [ $have_ffmpeg = 1 ]; then
    info=$(ffprobe -v error -show_entries stream=codec_name,width,height,pix_fmt -of csv=p=0 "$tmp/frames/frame_00038.png")
    [ "$info" = "png,32,8,rgb24" ] || fail "ffprobe reads '$info', expected png,32,8,rgb24"
    for k in 0 17 38; do
        f=$(printf '%s/frames/frame_%05d.png' "$tmp" $k)
        ffmpeg -v error -i "$f" -f rawvideo -pix_fmt rgb24 -y "$tmp/f.rgb" || fail "ffmpeg cannot read $f"
        "$TV" --compare-rgb "$tmp/f.rgb" "$V/case_official_chunks.safetensors" $k || fail "frame $k: pixels differ"
    done
else
    echo "note: ffmpeg/ffprobe not found; PNG frames not read back"
fi

# ---- audio: three layouts, WAV read back ------------------------------------------------------------------------
for kind in official diffusers comfy; do
    m="$tmp/audio_$kind"
    [ $kind = comfy ] && m="$m.safetensors"
    "$TA" --write-model $kind "$m" || fail "writing the $kind audio model"
done
run_audio() { # case model
    "$H3RUN" decode --model "$2" --latents "$A/case_$1.safetensors" --tensors-out "$tmp/a_$1.safetensors" \
        --out "$tmp/a_$1.wav" --threads 2 >"$tmp/out" 2>"$tmp/err" || { fail "decode audio $1 exited $?: $(cat "$tmp/err")"; return; }
    "$TV" --compare "$tmp/a_$1.safetensors" "$A/case_$1.safetensors" waveform 1e-4 || fail "audio $1: waveform differs"
}
run_audio stereo "$tmp/audio_official"
run_audio mono "$tmp/audio_official"
run_audio stereo "$tmp/audio_diffusers"
run_audio comfy_stereo "$tmp/audio_comfy.safetensors"
mkdir -p "$tmp/root" && ln -s "$tmp/audio_official" "$tmp/root/audio_vae"
run_audio stereo "$tmp/root"
if [ $have_ffmpeg = 1 ]; then
    info=$(ffprobe -v error -show_entries stream=codec_name,sample_rate,channels,duration_ts -of csv=p=0 "$tmp/a_stereo.wav")
    [ "$info" = "pcm_s16le,32000,2,4800" ] || fail "ffprobe reads '$info', expected pcm_s16le,32000,2,4800"
    ffmpeg -v error -i "$tmp/a_stereo.wav" -f s16le -y "$tmp/a.pcm" || fail "ffmpeg cannot read the WAV"
    "$TA" --compare-pcm "$tmp/a.pcm" "$A/case_stereo.safetensors" || fail "WAV samples differ"
fi

# ---- malformed latents and usage errors: exit status, one line on stderr naming the problem ---------------------
expect_error() { # status needle command...
    local want=$1 needle=$2
    shift 2
    "$@" >/dev/null 2>"$tmp/err"
    local rc=$? lines
    lines=$(wc -l <"$tmp/err")
    [ $rc -eq "$want" ] || fail "$*: exit status $rc, expected $want ($(cat "$tmp/err"))"
    [ "$lines" -eq 1 ] || fail "$*: $lines lines on stderr, expected one: $(head -c 600 "$tmp/err")"
    grep -qF -- "$needle" "$tmp/err" || fail "$*: message lacks '$needle': $(cat "$tmp/err")"
    if grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$tmp/err"; then fail "$*: sanitizer report"; fi
}
"$TV" --write-latents "$tmp/c16.safetensors" latents 1 16 7 4 4
"$TV" --write-latents "$tmp/odd.safetensors" latents 1 24 7 45 84
"$TV" --write-latents "$tmp/name.safetensors" video_rows 1 24 7 4 4
"$TV" --write-latents "$tmp/1d.safetensors" latents 24
"$TV" --write-latents "$tmp/a24.safetensors" latents 2 24 5
"$TV" --write-latents "$tmp/v0.safetensors" latents 1 24 2 4 0
"$TV" --write-latents "$tmp/a0.safetensors" latents 1 32 0
D="$H3RUN decode --model $V/official --tensors-out $tmp/x.safetensors --latents"
expect_error 2 "have 16 channels; this video VAE takes 24" $D "$tmp/c16.safetensors"
expect_error 2 "45 × 84: height and width must be even" $D "$tmp/odd.safetensors"
expect_error 1 "has no tensor named 'latents' (nor generate's 'video_latents')" $D "$tmp/name.safetensors"
expect_error 2 "neither video [1, C, T, H, W] nor audio" $D "$tmp/1d.safetensors"
expect_error 1 "need an audio VAE" $D "$tmp/a24.safetensors"
expect_error 2 "have 24 channels; this audio VAE takes 32" "$H3RUN" decode --model "$tmp/audio_official" \
    --latents "$tmp/a24.safetensors" --out "$tmp/x.wav"
# Latents with a zero dimension: said so (they were called "not contiguous", after a memcpy from NULL).
expect_error 2 "video latents [1, 24, 2, 4, 0] hold no values" $D "$tmp/v0.safetensors"
expect_error 2 "audio latents [1, 32, 0] hold no values" "$H3RUN" decode --model "$tmp/audio_official" \
    --latents "$tmp/a0.safetensors" --out "$tmp/x.wav"
expect_error 1 "No such file or directory" $D "$tmp/absent.safetensors"
expect_error 2 "--model and --latents are required" "$H3RUN" decode --latents "$tmp/c16.safetensors" --out "$tmp/o"
expect_error 2 "nothing to write" "$H3RUN" decode --model "$V/official" --latents "$V/case_comfy_image.safetensors"
expect_error 2 "unknown option" "$H3RUN" decode --frobnicate
# --device: a bad name or budget is a usage error; cuda decodes audio on the GPU where there is one (the waveform as
# the reference's, the device memory reported) and says what to do where there is none
expect_error 2 "unknown device 'tpu'" "$H3RUN" decode --device tpu --model "$tmp/audio_official" \
    --latents "$A/case_stereo.safetensors" --out "$tmp/x.wav"
expect_error 2 "unknown device 'warp'" $D "$V/case_comfy_image.safetensors" --device warp
expect_error 2 "--vram-budget" $D "$V/case_comfy_image.safetensors" --device cuda --vram-budget 8X
if "$H3RUN" decode --device cuda --model "$tmp/audio_official" --latents "$A/case_stereo.safetensors" \
    --tensors-out "$tmp/g.safetensors" >"$tmp/out" 2>"$tmp/err"; then
    "$TV" --compare "$tmp/g.safetensors" "$A/case_stereo.safetensors" waveform 1e-4 || fail "GPU audio decode differs"
    grep -q "device memory: peak" "$tmp/out" || fail "no device memory report: $(cat "$tmp/out")"
else
    expect_error 2 "use --device cpu" "$H3RUN" decode --device cuda --model "$tmp/audio_official" \
        --latents "$A/case_stereo.safetensors" --out "$tmp/x.wav"
    expect_error 2 "use --device cpu" $D "$V/case_official_tiles.safetensors" --device cuda
fi
[ -e "$tmp/x.wav" ] && fail "a failed decode left a WAV file"
# 0 read as "the default" (tile size, overlap, heads); thread counts past the limit; empty paths.
expect_error 2 "--tile-size takes a whole number from 1 to 65536; got '0'" $D "$tmp/c16.safetensors" --tile-size 0
expect_error 2 "--tile-overlap takes a whole number from 1 to 65536; got '0'" $D "$tmp/c16.safetensors" \
    --tile-overlap 0
expect_error 2 "--heads takes a whole number from 1 to 4096; got '0'" $D "$tmp/c16.safetensors" --heads 0
expect_error 2 "--threads takes a whole number from 0 to 1024; got '2147483647'" $D "$tmp/c16.safetensors" \
    --threads 2147483647
expect_error 2 "--latents needs a value (FILE); got an empty string" $D ""
[ -e "$tmp/x.safetensors" ] && fail "a failed decode left an output file"

# ---- the GPU's plan (arithmetic: no GPU needed) -------------------------------------------------------------------
"$H3RUN" decode --model "$V/official" --latents "$V/case_official_tiles.safetensors" --plan --device cuda \
    --vram-budget 1GiB >"$tmp/out" 2>"$tmp/err" || fail "decode --plan --device cuda exited $?: $(cat "$tmp/err")"
grep -q "on the GPU: 2 of 2 blocks resident, 0 streamed; 6 tiles per pass" "$tmp/out" ||
    fail "no device plan in: $(cat "$tmp/out")"
"$H3RUN" decode --help | grep -q "usage: h3run decode" || fail "--help"

[ $fails -eq 0 ] && echo "cli_decode: all checks passed" || echo "cli_decode: $fails failures"
exit $((fails > 0))
