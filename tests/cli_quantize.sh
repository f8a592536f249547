#!/usr/bin/env bash
# h3run quantize: files in ComfyUI's format from every layout (markers byte for byte), the quantized files run
# through h3run dit / inspect and h3run generate (quantized DiT and text encoder of the reduced model, on the CPU and
# on a GPU where there is one), the error table's ordering, and one-line errors with the right exit status.
# Usage: cli_quantize.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
SRC=${H3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
FIX=$SRC/tests/fixtures
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sanitizer() { grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$1"; }

# A column of the error table: the value in column $2 (1-based among the 7 formats) of the row starting with $1.
col() { grep -F -- "$1" "$tmp/out" | head -1 | awk -v c="$2" '{ print $(NF - 7 + c) }'; }
# awk-checked float comparison: ok "A < B"
ok() { awk "BEGIN { exit !($1) }"; }

# DiT, default format (int8_convrot): the file, the markers, the table.
"$H3RUN" quantize "$FIX/dit/comfy_pruned.safetensors" "$tmp/dit.safetensors" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] || fail "quantize DiT exited $rc: $(cat "$tmp/err")"
grep -q "int8_convrot, 68 tensors, 8 layers quantized" "$tmp/out" || fail "DiT summary line: $(head -1 "$tmp/out")"
grep -qaF '{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}' "$tmp/dit.safetensors" ||
    fail "the 72-byte ConvRot marker is not in the file"
for row in "blocks.0.attn.qkv_proj.weight [768, 32]" "blocks.0.mlp.fc2.weight [32, 64]" "DiT block 0 output" \
           "DiT block 0 update"; do
    grep -qF -- "$row" "$tmp/out" || fail "the table lacks '$row'"
done
i8=$(col "DiT block 0 update" 2); w8a8=$(col "DiT block 0 update" 3); w4a4=$(col "DiT block 0 update" 7)
echo "tiny DiT block update: int8_convrot $i8, W8A8 $w8a8, nvfp4 W4A4 $w4a4"
ok "$i8 < 0.03 && $w8a8 < 0.04 && $w4a4 > 5 * $w8a8" || fail "table ordering: int8 $i8, W8A8 $w8a8, W4A4 $w4a4"
if sanitizer "$tmp/err"; then fail "sanitizer report (DiT)"; fi

# The quantized DiT runs and stays near the bf16 reference; inspect names its formats.
"$H3RUN" dit --model "$tmp/dit.safetensors" --inputs "$FIX/dit/inputs.safetensors" \
    -o "$tmp/v.safetensors" --expect "$FIX/dit/expected_pruned.safetensors" --tol 0.05 >"$tmp/out" 2>"$tmp/err" ||
    fail "h3run dit on the int8 file: $(cat "$tmp/out" "$tmp/err" | tail -3)"
"$H3RUN" inspect --summary "$tmp/dit.safetensors" >"$tmp/out" 2>&1 || fail "inspect of the int8 file"
grep -q "quantized: int8_tensorwise, convrot" "$tmp/out" || fail "inspect names the format"
grep -qE "int8_tensorwise convrot 256 +2 tensors" "$tmp/out" || fail "inspect groups the ConvRot-256 layers"
"$H3RUN" inspect "$tmp/dit.safetensors" >"$tmp/out" 2>&1
grep -qE "^blocks\.0\.attn\.out_proj\.weight +I8 +\[32, 256\] +8,192  int8_tensorwise convrot 256$" "$tmp/out" ||
    fail "the listing names a weight's format"

# fp8 from the diffusers folder; nvfp4 of the DiT.
"$H3RUN" quantize "$FIX/dit/diffusers" "$tmp/fp8.safetensors" --format fp8 --no-table >"$tmp/out" 2>&1 ||
    fail "quantize --format fp8: $(cat "$tmp/out")"
grep -qaF '{"format": "float8_e4m3fn"}' "$tmp/fp8.safetensors" || fail "the 27-byte fp8 marker"
"$H3RUN" dit --model "$tmp/fp8.safetensors" --inputs "$FIX/dit/inputs.safetensors" \
    -o "$tmp/v.safetensors" --expect "$FIX/dit/expected_full.safetensors" --tol 0.15 >"$tmp/out" 2>&1 ||
    fail "h3run dit on the fp8 file: $(tail -3 "$tmp/out")"

# Text encoder (official folder), default nvfp4 with the int8 embedding.
"$H3RUN" quantize "$FIX/text_encoder/official" "$tmp/te.safetensors" --no-table >"$tmp/out" 2>&1 ||
    fail "quantize TE: $(cat "$tmp/out")"
grep -q "Qwen3-VL text encoder (official layout) -> .*: nvfp4" "$tmp/out" || fail "TE default is nvfp4: $(cat "$tmp/out")"
grep -qaF '{"format": "nvfp4", "full_precision_matrix_mult": true}' "$tmp/te.safetensors" || fail "the 55-byte nvfp4 marker"
grep -qaF '{"format": "int8_tensorwise"}' "$tmp/te.safetensors" || fail "the 29-byte embedding marker"
"$H3RUN" inspect "$tmp/te.safetensors" >"$tmp/out" 2>&1
grep -qE "^model\.embed_tokens\.weight +I8 .* int8_tensorwise$" "$tmp/out" || fail "inspect: the int8 embedding"
grep -q "lm_head" "$tmp/out" && fail "the TE file keeps lm_head"
"$H3RUN" quantize --table "$FIX/text_encoder/comfy.safetensors" >"$tmp/out" 2>&1 || fail "quantize --table TE"
grep -q "model.layers.0.mlp.down_proj.weight \[64, 96\]" "$tmp/out" || fail "TE table rows"

# The table on random weights of given shapes.
"$H3RUN" quantize --random-dit --hidden 256 --heads 2 --head-dim 64 --ffn 512 --rows 32 >"$tmp/out" 2>&1 ||
    fail "--random-dit: $(cat "$tmp/out")"
i8=$(col "DiT block 0 update" 2); w4a4=$(col "DiT block 0 update" 7)
echo "random DiT block (256 wide) update: int8_convrot $i8, nvfp4 W4A4 $w4a4"
ok "$i8 < 0.03 && $w4a4 > 0.1" || fail "random block: int8 $i8, W4A4 $w4a4"

# Errors: bad requests exit 2, failed jobs exit 1, one line each, no partial file left behind.
check_err() { # expected status, needle, args...
    local want=$1 needle=$2
    shift 2
    "$H3RUN" quantize "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq "$want" ] || fail "quantize $*: exit $rc, expected $want ($(cat "$tmp/err"))"
    [ "$(wc -l <"$tmp/err")" -le 2 ] || fail "quantize $*: more than one message: $(cat "$tmp/err")"
    grep -qF -- "$needle" "$tmp/err" || fail "quantize $*: message lacks '$needle': $(cat "$tmp/err")"
    if sanitizer "$tmp/err"; then fail "sanitizer report: quantize $*"; fi
}
check_err 2 "--format must be int8, int8_convrot, fp8 or nvfp4; got 'int4'" "$FIX/dit/comfy_pruned.safetensors" "$tmp/x.safetensors" --format int4
check_err 2 "give IN and OUT" "$FIX/dit/comfy_pruned.safetensors"
check_err 2 "give IN and OUT" --random-dit "$tmp/x"
check_err 2 "--rows takes a whole number from 1 to 1048576; got '0'" --random-dit --rows 0
check_err 2 "--threads takes a whole number from 0 to 1024; got '2147483647'" --random-dit --threads 2147483647
check_err 2 "--te-layers takes a whole number from 1 to 1048576; got '0'" "$FIX/text_encoder/official" \
    "$tmp/x.safetensors" --te-layers 0
check_err 2 "an empty argument" "" "$tmp/x.safetensors"
# Memory the table would take is checked against the host's before anything is allocated (7 TB here).
check_err 2 "the error table needs about" --random-dit --rows 1048576 --hidden 65536 --ffn 131072 --heads 1024
check_err 2 "already quantized" "$tmp/dit.safetensors" "$tmp/x.safetensors"
check_err 1 "absent.safetensors" "$FIX/absent.safetensors" "$tmp/x.safetensors"
check_err 1 "holds no MiniMax-H3 DiT or Qwen3-VL text encoder" "$FIX/dit/inputs.safetensors" "$tmp/x.safetensors"
# an output folder that does not exist is a bad request (2), found before any work, as in generate
check_err 2 "the folder $tmp/nodir does not exist" "$FIX/dit/comfy_pruned.safetensors" "$tmp/nodir/x.safetensors" \
    --no-table
[ -e "$tmp/x.safetensors" ] && fail "a failed run left its output"
ls "$tmp"/*.partial >/dev/null 2>&1 && fail "a failed run left a partial file"
"$H3RUN" quantize --help | grep -q "usage: h3run quantize" || fail "--help"

# generate with quantized components: the reduced model's DiT as int8 + ConvRot and its text encoder as nvfp4, on the
# CPU (and on the GPU where this build has one): a complete 22-frame clip each.
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
"$BUILD/h3-tinymodel" "$tmp/tiny" >/dev/null || fail "h3-tinymodel"
"$H3RUN" quantize "$tmp/tiny/transformer" "$tmp/tdit.safetensors" --no-table >/dev/null 2>&1 || fail "quantize the tiny DiT"
"$H3RUN" quantize "$tmp/tiny/text_encoder" "$tmp/tte.safetensors" --no-table >/dev/null 2>&1 || fail "quantize the tiny TE"
devices=cpu
"$H3RUN" --version | grep -q '^cuda: [1-9]' && devices="cpu cuda"
for d in $devices; do
    "$H3RUN" generate --model "$tmp/tiny" --dit "$tmp/tdit.safetensors" --text-encoder "$tmp/tte.safetensors" \
        --prompt "a red ball bounces" --frames 22 --size 128x128 --seed 3 --device "$d" -q -o "$tmp/q-$d.mp4" \
        2>"$tmp/err" || fail "generate on $d with the quantized DiT and text encoder: $(cat "$tmp/err")"
    if command -v ffprobe >/dev/null; then
        n=$(ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=nb_read_frames -of csv=p=0 \
            "$tmp/q-$d.mp4" 2>/dev/null)
        [ "$n" = 22 ] || fail "the quantized run on $d wrote $n frames, not 22"
    fi
done

[ $fails -eq 0 ] && echo "cli_quantize: all checks passed" || echo "cli_quantize: $fails failures"
exit $(( fails > 0 ))
