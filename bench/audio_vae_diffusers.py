"""diffusers' AutoencoderKLMiniMaxH3Audio with its default (release) config and random weights: the 5.2 s stereo
decode of BENCH.md (latents [2, 32, 207] -> waveform [2, 1, 165600]) on the GPU, in fp32 and bf16; prints the median
and spread of the decode time and the peak memory. The side-by-side figure for bench_audio_vae_cuda.

    DIFFUSERS_SRC=/path/with/src/diffusers python3 bench/audio_vae_diffusers.py [--latents T] [--reps N]

fp32 is timed as torch runs it by default (cuDNN may use TF32 tensor cores for convolutions:
torch.backends.cudnn.allow_tf32 is True) and with TF32 off (exact f32, what h3run computes); bf16 casts the whole
model (diffusers' from_pretrained would keep the decoder in fp32: _keep_in_fp32_modules). The weights are PyTorch's
default initialization (weight-normalized convs, recomputed at every forward as diffusers does); timing does not
depend on their values. Writes $OUT/audio_vae_diffusers.json when OUT is set."""
import json
import os
import sys
import time

import torch


def main():
    src = os.environ.get("DIFFUSERS_SRC")
    if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")) or not torch.cuda.is_available():
        print("audio_vae_diffusers: skipped: needs DIFFUSERS_SRC (a diffusers checkout) and a GPU")
        return 0
    sys.path.insert(0, os.path.join(src, "src"))
    from diffusers import AutoencoderKLMiniMaxH3Audio

    args = sys.argv[1:]
    T, reps = 207, 20
    for i, a in enumerate(args):
        if a == "--latents":
            T = int(args[i + 1])
        elif a == "--reps":
            reps = int(args[i + 1])
    dev = torch.device("cuda")
    torch.manual_seed(0)
    t0 = time.time()
    model = AutoencoderKLMiniMaxH3Audio().to(dev).eval()
    n_dec = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("decoder.", "dec_in_proj.")))
    print(f"diffusers AutoencoderKLMiniMaxH3Audio(): {n_dec:,} decoder parameters, built in {time.time() - t0:.1f} s "
          f"on {torch.cuda.get_device_name(0)}")
    g = torch.Generator(device=dev).manual_seed(0)
    latents = (torch.rand(2, model.config.latent_channels, T, device=dev, generator=g) * 2 - 1) * 3 ** 0.5
    results = {}
    variants = [("fp32", torch.float32, True), ("fp32, TF32 off", torch.float32, False), ("bf16", torch.bfloat16, True)]
    for name, dtype, tf32 in variants:
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        model = model.to(dtype)
        z = latents.to(dtype)
        with torch.no_grad():
            for _ in range(2):  # warm-up (cuDNN picks its algorithms)
                out = model.decode(z).sample
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = model.decode(z).sample
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1000)
        times.sort()
        med = times[len(times) // 2]
        peak = torch.cuda.max_memory_allocated() / 2**30
        dec_dtype = next(model.decoder.parameters()).dtype
        results[name] = dict(median_s=med, min_s=times[0], max_s=times[-1], peak_gib=peak, decoder_dtype=str(dec_dtype),
                             out_shape=list(out.shape))
        print(f"{name:15s} decode {med:.4f} s (min {times[0]:.4f}, max {times[-1]:.4f})  peak {peak:.2f} GiB  "
              f"decoder {dec_dtype}, out {tuple(out.shape)}")
    torch.backends.cudnn.allow_tf32 = True
    print("\n| diffusers | median s | min s | max s | peak GiB |\n|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['median_s']:.4f} | {r['min_s']:.4f} | {r['max_s']:.4f} | {r['peak_gib']:.2f} |")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "audio_vae_diffusers.json"), "w") as fh:
            json.dump(dict(latents=[2, 32, T], reps=reps, results=results), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
