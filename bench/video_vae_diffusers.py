"""diffusers' AutoencoderKLMiniMaxH3 at release size (its default config: the 2.42B-parameter ViT decoder), random
weights, tiling as released (on, 256 px tiles, at least 64 px overlap), one decode of BENCH.md's workloads: prints
seconds per decode (median with min and max over the timed repetitions, CUDA events) and the peak memory torch
allocated. The side-by-side figure for bench_video_vae_cuda (tests/gpu/run.sh video-vae runs both).

    DIFFUSERS_SRC=/path/with/src/diffusers python3 bench/video_vae_diffusers.py [W124 ...] [--modes bf16,autocast]
                                                                                 [--reps N]

Modes: bf16 (the model cast to bfloat16: the anchor in BENCH.md, 4.08 s and 5.97 GiB at W124) and autocast (float32
weights decoded under float16 autocast: what the pipeline's decode block does). The weights are generated in GPU
memory (values do not change the time): matrices with the variance of 1/fan-in, the residual scales 0.1. Writes
$OUT/video_vae_diffusers.json when OUT is set."""
import json
import os
import sys

import torch

WORKLOADS = {"W73": (960, 544, 73), "W124": (960, 544, 124), "W362": (960, 544, 362), "W124L": (1344, 768, 124)}


def latent_frames(frames):
    return 1 if frames == 1 else 2 if frames <= 5 else ((frames - 5) // 17) * 5 + 2


def build(dev, dtype):
    from diffusers import AutoencoderKLMiniMaxH3

    with torch.device("meta"):
        vae = AutoencoderKLMiniMaxH3()
    vae = vae.to_empty(device=dev)
    n = 0
    with torch.no_grad():
        for name, p in vae.named_parameters():
            n += p.numel()
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.uniform_(-(3.0 / fan_in) ** 0.5, (3.0 / fan_in) ** 0.5)
            elif "scale" in name:
                p.uniform_(-0.1, 0.1)
            elif "norm" in name and name.endswith("weight"):
                p.uniform_(0.9, 1.1)
            else:
                p.uniform_(-0.01, 0.01)
        for name, b in vae.named_buffers():  # the rotary frequencies (non-persistent, left empty by to_empty)
            if name.endswith("inv_freq"):
                dim = b.numel() * 6
                b.copy_(1.0 / 100.0 ** torch.arange(0, 1, 6 / dim, dtype=torch.float32, device=dev))
    vae = vae.to(dtype).eval()
    return vae, n


def main():
    src = os.environ.get("DIFFUSERS_SRC")
    if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")) or not torch.cuda.is_available():
        print("video_vae_diffusers: skipped: needs DIFFUSERS_SRC (a diffusers checkout) and a GPU")
        return 0
    sys.path.insert(0, os.path.join(src, "src"))
    args = sys.argv[1:]
    modes, reps, names = ["bf16"], 5, []
    i = 0
    while i < len(args):
        if args[i] == "--modes":
            modes = args[i + 1].split(",")
            i += 2
        elif args[i] == "--reps":
            reps = int(args[i + 1])
            i += 2
        else:
            names.append(args[i])
            i += 1
    names = names or ["W124"]
    dev = torch.device("cuda")
    results = {}
    for mode in modes:
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        torch.cuda.empty_cache()
        vae, n = build(dev, dtype)
        torch.cuda.synchronize()
        print(f"diffusers AutoencoderKLMiniMaxH3 ({mode}): {n:,} parameters, tiling {vae.use_tiling}, "
              f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated")
        for name in names:
            w, h, f = WORKLOADS[name]
            g = torch.Generator(device=dev).manual_seed(0)
            z = torch.randn(1, 24, latent_frames(f), h // 16, w // 16, device=dev, generator=g, dtype=dtype)
            times = []
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=mode == "autocast"):
                out = vae.decode(z, return_dict=False)[0]  # warm-up
                torch.cuda.synchronize()
                frames = out.shape[2]
                del out
                torch.cuda.reset_peak_memory_stats()
                for _ in range(reps):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    out = vae.decode(z, return_dict=False)[0]
                    b.record()
                    torch.cuda.synchronize()
                    times.append(a.elapsed_time(b) / 1000)
                    del out
            times.sort()
            med = times[len(times) // 2]
            peak = torch.cuda.max_memory_allocated() / 2**30
            results[f"{name} {mode}"] = dict(decode_s=med, spread=[times[0], times[-1]], peak_gib=peak,
                                             frames=frames, latents=list(z.shape), mode=mode)
            print(f"{name:6s} {mode:8s} latents {list(z.shape)} -> {frames} frames: {med:.3f} s per decode "
                  f"(min {times[0]:.3f}, max {times[-1]:.3f} over {reps}), peak {peak:.2f} GiB")
        del vae
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "video_vae_diffusers.json"), "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
