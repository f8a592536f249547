#!/usr/bin/env bash
# h3run dit on the fixtures of each layout (checked against the reference's outputs with --expect), h3run inspect
# naming the layouts, and one-line errors with a non-zero status for every malformed input file.
# Usage: cli_dit.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
SRC=${H3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
FIX=$SRC/tests/fixtures/dit
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One forward per layout, compared with the reference (max |diff| / max |ref| <= 1e-4).
for m in "official:expected_full" "official/model.safetensors.index.json:expected_full" "diffusers:expected_full" \
         "comfy_pruned.safetensors:expected_pruned"; do
    model=${m%%:*}
    exp=${m##*:}
    out=$("$H3RUN" dit --model "$FIX/$model" --inputs "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" \
          --expect "$FIX/$exp.safetensors" 2>"$tmp/err")
    rc=$?
    [ $rc -eq 0 ] || fail "dit $model exited $rc: $(cat "$tmp/err") $out"
    [ -s "$tmp/v.safetensors" ] || fail "dit $model wrote no output"
    grep -q "compare video_velocity" <<<"$out" || fail "dit $model: no comparison printed"
    echo "$model: $(grep compare <<<"$out" | sed 's/  */ /g' | tr '\n' ';')"
    rm -f "$tmp/v.safetensors"
done
# The output is a safetensors file with both velocities.
"$H3RUN" dit -q -m "$FIX/official" -i "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" || fail "dit -q"
listing=$("$H3RUN" inspect "$tmp/v.safetensors")
grep -q "^video_velocity  *F32  *\[18, 96\]" <<<"$listing" || fail "output lacks video_velocity [18, 96]: $listing"
grep -q "^audio_velocity  *F32  *\[6, 32\]" <<<"$listing" || fail "output lacks audio_velocity [6, 32]: $listing"
# A wrong answer is caught: the pruned model against the full model's outputs differs by ~2e-4.
"$H3RUN" dit -q -m "$FIX/comfy_pruned.safetensors" -i "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" \
    --expect "$FIX/expected_full.safetensors" >/dev/null 2>&1
[ $? -eq 1 ] || fail "--expect did not fail on outputs of another model"
# Reading the official shards with the wrong QKV order gives wrong numbers.
"$H3RUN" dit -q -m "$FIX/official" --qkv-order contiguous -i "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" \
    --expect "$FIX/expected_full.safetensors" >/dev/null 2>&1
[ $? -eq 1 ] || fail "--qkv-order contiguous on official shards must not match"

# --device: a bad name or budget is a usage error (exit 2, one line); auto where there is no GPU computes on the CPU
# (the same velocities); cuda where there is none says what to do; where there is one, the stage runs there as
# planned and reports its device peak (bf16 activations: compared with a looser tolerance).
for bad in "--device tpu:unknown device 'tpu'" "--vram-budget 8X:--vram-budget takes a size like 8GiB" \
           "--ram-budget 0:--ram-budget must be positive"; do
    opt=${bad%%:*}
    "$H3RUN" dit -m "$FIX/official" -i "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" --device auto $opt \
        >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] && grep -qF -- "${bad#*:}" "$tmp/err" && [ "$(wc -l <"$tmp/err")" -eq 1 ] ||
        fail "dit $opt: exit $rc, $(cat "$tmp/err")"
done
if "$H3RUN" --version | grep -q '^cuda: [1-9]'; then
    out=$("$H3RUN" dit -m "$FIX/official" -i "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" --device cuda \
          --expect "$FIX/expected_full.safetensors" --tol 5e-2 2>"$tmp/err")
    [ $? -eq 0 ] && grep -q "on the GPU; device peak" <<<"$out" || fail "dit --device cuda: $out $(cat "$tmp/err")"
else
    "$H3RUN" dit -q -m "$FIX/official" -i "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" --device auto \
        --expect "$FIX/expected_full.safetensors" || fail "dit --device auto without a GPU"
    "$H3RUN" dit -m "$FIX/official" -i "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" --device cuda \
        >/dev/null 2>"$tmp/err"
    [ $? -eq 2 ] && grep -q "use --device cpu" "$tmp/err" || fail "dit --device cuda without a GPU: $(cat "$tmp/err")"
fi
rm -f "$tmp/v.safetensors"

# The full-size official DiT (real header, data left as a sparse hole): every tensor binds zero-copy, the config
# inferred from the shapes is the release's, and the AdaLN bytes a step no longer reads are stated.
"$BUILD/h3-testdata" dit-official "$tmp/full.safetensors" || fail "h3-testdata dit-official"
out=$("$H3RUN" dit --describe -m "$tmp/full.safetensors" 2>"$tmp/err")
[ $? -eq 0 ] || fail "dit --describe on the full-size header: $(cat "$tmp/err")"
for want in "official layout, per-head interleaved QKV" "50 blocks + 2 refiner blocks, hidden 5376, 56 heads x 128" \
            "FFN 14336" "weights: 66,280,430,144 bytes" "AdaLN 26,142,079,488 bytes" "owned copies 0 bytes"; do
    grep -qF -- "$want" <<<"$out" || fail "describe of the full-size DiT lacks '$want': $out"
done
rm -f "$tmp/full.safetensors"

# A model folder whose transformer/ holds the DiT (FL2VA/, a diffusers root) is found.
mkdir -p "$tmp/FL2VA" && cp -r "$FIX/official" "$tmp/FL2VA/transformer"
"$H3RUN" dit -q -m "$tmp/FL2VA" -i "$FIX/inputs.safetensors" -o "$tmp/v.safetensors" \
    --expect "$FIX/expected_full.safetensors" || fail "dit on a model folder with transformer/"

# inspect names the layout and the AdaLN form.
"$H3RUN" inspect --summary "$FIX/official" | grep -q "official layout, 2 blocks, full AdaLN" || fail "inspect official"
"$H3RUN" inspect --summary "$FIX/diffusers" | grep -q "diffusers layout, 2 blocks, full AdaLN" || fail "inspect diffusers"
"$H3RUN" inspect --summary "$FIX/comfy_pruned.safetensors" | grep -q "ComfyUI layout, 2 blocks, pruned" ||
    fail "inspect pruned"

# Malformed inputs: exit status 1, exactly one line on stderr naming the problem, no sanitizer report.
"$BUILD/test_dit" --write-bad-inputs "$tmp/bad" || fail "test_dit --write-bad-inputs"
count=0
for f in "$tmp"/bad/*.safetensors; do
    count=$((count + 1))
    name=$(basename "$f" .safetensors)
    what=${name#missing_}
    what=${what#shape_}
    case $name in
        bad_tag) what=token_tags ;;
        float_indices) what=audio_indices ;;
        duplicate_index) what=text_indices ;;
    esac
    "$H3RUN" dit -m "$FIX/official" -i "$f" -o "$tmp/x.safetensors" >/dev/null 2>"$tmp/err"
    rc=$?
    lines=$(wc -l <"$tmp/err")
    [ $rc -eq 1 ] || fail "$name: exit status $rc, expected 1"
    [ "$lines" -eq 1 ] || fail "$name: $lines lines on stderr, expected one: $(head -c 600 "$tmp/err")"
    grep -q "^h3run dit: error: .*'$what'" "$tmp/err" || fail "$name: message does not name '$what': $(cat "$tmp/err")"
    if grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$tmp/err"; then fail "$name: sanitizer report"; fi
    [ -e "$tmp/x.safetensors" ] && fail "$name: an output was written"
done
[ $count -ge 23 ] || fail "only $count malformed input files were checked"
echo "malformed inputs rejected cleanly: $count"

# Bad model paths and files: status 1, named.
"$H3RUN" dit -m "$tmp/absent" -i "$FIX/inputs.safetensors" -o "$tmp/x.safetensors" 2>"$tmp/err" >/dev/null
[ $? -eq 1 ] && grep -q "absent" "$tmp/err" || fail "a missing model must exit 1 and be named: $(cat "$tmp/err")"
"$H3RUN" dit -m "$FIX/inputs.safetensors" -i "$FIX/inputs.safetensors" -o "$tmp/x.safetensors" 2>"$tmp/err" >/dev/null
[ $? -eq 1 ] && grep -q "not a MiniMax-H3 DiT" "$tmp/err" || fail "a non-DiT model must exit 1: $(cat "$tmp/err")"

# Usage errors exit 2 with one line naming the problem (2^31 - 1 threads once asked for a 16 GiB table; 0 chunk
# rows read as the default).
usage_error() { # needle args...
    local needle=$1
    shift
    "$H3RUN" dit "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "dit $*: exit status $rc, expected 2 ($(cat "$tmp/err"))"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "dit $*: not one line on stderr: $(head -c 600 "$tmp/err")"
    grep -qF -- "$needle" "$tmp/err" || fail "dit $*: message lacks '$needle': $(cat "$tmp/err")"
}
RUN=(-m "$FIX/official" -i "$FIX/inputs.safetensors" -o "$tmp/x.safetensors")
usage_error "--model, --inputs and -o are required" -m "$FIX/official" -o "$tmp/x.safetensors"
usage_error "--qkv-order must be auto, interleaved or contiguous" "${RUN[@]}" --qkv-order sideways
usage_error "unknown option '--bogus'" --bogus
usage_error "--threads takes a whole number from 0 to 1024; got '2147483647'" "${RUN[@]}" --threads 2147483647
usage_error "--chunk-rows takes a whole number from 1 to 1073741824; got '0'" "${RUN[@]}" --chunk-rows 0
usage_error "--tol takes a number from 0 to 1e+06; got '-1'" "${RUN[@]}" --tol -1
usage_error "--inputs needs a value (FILE); got an empty string" -m "$FIX/official" -i "" -o "$tmp/x.safetensors"
[ -e "$tmp/x.safetensors" ] && fail "a refused dit run wrote its output"
"$H3RUN" dit --help | grep -q "usage: h3run dit" || fail "--help"

[ $fails -eq 0 ] && echo "cli_dit: all checks passed" || echo "cli_dit: $fails failures"
exit $(( fails > 0 ))
