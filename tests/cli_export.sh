#!/usr/bin/env bash
# The exporters of tools/train (trained weights written in the release's official FL2VA/ layout) round-trip a reduced
# model (tools/h3-tinymodel): every tensor's bytes (the audio VAE's weight-norm pairs to float32 rounding), h3run
# inspect naming every component of the result, and h3run generate giving the same latents from it. Then the small
# model's training, shortened (tools/train/train_small.sh all: two datasets of 6 clips at 64x64, the VAEs and the DiT
# with the text encoder trained jointly, a few steps on the CPU): every export's check that h3run computes what the
# reference computes must pass, and the assembled model must generate a clip.
# Needs /usr/bin/python3 with torch and numpy (Debian's python3-torch, which scripts/test.sh installs): without them
# the test is skipped, except under CI, where a missing tool is a failure.
# Usage: cli_export.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
PY=${H3_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import torch, numpy" 2>/dev/null; then
    if [ -n "${CI:-}" ]; then echo "FAIL: $PY cannot import torch and numpy (apt-get install python3-torch)"; exit 1; fi
    echo "cli_export: skipped: $PY cannot import torch and numpy"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BUILD/h3-tinymodel" --no-keyframes "$tmp/tiny" >/dev/null || { echo "FAIL: h3-tinymodel"; exit 1; }
H3RUN="$H3RUN" "$PY" "$SRC/tools/train/test_export.py" "$tmp/tiny" "$tmp/out" || exit 1
"$PY" "$SRC/tools/train/test_encoders.py" || exit 1
# The training scripts end to end, a few steps on a few clips: each exits non-zero unless h3run, given the weights it
# exported, computes what the reference computed (the VAEs' decodes; the DiT's velocities with h3run's own text
# conditioning and layout).
export H3RUN H3SYNTH="$BUILD/h3-synth" H3TINY="$BUILD/h3-tinymodel" PYTHON="$PY"
CLIPS=6 JOBS=2 FRAMES=22 SIZE=64x64 VAE_STEPS=2 VV_BATCH=2 AV_BATCH=2 DIT_STEPS=2 DIT_BATCH=2 DIT_PAN=1 DIT_TEXT=1 \
    "$SRC/tools/train/train_small.sh" all "$tmp/train" >"$tmp/train.log" 2>&1 || {
    echo "FAIL: train_small.sh all"; cat "$tmp/train.log" "$tmp"/train/*.log; exit 1; }
n=$(cat "$tmp"/train/*.log | grep -cE "^ok ")
grep -hE "^(ok|FAIL) " "$tmp"/train/*.log
[ "$n" -eq 4 ] || { echo "FAIL: $n of 4 exports (video VAE, audio VAE, text encoder, DiT) agree with h3run"; exit 1; }
# a fresh encoder taught by an earlier one's latents (--teacher; the decoder from --init) exports and checks too
"$PY" "$SRC/tools/train/train_audio_vae.py" --data "$tmp"/train/data-100-*/ --template "$tmp/train/template" \
    --init "$tmp/train/av" --teacher "$tmp/train/av/audio_encoder.safetensors" --out "$tmp/av-taught" --steps 2 \
    --batch 2 --crop 4 --holdout 1 >"$tmp/taught.log" 2>&1 || { echo "FAIL: train_audio_vae.py --teacher"; cat "$tmp/taught.log"; exit 1; }
grep -q "teacher MSE" "$tmp/taught.log" && grep -hE "^ok " "$tmp/taught.log" || {
    echo "FAIL: train_audio_vae.py --teacher: no teacher loss or no passing check"; cat "$tmp/taught.log"; exit 1; }
# the decoder alone, on latents of the frozen encoder computed once, with the edge and colour terms: exports and checks
"$PY" "$SRC/tools/train/train_video_vae.py" --data "$tmp"/train/data-100-*/ --template "$tmp/train/template" \
    --init "$tmp/train/vv" --freeze-encoder --edge-weight 4 --color-weight 20 --out "$tmp/vv-decoder" --steps 2 \
    --batch 2 --holdout 1 >"$tmp/decoder.log" 2>&1 || { echo "FAIL: train_video_vae.py --freeze-encoder"; cat "$tmp/decoder.log"; exit 1; }
grep -q "encoding the training clips" "$tmp/decoder.log" && grep -hE "^ok " "$tmp/decoder.log" || {
    echo "FAIL: train_video_vae.py --freeze-encoder: no latent cache or no passing check"; cat "$tmp/decoder.log"; exit 1; }
cmp -s "$tmp/train/vv/video_encoder.safetensors" "$tmp/vv-decoder/video_encoder.safetensors" || {
    echo "FAIL: train_video_vae.py --freeze-encoder changed the encoder"; exit 1; }
# the jointly trained text encoder as a delta against its template (tools/train/delta.py) comes back byte for byte
te=$tmp/train/model/text_encoder/model.safetensors
"$PY" "$SRC/tools/train/delta.py" pack "$tmp/train/template/text_encoder/model.safetensors" "$te" "$tmp/te.delta.xz" \
    >"$tmp/delta.log" || { echo "FAIL: delta.py pack"; exit 1; }
"$PY" "$SRC/tools/train/delta.py" unpack "$tmp/train/template/text_encoder/model.safetensors" "$tmp/te.delta.xz" \
    "$tmp/te.back" "$(sha256sum "$te" | cut -c1-64)" && cmp -s "$te" "$tmp/te.back" || {
    echo "FAIL: delta.py unpack did not give the trained file back"; exit 1; }
"$PY" "$SRC/tools/train/delta.py" unpack "$tmp/train/template/text_encoder/model.safetensors" "$tmp/te.delta.xz" \
    "$tmp/te.wrong" "$(printf '0%.0s' $(seq 64))" 2>/dev/null && { echo "FAIL: delta.py accepted a wrong sha256"; exit 1; }
[ ! -e "$tmp/te.wrong" ] || { echo "FAIL: delta.py wrote a file that fails its check"; exit 1; }
echo "ok   delta.py: $(cat "$tmp/delta.log")"
# the release-structure encoders travel in the exported VAE files, under the release's names
"$H3RUN" inspect "$tmp/train/model/audio_vae" 2>&1 | grep -q "DAC encoder" || {
    echo "FAIL: the exported audio VAE holds no encoder"; exit 1; }
vv=$tmp/train/model/video_vae/source/model.safetensors
"$H3RUN" inspect "$vv" 2>&1 | grep -q "encoder.down.1.block.0.nin_shortcut" || {
    echo "FAIL: the exported video VAE holds no encoder under the release's names"; exit 1; }
"$H3RUN" generate --model "$tmp/train/model" --prompt "$("$BUILD/h3-synth" prompt 0)" --frames 22 --size 64x64 \
    --steps 2 --seed 1 --device cpu --progress none -o "$tmp/trained.mp4" >"$tmp/gen.log" 2>&1 || {
    echo "FAIL: generate with the trained model: $(tail -2 "$tmp/gen.log")"; exit 1; }
# the small model's LoRAs (tools/train/train_small_loras.sh), shortened: the bounce LoRA on clips whose motion differs
# from their captions, the turbo LoRA distilled from 8-call teacher trajectories; each export's check (h3run dit
# --lora against the reference forward with the factors merged) must pass; pack_small.py's transport folder must
# still give the model's encoders
"$PY" "$SRC/tools/train/pack_small.py" "$SRC/models/h3-small" "$tmp/small" >/dev/null || { echo "FAIL: pack_small.py"; exit 1; }
[ ! -e "$tmp/small/text_encoder" ] && [ -d "$tmp/small/transformer" ] || { echo "FAIL: pack_small.py's folder"; exit 1; }
DEVICE=cpu STEPS=2 BATCH=2 CLIPS=2 FRAMES=22 SIZE=64x64 TRAJECTORIES=4 TEACHER_STEPS=8 \
    "$SRC/tools/train/train_small_loras.sh" "$SRC/models/h3-small" "$tmp/loras" >"$tmp/loras.log" 2>&1 || {
    echo "FAIL: train_small_loras.sh"; cat "$tmp/loras.log" "$tmp"/loras/*.log; exit 1; }
n=$(cat "$tmp"/loras/bounce.log "$tmp"/loras/turbo.log | grep -cE "^ok ")
[ "$n" -eq 4 ] || { echo "FAIL: $n of 4 LoRA checks (trained and random factors, two LoRAs) agree with h3run"; cat "$tmp"/loras/*.log; exit 1; }
cat "$tmp"/loras/bounce-?/captions.jsonl >"$tmp/caps.jsonl"
! grep -qv '"shown_motion": "bounce"' "$tmp/caps.jsonl" && grep -q '"motion": "left"\|"motion": "right"\|"motion": "up"\|"motion": "down"\|"motion": "stay"' "$tmp/caps.jsonl" || {
    echo "FAIL: the bounce LoRA's clips are not all bouncing under captions of other motions"; cat "$tmp/caps.jsonl"; exit 1; }
grep -q "teacher: 4 trajectories of 8 Euler calls" "$tmp/loras/turbo.log" || { echo "FAIL: no teacher trajectories"; exit 1; }
grep -hE "^ok " "$tmp"/loras/bounce.log "$tmp"/loras/turbo.log
# fl2va on the small model (tools/train/add_vision.py, keyframe_inputs.py, train_dit.py --keyframes), shortened: a
# vision tower added to the trained model's text encoder as a second shard (generate then takes a first frame), the
# keyframe examples made by generate's own --dump-dit-inputs, and the DiT trained with them: both checks (a text-only
# and a keyframe example, h3run dit against the reference forward) must pass
"$BUILD/h3-tinymodel" --tokenizer "$tmp/train/model/tokenizer/tokenizer.json" "$tmp/tplv" >/dev/null || {
    echo "FAIL: h3-tinymodel (with a vision tower)"; exit 1; }
cp -r "$tmp/train/model" "$tmp/kfmodel"
"$PY" "$SRC/tools/train/add_vision.py" "$tmp/tplv/text_encoder" "$tmp/kfmodel/text_encoder" >"$tmp/vision.log" || {
    echo "FAIL: add_vision.py"; exit 1; }
cmp -s "$tmp/train/model/text_encoder/model.safetensors" "$tmp/kfmodel/text_encoder/model-00001-of-00002.safetensors" || {
    echo "FAIL: add_vision.py rewrote the language weights"; exit 1; }
"$PY" "$SRC/tools/train/add_vision.py" "$tmp/tplv/text_encoder" "$tmp/kfmodel/text_encoder" 2>/dev/null && {
    echo "FAIL: add_vision.py added a second tower"; exit 1; }
mkdir -p "$tmp/kf"
for j in 0 1; do
    "$BUILD/h3-synth" dataset "$tmp/kf/data-$j" --clips 3 --frames 22 --size 64x64 --seed $((300 + j)) >/dev/null 2>&1 || {
        echo "FAIL: h3-synth dataset"; exit 1; }
done
"$PY" "$SRC/tools/train/keyframe_inputs.py" --data "$tmp"/kf/data-0 "$tmp"/kf/data-1 --model "$tmp/kfmodel" \
    --per-dataset 3 --jobs 2 --out "$tmp/kf/pack.safetensors" >"$tmp/kfpack.log" 2>&1 || {
    echo "FAIL: keyframe_inputs.py"; cat "$tmp/kfpack.log"; exit 1; }
grep -q "6 examples" "$tmp/kfpack.log" || { echo "FAIL: keyframe_inputs.py: $(tail -1 "$tmp/kfpack.log")"; exit 1; }
"$PY" "$SRC/tools/train/train_dit.py" --data "$tmp"/kf/data-0 "$tmp"/kf/data-1 --template "$tmp/kfmodel" \
    --init "$tmp/kfmodel" --vae "$tmp/kfmodel" --keyframes "$tmp/kf/pack.safetensors" --out "$tmp/kf/dit" --steps 2 \
    --batch 2 >"$tmp/kfdit.log" 2>&1 || { echo "FAIL: train_dit.py --keyframes"; cat "$tmp/kfdit.log"; exit 1; }
n=$(grep -cE "^ok " "$tmp/kfdit.log")
grep -hE "^(ok|FAIL) " "$tmp/kfdit.log"
[ "$n" -eq 2 ] && grep -q "keyframes example" "$tmp/kfdit.log" || {
    echo "FAIL: $n of 2 DiT checks (text-only and keyframe examples) agree with h3run"; cat "$tmp/kfdit.log"; exit 1; }
# a pack made for other clips is refused
"$PY" "$SRC/tools/train/train_dit.py" --data "$tmp"/kf/data-1 --template "$tmp/kfmodel" --vae "$tmp/kfmodel" \
    --keyframes "$tmp/kf/pack.safetensors" --out "$tmp/kf/dit2" --steps 1 --batch 2 >"$tmp/kfdit2.log" 2>&1 && {
    echo "FAIL: train_dit.py took a keyframe pack of other clips"; exit 1; }
grep -q "not this run's" "$tmp/kfdit2.log" || { echo "FAIL: train_dit.py: $(tail -1 "$tmp/kfdit2.log")"; exit 1; }
echo "ok   keyframe training: add_vision.py, keyframe_inputs.py, train_dit.py --keyframes"
echo "cli_export: all passed"
