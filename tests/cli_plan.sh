#!/usr/bin/env bash
# h3run plan: the full-size release (header-only copies: real headers, data left as sparse holes) planned without
# a GPU at BENCH.md's workloads and budgets; the release-shaped model's four stages on an 8 GiB H200; a request that
# cannot fit stops with the budget that is short and what would fit; the fixtures' small components in separate
# folders; bad options exit 2 with one line.
# Usage: cli_plan.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
SRC=${H3_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/FL2VA/transformer" "$tmp/FL2VA/text_encoder"
"$BUILD/h3-testdata" dit-official "$tmp/FL2VA/transformer/model.safetensors" || fail "h3-testdata dit-official"
"$BUILD/h3-testdata" te-official "$tmp/FL2VA/text_encoder/model.safetensors" || fail "h3-testdata te-official"

# A component that does not open (a DiT whose config.json says 5 blocks, the file holds 4): exit 1 with the opener's
# message naming the file and the rule, not only an error code.
"$BUILD/h3-tinymodel" "$tmp/tiny" >/dev/null || fail "h3-tinymodel"
sed -i 's/"num_layers": 4/"num_layers": 5/' "$tmp/tiny/transformer/config.json"
"$H3RUN" plan "$tmp/tiny" --frames 22 --size 64x64 --vram-budget 1GiB >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "plan of a broken DiT exited $rc: $(cat "$tmp/err")"
grep -q "transformer.*block" "$tmp/err" || fail "plan of a broken DiT does not say what is wrong: $(cat "$tmp/err")"

# A model folder with a LoRA file beside its components (where a user keeps one): plan finds the components where
# generate finds them, the DiT in transformer/; a folder without a DiT is planned without one, and says so.
"$BUILD/h3-tinymodel" "$tmp/tiny2" >/dev/null || fail "h3-tinymodel"
"$BUILD/h3-testdata" lora "$tmp/tiny2/style.safetensors" --dit "$tmp/tiny2/transformer" --rank 4 >/dev/null || fail "h3-testdata lora"
out=$("$H3RUN" plan "$tmp/tiny2" --frames 22 --size 64x64 --device h200 2>&1) || fail "plan with a LoRA in the folder: $out"
grep -q "^model: DiT $tmp/tiny2/transformer;" <<<"$out" || fail "plan with a LoRA in the folder: no DiT: $out"
grep -q "^DiT: " <<<"$out" || fail "plan with a LoRA in the folder: no DiT stage: $out"
out=$("$H3RUN" plan "$tmp/tiny2/video_vae" --frames 22 --size 64x64 --device h200 2>&1) || fail "plan of a VAE alone: $out"
grep -q "not found, so not planned: DiT; text encoder; audio VAE;" <<<"$out" || fail "plan of a VAE alone: $out"

# W124 at 8 GiB on the H200's figures: fits, streams, and predicts the resident step time (copies hide).
out=$("$H3RUN" plan "$tmp/FL2VA" --workload W124 --vram-budget 8GiB --ram-budget 100GiB --device h200 2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] || fail "plan W124 8GiB exited $rc: $(cat "$tmp/err")"
for want in "DiT: 19412 packed rows (128 text, 414 audio, 18870 video); fits" "placement:" "streamed from pinned memory" \
            "device peak" "of 8.00 GiB" "resident weights" "stream slots" "modulation" "activations" \
            "time per step:" "ratio 1.0" "text encoder: on the device: 50 of 64 layers streamed"; do
    grep -qF -- "$want" <<<"$out" || fail "plan W124 8GiB lacks '$want': $out"
done
peak=$(sed -n 's/^  device peak \([0-9.]*\) GiB of 8.00 GiB:$/\1/p' <<<"$out")
awk -v p="$peak" 'BEGIN { exit !(p > 6 && p <= 8) }' || fail "W124 at 8 GiB: peak '$peak' GiB"
echo "W124 8GiB: $(grep -E 'placement|time per step' <<<"$out" | tr -s ' ' | tr '\n' ';')"
# --refine: the second DiT stage at the refine canvas (its longer sequence) planned and shown beside the first, the
# VAEs at the refine canvas; a refine canvas smaller than the first is refused (exit 2).
out=$("$H3RUN" plan "$tmp/FL2VA" --workload W124 --refine 1344x768:0.5 --vram-budget 8GiB --ram-budget 100GiB \
      --device h200 2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] || fail "plan --refine exited $rc: $(cat "$tmp/err")"
for want in "refine: a second pass at 1344x768, 25 model calls" "DiT: 19412 packed rows" \
            "DiT, refine pass at 1344x768: 37838 packed rows (128 text, 414 audio, 37296 video); fits"; do
    grep -qF -- "$want" <<<"$out" || fail "plan --refine lacks '$want': $out"
done
grep -qE "^  DiT refine +device " <<<"$out" || fail "plan --refine: no 'DiT refine' line in the stages: $out"
"$H3RUN" plan "$tmp/FL2VA" --workload W124 --refine 640x544 --vram-budget 8GiB >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] || fail "plan --refine 640x544 (smaller than 960x544) exited $rc, not 2"
grep -q "smaller than the first pass's 960x544" "$tmp/err" || fail "plan --refine 640x544: $(cat "$tmp/err")"

# The release-shaped model (h3-testdata model --header-only: the pruned int8 ConvRot DiT, the nvfp4 text encoder,
# the f16 video VAE, the f32 audio VAE), W124 at 8 GiB, 20 steps on the H200's figures: every stage planned on the
# device in the order it runs, each with its device peak under the budget, its host peak and its predicted time.
"$BUILD/h3-testdata" model "$tmp/rel" --header-only >/dev/null || fail "h3-testdata model --header-only"
out=$("$H3RUN" plan "$tmp/rel" --workload W124 --vram-budget 8GiB --ram-budget 100GiB --device h200 --steps 20 \
      2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] || fail "plan of the release-shaped model exited $rc: $(cat "$tmp/err")"
table=$(sed -n '/^stages, in turn/,$p' <<<"$out")
n=0
for stage in "text encoder" "DiT" "audio VAE" "video VAE"; do
    line=$(grep -E "^  $stage +(device|host) " <<<"$table")
    [ -n "$line" ] || { fail "the release-shaped plan has no line for the $stage: $out"; continue; }
    n=$((n + 1))
    # "  NAME  device  P GiB of 8.00 GiB  H GiB  T s"
    read -r place peak of bud host pred <<<"$(sed -E "s/^  $stage +//; s/ GiB//g; s/ s( .*)?$//" <<<"$line")"
    [ "$place" = device ] || fail "the $stage is not on the device at 8 GiB: $line"
    awk -v p="$peak" -v h="$host" -v t="$pred" 'BEGIN { exit !(p > 0 && p + 0.08 <= 8 && h >= 0 && t > 0) }' ||
        fail "the $stage at 8 GiB: peak '$peak', host '$host', time '$pred' ($line)"
done
[ $n -eq 4 ] && [ "$(grep -cE '^  (text encoder|DiT|audio VAE|video VAE) ' <<<"$table")" -eq 4 ] ||
    fail "the stage table does not hold exactly the four stages: $table"
# the text encoder reads its 50 nvfp4 layers (12.78 GiB), not the whole file's average bytes per parameter
grep -qF "text encoder: on the device: 50 of 64 layers streamed from the mapped file through 2 slots (12.78 GiB read per prompt)" \
    <<<"$out" || fail "the nvfp4 text encoder's bytes read per prompt: $(grep '^text encoder' <<<"$out")"
echo "release-shaped model, W124 at 8 GiB:"
echo "$table"

# With keyframes (fl2va): the video VAE encoder is a stage of its own, between the text encoder and the DiT, on the
# device at 8 GiB (the release's encoder: 0.67 GiB of f32 weights, 4 x 7 tiles of a 1344x768 keyframe, one at a time);
# a budget too small for it puts it on the host and says why; a model without a video VAE cannot plan keyframes.
out=$("$H3RUN" plan "$tmp/rel" --workload W124 --vram-budget 8GiB --ram-budget 100GiB --keyframes 2 --size 1344x768 \
      2>"$tmp/err") || fail "plan --keyframes 2 exited $?: $(cat "$tmp/err")"
grep -q "^video VAE encoder (keyframes, references): on the device: 2 images of 1344x768 px, one at a time; 4 x 7 tiles" \
    <<<"$out" || fail "plan --keyframes: no encoder stage: $out"
# the image tokens of a 1344x768 keyframe: smart_resize gives 768x1344, 48x84 patches of 16, /4 merged = 1008; with the label (8) and the ends (2), 128 + 2 x 1018 = 2164 rows
grep -q "^keyframes: 2, 1008 image tokens each at 1344x768: 2164 rows of text in all" <<<"$out" ||
    fail "plan --keyframes: the image tokens: $(grep -i keyframes <<<"$out")"
grep -q "^text encoder: on the device: .*, and the vision tower resident" <<<"$out" ||
    fail "plan --keyframes: the vision tower is not in the text encoder's stage: $(grep '^text encoder' <<<"$out")"
sed -n '/^stages, in turn/,$p' <<<"$out" | sed -n 3,4p | grep -q "^  keyframes     device" ||
    fail "plan --keyframes: the encoder is not the second stage: $out"
"$H3RUN" plan "$tmp/rel/video_vae" --keyframes 1 --vram-budget 40MiB --size 1344x768 >"$tmp/out" 2>&1
grep -q "^video VAE encoder (keyframes, references): runs on the host" "$tmp/out" || fail "plan --keyframes at 40 MiB: $(cat "$tmp/out")"
"$H3RUN" plan "$tmp/rel/audio_vae" --keyframes 1 --vram-budget 8GiB >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "keyframes needs a video VAE" "$tmp/err" || fail "plan --keyframes without a video VAE: $(cat "$tmp/err")"

# --gpus 2: the DiT split over two GPUs (sequence parallel), each GPU planned and shown with its rows, placement and
# peak; at 8 GiB a GPU the step stays within 1.1x of the two GPUs' resident one; 56 heads do not split over 3 GPUs.
out=$("$H3RUN" plan "$tmp/FL2VA" --workload W124 --gpus 2 --device h200 --ram-budget 100GiB 2>"$tmp/err") ||
    fail "plan --gpus 2 exited $?: $(cat "$tmp/err")"
for want in "GPUs: the DiT split over 2" "split over 2 GPUs (sequence parallel)" "exchange buffers" "exchanges:"             "each GPU:"; do
    grep -qF -- "$want" <<<"$out" || fail "plan --gpus 2 lacks '$want': $out"
done
grep -qE "^    0 +0\.\.9706 +52/0/0 " <<<"$out" && grep -qE "^    1 +9706\.\.19412 +52/0/0 " <<<"$out" ||
    fail "plan --gpus 2: not one line a GPU with its rows: $out"
res=$(sed -n 's/^  time per step: \([0-9.]*\) s predicted.*/\1/p' <<<"$out")
out8=$("$H3RUN" plan "$tmp/FL2VA" --workload W124 --gpus 2 --device h200 --vram-budget 8GiB --ram-budget 100GiB \
       2>"$tmp/err") || fail "plan --gpus 2 at 8 GiB exited $?: $(cat "$tmp/err")"
st8=$(sed -n 's/^  time per step: \([0-9.]*\) s predicted.*/\1/p' <<<"$out8")
awk -v a="$st8" -v b="$res" 'BEGIN { exit !(a > 0 && b > 0 && a <= 1.1 * b) }' ||
    fail "plan --gpus 2: the step at 8 GiB a GPU ($st8 s) is not within 1.1x of the resident one ($res s)"
echo "W124 on 2 GPUs: resident $res s a step, 8 GiB a GPU $st8 s"
"$H3RUN" plan "$tmp/FL2VA" --workload W124 --gpus 3 --device h200 >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "do not split over 3 GPUs.*give 2, 4, 7, 8" "$tmp/err" ||
    fail "plan --gpus 3 (56 heads): exit $rc, $(cat "$tmp/err")"
"$H3RUN" plan "$tmp/FL2VA" --workload W124 --gpus 9 --device h200 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "plan --gpus 9 was not refused as a usage error: $(cat "$tmp/err")"

# Every BENCH.md budget of W73 and W124 fits and never plans above its budget.
for w in W73 W124; do
    for b in 24 16 12 8 6; do
        out=$("$H3RUN" plan "$tmp/FL2VA/transformer" --workload $w --vram-budget ${b}GiB --device h200 -q 2>"$tmp/err")
        [ $? -eq 0 ] || fail "plan $w ${b}GiB: $(cat "$tmp/err")"
        peak=$(sed -n "s/^  device peak \([0-9.]*\) GiB of .*:$/\1/p" <<<"$out")
        awk -v p="$peak" -v b="$b" 'BEGIN { exit !(p > 0 && p <= b) }' || fail "$w ${b}GiB: peak '$peak' GiB"
    done
done

# W362 at 2 GiB cannot fit: exit 1 before loading, naming the device budget's shortfall and what would fit.
"$H3RUN" plan "$tmp/FL2VA" --workload W362 --vram-budget 2GiB --ram-budget 100GiB --steps 20 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "W362 at 2 GiB exited $rc, expected 1"
for want in "do not fit" "the device budget of 2.00 GiB is short by" "Would fit: --vram-budget" "frames" "canvas"; do
    grep -qF -- "$want" "$tmp/err" || fail "W362 at 2 GiB: the message lacks '$want': $(cat "$tmp/err")"
done
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "the message is not one line: $(cat "$tmp/err")"
grep -q "DOES NOT FIT" "$tmp/out" || fail "the plan printed does not say it does not fit"
echo "W362 2GiB: $(cat "$tmp/err")"
# ... and the budget it names does fit.
need=$(sed -n 's/.*Would fit: --vram-budget \([0-9.]*GiB\).*/\1/p' "$tmp/err")
"$H3RUN" plan "$tmp/FL2VA" --workload W362 --vram-budget "$need" --ram-budget 100GiB --steps 20 -q >/dev/null \
    2>"$tmp/err" || fail "W362 at the named $need: $(cat "$tmp/err")"
# With the default 49 steps the modulation kept for 98 timesteps (0.89 GiB) is what 2 GiB cannot hold beside a slot:
# fewer steps are named.
"$H3RUN" plan "$tmp/FL2VA" --workload W73 --vram-budget 2GiB --ram-budget 100GiB -q >/dev/null 2>"$tmp/err"
grep -qE "or [0-9]+ sampling steps" "$tmp/err" || fail "W73 at 2 GiB, 49 steps: no steps suggestion: $(cat "$tmp/err")"
steps=$(sed -n 's/.*or \([0-9]*\) sampling steps.*/\1/p' "$tmp/err")
"$H3RUN" plan "$tmp/FL2VA" --workload W73 --vram-budget 2GiB --ram-budget 100GiB --steps "$steps" -q >/dev/null 2>&1 ||
    fail "W73 at 2 GiB with the suggested $steps steps does not fit"
"$H3RUN" plan "$tmp/FL2VA" --workload W73 --vram-budget 2GiB --ram-budget 100GiB --steps $((steps + 1)) -q >/dev/null 2>&1 &&
    fail "W73 at 2 GiB with $((steps + 1)) steps fits: the suggestion was not the most"

# A host budget too small for the staging buffers and tables: the host budget is named.
"$H3RUN" plan "$tmp/FL2VA/transformer" --workload W124 --vram-budget 8GiB --ram-budget 1GiB -q >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "host budget of 1.00 GiB is short" "$tmp/err" || fail "1 GiB host budget: $(cat "$tmp/err")"
# A host budget that holds some blocks pinned: the rest are read from disk each step.
# The text encoder alone on a budget that cannot hold two of its 0.9 GiB layer slots: it runs on the host.
out=$("$H3RUN" plan "$tmp/FL2VA/text_encoder" --workload W124 --vram-budget 1.5GiB 2>&1)
grep -qF "text encoder: runs on the host: 50 of 64 layers" <<<"$out" && grep -qF "on the device it would need 1.88 GiB" <<<"$out" \
    || fail "text encoder at 1.5 GiB: $out"
out=$("$H3RUN" plan "$tmp/FL2VA/transformer" --workload W124 --vram-budget 8GiB --ram-budget 12GiB --device h200 2>&1)
grep -qE "[1-9][0-9]* from disk" <<<"$out" || fail "12 GiB host budget streams nothing from disk: $out"

# The fixtures' small components, one folder each: all found, everything resident.
F=$SRC/tests/fixtures
out=$("$H3RUN" plan "$F/dit/official" "$F/text_encoder/official" "$F/video_vae/official" --frames 22 --size 256x128 \
      --vram-budget 1GiB 2>"$tmp/err")
[ $? -eq 0 ] || fail "plan on the fixtures: $(cat "$tmp/err")"
for want in "DiT: " "4 of 4 blocks resident" "text encoder: on the device" "video VAE: on the device: 2 of 2 blocks resident"; do
    grep -qF -- "$want" <<<"$out" || fail "fixtures plan lacks '$want': $out"
done

# Bad requests: one line, exit 2.
check_usage() {
    local want=$1
    shift
    "$H3RUN" plan "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "plan $* exited $rc, expected 2: $(cat "$tmp/err")"
    grep -qF -- "$want" "$tmp/err" || fail "plan $*: message lacks '$want': $(cat "$tmp/err")"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "plan $*: not one line: $(cat "$tmp/err")"
}
check_usage "--vram-budget takes a size like 8GiB" "$tmp/FL2VA" --vram-budget 8XB
check_usage "--ram-budget must be positive" "$tmp/FL2VA" --vram-budget 8GiB --ram-budget 0
check_usage "17n+5" "$tmp/FL2VA" --vram-budget 8GiB --frames 100
check_usage "multiples of 32" "$tmp/FL2VA" --vram-budget 8GiB --size 1000x544
check_usage "--workload must be" "$tmp/FL2VA" --vram-budget 8GiB --workload W999
check_usage "no figures for a device named" "$tmp/FL2VA" --vram-budget 8GiB --device tpu
# 0 frames and 0 steps planned the defaults; prompts past the 8192 tokens a request may have; empty arguments.
check_usage "--frames takes a whole number from 1 to 14400; got '0'" "$tmp/FL2VA" --vram-budget 8GiB --frames 0
check_usage "--steps takes a whole number from 1 to 1000; got '0'" "$tmp/FL2VA" --vram-budget 8GiB --steps 0
check_usage "--text-tokens takes a whole number from 1 to 8192; got '8193'" "$tmp/FL2VA" --vram-budget 8GiB \
    --text-tokens 8193
check_usage "got 0x0" "$tmp/FL2VA" --vram-budget 8GiB --size 0x0
check_usage "an empty argument" "" --vram-budget 8GiB
"$H3RUN" plan >/dev/null 2>&1
[ $? -eq 2 ] || fail "plan without a model did not exit 2"
if ! "$H3RUN" --version | grep -q '^cuda: [1-9]'; then # no device for this h3run: the budget must be given
    check_usage "give --vram-budget" "$tmp/FL2VA"
fi
# Nothing to plan: exit 1, naming the path.
mkdir -p "$tmp/empty"
"$H3RUN" plan "$tmp/empty" --vram-budget 8GiB >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "no MiniMax-H3 component" "$tmp/err" || fail "empty folder: $(cat "$tmp/err")"

if [ $fails -eq 0 ]; then echo "cli_plan: all checks passed"; else echo "cli_plan: $fails failures"; fi
exit $((fails > 0))
