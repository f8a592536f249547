"""diffusers' MiniMaxH3Transformer3DModel, full size with random bf16 weights of the official shapes (fp32 islands
kept fp32), one forward = one sampling step at BENCH.md's workloads; prints s/step and peak memory.

    DIFFUSERS_SRC=/path/with/src/diffusers python3 bench/dit_diffusers.py [W73 W124 W362] [--group-offload]

--group-offload: after the resident runs, the same model moved to the host and run through diffusers' block-level
group offloading (one block per group, copies on a side stream from pinned memory: its fastest setting), at the
same workloads; the ratio to resident is printed. This is the side-by-side figure for bench_dit_stream
(tests/gpu/run.sh: DIT_WORKLOADS="W124 --group-offload" ... dit-diffusers). Not yet run.

--fp8-error: after the resident runs, how far e4m3 GEMMs move this model's output, as bench_dit_cuda --quantize fp8
measures h3run's: the inputs of every linear of the 50 blocks but the AdaLN projection rounded to e4m3 with one
scale a token (max|x| / 448) and their weights with one scale a tensor, h3run's fp8 rule, the products in bf16 with
f32 sums (the e4m3 values times their scales are exact in bf16 but for the scale's own rounding); the velocities'
relative L2 off the bf16 forward on the same inputs, with all 50 blocks so, then the first only, then the last only.

The weights are generated in GPU memory (the machine's disk cannot hold 66 GB twice); timing does not depend on
their values. Writes $OUT/dit_diffusers.json when OUT is set."""
import json
import math
import os
import sys
import time

import torch

WORKLOADS = {  # name: (width, height, frames)
    "W73": (960, 544, 73),
    "W124": (960, 544, 124),
    "W362": (960, 544, 362),
    "W124L": (1344, 768, 124),
}
TEXT = 128


def latent_frames(frames):
    return 2 if frames <= 5 else ((frames - 5) // 17) * 5 + 2


def packed_inputs(width, height, frames, device):
    """Shapes and a valid layout [text | audio L | audio R | video]; values are random (timing only)."""
    T = latent_frames(frames)
    hp, wp = height // 16 // 2, width // 16 // 2
    nv = T * hp * wp
    ta = round(frames / 24 * 40)
    na = 2 * ta
    S = TEXT + na + nv
    g = torch.Generator(device=device).manual_seed(0)
    video = torch.randn(1, nv, 96, device=device, generator=g)
    audio = torch.randn(1, na, 32, device=device, generator=g)
    text = torch.randn(1, TEXT, 5120, device=device, dtype=torch.bfloat16, generator=g)
    tags = torch.cat([torch.ones(TEXT), torch.full((na,), 2.0), torch.zeros(nv)]).long().to(device)
    tidx = torch.cat([torch.zeros(TEXT), torch.ones(na), torch.zeros(nv)]).long().to(device)
    pos = torch.zeros(S, 3, dtype=torch.float64, device=device)
    pos[:TEXT, 0] = torch.arange(TEXT)
    pos[TEXT:, 0] = TEXT + torch.rand(S - TEXT, device=device, dtype=torch.float64) * (na // 2)
    pos[TEXT:, 1:] = torch.rand(S - TEXT, 2, device=device, dtype=torch.float64) * 32
    idx = torch.arange(S, device=device)
    return dict(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text,
                timestep=torch.tensor([0.3, 0.6], device=device), timestep_indices=tidx, token_tags=tags,
                position_ids=pos, text_indices=idx[:TEXT], audio_indices=idx[TEXT:TEXT + na],
                video_indices=idx[TEXT + na:]), S, nv, na


def main():
    src = os.environ.get("DIFFUSERS_SRC")
    if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")) or not torch.cuda.is_available():
        print("dit_diffusers: skipped: needs DIFFUSERS_SRC (a diffusers checkout) and a GPU")
        return 0
    sys.path.insert(0, os.path.join(src, "src"))
    from diffusers import MiniMaxH3Transformer3DModel

    args = sys.argv[1:]
    offload = "--group-offload" in args
    fp8_error = "--fp8-error" in args
    names = [a for a in args if not a.startswith("--")] or ["W73", "W124", "W362"]
    dev = torch.device("cuda")
    t0 = time.time()
    with torch.device("meta"):
        model = MiniMaxH3Transformer3DModel()
    model = model.to_empty(device=dev)
    fp32 = ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out")
    n_params = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            keep = any(name.startswith(f) for f in fp32)
            p.data = p.data.to(torch.float32 if keep else torch.bfloat16)
            p.normal_(0.0, 0.02 if p.dim() > 1 else 0.5)
            n_params += p.numel()
        for name, b in model.named_buffers():
            if name.endswith("inv_freq"):
                b.copy_(1.0 / (10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float32, device=dev) / 32)))
    model.eval()
    torch.cuda.synchronize()
    print(f"diffusers model: {n_params:,} parameters, built in {time.time() - t0:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB")
    results = {}
    run_all(model, names, dev, results, "resident")
    if fp8_error:
        run_fp8_error(model, names, dev, results)
    if offload:
        t0 = time.time()
        # From the device: each tensor is copied to a pinned host copy and its device memory freed (moving the model
        # to the host first would hold a second, unpinned copy: 2 x 66 GB of RAM).
        model.enable_group_offload(onload_device=dev, offload_device=torch.device("cpu"), offload_type="block_level",
                                   num_blocks_per_group=1, use_stream=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        print(f"group offloading set up in {time.time() - t0:.1f} s; "
              f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB left on the device")
        run_all(model, names, dev, results, "group_offload")
        for name in names:
            r, o = results.get(f"{name} resident"), results.get(f"{name} group_offload")
            if r and o:
                print(f"{name:6s} group offloading {o['s_per_step']:.3f} s vs resident {r['s_per_step']:.3f} s: "
                      f"{o['s_per_step'] / r['s_per_step']:.2f}x, peak {o['peak_gib']:.1f} GiB")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "dit_diffusers.json"), "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


def e4m3_round(x, scale):
    """x rounded to e4m3 at scale (x / scale within ±448), back in x's dtype"""
    return ((x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def run_fp8_error(model, names, dev, results):
    """The velocities' relative L2 off the bf16 forward with the blocks' linears in e4m3 (module docstring)."""
    import torch.nn.functional as F
    active = set()
    linears = []
    for b, blk in enumerate(model.transformer_blocks):
        for lname, mod in blk.named_modules():
            if isinstance(mod, torch.nn.Linear) and not lname.startswith("adaln_proj"):
                linears.append((b, mod))

    def hooked(b, mod):
        def fwd(x):
            if b not in active:
                return F.linear(x, mod.weight, mod.bias)
            xs = (x.float().abs().amax(dim=-1, keepdim=True) / 448).clamp_min(1e-30)
            ws = (mod.weight.float().abs().amax() / 448).clamp_min(1e-30)
            return F.linear(e4m3_round(x, xs), e4m3_round(mod.weight, ws), mod.bias)
        return fwd

    for b, mod in linears:
        mod.forward = hooked(b, mod)
    nblk = len(model.transformer_blocks)
    for name in names:
        w, h, f = WORKLOADS[name]
        inputs, S, nv, na = packed_inputs(w, h, f, dev)
        with torch.no_grad():
            active.clear()
            ref = [t.float() for t in model(**inputs, return_dict=False)]
            for label, blocks in (("all blocks", range(nblk)), ("block 0 only", [0]),
                                  (f"block {nblk - 1} only", [nblk - 1])):
                active.clear()
                active.update(blocks)
                out = [t.float() for t in model(**inputs, return_dict=False)]
                rel = [float((o - r).norm() / r.norm()) for o, r in zip(out, ref)]
                results[f"{name} fp8 error {label}"] = dict(video=rel[0], audio=rel[1] if len(rel) > 1 else None)
                print(f"{name:6s} e4m3 linears, {label:13s}: velocities {rel[0]:.2e} (video)"
                      + (f" {rel[1]:.2e} (audio)" if len(rel) > 1 else "") + " relative L2 off the bf16 forward")
        active.clear()
        del inputs
        torch.cuda.empty_cache()


def run_all(model, names, dev, results, mode):
    for name in names:
        w, h, f = WORKLOADS[name]
        inputs, S, nv, na = packed_inputs(w, h, f, dev)
        torch.cuda.reset_peak_memory_stats()
        reps = 2 if S > 40000 else 4
        times = []
        with torch.no_grad():
            model(**inputs, return_dict=False)  # warm-up
            torch.cuda.synchronize()
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                model(**inputs, return_dict=False)
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1000)
        times.sort()
        med = times[len(times) // 2]
        peak = torch.cuda.max_memory_allocated() / 2**30
        key = name if mode == "resident" else f"{name} {mode}"
        results[key] = dict(rows=S, video_rows=nv, audio_rows=na, s_per_step=med, spread=[times[0], times[-1]],
                            peak_gib=peak, mode=mode)
        if mode == "resident":
            results[f"{name} resident"] = results[key]
        print(f"{name:6s} {mode:13s} rows {S:6d}  {med:8.3f} s/step  (min {times[0]:.3f}, max {times[-1]:.3f})  "
              f"peak {peak:6.1f} GiB")
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
