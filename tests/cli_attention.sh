#!/usr/bin/env bash
# generate --attention (the DiT blocks' attention, pipeline/plan.h) with the small model on the CPU, where fp8 runs
# the reference computation of the GPU's kernel (tensor/ops.h H3_ATTN_FP8), and int8 likewise (H3_ATTN_INT8):
#  - fp8, int8 and bf16 runs of one request finish, the log names the attention each ran, and the low-bit latents
#    move off the bf16 ones (the quantization ran) but stay close (the clip is the same clip: within 3% (video) and
#    6% (audio) after 6 steps of the trained model);
#  - an unknown mode is refused with exit 2 and a message naming the choices, writing nothing;
#  - sparse under its 4,096 rows runs the dense blocks (the same latents) and says so; --sparse's rule (implying
#    sparse) is said in the log and the plan, and a bad rule or --sparse with another mode exits 2 writing nothing;
#  - h3run plan names the attention it planned, and auto keeps bf16 for bf16 block weights.
# Usage: cli_attention.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
A=(--prompt "a red circle moves from left to right, a rising tone" --frames 22 --steps 6 --seed 3 --device cpu
   --threads 2 --progress none)
for m in bf16 fp8 int8; do
    "$H3RUN" generate "${A[@]}" --attention $m -o "$tmp/$m.mp4" --latents "$tmp/$m.st" >"$tmp/$m.out" 2>"$tmp/$m.err" ||
        fail "--attention $m: $(tail -2 "$tmp/$m.err")"
    grep -q "DiT attention: $m (asked" "$tmp/$m.err" || fail "--attention $m: the log does not name it: $(grep -i attention "$tmp/$m.err")"
done
for m in fp8 int8; do
    [ -f "$tmp/bf16.st" ] && [ -f "$tmp/$m.st" ] || continue
    d=$(python3 "$SRC/tests/latents_tool.py" distance "$tmp/bf16.st" "$tmp/$m.st")
    echo "$m attention: relative L2 off the bf16 run's latents (video, audio): $d"
    read -r dv da <<<"$d"
    # measured: fp8 0.0040 / 0.020 (0.0040 / 0.017 with exponentials rounded to e4m3 instead of the probabilities'
    # codes), int8 0.0024 / 0.016; fp8 with q and k in e4m3 (its first form) was 0.0089 / 0.12
    awk -v v="$dv" -v a="$da" 'BEGIN{exit !(v > 1e-4 && v <= 0.03 && a > 1e-4 && a <= 0.06)}' ||
        fail "$m attention's latents are $dv (video) and $da (audio) off bf16's: expected (1e-4, 0.03] and (1e-4, 0.06]"
done
# sparse: this clip is under 4,096 rows, so the blocks stay dense and the latents are bf16's to the bit
"$H3RUN" generate "${A[@]}" --attention sparse -o "$tmp/sp.mp4" --latents "$tmp/sp.st" >"$tmp/sp.out" 2>"$tmp/sp.err" ||
    fail "--attention sparse: $(tail -2 "$tmp/sp.err")"
grep -q "DiT attention: sparse (asked; on the host: the reference; tau 1.3, steps 0.2..0.9, dense: under 4,096 rows)" "$tmp/sp.err" ||
    fail "--attention sparse: the log does not say it: $(grep -i attention "$tmp/sp.err")"
if [ -f "$tmp/bf16.st" ] && [ -f "$tmp/sp.st" ]; then
    d=$(python3 "$SRC/tests/latents_tool.py" distance "$tmp/bf16.st" "$tmp/sp.st")
    read -r dv da <<<"$d"
    awk -v v="$dv" -v a="$da" 'BEGIN{exit !(v == 0 && a == 0)}' || fail "--attention sparse under 4,096 rows moved the latents: $d"
fi
"$H3RUN" plan "$SRC/models/h3-small" --frames 22 --size 128x128 --device h200 --attention sparse >"$tmp/ps" 2>&1 ||
    fail "plan --attention sparse: $(tail -1 "$tmp/ps")"
grep -q "attention: sparse (block-sparse" "$tmp/ps" || fail "plan --attention sparse does not say so: $(grep -i attention "$tmp/ps")"
"$H3RUN" generate "${A[@]}" --attention fp9 -o "$tmp/bad.mp4" >"$tmp/bad.out" 2>"$tmp/bad.err"
rc=$?
[ $rc = 2 ] || fail "--attention fp9 exited $rc, not 2"
grep -q "choose auto, bf16, fp8, int8 or sparse" "$tmp/bad.err" || fail "--attention fp9: $(cat "$tmp/bad.err")"
[ ! -e "$tmp/bad.mp4" ] && [ ! -e "$tmp/bad.mp4.partial" ] || fail "--attention fp9 left a file"
# --sparse: the rule (implies --attention sparse), said in the log and the plan; bad rules and other modes refused
"$H3RUN" generate "${A[@]}" --sparse 0.5,0,1 -o "$tmp/sr.mp4" >"$tmp/sr.out" 2>"$tmp/sr.err" ||
    fail "--sparse 0.5,0,1: $(tail -2 "$tmp/sr.err")"
grep -q "DiT attention: sparse (asked; on the host: the reference; tau 0.5, steps 0..1, dense: under 4,096 rows)" "$tmp/sr.err" ||
    fail "--sparse 0.5,0,1: the log does not say it: $(grep -i attention "$tmp/sr.err")"
for bad in "1.3,0.9,0.2|0 <= START < END <= 1" "x|give TAU or TAU,START,END" "--attention fp8 --sparse 1.3|give --attention sparse"; do
    args=${bad%%|*} msg=${bad#*|}
    [ "${args#--}" = "$args" ] && args="--sparse $args"
    # shellcheck disable=SC2086
    "$H3RUN" generate "${A[@]}" $args -o "$tmp/bs.mp4" >"$tmp/bs.out" 2>"$tmp/bs.err"
    rc=$?
    [ $rc = 2 ] || fail "$args exited $rc, not 2"
    grep -q -- "$msg" "$tmp/bs.err" || fail "$args: $(cat "$tmp/bs.err")"
    [ ! -e "$tmp/bs.mp4" ] && [ ! -e "$tmp/bs.mp4.partial" ] || fail "$args left a file"
done
M="$SRC/models/h3-small"
"$H3RUN" plan "$M" --frames 22 --size 128x128 --device h200 --sparse 2,0.1,0.5 >"$tmp/psr" 2>&1 ||
    fail "plan --sparse: $(tail -1 "$tmp/psr")"
grep -q "DiT attention: sparse (asked; Hopper's wgmma kernel; tau 2, steps 0.1..0.5," "$tmp/psr" ||
    fail "plan --sparse does not say it: $(grep -i attention "$tmp/psr")"
"$H3RUN" plan "$M" --frames 22 --size 128x128 --device h200 --attention fp8 >"$tmp/p8" 2>&1 || fail "plan --attention fp8: $(tail -1 "$tmp/p8")"
grep -q "attention: fp8 (int8 q, k" "$tmp/p8" || fail "plan --attention fp8 does not say so: $(grep -i attention "$tmp/p8")"
"$H3RUN" plan "$M" --frames 22 --size 128x128 --device h200 --attention int8 >"$tmp/pi" 2>&1 || fail "plan --attention int8: $(tail -1 "$tmp/pi")"
grep -q "attention: int8 (int8 q, k" "$tmp/pi" || fail "plan --attention int8 does not say so: $(grep -i attention "$tmp/pi")"
"$H3RUN" plan "$M" --frames 22 --size 128x128 --device h200 >"$tmp/pa" 2>&1 || fail "plan: $(tail -1 "$tmp/pa")"
grep -q "DiT attention: bf16 (auto: the block weights are not fp8" "$tmp/pa" && grep -q "attention: bf16 (exact" "$tmp/pa" ||
    fail "plan's auto with bf16 block weights: $(grep -i attention "$tmp/pa")"
[ $fails = 0 ] && echo "cli_attention: ok"
exit $((fails > 0))
