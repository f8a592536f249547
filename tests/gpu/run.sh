#!/usr/bin/env bash
# On the GPU machine: runs the bundled GPU tests and benchmarks (see bundle.sh) and the torch comparisons,
# logging each to $OUT. Usage: tests/gpu/run.sh [step ...]
#   steps: info ops attn bench sdpa (the default set), dit-test, te-test, dit-cuda (DIT_ARGS passes bench_dit_cuda's
#   options: DIT_ARGS="--quant fp8 --attention fp8" DIT_WORKLOADS=W124 ... dit-cuda dit-diffusers is the low-bit step
#   against diffusers' bf16 step in one run), dit-diffusers, gpu-compare, streamer,
#   audio-vae (the audio decoder's ops and decode vs the CPU, then its release-size stereo decode against diffusers';
#   AUDIO_BENCH passes bench_audio_vae_cuda's arguments, default --math all),
#   stream-bench (STREAM_ARGS passes its arguments), generate, long (a two-prompt clip in windows, GPU vs CPU),
#   lora-stream (a LoRA merged into resident blocks, merged into streamed blocks as they arrive, and on the side path,
#   each against the CPU),
#   quant (QUANT_BENCH, QUANT_STREAM),
#   overheads (bench_stream_read from a cached and a cold file, on the host and through the device; bench_media_encode:
#   the MP4 writer fed as generate feeds it; OVH_LAYERS sets the read file's layers, default 24 = 6.6 GB),
#   ref2va (compare_ref2va_diffusers: references against diffusers' ref2va blocks),
#   fl2va (test_te_cuda vision, test_video_vae_cuda encoder, then compare_fl2va_diffusers, compare_te_vision_transformers,
#   compare_vae_encode_diffusers, compare_lora_diffusers),
#   e2e (bench/e2e.sh: the release-shaped model, h3run generate at two budgets against diffusers' stages; E2E_*),
#   serve (bench/serve_reuse.py: h3run serve's second job on e2e's model, its DiT at least 3x sooner; SERVE_ARGS),
#   video-vae (the video VAE GPU vs CPU, then h3run's and diffusers' W124 decodes; VVAE_ARGS, VVAE_DIFFUSERS_ARGS),
#   vae-split (GPU 0's share of the video decode split over 2 and 4 GPUs against the whole decode, W124 and W362),
#   keyframes (the small model's DiT trained with keyframes, and with references when .devbundle/references.safetensors.xz is there: RUN.md steps 12, 13),
#   lt-fp8 (bench/lt_fp8_modes.cu: cuBLASLt's fp8 GEMM per-tensor vs per-row scales, fast accumulation; LT_ROWS),
#   ab (bench_cuda_kernels' attention, base and each H3_BUNDLE_VARIANTS build alternated twice; AB_ROWS; AB_TEST
#   runs those test_cuda_ops cases on each build first),
#   lowbit (the low-bit attention kernels: test_cuda_ops attention*, test_dit_cuda full_width*, bench_cuda_kernels at
#   W124's sequence with q, k, v in ±3), lowbit-ncu (Nsight Compute on one launch of Hopper's fp8 kernel there),
#   sparse (block-sparse attention: test_cuda_ops attention_sparse, test_dit_cuda full_width_sparse, bench_cuda_kernels
#   at W362's 55,904 rows, bench_dit_cuda --attention sparse W362: the dense and sparse steps of one process),
#   sp (test_dit_sp_cuda: the DiT split over SP_RANKS GPUs, default 2, over NCCL against the whole forward; NCCL from
#   the system or torch's nvidia-nccl package),
#   train (tools/train/train_small.sh on the GPU: TRAIN_STAGES, default "smoke vae"; TRAIN_FROM a folder holding an
#   earlier run's vv/ and av/; the other settings pass through the environment; results in $OUT/train/train.tgz.* parts)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/h3out}
mkdir -p "$OUT"
[ -f .devbundle/lib.tar.xz ] && [ ! -d .devbundle/lib ] && tar xJf .devbundle/lib.tar.xz -C .devbundle
export LD_LIBRARY_PATH="$PWD/.devbundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export H3_SOURCE_DIR="$PWD" H3_BUILD_DIR="$PWD/.devbundle/bin" H3RUN="$PWD/.devbundle/bin/h3run"
B=.devbundle/bin
for d in .devbundle/diffusers.tar.gz .devbundle/diffusers.tar.xz; do
    [ -f $d ] && mkdir -p /tmp/diffusers && tar xf $d -C /tmp/diffusers && export DIFFUSERS_SRC=/tmp/diffusers
done
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(info ops attn bench sdpa)
rc=0
for s in "${steps[@]}"; do
    echo "=== $s"
    case $s in
        sp) nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
            LD_LIBRARY_PATH="${nccl:+$nccl:}$LD_LIBRARY_PATH" $B/test_dit_sp_cuda "${SP_RANKS:-2}" 2>&1 | tee "$OUT/sp.log"
            rc=$((rc | PIPESTATUS[0])) ;;
        lowbit) $B/test_cuda_ops attention 2>&1 | tee "$OUT/test_cuda_ops_attention.log"; rc=$((rc | PIPESTATUS[0]))
                $B/test_dit_cuda full_width 2>&1 | tee "$OUT/test_dit_cuda_full_width.log"; rc=$((rc | PIPESTATUS[0]))
                H3_BENCH_ATTN_AMP=3 $B/bench_cuda_kernels 19412 2>&1 | tee "$OUT/bench_cuda_kernels_19412.log"
                rc=$((rc | PIPESTATUS[0])) ;;
        lowbit-ncu) # where the fp8 kernel's time goes at W124's shapes: one launch under Nsight Compute
            ncu --kernel-name regex:attn_wgmma8_fp8 --launch-count 1 --section SpeedOfLight \
                --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
                --section InstructionStats --section Occupancy \
                env H3_BENCH_ATTN_AMP=3 $B/bench_cuda_kernels 19412 > "$OUT/ncu_fp8_19412.txt" 2>&1
            rc=$((rc | $?)); tail -120 "$OUT/ncu_fp8_19412.txt"
            # each pipe's share and each stall reason per issued instruction, the kernel's SASS, and the stall
            # samples per SASS instruction
            ncu --kernel-name regex:attn_wgmma8_fp8 --launch-count 1 --section SourceCounters --section WarpStateStats \
                --metrics 'regex:^(sm__inst_executed_pipe_|sm__pipe_|smsp__average_warps_issue_stalled_).*(pct_of_peak_sustained_active|per_issue_active\.ratio)$' \
                -o "$OUT/ncu_fp8" env H3_BENCH_ATTN_AMP=3 H3_BENCH_ATTN_ONLY=1 $B/bench_cuda_kernels 19412 > /dev/null 2>&1
            ncu -i "$OUT/ncu_fp8.ncu-rep" --page details --print-details all > "$OUT/ncu_fp8_details.txt" 2>&1
            ncu -i "$OUT/ncu_fp8.ncu-rep" --page raw --csv > "$OUT/ncu_fp8_raw.csv" 2>&1
            ncu -i "$OUT/ncu_fp8.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_fp8_sass.csv" 2>&1
            cuobjdump -sass $B/bench_cuda_kernels |
                awk '/Function : _Z15attn_wgmma8_fp8/{f=1;print;next} f&&/Function :/{exit} f{print}' > "$OUT/fp8.sass"
            grep -E "pipe_|stalled" "$OUT/ncu_fp8_details.txt" | head -80 ;;
        ab) # A/B of kernel variants (bundle.sh H3_BUNDLE_VARIANTS): the base and each variant's bench, alternated
            # AB_ROUNDS times (2); AB_TEST names test_cuda_ops cases each build runs first (e.g. attention_fp8)
            [ -n "${AB_TEST:-}" ] && for t in $B/test_cuda_ops $B/test_cuda_ops.*; do
                [ -x "$t" ] || continue
                $t $AB_TEST > "$OUT/ab_$(basename "$t").log" 2>&1; r=$?; rc=$((rc | r))
                echo "--- $(basename "$t") $AB_TEST: exit $r"; tail -2 "$OUT/ab_$(basename "$t").log"
            done
            for round in $(seq "${AB_ROUNDS:-2}"); do
                for b in $B/bench_cuda_kernels $B/bench_cuda_kernels.*; do
                    echo "--- $(basename "$b") round $round"
                    H3_BENCH_ATTN_AMP=3 H3_BENCH_ATTN_ONLY=1 $b ${AB_ROWS:-19412} 2>&1 | grep attention
                done
            done 2>&1 | tee "$OUT/ab_${AB_ROWS:-19412}.log" ;;
        lt-fp8) # cuBLASLt's fp8 GEMM at W124's block shapes: per-tensor against per-row/per-token scales, with and
                # without fast accumulation (bench/lt_fp8_modes.cu, standalone, built here)
            nvcc -O2 -o /tmp/lt_fp8_modes bench/lt_fp8_modes.cu -lcublasLt &&
                /tmp/lt_fp8_modes ${LT_ROWS:-19412} 2>&1 | tee "$OUT/lt_fp8_modes.log"; rc=$((rc | PIPESTATUS[0])) ;;
        sparse) $B/test_cuda_ops attention_sparse 2>&1 | tee "$OUT/test_cuda_ops_sparse.log"; rc=$((rc | PIPESTATUS[0]))
                $B/test_dit_cuda full_width_sparse 2>&1 | tee "$OUT/test_dit_cuda_sparse.log"; rc=$((rc | PIPESTATUS[0]))
                $B/bench_dit_cuda --attention sparse W362 2>&1 | tee "$OUT/bench_dit_cuda_sparse.log"
                rc=$((rc | PIPESTATUS[0]))
                $B/bench_cuda_kernels 55904 2>&1 | tee "$OUT/bench_cuda_kernels_55904.log"; rc=$((rc | PIPESTATUS[0])) ;;
        info) nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv; ldd --version | head -1
              python3 -c 'import torch; print("torch", torch.__version__)' ;;
        ops) $B/test_cuda_ops 2>&1 | tee "$OUT/test_cuda_ops.log"; rc=$((rc | PIPESTATUS[0])) ;;
        attn) $B/attention_forward 2>&1 | tee "$OUT/attention_forward.log"; rc=$((rc | PIPESTATUS[0])) ;;
        bench) $B/bench_cuda_kernels 2>&1 | tee "$OUT/bench_cuda_kernels.log"; rc=$((rc | PIPESTATUS[0])) ;;
        sdpa) python3 bench/attention_sdpa.py 2>&1 | tee "$OUT/attention_sdpa.log"; rc=$((rc | PIPESTATUS[0])) ;;
        streamer) $B/test_streamer 2>&1 | tee "$OUT/test_streamer.log"; rc=$((rc | PIPESTATUS[0])) ;;
        stream-bench) $B/bench_dit_stream ${STREAM_ARGS:-} 2>&1 | tee "$OUT/bench_dit_stream.log"; rc=$((rc | PIPESTATUS[0])) ;;
        overheads) for a in "" "--device cuda" "--cold" "--device cuda --cold"; do
                # shellcheck disable=SC2086
                $B/bench_stream_read --layers "${OVH_LAYERS:-24}" $a 2>&1 | tee -a "$OUT/bench_stream_read.log"
                rc=$((rc | PIPESTATUS[0]))
            done
            $B/bench_media_encode 2>&1 | tee "$OUT/bench_media_encode.log"; rc=$((rc | PIPESTATUS[0])) ;;
        te-test) $B/test_te_cuda 2>&1 | tee "$OUT/test_te_cuda.log"; rc=$((rc | PIPESTATUS[0])) ;;
        dit-test) $B/test_dit_cuda 2>&1 | tee "$OUT/test_dit_cuda.log"; rc=$((rc | PIPESTATUS[0])) ;;
        dit-cuda) $B/bench_dit_cuda ${DIT_ARGS:-} ${DIT_WORKLOADS:-W73 W124 W362} 2>&1 | tee "$OUT/bench_dit_cuda.log"; rc=$((rc | PIPESTATUS[0])) ;;
        dit-diffusers) PYTHONUNBUFFERED=1 python3 bench/dit_diffusers.py ${DIT_WORKLOADS:-W73 W124 W362} 2>&1 | tee "$OUT/dit_diffusers.log"; rc=$((rc | PIPESTATUS[0])) ;;
        audio-vae) # the audio VAE on the GPU: the batched convs and the fused activation vs the CPU, the decode vs the
                   # CPU and the fixtures with its device memory vs the plan, then the 5.2 s stereo decode timed against
                   # diffusers' in the same run
            for c in conv_batched snake_aa; do
                H3_TEST_VERBOSE=1 $B/test_cuda_ops $c 2>&1 | tee "$OUT/test_cuda_ops_$c.log"; rc=$((rc | PIPESTATUS[0]))
            done
            $B/test_audio_vae cuda 2>&1 | tee "$OUT/test_audio_vae_cuda.log"; rc=$((rc | PIPESTATUS[0]))
            $B/bench_audio_vae_cuda ${AUDIO_BENCH:---math all} 2>&1 | tee "$OUT/bench_audio_vae_cuda.log"
            rc=$((rc | PIPESTATUS[0]))
            PYTHONUNBUFFERED=1 python3 bench/audio_vae_diffusers.py 2>&1 | tee "$OUT/audio_vae_diffusers.log"
            rc=$((rc | PIPESTATUS[0])) ;;
        gpu-compare) for f in tests/gpu/compare_*.py; do echo "--- $f"; PYTHONUNBUFFERED=1 python3 "$f" 2>&1 | tee "$OUT/$(basename "$f" .py).log"; rc=$((rc | PIPESTATUS[0])); done ;;
        train) # the small model's training: a 2-step smoke of every stage first, then the stages asked for
            W=${TRAIN_WORK:-/tmp/h3train}; mkdir -p "$W" "$OUT/train"
            # the Qwen3 tokenizer travels xz-packed (bundle it: xz -c tests/js/node_modules/.../tokenizer.json)
            [ -f .devbundle/tokenizer.json.xz ] && xz -dc .devbundle/tokenizer.json.xz >/tmp/tokenizer.json
            export DEVICE=cuda H3TINY=$B/h3-tinymodel H3SYNTH=$B/h3-synth TOKENIZER=${TOKENIZER:-/tmp/tokenizer.json}
            [ -n "${TRAIN_FROM:-}" ] && cp -r "$TRAIN_FROM"/vv "$TRAIN_FROM"/av "$W"/
            for st in ${TRAIN_STAGES:-smoke vae}; do
                if [ "$st" = smoke ]; then
                    CLIPS=6 JOBS=2 FRAMES=22 SIZE=64x64 VAE_STEPS=2 DIT_STEPS=2 DIT_BATCH=2 VAE_MINUTES= DIT_MINUTES= \
                        tools/train/train_small.sh all /tmp/h3smoke 2>&1 | tail -n 3 | tee "$OUT/train/smoke.log"
                    rc=$((rc | PIPESTATUS[0]))
                else
                    tools/train/train_small.sh "$st" "$W" 2>&1 | tee "$OUT/train/$st.log"; rc=$((rc | PIPESTATUS[0]))
                fi
            done
            # everything in one archive cut in 15 MiB parts: a call brings back at most 8 files of 16 MiB, 2 folders
            # down (here: cat train.tgz.* | tar xz); vv/ and av/ brought by TRAIN_FROM stay out
            keep=(dit model); [ -z "${TRAIN_FROM:-}" ] && keep+=(vv av)
            (cd "$W" && tar czf - --exclude='*/cache' --exclude='*/heldout-*' --exclude='*/check_*' \
                $(ls -d "${keep[@]}" ./*.log 2>/dev/null) | split -b 15M - "$OUT/train/train.tgz.") ;;
        keyframes) # the small model's DiT trained with keyframes (tools/train/run/RUN.md steps 12, 13), from the shipped one:
                   # .devbundle/small (pack_small.py), .devbundle/keyframes.safetensors (keyframe_inputs.py, made where
                   # libav reads the images) and .devbundle/textcache.tar.xz (the captions' text states); the datasets
                   # are rendered here (seeds 200-207, as keyframe_inputs.py's were); DIT_MINUTES, DIT_LR, DIT_BATCH,
                   # KF_SHARE; the transformer and the log come back in $OUT
            W=${TRAIN_WORK:-/tmp/h3kf}; mkdir -p "$W/out/cache"
            # (small/ may travel xz-packed: tar cf - small | xz >.devbundle/small.tar.xz)
            [ -f .devbundle/small.tar.xz ] && [ ! -d .devbundle/small ] && tar xJf .devbundle/small.tar.xz -C .devbundle
            [ -f .devbundle/keyframes.safetensors.xz ] && xz -dc .devbundle/keyframes.safetensors.xz >.devbundle/keyframes.safetensors
            # a ref2va pack beside it (keyframe_inputs.py --reference: RUN.md step 13) trains the references too
            [ -f .devbundle/references.safetensors.xz ] && xz -dc .devbundle/references.safetensors.xz >.devbundle/references.safetensors
            packs=(.devbundle/keyframes.safetensors)
            [ -f .devbundle/references.safetensors ] && packs+=(.devbundle/references.safetensors)
            tar xJf .devbundle/textcache.tar.xz -C "$W/out/cache" || rc=1
            for j in 0 1 2 3 4 5 6 7; do
                $B/h3-synth dataset "$W/data-200-$j" --clips 250 --frames 56 --size 128x128 --seed $((200 + j)) >/dev/null &
            done
            wait
            H3RUN=$PWD/$B/h3run H3SYNTH=$PWD/$B/h3-synth PYTHONUNBUFFERED=1 python3 tools/train/train_dit.py \
                --data "$W"/data-200-{0,1,2,3,4,5,6,7} --template .devbundle/small --init .devbundle/small \
                --vae .devbundle/small --keyframes "${packs[@]}" --keyframe-share "${KF_SHARE:-0.5}" \
                --out "$W/out" --device cuda --batch "${DIT_BATCH:-32}" --lr "${DIT_LR:-3e-4}" --pan-weight 1 \
                --minutes "${DIT_MINUTES:-6}" 2>&1 | tee "$OUT/dit_keyframes.log"; rc=$((rc | PIPESTATUS[0]))
            cp "$W"/out/transformer/* "$W/out/dit_train.json" "$OUT/" ;;
        generate) # the CLI end to end with the DiT on the GPU (tiny random model): test_generate compares the
                  # latents with the CPU's; h3run writes a clip on each device (ffprobe checks them in CI's test)
            $B/test_generate cuda 2>&1 | tee "$OUT/test_generate.log"; rc=$((rc | PIPESTATUS[0]))
            $B/h3-tinymodel /tmp/h3-tiny >/dev/null || rc=1
            for d in cpu cuda; do
                t0=$(date +%s.%N)
                $B/h3run generate --model /tmp/h3-tiny --frames 22 --size 128x128 --device $d -q \
                    -o "$OUT/tiny-$d.mp4" --prompt "a harbor at sunrise. <d>[English] Good morning!</d>" \
                    2>&1 | tee -a "$OUT/generate.log"; rc=$((rc | PIPESTATUS[0]))
                echo "$d: $(awk "BEGIN{print $(date +%s.%N) - $t0}") s, $(stat -c %s "$OUT/tiny-$d.mp4" 2>/dev/null) bytes" \
                    | tee -a "$OUT/generate.log"
            done
            # a budget (placement, memory report, trace), then one nothing fits (exit 1 before loading)
            $B/h3run generate --model /tmp/h3-tiny --frames 22 --size 128x128 --device cuda --progress none \
                --vram-budget 0.25GiB --ram-budget 1GiB --memory-trace "$OUT/trace.json" -o "$OUT/tiny-budget.mp4" \
                --prompt "a harbor at sunrise." 2>&1 | tee -a "$OUT/generate.log"; rc=$((rc | PIPESTATUS[0]))
            $B/h3run generate --model /tmp/h3-tiny --frames 22 --size 128x128 --device cuda --progress json \
                --vram-budget 16MiB -o "$OUT/tiny-nofit.mp4" --prompt "x" 2>&1 | tee -a "$OUT/generate.log"
            [ "${PIPESTATUS[0]}" = 1 ] && [ ! -e "$OUT/tiny-nofit.mp4" ] || { echo "FAIL: 16MiB"; rc=1; } ;;
        group) # generate --gpus 2 (pipeline/dit_group.h) on the tiny random model. With two GPUs or more: the clip's
               # latents against --gpus 1's (same seed), equal within bf16 rounding. With one: both ranks on GPU 0
               # (H3_DIT_GROUP_ONE_GPU=1), so the worker process starts, takes its setup and its GPU, and NCCL refuses
               # two ranks on one GPU: the run must end at once with exit 1 naming NCCL, no worker left, no clip.
            nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
            export LD_LIBRARY_PATH="${nccl:+$nccl:}$LD_LIBRARY_PATH"
            $B/h3-tinymodel /tmp/h3-tiny >/dev/null || rc=1
            G=(generate --model /tmp/h3-tiny --frames 22 --size 128x128 --device cuda --seed 7 --steps 4 --progress lines
               --vram-budget 8GiB --prompt "a harbor at sunrise.")
            if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
                $B/h3run "${G[@]}" --latents "$OUT/one.safetensors" -o "$OUT/one.mp4" 2>&1 | tee "$OUT/group.log"
                rc=$((rc | PIPESTATUS[0]))
                $B/h3run "${G[@]}" --gpus 2 --latents "$OUT/two.safetensors" -o "$OUT/two.mp4" 2>&1 | tee -a "$OUT/group.log"
                rc=$((rc | PIPESTATUS[0]))
                d=$(python3 tests/latents_tool.py distance "$OUT/one.safetensors" "$OUT/two.safetensors")
                echo "two GPUs against one (video, audio latents, relative L2): $d" | tee -a "$OUT/group.log"
                awk -v d="$d" 'BEGIN { n = split(d, x, " "); exit !(n == 2 && x[1] + 0 <= 2e-2 && x[2] + 0 <= 2e-2) }' ||
                    { echo "FAIL: two GPUs' latents off one's: $d"; rc=1; }
                # the video decode split over both GPUs against GPU 0's alone, of the same latents: the same frames
                $B/h3run "${G[@]}" --gpus 2 --latents "$OUT/two.safetensors" --png-dir "$OUT/two-png" -o "$OUT/two.mp4" \
                    >>"$OUT/group.log" 2>&1 || rc=1
                $B/h3run decode --model /tmp/h3-tiny --latents "$OUT/two.safetensors" --out "$OUT/one-png" \
                    >>"$OUT/group.log" 2>&1 || rc=1
                if cmp -s <(cd "$OUT/two-png" && cat -- *.png | md5sum) <(cd "$OUT/one-png" && cat -- *.png | md5sum); then
                    echo "the split decode's PNG frames equal GPU 0's alone" | tee -a "$OUT/group.log"
                else
                    echo "FAIL: the split decode's PNG frames differ from GPU 0's alone" | tee -a "$OUT/group.log"; rc=1
                fi
            else
                H3_BUILD_DIR=$B $B/test_dit_group processes 2>&1 | tee "$OUT/test_dit_group.log"; rc=$((rc | PIPESTATUS[0]))
                t0=$(date +%s)
                H3_DIT_GROUP_ONE_GPU=1 timeout 300 $B/h3run "${G[@]}" --gpus 2 -o "$OUT/two.mp4" 2>&1 | tee -a "$OUT/group.log"
                code=${PIPESTATUS[0]}
                echo "exit $code after $(($(date +%s) - t0)) s; workers left: $(pgrep -fc '__dit-rank' || true)" | tee -a "$OUT/group.log"
                [ "$code" = 1 ] && grep -q "NCCL" "$OUT/group.log" && [ ! -e "$OUT/two.mp4" ] &&
                    [ "$(pgrep -fc '__dit-rank' || true)" = 0 ] || { echo "FAIL: group on one GPU"; rc=1; }
            fi ;;
        lora-stream) # a LoRA on a DiT wide enough to stream at 0.4 GiB (the least that fits with the LoRA is 0.38): merged into the resident
                     # blocks (default budget), into the streamed blocks as they arrive (0.4 GiB), and on the side path
                     # (0.4 GiB, --lora-mode side); each run's latents against the CPU's (relative L2, video and audio)
            $B/h3-tinymodel --dit-hidden 1024 --dit-heads 8 --dit-ffn 4096 --dit-blocks 6 --force /tmp/h3-tw >/dev/null || rc=1
            $B/h3-testdata lora /tmp/h3-tw-lora.safetensors --dit /tmp/h3-tw/transformer --rank 16 || rc=1
            for cfg in "cpu:--device cpu" "nolora:--device cuda" "resident:--device cuda" \
                "arrival:--device cuda --vram-budget 0.4GiB" "side:--device cuda --vram-budget 0.4GiB --lora-mode side"; do
                n=${cfg%%:*} l=(--lora /tmp/h3-tw-lora.safetensors)
                [ "$n" = nolora ] && l=()
                # shellcheck disable=SC2086
                $B/h3run generate --model /tmp/h3-tw --prompt "a harbor at sunrise." --frames 22 --size 64x64 --steps 4 \
                    --seed 3 "${l[@]}" ${cfg#*:} --progress none --latents "$OUT/lora-$n.safetensors" \
                    -o "/tmp/lora-$n.mp4" >"$OUT/lora-$n.log" 2>&1 || { echo "FAIL: generate $n"; cat "$OUT/lora-$n.log"; rc=1; }
            done
            grep -h "LoRA:" "$OUT"/lora-*.log | tee -a "$OUT/lora-stream.log"
            for n in nolora resident arrival side; do
                echo "$n against the CPU (video, audio): $(python3 tests/latents_tool.py distance "$OUT/lora-cpu.safetensors" \
                    "$OUT/lora-$n.safetensors" | tr '\n' ' ')" | tee -a "$OUT/lora-stream.log"
            done ;;
        long) # a long clip on the GPU (pipeline/window.h): the tiny random model, two prompts in windows of 56 frames,
              # on the CPU and the GPU, then the same with keyframes in two of its windows; the latents compared
              # (relative L2, video and audio)
            $B/h3-tinymodel /tmp/h3-tiny-long >/dev/null || rc=1
            python3 -c "from PIL import Image; Image.new('RGB', (160, 128), (200, 30, 30)).save('/tmp/kf-a.png'); \
Image.new('RGB', (128, 96), (20, 40, 220)).save('/tmp/kf-b.png')" || rc=1
            for kf in "" "--first-frame /tmp/kf-a.png --keyframe /tmp/kf-b.png@60"; do
                for d in cpu cuda; do
                    # shellcheck disable=SC2086
                    $B/h3run generate --model /tmp/h3-tiny-long --frames 124 --window 56 --overlap 17 --size 128x128 \
                        --steps 4 --seed 2 --device $d --progress none --prompt "a harbor at sunrise" $kf \
                        --prompt "a storm over the sea, thunder" --latents "$OUT/long-$d.st" -o "$OUT/long-$d.mp4" -v \
                        2>&1 | grep -E "window|wrote|error|keyframes" | tee -a "$OUT/long.log"; rc=$((rc | PIPESTATUS[0]))
                done
                echo "${kf:-no keyframes}: relative L2 of the GPU's latents off the CPU's (video, audio): $(python3 \
                    tests/latents_tool.py distance "$OUT/long-cpu.st" "$OUT/long-cuda.st")" | tee -a "$OUT/long.log"
            done ;;
        fl2va) # keyframes: the vision tower and the video VAE encoder on the GPU against the CPU, then the torch
               # comparisons of the processor and tower (transformers), the encoder and fl2va's packing and sampling
               # (diffusers)
            $B/test_te_cuda vision 2>&1 | tee "$OUT/test_te_cuda_vision.log"; rc=$((rc | PIPESTATUS[0]))
            $B/test_video_vae_cuda encoder 2>&1 | tee "$OUT/test_video_vae_cuda_encoder.log"; rc=$((rc | PIPESTATUS[0]))
            for f in compare_fl2va_diffusers compare_te_vision_transformers compare_vae_encode_diffusers compare_lora_diffusers; do
                echo "--- $f"; PYTHONUNBUFFERED=1 python3 "tests/gpu/$f.py" 2>&1 | tee "$OUT/$f.log"; rc=$((rc | PIPESTATUS[0]))
            done ;;
        ref2va) # references: their normalization, presentation, text states with video blocks, rows, packing and
                # sampling against diffusers' ref2va blocks and transformers (compare_ref2va_diffusers.py)
            echo "--- compare_ref2va_diffusers"; PYTHONUNBUFFERED=1 python3 tests/gpu/compare_ref2va_diffusers.py 2>&1 \
                | tee "$OUT/compare_ref2va_diffusers.log"; rc=$((rc | PIPESTATUS[0])) ;;
        e2e) bash bench/e2e.sh 2>&1 | tee "$OUT/e2e.log"; rc=$((rc | PIPESTATUS[0])) ;;
        serve) # h3run serve's second job on the release-shaped model of e2e (written there first, or reused with
               # E2E_REUSE=1): its DiT must begin at least 3x sooner than the first's (bench/serve_reuse.py)
            if [ ! -f "${E2E_DIR:-/tmp/h3-e2e/FL2VA}/e2e_opts" ]; then
                E2E_DIFFUSERS=0 E2E_STEPS=1 E2E_FRAMES=22 E2E_SIZE=512x288 bash bench/e2e.sh >"$OUT/serve_model.log" 2>&1
            fi
            python3 bench/serve_reuse.py "$H3RUN" "${E2E_DIR:-/tmp/h3-e2e/FL2VA}" ${SERVE_ARGS:-} \
                --out "$OUT/serve_reuse.json" 2>&1 | tee "$OUT/serve_reuse.log"; rc=$((rc | PIPESTATUS[0])) ;;
        quant) # quantized weights on the GPU: the GEMM paths' parity, the quantized DiT files, then resident
               # s/step of the pruned DiT in bf16 vs int8 (W8A8) vs fp8 in one process, and int8 streamed at budgets
            $B/test_cuda_ops qgemm 2>&1 | tee "$OUT/test_cuda_ops_qgemm.log"; rc=$((rc | PIPESTATUS[0]))
            $B/test_dit_cuda quantized 2>&1 | tee "$OUT/test_dit_cuda_quantized.log"; rc=$((rc | PIPESTATUS[0]))
            $B/bench_dit_cuda --pruned ${QUANT_BENCH:---quant int8_convrot --quant fp8 W73 W124} 2>&1 \
                | tee "$OUT/bench_dit_cuda_quant.log"; rc=$((rc | PIPESTATUS[0]))
            $B/bench_dit_stream --pruned --quant int8_convrot ${QUANT_STREAM:-W124 --budgets 8,6 --no-disk} 2>&1 \
                | tee "$OUT/bench_dit_stream_int8.log"; rc=$((rc | PIPESTATUS[0])) ;;
        video-vae) # the video VAE decoder on the GPU: every fixture case, frame count and placement against the CPU
                   # (and the predicted device peak against the measured one), then the release-size decode of the
                   # W124 latents, h3run at the default budget and at 8 GiB, and diffusers' in the same run
            $B/test_video_vae_cuda 2>&1 | tee "$OUT/test_video_vae_cuda.log"; rc=$((rc | PIPESTATUS[0]))
            H3_VVAE_BLOCKS=36 $B/test_video_vae_cuda release_width 2>&1 | tee "$OUT/test_video_vae_cuda_36.log"
            rc=$((rc | PIPESTATUS[0]))
            $B/bench_video_vae_cuda ${VVAE_ARGS:-W124 --budgets default,8} 2>&1 | tee "$OUT/bench_video_vae_cuda.log"
            rc=$((rc | PIPESTATUS[0]))
            PYTHONUNBUFFERED=1 python3 bench/video_vae_diffusers.py ${VVAE_DIFFUSERS_ARGS:-W124} 2>&1 \
                | tee "$OUT/video_vae_diffusers.log"; rc=$((rc | PIPESTATUS[0])) ;;
        vae-split) # the video decode split over GPUs (h3_video_vae_decode_split), GPU 0's share measured on this GPU with
                   # the others stood in for (bench_video_vae_cuda --split N) against the whole decode in the same
                   # process: W124 on two GPUs at the default budget and 8 GiB, W362 on two, W124 on four; then the
                   # decoder's parity tests and the worker processes' launch (test_dit_group processes)
            $B/bench_video_vae_cuda W124 --budgets default,8 --split 2 2>&1 | tee "$OUT/vae_split_w124.log"; rc=$((rc | PIPESTATUS[0]))
            $B/bench_video_vae_cuda W362 --budgets default --split 2 --reps 3 2>&1 | tee "$OUT/vae_split_w362.log"; rc=$((rc | PIPESTATUS[0]))
            $B/bench_video_vae_cuda W124 --budgets default --split 4 --reps 3 2>&1 | tee "$OUT/vae_split_w124_4.log"; rc=$((rc | PIPESTATUS[0]))
            $B/test_video_vae_cuda 2>&1 | tee "$OUT/test_video_vae_cuda.log"; rc=$((rc | PIPESTATUS[0]))
            nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
            LD_LIBRARY_PATH="${nccl:+$nccl:}$LD_LIBRARY_PATH" $B/test_dit_group 2>&1 | tee "$OUT/test_dit_group.log"
            rc=$((rc | PIPESTATUS[0])) ;;
        *) echo "unknown step $s"; rc=1 ;;
    esac
done
exit $rc
