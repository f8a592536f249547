#!/usr/bin/env bash
# Paths that are not what a command expects, in every command: inputs that are FIFOs (which used to block open()
# forever), devices or folders where a file is wanted are refused at once; outputs that name a FIFO or a device
# node are refused and the node is left as it was (it used to be replaced by the renamed .partial file); two
# outputs on one path, an output on another's temporary name or inside another's folder, and an output on an input
# (the same file, through a symlink or a hard link, or a file inside an input folder such as a weight shard) are
# refused up front with exit 2; a frames folder that already holds files is refused (the run used to write into
# it and delete what it found there when interrupted); a failed command leaves none of its outputs (decode's PNG
# frames when --tensors-out cannot be written; dit's and encode's -o when --expect fails) and never touches the
# files that were at those paths. After every case: no input changed (checksums), every FIFO and device node still
# one, no *.partial left behind, one line on stderr.
# Usage: cli_paths.sh PATH/TO/h3run (CTest passes it). Needs python3 (tests/make_inputs.py, standard library).
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
FIX=$SRC/tests/fixtures
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mk() { python3 "$SRC/tests/make_inputs.py" "$@" || fail "make_inputs.py $*"; }

# ---- the inputs, all copies under $G (guarded: their checksums must never change) ---------------------------------
G=$tmp/g
mkdir -p "$G"
"$BUILD/h3-tinymodel" "$G/tiny" >"$tmp/out" 2>&1 || { fail "h3-tinymodel: $(cat "$tmp/out")"; exit 1; }
M=$G/tiny
SHARD=$(ls "$M"/transformer/*.safetensors | head -1)
TOK=$M/tokenizer/tokenizer.json
cp -r "$FIX/dit" "$G/dit"
cp -r "$FIX/text_encoder" "$G/te"
mk latents "$G/video.safetensors" 2 4 4
mk audio "$G/audio.safetensors" 10
echo "a harbor at sunrise" >"$G/prompt.txt"
ln "$TOK" "$G/tok_hardlink.json"          # a hard link to the model's tokenizer
ln -s "$G/prompt.txt" "$G/prompt_link.txt" # a symlink to an input
mkdir -p "$G/frames_old" && echo old >"$G/frames_old/frame_00000.png"
echo old >"$G/old.safetensors"
(cd "$G" && find . -type f | sort | xargs md5sum) >"$tmp/sums"

# ---- nodes: a FIFO (in a folder of its own too, named like a weight file) and, as root, a device -----------------
F=$tmp/fifo
mkfifo "$F"
mkdir -p "$tmp/fifodir" && mkfifo "$tmp/fifodir/model.safetensors"
DEV=
if [ "$(id -u)" = 0 ] && mknod "$tmp/null" c 1 3 2>/dev/null; then DEV=$tmp/null; fi
mkdir -p "$tmp/empty" "$tmp/adir"

check_after() { # what: the invariants every case keeps
    (cd "$G" && md5sum -c --quiet "$tmp/sums") >"$tmp/md5" 2>&1 || fail "$1: an input changed: $(cat "$tmp/md5")"
    [ -p "$F" ] && [ -p "$tmp/fifodir/model.safetensors" ] || fail "$1: a FIFO was replaced"
    [ -z "$DEV" ] || [ -c "$DEV" ] || fail "$1: the device node was replaced"
    local left
    left=$(find "$tmp" -name '*.partial' ! -type p)
    [ -z "$left" ] || fail "$1: left $left"
    rm -rf "$left" "$tmp/o" "$tmp/o.partial"
    rmdir "$tmp/empty" 2>/dev/null; mkdir -p "$tmp/empty"
}

expect() { # status needle args...: refused with that status and message, at once, leaving everything as it was
    local want=$1 needle=$2 rc lines
    shift 2
    timeout 30 "$H3RUN" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 124 ]; then
        fail "$*: still running after 30 s (blocked?)"
    else
        [ $rc -eq "$want" ] || fail "$*: exit status $rc, expected $want: $(head -c 600 "$tmp/err")"
        grep -qF -- "$needle" "$tmp/err" || fail "$*: message lacks '$needle': $(head -c 600 "$tmp/err")"
        lines=$(grep -vc '^warning: ' "$tmp/err")
        [ "$lines" -eq 1 ] || fail "$*: $lines lines on stderr, expected one: $(head -c 600 "$tmp/err")"
    fi
    check_after "$*"
}

GEN=(generate -q --model "$M" --prompt "a harbor" --frames 5 --size 64x64 --steps 2)
DIT=(dit -m "$G/dit/official" -i "$G/dit/inputs.safetensors")
TE=(encode --text-encoder "$G/te/official" --token-ids 3,1,4 --layer 2)
FIFO_IN="is a FIFO (named pipe), not a regular file"
FIFO_OUT="is a FIFO (named pipe): h3run writes its outputs only to regular files"
SAME="name the same file"
ON_INPUT="an output must not replace what the command reads"

# ---- F7: inputs that are FIFOs, devices, folders where a file is wanted -------------------------------------------
expect 2 "$FIFO_IN" inspect "$F"
expect 2 "$FIFO_IN" plan "$F" --vram-budget 8GiB
expect 2 "$FIFO_IN" decode -m "$M/video_vae" -l "$F" -o "$tmp/o"
expect 2 "$FIFO_IN" decode -m "$F" -l "$G/video.safetensors" -o "$tmp/o"
expect 2 "$FIFO_IN" "${TE[@]}" --expect "$F"
expect 2 "$FIFO_IN" "${TE[@]}" --config "$F"
expect 2 "$FIFO_IN" encode --text-encoder "$F" --token-ids 1
expect 2 "$FIFO_IN" encode --tokenizer "$F" --prompt x --ids
expect 2 "$FIFO_IN" encode --tokenizer "$TOK" --prompt-file "$F" --ids
expect 2 "$FIFO_IN" dit -m "$F" --describe
expect 2 "$FIFO_IN" dit -m "$G/dit/official" -i "$F" -o "$tmp/o"
expect 2 "$FIFO_IN" "${DIT[@]}" --config "$F" -o "$tmp/o"
expect 2 "$FIFO_IN" "${DIT[@]}" --expect "$F" -o "$tmp/o"
expect 2 "$FIFO_IN" quantize "$F" "$tmp/o"
expect 2 "$FIFO_IN" quantize --table "$F"
expect 2 "$FIFO_IN" "${GEN[@]}" --tokenizer "$F" -o "$tmp/o"
expect 2 "$FIFO_IN" "${GEN[@]}" --dit "$F" -o "$tmp/o"
expect 2 "$FIFO_IN" "${GEN[@]}" --audio-vae "$F" -o "$tmp/o"
# A FIFO inside a folder, named like a weight file: the reader refuses it (a bad model folder: 1).
expect 1 "$FIFO_IN" inspect "$tmp/fifodir"
expect 1 "$FIFO_IN" dit -m "$tmp/fifodir" --describe
expect 1 "$FIFO_IN" "${GEN[@]}" --dit "$tmp/fifodir" -o "$tmp/o"
expect 2 "is a folder; give a file" encode --tokenizer "$TOK" --prompt-file "$tmp/adir" --ids
expect 2 "is a folder; give a file" "${DIT[@]}" --config "$tmp/adir" -o "$tmp/o"
if [ -n "$DEV" ]; then
    expect 2 "is a character device, not a regular file" inspect "$DEV"
    expect 2 "is a character device, not a regular file" encode --tokenizer "$TOK" --prompt-file "$DEV" --ids
fi

# ---- F8: outputs that name a FIFO or a device: refused, the node left as it is ------------------------------------
expect 2 "$FIFO_OUT" "${GEN[@]}" -o "$F"
expect 2 "$FIFO_OUT" "${GEN[@]}" -o "$tmp/o" --wav "$F"
expect 2 "$FIFO_OUT" "${GEN[@]}" -o "$tmp/o" --latents "$F"
expect 2 "$FIFO_OUT" "${GEN[@]}" -o "$tmp/o" --memory-trace "$F"
expect 2 "is a FIFO (named pipe)" "${GEN[@]}" -o "$tmp/o" --png-dir "$F"
expect 2 "$FIFO_OUT" decode -m "$M/audio_vae" -l "$G/audio.safetensors" -o "$F"
expect 2 "$FIFO_OUT" decode -m "$M/video_vae" -l "$G/video.safetensors" --tensors-out "$F"
expect 2 "$FIFO_OUT" "${DIT[@]}" -o "$F"
expect 2 "$FIFO_OUT" "${TE[@]}" -o "$F"
expect 2 "$FIFO_OUT" quantize "$G/dit/comfy_pruned.safetensors" "$F"
if [ -n "$DEV" ]; then
    expect 2 "is a character device: h3run writes its outputs only to regular files" "${GEN[@]}" -o "$DEV"
    expect 2 "is a character device: h3run writes its outputs only to regular files" "${DIT[@]}" -o "$DEV"
fi
# A FIFO where the temporary file goes is refused too (creating the temporary file would open it).
mkfifo "$tmp/t.wav.partial"
expect 2 "t.wav.partial exists and is a FIFO" decode -m "$M/audio_vae" -l "$G/audio.safetensors" -o "$tmp/t.wav"
rm -f "$tmp/t.wav.partial"

# ---- F9: two outputs on one path; an output on an input ---------------------------------------------------------
expect 2 "$SAME" "${GEN[@]}" -o "$tmp/same.bin" --wav "$tmp/same.bin"
expect 2 "$SAME" "${GEN[@]}" -o "$tmp/same.bin" --latents "$tmp/same.bin"
expect 2 "$SAME" "${GEN[@]}" -o "$tmp/x.mp4" --wav "$tmp/same.bin" --latents "$tmp/./empty/../same.bin"
expect 2 "$SAME" "${GEN[@]}" -o "$tmp/same" --png-dir "$tmp/same/"
echo old >"$tmp/target.bin" && ln -s "$tmp/target.bin" "$tmp/link.bin"
expect 2 "$SAME" "${GEN[@]}" -o "$tmp/link.bin" --wav "$tmp/target.bin"
rm -f "$tmp/target.bin" "$tmp/link.bin"
expect 2 "is the temporary file of --output" "${GEN[@]}" -o "$tmp/x.mp4" --wav "$tmp/x.mp4.partial"
expect 2 "lies inside the folder of --png-dir" "${GEN[@]}" -o "$tmp/empty/x.mp4" --png-dir "$tmp/empty"
expect 2 "is a file of the input --model" "${GEN[@]}" -o "$SHARD"
expect 2 "is a file of the input --model" "${GEN[@]}" -o "$tmp/x.mp4" --latents "$M/transformer/config.json"
expect 2 "is a file of the input --model" "${GEN[@]}" -o "$G/tok_hardlink.json"
expect 2 "$ON_INPUT" "${GEN[@]}" --tokenizer "$G/tok_hardlink.json" -o "$tmp/x.mp4" --wav "$TOK"
expect 2 "$SAME" decode -m "$M/audio_vae" -l "$G/audio.safetensors" -o "$tmp/x.wav" --tensors-out "$tmp/x.wav"
expect 2 "$ON_INPUT" decode -m "$M/audio_vae" -l "$G/audio.safetensors" --tensors-out "$G/audio.safetensors"
expect 2 "$ON_INPUT" "${DIT[@]}" -o "$G/dit/inputs.safetensors"
expect 2 "$ON_INPUT" "${DIT[@]}" -o "$G/dit/official/$(ls "$G/dit/official" | grep -m1 'safetensors$')"
expect 2 "$ON_INPUT" "${TE[@]}" --expect "$G/te/expected.safetensors:hidden.b.2" -o "$G/te/expected.safetensors"
expect 2 "$ON_INPUT" encode --tokenizer "$TOK" --text-encoder "$M/text_encoder" --prompt-file "$G/prompt_link.txt" \
    -o "$G/prompt.txt"
expect 2 "$ON_INPUT" quantize "$G/dit/comfy_pruned.safetensors" "$G/dit/comfy_pruned.safetensors"
expect 2 "$ON_INPUT" quantize "$G/dit/official" "$G/dit/official/config.json"

# ---- F10: frames go only into a new or empty folder ---------------------------------------------------------------
expect 2 "is a folder that is not empty" "${GEN[@]}" -o "$tmp/o" --png-dir "$G/frames_old"
expect 2 "is a folder that is not empty" decode -m "$M/video_vae" -l "$G/video.safetensors" -o "$G/frames_old"
# an empty folder takes the frames (moved into place whole)
"$H3RUN" decode -m "$M/video_vae" -l "$G/video.safetensors" -o "$tmp/empty" -q 2>"$tmp/err" ||
    fail "decode into an empty folder: $(cat "$tmp/err")"
[ "$(ls "$tmp/empty" | grep -c '^frame_[0-9]*\.png$')" = 5 ] || fail "decode into an empty folder: $(ls "$tmp/empty")"
check_after "decode into an empty folder"

# ---- F11: a failed command leaves none of its outputs, and the files that were there as they were -----------------
expect 2 "the folder $tmp/nodir does not exist" decode -m "$M/video_vae" -l "$G/video.safetensors" \
    -o "$tmp/frames" --tensors-out "$tmp/nodir/t.safetensors"
[ -e "$tmp/frames" ] && fail "decode with a bad --tensors-out left $tmp/frames"
cp "$G/old.safetensors" "$tmp/v.safetensors"
expect 1 "the velocities differ from" dit -m "$G/dit/comfy_pruned.safetensors" -i "$G/dit/inputs.safetensors" \
    -o "$tmp/v.safetensors" --expect "$G/dit/expected_full.safetensors"
cmp -s "$G/old.safetensors" "$tmp/v.safetensors" || fail "dit --expect failing replaced the file at -o"
expect 1 "differs from" encode --text-encoder "$G/te/official" --token-ids 255 --layer 2 \
    --expect "$G/te/expected.safetensors:hidden.b.1" -o "$tmp/h.safetensors"
[ -e "$tmp/h.safetensors" ] && fail "encode --expect failing wrote -o"
rm -f "$tmp/v.safetensors"

[ $fails -eq 0 ] && echo "cli_paths: all checks passed" || echo "cli_paths: $fails failures"
exit $((fails > 0))
