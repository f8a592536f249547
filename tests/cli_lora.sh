#!/usr/bin/env bash
# h3run generate --lora and dit --lora on the reduced model (tools/h3-tinymodel) with the LoRA seeds of the fuzz
# corpus (fuzz/corpus/lora: files for its DiT): two LoRAs change the latents and a LoRA at strength 0 does not; the
# merged and side paths run (test_lora compares them); a file that is no LoRA, an incomplete one, a bad strength or
# mode, a FIFO and an output on a LoRA file are refused with their messages and exit statuses, leaving no output.
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
TINY=$BUILD/h3-tinymodel
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$TINY" "$tmp/tiny" >"$tmp/out" 2>&1 || { fail "h3-tinymodel: $(cat "$tmp/out")"; exit 1; }
M=$tmp/tiny
L=$SRC/fuzz/corpus/lora
P="a red square moves left"
gen() { # out-latents extra args...
    local out=$1
    shift
    "$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 64x64 --steps 2 --seed 3 --threads 2 -q \
        --device cpu -o "$tmp/o.mp4" --latents "$out" "$@" >"$tmp/gout" 2>&1
}
cmp_latents() { # a b -> 0 when identical
    cmp -s "$1" "$2"
}
gen "$tmp/base.st" || fail "generate without a LoRA: $(tail -3 "$tmp/gout")"
gen "$tmp/lora.st" --lora "$L/diffsynth_qkv" --lora "$L/globals_meta_alpha:0.5" ||
    fail "generate --lora: $(tail -3 "$tmp/gout")"
gen "$tmp/side.st" --lora "$L/diffsynth_qkv" --lora "$L/globals_meta_alpha:0.5" --lora-mode side ||
    fail "generate --lora --lora-mode side: $(tail -3 "$tmp/gout")"
gen "$tmp/zero.st" --lora "$L/diffsynth_qkv:0" || fail "generate --lora at strength 0: $(tail -3 "$tmp/gout")"
cmp_latents "$tmp/base.st" "$tmp/lora.st" && fail "a LoRA left the latents unchanged"
cmp_latents "$tmp/base.st" "$tmp/zero.st" || fail "a LoRA at strength 0 changed the latents"
for mode in merge side; do
    "$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 64x64 --steps 1 --seed 3 --threads 2 -q \
        --device cpu -o "$tmp/m.mp4" --latents "$tmp/$mode.st" --lora "$L/musubi_fc1_alpha" --lora-mode $mode \
        >"$tmp/gout" 2>&1 || fail "generate --lora-mode $mode: $(tail -3 "$tmp/gout")"
done
# refusals: exit status, message, no output left
expect_refusal() { # status needle what args...
    local want=$1 needle=$2 what=$3
    shift 3
    rm -f "$tmp/r.mp4"
    "$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 64x64 --steps 1 --threads 2 -q --device cpu \
        -o "$tmp/r.mp4" "$@" >"$tmp/rout" 2>&1
    local rc=$?
    [ $rc -eq "$want" ] || fail "$what: exit $rc, expected $want: $(tail -2 "$tmp/rout")"
    grep -qF -- "$needle" "$tmp/rout" || fail "$what: no '$needle' in: $(tail -2 "$tmp/rout")"
    [ -e "$tmp/r.mp4" ] && fail "$what: the output was written"
}
expect_refusal 1 "is not a LoRA factor" "a file that is no LoRA" --lora "$SRC/tests/fixtures/dit/inputs.safetensors"
expect_refusal 1 "has an A but no B factor" "an incomplete LoRA" --lora "$L/incomplete"
expect_refusal 2 "the strength takes a number from -100 to 100" "a strength out of range" --lora "$L/diffsynth_qkv:1e9"
expect_refusal 2 "--lora-mode must be auto, merge or side" "a bad mode" --lora "$L/diffsynth_qkv" --lora-mode fast
mkfifo "$tmp/fifo"
expect_refusal 2 "not a regular file" "a FIFO" --lora "$tmp/fifo"
cp "$L/diffsynth_qkv" "$tmp/l.st"
rm -f "$tmp/l2.st"
"$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 64x64 --steps 1 -q --device cpu -o "$tmp/l.st" \
    --lora "$tmp/l.st" >"$tmp/rout" 2>&1
[ $? -eq 2 ] || fail "an output on the LoRA file was not refused: $(tail -2 "$tmp/rout")"
cmp -s "$L/diffsynth_qkv" "$tmp/l.st" || fail "the LoRA file was changed"
"$H3RUN" generate --help | grep -q -- "--lora FILE\[:STRENGTH\]" || fail "generate --help lacks --lora"
"$H3RUN" dit --help | grep -q -- "--lora-mode" || fail "dit --help lacks --lora-mode"
# Turbo presets (pipeline/turbo.h): a LoRA named as LightX2V's 768p 4-step file takes 4 model calls at shift 6:3
# when the request gives neither; other steps or shifts run as asked, with a warning naming the preset; --shift is
# checked
T=$tmp/minimax_h3_fl2v_turbo_4step_v1.0_768p_comfyui_bf16.safetensors
cp "$L/diffsynth_qkv" "$T"
tgen() { "$H3RUN" generate --model "$M" --prompt "$P" --frames 22 --size 64x64 --seed 3 --threads 2 --device cpu \
    --progress none -o "$tmp/t.mp4" --lora "$T" "$@" >"$tmp/tout" 2>"$tmp/terr"; }
tgen || fail "a turbo LoRA: $(tail -3 "$tmp/terr")"
grep -q "LoRA preset: LightX2V turbo 4-step, 768p: 4 model calls at shift 6:3" "$tmp/terr" ||
    fail "the turbo preset is not applied: $(cat "$tmp/terr")"
grep -q "4 steps of euler on the h3 schedule (shift 6:3)" "$tmp/tout" || fail "the turbo run: $(cat "$tmp/tout")"
grep -q "was not trained for" "$tmp/terr" && fail "a warning at the preset's own settings: $(cat "$tmp/terr")"
tgen --steps 3 || fail "a turbo LoRA at 3 steps: $(tail -3 "$tmp/terr")"
grep -q "made for 4 model calls at shift 6:3; this request asks 3 at 6:3" "$tmp/terr" ||
    fail "no warning at other steps: $(cat "$tmp/terr")"
tgen --shift 12:3 --sampler res_multistep || fail "a turbo LoRA at shift 12: $(tail -3 "$tmp/terr")"
grep -q "this request asks 4 at 12:3" "$tmp/terr" && grep -q "this request uses res_multistep on h3" "$tmp/terr" ||
    fail "no warnings at another shift and sampler: $(cat "$tmp/terr")"
grep -q "(shift 12:3)" "$tmp/tout" || fail "--shift 12:3 not used: $(cat "$tmp/tout")"
for bad in 0 x 6:x 2000 6:-1; do
    "$H3RUN" generate --model "$M" --prompt "$P" --shift "$bad" -o "$tmp/bad.mp4" >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "--shift takes V or V:A" "$tmp/err" || fail "--shift $bad: exit $rc: $(cat "$tmp/err")"
done
[ ! -e "$tmp/bad.mp4" ] || fail "a refused --shift left an output"
[ $fails -eq 0 ] && echo "cli_lora: ok"
exit $((fails > 0))
