#!/usr/bin/env bash
# h3run vae-encode: the small model's encoders through the command (an image, a clip, the seeded sample, the plan; a
# waveform through the audio VAE's encoder, against the float64 reference), and bad inputs refused with exit 2 and one message naming the problem, leaving no output. Usage: cli_vae_encode.sh
# PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
SRC=${H3_SOURCE_DIR:-$(dirname "$0")/..}
M=$SRC/models/h3-small/video_vae
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# pixels FILE NAME DTYPE SHAPE...: a safetensors file holding one tensor of that dtype (U8 or F32) and shape.
pixels() {
    python3 - "$@" <<'PY'
import json, struct, sys
path, name, dt, *shape = sys.argv[1:]
shape = [int(s) for s in shape]
n = 1
for s in shape: n *= s
size = {"U8": 1, "F32": 4}[dt]
data = bytes((i * 37) % 256 for i in range(n)) if dt == "U8" else struct.pack("<%df" % n, *([0.5] * n))
h = json.dumps({name: {"dtype": dt, "shape": shape, "data_offsets": [0, n * size]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
}

# ---- good inputs: the latents' shape, the sample differs from the mean and depends on the seed -------------------
pixels "$tmp/img.st" pixels U8 1 3 1 64 96
"$H3RUN" vae-encode --model "$M" --input "$tmp/img.st" --out "$tmp/mean.st" --threads 2 >"$tmp/out" 2>"$tmp/err" ||
    fail "image exited $?: $(cat "$tmp/err")"
"$H3RUN" inspect "$tmp/mean.st" 2>&1 | grep -q "latents.*F32.*\[1, 24, 1, 4, 6\]" || fail "image latents: $("$H3RUN" inspect "$tmp/mean.st" 2>&1)"
for s in 1 2; do
    "$H3RUN" vae-encode --model "$M" --input "$tmp/img.st" --out "$tmp/s$s.st" --sample $s --threads 2 >/dev/null 2>"$tmp/err" ||
        fail "--sample $s exited $?: $(cat "$tmp/err")"
done
cmp -s "$tmp/mean.st" "$tmp/s1.st" && fail "--sample wrote the mean"
cmp -s "$tmp/s1.st" "$tmp/s2.st" && fail "--sample 1 and 2 wrote the same latents"
"$H3RUN" vae-encode --model "$M" --input "$tmp/img.st" --out "$tmp/s1b.st" --sample 1 --threads 2 >/dev/null 2>&1
cmp -s "$tmp/s1.st" "$tmp/s1b.st" || fail "--sample 1 twice differs"
pixels "$tmp/clip.st" pixels U8 1 3 5 32 32
"$H3RUN" vae-encode --model "$M" --input "$tmp/clip.st" --out "$tmp/clip_l.st" --threads 2 >/dev/null 2>"$tmp/err" ||
    fail "5 frames exited $?: $(cat "$tmp/err")"
"$H3RUN" inspect "$tmp/clip_l.st" 2>&1 | grep -q "\[1, 24, 2, 2, 2\]" || fail "5 frames: not 2 latent frames"
"$H3RUN" vae-encode --model "$M" --input "$tmp/clip.st" --plan >"$tmp/out" 2>&1 || fail "--plan exited $?"
grep -q "planned encode memory" "$tmp/out" || fail "--plan: $(cat "$tmp/out")"

# ---- bad inputs: exit 2, one message, no output ------------------------------------------------------------------
bad() { # what expected-substring file [options...]
    local what=$1 want=$2 f=$3
    shift 3
    rm -f "$tmp/bad_out.st"
    "$H3RUN" vae-encode --model "$M" --input "$f" --out "$tmp/bad_out.st" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "$what: exit $rc, not 2: $(cat "$tmp/err")"
    grep -q -- "$want" "$tmp/err" || fail "$what: message lacks '$want': $(cat "$tmp/err")"
    [ "$(wc -l <"$tmp/err")" -le 2 ] || fail "$what: more than a message: $(cat "$tmp/err")"
    ls "$tmp"/bad_out.st* >/dev/null 2>&1 && fail "$what: left an output"
}
pixels "$tmp/f32.st" pixels F32 1 3 1 32 32
bad "f32 pixels" "uint8" "$tmp/f32.st"
pixels "$tmp/rank.st" pixels U8 3 32 32
bad "rank 3" "\[1, 3, frames, H, W\]" "$tmp/rank.st"
pixels "$tmp/ch.st" pixels U8 1 4 1 32 32
bad "4 channels" "\[1, 3, frames, H, W\]" "$tmp/ch.st"
pixels "$tmp/batch.st" pixels U8 2 3 1 32 32
bad "batch 2" "\[1, 3, frames, H, W\]" "$tmp/batch.st"
pixels "$tmp/f2.st" pixels U8 1 3 2 32 32
bad "2 frames" "17n+5" "$tmp/f2.st"
pixels "$tmp/f21.st" pixels U8 1 3 21 32 32
bad "21 frames" "17n+5" "$tmp/f21.st"
pixels "$tmp/side.st" pixels U8 1 3 1 40 32
bad "40 px high" "multiples of 16" "$tmp/side.st"
pixels "$tmp/huge.st" pixels U8 1 3 1 16 16400
bad "16400 px wide" "16384" "$tmp/huge.st"
pixels "$tmp/zero.st" pixels U8 1 3 0 32 32
bad "0 frames" "frames" "$tmp/zero.st"
pixels "$tmp/noname.st" image U8 1 3 1 32 32
bad "no 'pixels'" "no tensor named 'pixels'" "$tmp/noname.st"
bad "negative seed" "sample" "$tmp/img.st" --sample -3
bad "unknown device" "device" "$tmp/img.st" --device tpu
"$H3RUN" vae-encode --model "$M" --input "$tmp/img.st" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "no --out: not exit 2"
"$H3RUN" vae-encode --model "$M" --input /dev/null --out "$tmp/x.st" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "a device as input: not exit 2: $(cat "$tmp/err")"
"$H3RUN" vae-encode --model "$M" --input "$tmp/img.st" --out "$tmp/img.st" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "output on the input: not exit 2: $(cat "$tmp/err")"
"$H3RUN" vae-encode --help | grep -q "17n+5" || fail "--help does not describe the frames"
"$H3RUN" --help | grep -q "vae-encode" || fail "h3run --help does not list vae-encode"

# ---- the audio VAE's encoder: 'waveform' in, latents [channels, 32, ceil(samples / 800)] out; bad waveforms -------
A=$SRC/models/h3-small/audio_vae
pixels "$tmp/wave.st" waveform F32 2 1 1700
"$H3RUN" vae-encode --model "$A" --input "$tmp/wave.st" --out "$tmp/alat.st" --threads 2 >"$tmp/out" 2>"$tmp/err" ||
    fail "waveform exited $?: $(cat "$tmp/err")"
"$H3RUN" inspect "$tmp/alat.st" 2>&1 | grep -q "latents.*F32.*\[2, 32, 3\]" || fail "audio latents: $("$H3RUN" inspect "$tmp/alat.st" 2>&1)"
grep -q "audio VAE encoder" "$tmp/out" || fail "the audio encode's summary: $(cat "$tmp/out")"
abad() { # WHAT NEEDLE INPUT [extra options]: exit 2, the needle in the message, no output
    local what=$1 needle=$2 in=$3
    shift 3
    rm -f "$tmp/abad.st"
    "$H3RUN" vae-encode --model "$A" --input "$in" --out "$tmp/abad.st" "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "$what: exit $rc, not 2: $(cat "$tmp/err")"
    grep -q -- "$needle" "$tmp/err" || fail "$what: message lacks '$needle': $(cat "$tmp/err")"
    [ ! -e "$tmp/abad.st" ] || fail "$what: left an output"
}
pixels "$tmp/w3.st" waveform F32 2 2 100
abad "a waveform of [2, 2, 100]" "\[channels, 1, samples\]" "$tmp/w3.st"
pixels "$tmp/w0.st" waveform F32 1 1 0
abad "an empty waveform" "no samples" "$tmp/w0.st"
abad "--sample with a waveform" "sample" "$tmp/wave.st" --sample 3
# the video encoder's model given a waveform: no encoder of that kind in it
"$H3RUN" vae-encode --model "$M" --input "$tmp/wave.st" --out "$tmp/abad.st" >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -ne 0 ] && [ ! -e "$tmp/abad.st" ] || fail "a video VAE given a waveform: exit $rc"

# ---- against the project's torch encoder (tools/train/encoders.py) on the shipped weights, where torch is -------
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
    /usr/bin/python3 "$SRC/tests/vae_encode_torch.py" "$H3RUN" "$tmp" || fail "h3run and tools/train/encoders.py differ"
    /usr/bin/python3 "$SRC/tests/audio_encode_ref.py" "$H3RUN" "$tmp" || fail "h3run's audio encoder and tools/reference/audio_vae.py differ"
else
    echo "cli_vae_encode: no torch for /usr/bin/python3: the comparison with tools/train/encoders.py is skipped"
fi

[ $fails -eq 0 ] && echo "cli_vae_encode: all passed"
exit $((fails > 0))
