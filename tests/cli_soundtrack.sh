#!/usr/bin/env bash
# generate --audio FILE (a soundtrack the video follows) with the small model on the CPU, 4 steps:
#  - a 44.1 kHz mono WAV: resampled to 32 kHz, encoded by the audio VAE's encoder and held clean as the clip's audio:
#    two seeds give the same audio latents (the held ones) and a run without it other ones; the MP4's sound is the
#    given one (its decoded AAC against the WAV resampled by ffmpeg: correlation >= 0.95);
#  - without --frames the clip takes the soundtrack's length (1.5 s -> 22 frames); a shorter soundtrack than the
#    clip is padded with silence and says so;
#  - a missing file, a file without sound, --refine with --audio and a soundtrack too short for a clip are refused
#    with exit 2 and a message, writing nothing.
# Usage: cli_soundtrack.sh PATH/TO/h3run (CTest passes it). Needs ffmpeg.
set -u
H3RUN=$1
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
MODEL=$SRC/models/h3-small
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v ffmpeg >/dev/null || { echo "FAIL: ffmpeg is needed (scripts/deps.sh)"; exit 1; }
tone() { # FILE SECONDS RATE: a mono 16-bit WAV, 523 Hz with a slow vibrato
    python3 - "$@" <<'PY'
import math, struct, sys, wave
path, secs, rate = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
w = wave.open(path, "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(rate)
n = int(secs * rate)
w.writeframes(b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * 523 * i / rate + 3 * math.sin(2 * math.pi * 2 * i / rate)))) for i in range(n)))
w.close()
PY
}
tone "$tmp/t.wav" 2.5 44100
A=(--prompt "a red circle moves right, a high tone" --steps 4 --device cpu --threads 2 --progress none)
for s in 1 2; do
    "$H3RUN" generate "${A[@]}" --audio "$tmp/t.wav" --seed $s -o "$tmp/s$s.mp4" --latents "$tmp/s$s.st" >"$tmp/out" 2>"$tmp/err" ||
        fail "--audio, seed $s: exit $?: $(tail -3 "$tmp/err")"
done
grep -q "^soundtrack: $tmp/t.wav (2.50 s), held as the clip's audio" "$tmp/out" || fail "the summary: $(cat "$tmp/out")"
"$H3RUN" generate "${A[@]}" --seed 1 -o "$tmp/free.mp4" --latents "$tmp/free.st" >/dev/null 2>&1 || fail "the run without --audio"
python3 "$SRC/tests/latents_tool.py" same-audio "$tmp/s1.st" "$tmp/s2.st" || fail "two seeds with one soundtrack: other audio latents"
python3 "$SRC/tests/latents_tool.py" same-audio "$tmp/s1.st" "$tmp/free.st" && fail "the soundtrack did not change the audio latents"
# the MP4 carries the given sound
ffmpeg -v error -i "$tmp/s1.mp4" -map 0:a -ac 1 -ar 32000 -f f32le "$tmp/got.raw" || fail "decoding the MP4's sound"
ffmpeg -v error -i "$tmp/t.wav" -ac 1 -ar 32000 -t 2.3333 -f f32le "$tmp/want.raw" || fail "resampling the WAV"
python3 - "$tmp/got.raw" "$tmp/want.raw" <<'PY' || fail "the MP4's sound is not the soundtrack"
import math, sys
from array import array
a, b = array("f"), array("f")
a.frombytes(open(sys.argv[1], "rb").read()); b.frombytes(open(sys.argv[2], "rb").read())
n = min(len(a), len(b)) - 4000
best = 0
for lag in range(-1200, 1201, 8):  # AAC's priming delay, in steps of 8 samples
    x = a[2000 + lag:2000 + lag + n - 2000]
    y = b[2000:2000 + len(x)]
    if len(x) != len(y) or not x: continue
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((p - mx) * (q - my) for p, q in zip(x, y)); sx = sum((p - mx) ** 2 for p in x); sy = sum((q - my) ** 2 for q in y)
    c = sxy / math.sqrt(sx * sy) if sx > 0 and sy > 0 else 0
    best = max(best, c)
print("the MP4's sound against the soundtrack: correlation %.4f" % best)
sys.exit(0 if best >= 0.95 else 1)
PY
# the clip's length from the soundtrack; a soundtrack shorter than the clip
tone "$tmp/short.wav" 1.5 32000
"$H3RUN" generate --model "$MODEL" "${A[@]}" --size 128x128 --audio "$tmp/short.wav" --seed 1 -o "$tmp/len.mp4" >"$tmp/out" 2>"$tmp/err" ||
    fail "length from the soundtrack: exit $?: $(tail -3 "$tmp/err")"
grep -q "22 frames at 128x128" "$tmp/out" || fail "1.5 s of sound did not give 22 frames: $(cat "$tmp/out")"
"$H3RUN" generate "${A[@]}" --audio "$tmp/short.wav" --seed 1 -o "$tmp/pad.mp4" >/dev/null 2>"$tmp/err" || fail "a short soundtrack"
grep -q "the rest of the clip is silence" "$tmp/err" || fail "no word of the silence after a short soundtrack: $(cat "$tmp/err")"
# refused
bad() { # WHAT NEEDLE [options]
    local what=$1 needle=$2
    shift 2
    "$H3RUN" generate "${A[@]}" --seed 1 -o "$tmp/bad.mp4" "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "$what: exit $rc, not 2: $(cat "$tmp/err")"
    grep -q -- "$needle" "$tmp/err" || fail "$what: the message lacks '$needle': $(cat "$tmp/err")"
    [ ! -e "$tmp/bad.mp4" ] || fail "$what: left a clip"
}
bad "a missing soundtrack" "nope.wav" --audio "$tmp/nope.wav"
printf 'P6\n4 4\n255\n%s' "$(head -c 48 /dev/zero | tr '\0' 'x')" >"$tmp/img.ppm"
bad "a file without sound" "no audio stream" --audio "$tmp/img.ppm"
bad "--refine with --audio" "--refine with --audio" --audio "$tmp/t.wav" --refine 160x160
tone "$tmp/tiny.wav" 0.5 32000
"$H3RUN" generate --model "$MODEL" "${A[@]}" --size 128x128 --audio "$tmp/tiny.wav" -o "$tmp/bad.mp4" >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "too short for a clip" "$tmp/err" || fail "0.5 s of sound: exit $rc, $(cat "$tmp/err")"
[ $fails = 0 ] && echo "cli_soundtrack: all passed"
exit $((fails > 0))
