#!/usr/bin/env bash
# h3run generate end to end: a reduced H3 with random weights (tools/h3-tinymodel) in the official and the ComfyUI
# layouts generates clips that ffprobe checks (H.264, yuv420p, 24 fps, frame count, size, AAC 32 kHz stereo,
# durations within one frame); PNG frames, WAV and latents come out with them; the same seed gives the same latents;
# every kind of bad request exits 2 and every kind of bad model folder exits 1, each with one line naming the fix and
# no output left behind; an interrupted run leaves no file that looks finished.
# Usage: cli_generate.sh PATH/TO/h3run (CTest passes it). Needs ffprobe (scripts/deps.sh installs ffmpeg).
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
TINY=$BUILD/h3-tinymodel
# A GPU run is expected where this h3run finds a CUDA device (its --version says), not merely where nvidia-smi works.
gpu=0
"$H3RUN" --version | grep -q '^cuda: [1-9]' && gpu=1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! command -v ffprobe >/dev/null; then
    echo "FAIL: ffprobe is needed (install ffmpeg: scripts/deps.sh)"
    exit 1
fi
sanitizer_clean() { # file what
    if grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$1"; then fail "$2: sanitizer report: $(head -c 800 "$1")"; fi
}

"$TINY" "$tmp/tiny" >"$tmp/out" 2>&1 || { fail "h3-tinymodel: $(cat "$tmp/out")"; exit 1; }
"$TINY" --layout comfy "$tmp/comfy" >"$tmp/out" 2>&1 || fail "h3-tinymodel --layout comfy: $(cat "$tmp/out")"
M=$tmp/tiny
P="a harbor at sunrise, gulls over the boats. <d>[English] Good morning!</d>"

# ---- ffprobe: the checks of the clip -----------------------------------------------------------------------------
probe() { # file frames width height what
    local f=$1 n=$2 w=$3 h=$4 what=$5 v a fmt fd
    [ -f "$f" ] || { fail "$what: $f was not written"; return; }
    v=$(ffprobe -v error -select_streams v:0 -count_frames -show_entries \
        stream=codec_name,pix_fmt,width,height,r_frame_rate,avg_frame_rate,nb_read_frames,duration -of csv=p=0 "$f")
    a=$(ffprobe -v error -select_streams a:0 -show_entries stream=codec_name,sample_rate,channels,duration \
        -of csv=p=0 "$f")
    fmt=$(ffprobe -v error -show_entries format=format_name -of default=nw=1:nk=1 "$f")
    fd=$(ffprobe -v error -show_entries format=duration -of default=nw=1:nk=1 "$f")
    # csv order is ffprobe's: codec_name,width,height,pix_fmt,r_frame_rate,avg_frame_rate,duration,nb_read_frames
    IFS=, read -r vc vw vh vp vr var vd vn <<<"$v"
    IFS=, read -r ac asr ach ad <<<"$a"
    [ "$vc" = h264 ] || fail "$what: video codec '$vc', expected h264 ($v)"
    [ "$vp" = yuv420p ] || fail "$what: pixel format '$vp', expected yuv420p"
    [ "$vr" = 24/1 ] && [ "$var" = 24/1 ] || fail "$what: frame rate $vr / $var, expected 24/1"
    [ "$vw" = "$w" ] && [ "$vh" = "$h" ] || fail "$what: size ${vw}x$vh, expected ${w}x$h"
    [ "$vn" = "$n" ] || fail "$what: $vn frames decoded, expected $n"
    [ "$ac" = aac ] || fail "$what: audio codec '$ac', expected aac ($a)"
    [ "$asr" = 32000 ] || fail "$what: sample rate '$asr', expected 32000"
    [ "$ach" = 2 ] || fail "$what: $ach audio channels, expected 2"
    case "$fmt" in mov,mp4,*) ;; *) fail "$what: container '$fmt', expected mp4" ;; esac
    # Durations: video, audio and the file within one frame (1/24 s) of frames/24.
    awk -v n="$n" -v vd="$vd" -v ad="$ad" -v fd="$fd" 'BEGIN {
        t = n / 24; e = 1 / 24;
        if (!(vd - t <= e && t - vd <= e)) { print "video duration " vd " vs " t; exit 1 }
        if (!(ad - t <= e && t - ad <= e)) { print "audio duration " ad " vs " t; exit 1 }
        if (!(fd - t <= e && t - fd <= e)) { print "file duration " fd " vs " t; exit 1 } }' >"$tmp/dur" ||
        fail "$what: $(cat "$tmp/dur") s, more than one frame apart"
}

# ---- the README's clip: 22 frames at 128x128, every output ------------------------------------------------------
"$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 128x128 --seed 11 --threads 2 -o "$tmp/a.mp4" \
    --png-dir "$tmp/frames" --wav "$tmp/a.wav" --latents "$tmp/a.safetensors" --progress json \
    >"$tmp/stdout" 2>"$tmp/stderr" || fail "generate exited $?: $(tail -3 "$tmp/stderr")"
sanitizer_clean "$tmp/stderr" "generate"
probe "$tmp/a.mp4" 22 128 128 "22 frames at 128x128"
[ -e "$tmp/a.mp4.partial" ] && fail "a .partial file was left beside the MP4"
grep -q "wrote $tmp/a.mp4: 22 frames at 128x128" "$tmp/stdout" || fail "no summary: $(cat "$tmp/stdout")"
n=$(ls "$tmp/frames" 2>/dev/null | grep -c '^frame_[0-9]\{5\}\.png$')
[ "$n" = 22 ] || fail "$n PNG frames, expected 22"
info=$(ffprobe -v error -show_entries stream=codec_name,width,height -of csv=p=0 "$tmp/frames/frame_00021.png")
[ "$info" = "png,128,128" ] || fail "the last PNG reads '$info', expected png,128,128"
info=$(ffprobe -v error -show_entries stream=codec_name,sample_rate,channels,duration_ts -of csv=p=0 "$tmp/a.wav")
[ "$info" = "pcm_s16le,32000,2,29333" ] || fail "the WAV reads '$info', expected pcm_s16le,32000,2,29333 (22/24 s)"
"$H3RUN" inspect "$tmp/a.safetensors" >"$tmp/insp" 2>&1 || fail "inspect of the latents: $(cat "$tmp/insp")"
grep -Eq "^video_latents +F32 +\[1, 24, 7, 8, 8\]" "$tmp/insp" || fail "video_latents: $(cat "$tmp/insp")"
grep -Eq "^audio_latents +F32 +\[2, 32, 37\]" "$tmp/insp" || fail "audio_latents: $(cat "$tmp/insp")"
# decode takes the latents file as it is: the same frames as the run's own decode
"$H3RUN" decode --model "$M" --latents "$tmp/a.safetensors" --out "$tmp/redecoded" --threads 2 >/dev/null 2>"$tmp/err" ||
    fail "decode of generate's latents exited $?: $(cat "$tmp/err")"
cmp -s <(cd "$tmp/frames" && cat -- *.png) <(cd "$tmp/redecoded" && cat -- *.png) ||
    fail "decode of generate's latents: its PNG frames differ from generate's"
# Progress as JSON: one object per line, every stage begun and ended in order, 49 DiT steps, a final event.
stages=$(grep -o '"event":"stage_begin","stage":"[a-z_]*"' "$tmp/stderr" | sed 's/.*"stage":"//; s/"//' | tr '\n' ' ')
[ "$stages" = "tokenize text_encoder dit audio_vae video_vae mux " ] || fail "stages in order: '$stages'"
[ "$(grep -c '"event":"step","stage":"dit"' "$tmp/stderr")" = 49 ] || fail "49 DiT step events expected"
grep -q '"event":"step","stage":"dit","step":49,"steps":49' "$tmp/stderr" || fail "no step 49/49 event"
tail -1 "$tmp/stderr" | grep -q '^{"event":"done","elapsed_s":[0-9.]*}$' || fail "the last line is not the done event"
bad=$(grep '^{' "$tmp/stderr" | grep -vc '^{"event":"[a-z_]*"\(,"[a-z_]*":\("[a-z_]*"\|[0-9.-]*\)\)*}$')
[ "$bad" = 0 ] || fail "$bad progress lines are not flat JSON objects"

# ---- the same seed, the same latents; another seed, others --------------------------------------------------------
"$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 128x128 --seed 11 -q -o "$tmp/b.mp4" \
    --latents "$tmp/b.safetensors" 2>"$tmp/err" || fail "second run exited $?: $(cat "$tmp/err")"
cmp -s "$tmp/a.safetensors" "$tmp/b.safetensors" || fail "the same seed gave different latents"
"$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 128x128 --seed 12 -q -o "$tmp/c.mp4" \
    --latents "$tmp/c.safetensors" 2>"$tmp/err" || fail "third run exited $?: $(cat "$tmp/err")"
cmp -s "$tmp/a.safetensors" "$tmp/c.safetensors" && fail "seeds 11 and 12 gave the same latents"

# ---- other lengths, canvases, samplers and schedulers; the ComfyUI layout -------------------------------------------
"$H3RUN" generate --model "$M" --prompt "$P" --seconds 1 --size 96x192 --scheduler simple --sampler res_multistep \
    --steps 4 --seed 3 -o "$tmp/d.mp4" --x264-preset ultrafast --progress none >/dev/null 2>"$tmp/err" ||
    fail "--seconds 1, simple + res_multistep exited $?: $(cat "$tmp/err")"
probe "$tmp/d.mp4" 39 96 192 "--seconds 1 (39 frames) at 96x192"
"$H3RUN" generate --model "$M" --prompt "" --frames 5 --size 64x64 --scheduler beta --sampler dpmpp_2m --steps 3 \
    -o "$tmp/e.mp4" --progress lines >/dev/null 2>"$tmp/err" || fail "an empty prompt, 5 frames exited $?: $(cat "$tmp/err")"
probe "$tmp/e.mp4" 5 64 64 "5 frames at 64x64, empty prompt"
grep -q "dit: started (3 steps)" "$tmp/err" && grep -q "dit: done in" "$tmp/err" ||
    fail "--progress lines: no start and end lines of the DiT: $(cat "$tmp/err")"
# Lines come at most once a second per stage: the text encoder's 50 layers printed 50 lines of "0.00 s/step".
n=$(grep -c "^text_encoder: step" "$tmp/err")
[ "$n" -lt 10 ] || fail "--progress lines: $n text_encoder step lines for a stage of a second or two"
grep -q "seed: [0-9]* (repeat this run with --seed" "$tmp/err" || fail "a random seed is not printed"
"$H3RUN" generate --model "$tmp/comfy/models" --prompt "$P" --frames 22 --size 128x128 --steps 6 -q \
    -o "$tmp/f.mp4" 2>"$tmp/err" || fail "ComfyUI models/ folder exited $?: $(cat "$tmp/err")"
probe "$tmp/f.mp4" 22 128 128 "ComfyUI layout"
# The diffusers folder names (vae/ for the video VAE) and a repository root holding FL2VA/.
mkdir -p "$tmp/diffusers" "$tmp/repo"
for c in transformer text_encoder tokenizer audio_vae; do ln -s "$M/$c" "$tmp/diffusers/$c"; done
ln -s "$M/video_vae" "$tmp/diffusers/vae"
ln -s "$M" "$tmp/repo/FL2VA"
for m in "$tmp/diffusers" "$tmp/repo"; do
    "$H3RUN" generate --model "$m" --prompt "$P" --frames 5 --size 64x64 --steps 2 -o "$tmp/g.mp4" --progress none \
        >/dev/null 2>"$tmp/err" || fail "--model $m exited $?: $(cat "$tmp/err")"
done
grep -q "model (official layout): DiT $tmp/repo/FL2VA/transformer" "$tmp/err" || fail "repo root: $(cat "$tmp/err")"
# Components named one by one, without --model.
"$H3RUN" generate --dit "$M/transformer" --text-encoder "$M/text_encoder" --tokenizer "$M/tokenizer/tokenizer.json" \
    --video-vae "$M/video_vae" --audio-vae "$M/audio_vae" --prompt "$P" --frames 5 --size 64x64 --steps 2 \
    -o "$tmp/h.mp4" -q 2>"$tmp/err" || fail "components by name exited $?: $(cat "$tmp/err")"
# The device budget plans the GPU: on the CPU it is ignored, with a warning (the host budget bounds the CPU's DiT).
"$H3RUN" generate --model "$M" --prompt "$P" --frames 5 --size 64x64 --steps 2 --device cpu --vram-budget 8GiB -q \
    -o "$tmp/b.mp4" 2>"$tmp/err" || fail "--device cpu --vram-budget 8GiB exited $?: $(cat "$tmp/err")"
grep -q "warning: --vram-budget and --memory-trace plan the GPU's memory" "$tmp/err" ||
    fail "--vram-budget on the CPU: no warning: $(cat "$tmp/err")"
# --device cuda where there is no GPU is a bad request; where there is one, the DiT runs there.
if [ "$gpu" = 1 ]; then
    "$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 128x128 --device cuda -q -o "$tmp/gpu.mp4" \
        2>"$tmp/err" || fail "--device cuda exited $?: $(cat "$tmp/err")"
    probe "$tmp/gpu.mp4" 22 128 128 "--device cuda"
    # A budget: the plan's placement, the memory report (predicted vs measured peak) and the trace.
    "$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 128x128 --device cuda --vram-budget 0.25GiB \
        --ram-budget 1GiB --memory-trace "$tmp/trace.json" --progress none -o "$tmp/gpu2.mp4" >"$tmp/out" \
        2>"$tmp/err" || fail "--vram-budget 0.25GiB exited $?: $(cat "$tmp/err")"
    grep -q "DiT on the GPU: budget 0.25 GiB (host 1.00 GiB), 6 blocks resident" "$tmp/out" ||
        fail "no placement line: $(cat "$tmp/out")"
    grep -q "peak, all together" "$tmp/out" || fail "no memory report: $(cat "$tmp/out")"
    grep -q '"measured_peak"' "$tmp/trace.json" 2>/dev/null || fail "--memory-trace: no timeline written"
    # A budget nothing fits: stopped before anything loads, with the budget that would fit.
    expect_error_gpu() {
        "$H3RUN" generate --progress json --model "$M" --prompt "$P" --frames 22 --size 128x128 --device cuda \
            --vram-budget 16MiB -o "$tmp/y.mp4" >/dev/null 2>"$tmp/err"
        local rc=$?
        [ $rc -eq 1 ] || fail "--vram-budget 16MiB: exit status $rc, expected 1 ($(cat "$tmp/err"))"
        grep -q "do not fit: the device budget of 0.02 GiB is short by .* Would fit: --vram-budget" "$tmp/err" ||
            fail "--vram-budget 16MiB: $(cat "$tmp/err")"
        grep -q '"tokenize"' "$tmp/err" || fail "--vram-budget 16MiB: no progress events: $(cat "$tmp/err")"
        grep -q '"text_encoder"' "$tmp/err" && fail "--vram-budget 16MiB: the text encoder ran before the plan stopped it"
        [ -e "$tmp/y.mp4" ] && fail "--vram-budget 16MiB left $tmp/y.mp4"
    }
    expect_error_gpu
fi

# ---- bad requests (2) and bad model folders (1): one line naming the fix, nothing written --------------------------
expect_error() { # status needle args...
    local want=$1 needle=$2 rc lines
    shift 2
    "$H3RUN" generate -q "$@" >/dev/null 2>"$tmp/err"
    rc=$?
    lines=$(grep -vc '^warning: ' "$tmp/err") # -q keeps warnings (a length outside the trained 4-15 s)
    [ $rc -eq "$want" ] || fail "generate $*: exit status $rc, expected $want ($(cat "$tmp/err"))"
    [ "$lines" -eq 1 ] || fail "generate $*: $lines lines on stderr besides warnings, expected one: $(head -c 600 "$tmp/err")"
    grep -qF -- "$needle" "$tmp/err" || fail "generate $*: message lacks '$needle': $(cat "$tmp/err")"
    sanitizer_clean "$tmp/err" "generate $*"
    for f in "$tmp/x.mp4" "$tmp/x.mp4.partial" "$tmp/x.wav" "$tmp/x.safetensors" "$tmp/xframes"; do
        [ -e "$f" ] && fail "generate $*: $f was left behind"
    done
    rm -rf "$tmp/x.mp4" "$tmp/x.mp4.partial" "$tmp/x.wav" "$tmp/x.safetensors" "$tmp/xframes"
}
OUT=(-o "$tmp/x.mp4" --wav "$tmp/x.wav" --latents "$tmp/x.safetensors" --png-dir "$tmp/xframes")
R=(--model "$M" --prompt "$P" "${OUT[@]}")
expect_error 2 "frames must be 17n+5 (the video VAE works in 17-frame chunks); got 100: use 90 or 107" "${R[@]}" --frames 100
expect_error 2 "--frames takes a whole number from 1 to 14400; got '-5'" "${R[@]}" --frames -5
expect_error 2 "1280x720: use 1280x704 or 1280x736" "${R[@]}" --size 1280x720
expect_error 2 "the aspect ratio must lie between 1:4 and 4:1; got 4096x512" "${R[@]}" --size 4096x512
expect_error 2 "size must be WIDTHxHEIGHT in pixels (e.g. 1344x768); got 'big'" "${R[@]}" --size big
expect_error 2 "--seconds takes a number from 0.2 to 600; got '-1'" "${R[@]}" --seconds -1
expect_error 2 "give the length as --frames or as --seconds, not both" "${R[@]}" --frames 22 --seconds 1
expect_error 2 "--steps takes a whole number from 1 to 1000; got '5000'" "${R[@]}" --steps 5000
expect_error 2 "unknown sampler 'heun': choose euler, res_multistep or dpmpp_2m" "${R[@]}" --sampler heun
expect_error 2 "unknown scheduler 'karras'" "${R[@]}" --scheduler karras
expect_error 2 "unknown device 'tpu': choose cpu, cuda or auto" "${R[@]}" --device tpu
expect_error 2 "--seed takes a whole number >= 0" "${R[@]}" --seed -3
expect_error 2 "--frames takes a whole number from 1 to 14400; got 'many'" "${R[@]}" --frames many
# Values that once read as "not given" and ran the defaults (0x0 ran 1344x768, 0 frames 124, 0 steps 49), values
# past every limit (2^31 - 1 threads asked for a 16 GiB table), and empty strings: each a bad request.
expect_error 2 "width and height must be positive multiples of 32 (e.g. 1344x768); got 0x0" "${R[@]}" --size 0x0
expect_error 2 "got 0x768" "${R[@]}" --size 0x768
expect_error 2 "--frames takes a whole number from 1 to 14400; got '0'" "${R[@]}" --frames 0
expect_error 2 "--frames takes a whole number from 1 to 14400; got '99999999999999999999'" "${R[@]}" \
    --frames 99999999999999999999
expect_error 2 "--seconds takes a number from 0.2 to 600; got '0'" "${R[@]}" --seconds 0
expect_error 2 "--seconds takes a number from 0.2 to 600; got 'nan'" "${R[@]}" --seconds nan
expect_error 2 "--seconds takes a number from 0.2 to 600; got 'inf'" "${R[@]}" --seconds inf
expect_error 2 "--seconds takes a number from 0.2 to 600; got '1e308'" "${R[@]}" --seconds 1e308
expect_error 2 "--steps takes a whole number from 1 to 1000; got '0'" "${R[@]}" --steps 0
expect_error 2 "--threads takes a whole number from 0 to 1024; got '2147483647'" "${R[@]}" --threads 2147483647
expect_error 2 "--threads takes a whole number from 0 to 1024; got '-1'" "${R[@]}" --threads -1
expect_error 2 "--size needs a value (WxH); got an empty string" "${R[@]}" --size ""
expect_error 2 "--model needs a value (PATH); got an empty string" --model "" --prompt "$P" "${OUT[@]}"
expect_error 2 "--png-dir needs a value (DIR); got an empty string" "${R[@]}" --png-dir ""
expect_error 2 "--sampler needs a value (NAME); got an empty string" "${R[@]}" --sampler ""
expect_error 2 "--vram-budget needs a value (SIZE); got an empty string" "${R[@]}" --vram-budget ""
# A prompt too long for the model is refused once tokenized, before the text encoder runs: 220,000 characters
# (too long for a command line: --prompt-file) are tens of thousands of tokens, past the 8192 a prompt may have.
yes 'a red ball' | head -n 20000 | tr '\n' ' ' >"$tmp/long.txt"
t0=$(date +%s)
expect_error 2 "tokens; at most 8192 are taken" --model "$M" --prompt-file "$tmp/long.txt" "${OUT[@]}"
[ $(($(date +%s) - t0)) -lt 30 ] || fail "refusing a 220,000-character prompt took $(($(date +%s) - t0)) s"
head -c 1048577 /dev/zero | tr '\0' a >"$tmp/huge.txt"
expect_error 2 "the prompt is 1048577 bytes; at most 1048576 (1 MiB)" --model "$M" --prompt-file "$tmp/huge.txt" \
    "${OUT[@]}"
expect_error 2 "--prompt-file $tmp/nowhere.txt: No such file" --model "$M" --prompt-file "$tmp/nowhere.txt" "${OUT[@]}"
expect_error 2 "only one of them" "${R[@]}" --prompt-file "$tmp/long.txt"
# On the CPU the DiT stage's host memory is checked against the host budget before the text encoder runs (the
# largest request the limits allow needs hundreds of GB).
expect_error 1 "of host memory for the DiT on the CPU (latents, rows and the sampler" "${R[@]}" --device cpu \
    --frames 22 --size 128x128 --ram-budget 1MiB
grep -qF "the host budget is 0.00 GiB (--ram-budget): ask for fewer frames or a smaller canvas" "$tmp/err" ||
    fail "--ram-budget 1MiB on the CPU: the message does not name the budget: $(cat "$tmp/err")"
expect_error 2 "--progress takes auto, bar, lines, json or none" "${R[@]}" --progress loud
expect_error 2 "unknown x264 preset 'quick'" "${R[@]}" --frames 5 --size 64x64 --x264-preset quick
expect_error 2 "--prompt TEXT is required" --model "$M" "${OUT[@]}"
# without --model, generate looks for models/h3-small in the places src/cli/cli.h lists (tests/cli_install.sh and
# tests/cli_adherence.sh run it; test_cli checks the order and the message when it is in none of them)
expect_error 2 "no such folder (give the official FL2VA/ folder" --model "$tmp/nowhere" --prompt "$P" "${OUT[@]}"
expect_error 2 "the folder $tmp/missing does not exist (create it first)" --model "$M" --prompt "$P" -o "$tmp/missing/x.mp4"
expect_error 2 "unknown option '--fps'" "${R[@]}" --fps 30
expect_error 2 "--vram-budget takes a size like 8GiB" "${R[@]}" --vram-budget lots
expect_error 2 "--ram-budget takes a size like 8GiB, 24G, 512MiB or 123456 (bytes), or auto; got '-5G'" "${R[@]}" \
    --ram-budget -5G
# --gpus: a split DiT runs on GPUs only, at most 8 of them, and no more than the machine has
expect_error 2 "--gpus 2 splits the DiT over GPUs: it needs --device cuda" "${R[@]}" --gpus 2 --device cpu
expect_error 2 "--gpus takes a whole number from 1 to 8; got '9'" "${R[@]}" --gpus 9
if [ "$gpu" = 0 ]; then
    expect_error 2 "--device cuda:" "${R[@]}" --frames 5 --size 64x64 --device cuda
    grep -qF "use --device cpu" "$tmp/err" || fail "--device cuda without a GPU does not name the fix"
fi
"$H3RUN" generate --prompt x --model "$M" --frames 5 --size 64x64 --png-dir "$tmp/xframes" -o "$tmp/x.mp4" --seed 1 \
    --steps 1 -q --threads 9999 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "--threads 9999 should exit 2: $(cat "$tmp/err")"
rm -rf "$tmp/xframes" "$tmp/x.mp4"

# Model folders that lack a component or hold a broken file: exit 1, the message names the part and the fix.
broken() { # name: the tiny model's five parts linked into a new folder, one of which the caller replaces
    rm -rf "$tmp/$1"
    mkdir -p "$tmp/$1"
    for c in transformer text_encoder tokenizer video_vae audio_vae; do ln -s "$M/$c" "$tmp/$1/$c"; done
    echo "$tmp/$1"
}
B=$(broken noaudio) && rm "$B/audio_vae"
expect_error 1 "has no audio VAE: expected audio_vae/; download it from the release or give --audio-vae PATH" \
    --model "$B" --prompt "$P" "${OUT[@]}"
B=$(broken notok) && rm "$B/tokenizer"
expect_error 1 "has no tokenizer: expected tokenizer/tokenizer.json" --model "$B" --prompt "$P" "${OUT[@]}"
B=$(broken badtok) && rm "$B/tokenizer" && mkdir "$B/tokenizer" &&
    head -c 3000 "$M/tokenizer/tokenizer.json" >"$B/tokenizer/tokenizer.json"
expect_error 1 "cannot be read (replace it with the release's tokenizer/ folder or give --tokenizer PATH)" \
    --model "$B" --prompt "$P" "${OUT[@]}"
B=$(broken nottok) && rm "$B/tokenizer" && mkdir "$B/tokenizer" &&
    echo '{"model": {"type": "WordPiece", "vocab": {}, "merges": []}}' >"$B/tokenizer/tokenizer.json"
expect_error 1 "model type 'WordPiece' is not supported" --model "$B" --prompt "$P" "${OUT[@]}"
B=$(broken shortdit) && rm "$B/transformer" && cp -r "$M/transformer" "$B/transformer" &&
    truncate -s 100000 "$B/transformer/model-00002-of-00002.safetensors"
expect_error 1 "the DiT ($B/transformer)" --model "$B" --prompt "$P" "${OUT[@]}"
B=$(broken fewlayers) && rm "$B/text_encoder" && ln -s "$SRC/tests/fixtures/text_encoder/official" "$B/text_encoder"
expect_error 1 "has 5 decoder layers; H3 conditions on the output of layer 50" --model "$B" --prompt "$P" "${OUT[@]}"
B=$(broken swapped) && rm "$B/video_vae" && ln -s "$M/audio_vae" "$B/video_vae"
expect_error 1 "the video VAE ($B/video_vae)" --model "$B" --prompt "$P" "${OUT[@]}"
expect_error 1 "is not an H3 model folder: expected transformer/" --model "$tmp/frames" --prompt "$P" "${OUT[@]}"
expect_error 2 "--audio-vae $tmp/none: no such file or folder" --model "$M" --audio-vae "$tmp/none" --prompt "$P" "${OUT[@]}"

# ---- interrupted: SIGINT during the DiT steps stops the run cleanly, nothing is left -------------------------------
"$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 128x128 --steps 1000 --progress lines \
    -o "$tmp/i.mp4" --png-dir "$tmp/iframes" --wav "$tmp/i.wav" >/dev/null 2>"$tmp/ierr" &
pid=$!
for _ in $(seq 1 600); do grep -q "dit: step" "$tmp/ierr" && break; sleep 0.05; done
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 1 ] || fail "SIGINT: exit status $rc, expected 1 ($(tail -2 "$tmp/ierr"))"
grep -q "interrupted during dit" "$tmp/ierr" || fail "SIGINT: no 'interrupted' message: $(tail -2 "$tmp/ierr")"
sanitizer_clean "$tmp/ierr" "SIGINT"
for f in "$tmp/i.mp4" "$tmp/i.mp4.partial" "$tmp/i.wav" "$tmp/iframes"; do [ -e "$f" ] && fail "SIGINT left $f"; done
# SIGKILL cannot be handled: what it leaves must not look finished (no i.mp4; at most i.mp4.partial).
"$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 128x128 --steps 1000 --progress lines \
    -o "$tmp/k.mp4" >/dev/null 2>"$tmp/kerr" &
pid=$!
for _ in $(seq 1 600); do grep -q "dit: step" "$tmp/kerr" && break; sleep 0.05; done
kill -KILL $pid
wait $pid 2>/dev/null
[ -e "$tmp/k.mp4" ] && fail "SIGKILL left a file named like a finished clip"

"$H3RUN" generate --help | grep -q "MODEL CALLS" || fail "--help does not say that --steps counts model calls"
"$H3RUN" --help | grep -q "generate" || fail "h3run --help does not list generate"

[ $fails -eq 0 ] && echo "cli_generate: all checks passed" || echo "cli_generate: $fails failures"
exit $((fails > 0))
