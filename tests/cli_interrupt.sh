#!/usr/bin/env bash
# Stopping: every command that computes and writes (generate in its DiT steps and in the video VAE, decode, dit,
# encode, quantize) is sent SIGTERM or SIGINT in the middle of its work, on requests big enough that a single step
# takes seconds on two cores (the small model at 384x384, a 6,000-row DiT sequence, 3,000 tokens, 4,096 table
# rows). Each must exit with status 1 and an 'interrupted' message within 2 s of the signal (the stop flag is read
# inside ops and between GEMM blocks, attention tiles and convolution chunks, not only between steps; a DiT step of
# the default CPU request used to ignore SIGTERM for over 70 s), leave none of its outputs, no *.partial and no
# frames folder, and leave the files that were at its output paths as they were. A decode killed with SIGKILL leaves
# no folder of frames that looks finished (only FOLDER.partial).
# Usage: cli_interrupt.sh PATH/TO/h3run (CTest passes it). Needs python3 (tests/make_inputs.py, standard library).
set -u
H3RUN=$1
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
M=$SRC/models/h3-small
LIMIT_MS=${H3_STOP_LIMIT_MS:-2000}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -KILL $pid 2>/dev/null; rm -rf "$tmp"' EXIT
mk() { python3 "$SRC/tests/make_inputs.py" "$@" || fail "make_inputs.py $*"; }
sanitizer_clean() { ! grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$1"; }

mk latents "$tmp/latents.safetensors" 14 32 32 # 56 frames at 512x512 through the small model's video VAE
text_dim=$(sed -n 's/.*"text_dim": *\([0-9]*\).*/\1/p' "$M/transformer/config.json")
mk dit "$tmp/inputs.safetensors" 6000 "$text_dim"
ids=$(awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%s%d", (i ? "," : ""), 10 + i % 1000 }')

O=$tmp/out # every case writes here; before each, it holds three old files that must come out untouched
OLD="old.mp4 old.safetensors old.wav"
fresh_out() {
    rm -rf "$O" && mkdir -p "$O"
    for f in $OLD; do echo "old $f" >"$O/$f"; done
}
cpu_s() { # CPU seconds the process has used so far
    awk -v t="$(getconf CLK_TCK)" '{ print int(($14 + $15) / t) }' "/proc/$1/stat" 2>/dev/null || echo 0
}
now_ms() { date +%s%3N; }

# stop NAME SIGNAL READY CMD...: starts CMD, waits until the shell condition READY holds (the work is under way),
# sends SIGNAL and checks the stop: time, status, message, and the output folder exactly as before.
stop() {
    local name=$1 sig=$2 ready=$3 rc t0 t1 left
    shift 3
    fresh_out
    "$H3RUN" "$@" >"$tmp/stdout" 2>"$tmp/err" &
    pid=$!
    for _ in $(seq 1 1200); do
        eval "$ready" && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    if ! kill -0 $pid 2>/dev/null; then
        fail "$name: ended before it could be stopped: $(tail -3 "$tmp/err")"
        wait $pid
        pid=
        return
    fi
    t0=$(now_ms)
    kill -"$sig" $pid
    wait $pid
    rc=$?
    t1=$(now_ms)
    pid=
    echo "$name: SIG$sig, stopped in $((t1 - t0)) ms (exit status $rc)"
    [ $((t1 - t0)) -le "$LIMIT_MS" ] || fail "$name: took $((t1 - t0)) ms to stop after SIG$sig (limit $LIMIT_MS)"
    [ $rc -eq 1 ] || fail "$name: exit status $rc, expected 1: $(tail -2 "$tmp/err")"
    grep -q "interrupted" "$tmp/err" || fail "$name: no 'interrupted' message: $(tail -2 "$tmp/err")"
    [ "$(grep -c 'error' "$tmp/err")" -eq 1 ] || fail "$name: not one error line: $(grep error "$tmp/err")"
    sanitizer_clean "$tmp/err" || fail "$name: sanitizer report: $(head -c 800 "$tmp/err")"
    left=$(cd "$O" && ls -A | sort | tr '\n' ' ')
    [ "$left" = "$OLD " ] || fail "$name: the output folder holds '$left', expected '$OLD '"
    for f in $OLD; do
        [ "$(cat "$O/$f" 2>/dev/null)" = "old $f" ] || fail "$name: $f was replaced"
    done
}

GEN=(generate --model "$M" --prompt "a red circle moves to the left" --size 384x384 --frames 56 --threads 2
     --progress lines -o "$O/old.mp4" --wav "$O/old.wav" --latents "$O/old.safetensors" --png-dir "$O/frames")
# The done-when of prompt stop: SIGTERM inside a DiT step of a CPU request whose steps take seconds.
stop "generate, in a DiT step" TERM 'grep -q "dit: step 1/" "$tmp/err" && sleep 1' "${GEN[@]}" --steps 1000
grep -q "interrupted during dit" "$tmp/err" || fail "generate: the message does not name the stage: $(tail -1 "$tmp/err")"
# The video VAE's chunks take under a second each here: a longer clip (7 chunks) and the first step line printed
# (line progress prints at most one a second, so "step 1/" may not appear).
stop "generate, in the video VAE" INT 'grep -q "video_vae: step" "$tmp/err"' "${GEN[@]}" --steps 1 --frames 124
stop "decode (video)" TERM 'ls "$O/frames.partial" 2>/dev/null | grep -q png' \
    decode -m "$M/video_vae" -l "$tmp/latents.safetensors" -o "$O/frames" --tensors-out "$O/old.safetensors" \
    --threads 2
stop "dit" TERM '[ "$(cpu_s $pid)" -ge 2 ]' \
    dit -m "$M/transformer" -i "$tmp/inputs.safetensors" -o "$O/old.safetensors" --threads 2
stop "encode" TERM '[ "$(cpu_s $pid)" -ge 2 ]' \
    encode --text-encoder "$M/text_encoder" --token-ids "$ids" -o "$O/old.safetensors" --threads 2
stop "quantize" TERM '[ "$(cpu_s $pid)" -ge 2 ]' \
    quantize "$M/transformer" "$O/q.safetensors" --rows 4096 --threads 2

# SIGKILL cannot be handled: what it leaves must not look finished (frames only in frames.partial).
fresh_out
"$H3RUN" decode -m "$M/video_vae" -l "$tmp/latents.safetensors" -o "$O/frames" --threads 2 >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 1200); do ls "$O/frames.partial" 2>/dev/null | grep -q png && break; sleep 0.1; done
kill -KILL $pid
wait $pid 2>/dev/null
pid=
[ -e "$O/frames" ] && fail "SIGKILL left a frames folder that looks finished"
[ -d "$O/frames.partial" ] || fail "SIGKILL during decode: no frames.partial (was it killed while writing?)"

[ $fails -eq 0 ] && echo "cli_interrupt: all checks passed" || echo "cli_interrupt: $fails failures"
exit $((fails > 0))
