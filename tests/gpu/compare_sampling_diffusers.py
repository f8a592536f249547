"""The sampling and layout fixtures (tests/fixtures/sample) against diffusers' MiniMax-H3 code.

The fixtures come from the project's own reference (tools/reference/sampling_reference.py) and the C tests compare
h3run with them. This script checks the fixtures themselves against diffusers:
  - MiniMaxH3Scheduler(12) / (3): set_timesteps(steps + 1) against the fixtures' h3 schedules;
  - diffusers' Euler loop (scheduler.step per stream, float32) on the analytic Gaussian model against the fixtures'
    h3/euler runs;
  - MiniMaxH3PrepareLayoutStep.build_packed_sequence against the fixtures' positions and tags, and the index arrays;
  - MiniMaxH3SetTimestepsStep.build_row_timesteps against the rule h3run uses (text and video rows on t_video);
  - patchify_video_latents, video_latent_num_frames and audio_latent_num_frames.

    DIFFUSERS_SRC=/path/to/diffusers python tests/gpu/compare_sampling_diffusers.py   # the folder holding src/diffusers
    python tests/gpu/compare_sampling_diffusers.py --self-test   # runs the comparisons against the project reference

Skips (exit 0) when DIFFUSERS_SRC is unset or diffusers does not import. Exit status 1 when a check exceeds its
tolerance: sigmas 1e-6 relative (torch.linspace's CPU rounding may differ by an ulp between torch versions), Euler
runs 1e-5 relative, positions 1e-12 absolute, tags/indices/patchify exact. Everything runs on the CPU (these are the
CPU tensors diffusers builds too). Details go to $OUT/compare_sampling_diffusers.json when OUT is set.
"""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "sample")
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))


def skip(msg):
    print(f"compare_sampling_diffusers: SKIP: {msg}")
    sys.exit(0)


SELF_TEST = "--self-test" in sys.argv

try:
    import torch
except Exception as e:  # noqa: BLE001
    skip(f"torch does not import: {e}")

import sampling_reference as ref  # noqa: E402

if SELF_TEST:
    # Stand-ins built from the project reference, so the comparison code itself can be exercised anywhere.
    class MiniMaxH3Scheduler:
        def __init__(self, shift=12.0):
            self.shift = shift

        def set_timesteps(self, n):
            base = torch.linspace(1.0, 0.0, n, dtype=torch.float32)
            self.sigmas = torch.unique_consecutive(ref.shift_f32(base, self.shift))
            self.timesteps = 1.0 - self.sigmas[:-1]
            self._i = 0

        def step(self, v, t, x, return_dict=False):
            x0 = x + (1 - t) * v
            r = self.sigmas[self._i + 1] / self.sigmas[self._i]
            self._i += 1
            return (r * x + (1 - r) * x0,)

    def build_packed_sequence(tags, lt, lh, lw, ta, patch, channels, audio_tag, video_tag):
        frames = (lt - 2) // 5 * 17 + 5
        lay = ref.t2va_layout(tags.shape[0], frames, lw * 16, lh * 16)
        S = len(lay["tags"])
        L = tags.shape[0]
        na = 2 * ta
        return (torch.from_numpy(lay["pos"]), torch.tensor(lay["tags"]), torch.arange(L + na, S),
                torch.arange(L, L + na), torch.arange(L), 0, 0)

    def build_row_timesteps(vi, ai, ncv, nca, L, tv, ta, ctv, cta):
        row = torch.full((vi.numel() + ai.numel() + L,), tv, dtype=torch.float32)
        row[ai] = ta
        return torch.unique(row, sorted=True, return_inverse=True)

    def patchify_video_latents(lat, patch):
        return ref.patchify_video(lat[0])

    video_latent_num_frames = lambda f, a, b: ref.latent_frames(f)  # noqa: E731
    audio_latent_num_frames = ref.audio_latents
    SOURCE = "project reference (self-test)"
else:
    src = os.environ.get("DIFFUSERS_SRC")
    if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")):
        skip("set DIFFUSERS_SRC to the diffusers source folder (the one containing src/diffusers)")
    sys.path.insert(0, os.path.join(src, "src"))
    try:
        from diffusers.modular_pipelines.minimax_h3.before_denoise import (
            MiniMaxH3PrepareLayoutStep,
            MiniMaxH3SetTimestepsStep,
            patchify_video_latents,
        )
        from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
            audio_latent_num_frames,
            video_latent_num_frames,
        )
        from diffusers.schedulers.scheduling_minimax_h3 import MiniMaxH3Scheduler
    except Exception as e:  # noqa: BLE001 - any import failure means this machine cannot run the comparison
        skip(f"diffusers does not import from {src}: {e}")
    build_packed_sequence = MiniMaxH3PrepareLayoutStep.build_packed_sequence
    build_row_timesteps = MiniMaxH3SetTimestepsStep.build_row_timesteps
    SOURCE = f"diffusers at {src}"

with open(os.path.join(FIX, "sampling.json")) as f:
    FX = json.load(f)

results = []  # (check, measured, tolerance, ok, detail)


def record(name, measured, tol, detail=""):
    ok = measured <= tol
    results.append(dict(check=name, measured=float(measured), tolerance=tol, ok=bool(ok), detail=detail))


# ---- schedules ---------------------------------------------------------------------------------------------------
worst_v = worst_a = 0.0
exact = total = 0
for e in FX["schedules"]:
    if e["kind"] != "h3":
        continue
    for shift, key in ((12.0, "sigma_v"), (3.0, "sigma_a")):
        s = MiniMaxH3Scheduler(shift=shift)
        s.set_timesteps(e["steps"] + 1)
        got = s.sigmas.double().cpu().numpy()
        want = np.array(e[key])
        if got.shape != want.shape:
            record(f"h3 schedule {e['steps']} steps shape", 1.0, 0.0, f"{got.shape} vs {want.shape}")
            continue
        rel = np.abs(got - want) / np.maximum(want, 1e-30)
        rel[want == 0] = np.abs(got - want)[want == 0]
        exact += int((got == want).sum())
        total += got.size
        if key == "sigma_v":
            worst_v = max(worst_v, float(rel.max()))
        else:
            worst_a = max(worst_a, float(rel.max()))
record("h3 schedule, video sigmas (max rel)", worst_v, 1e-6, f"{exact}/{total} sigmas identical")
record("h3 schedule, audio sigmas (max rel)", worst_a, 1e-6)

# ---- Euler runs ----------------------------------------------------------------------------------------------------
case = FX["sampler"]
mu_v, s_v = np.array(case["mu_v"]), np.array(case["s_v"])
mu_a, s_a = np.array(case["mu_a"]), np.array(case["s_a"])
worst = 0.0
for run in case["runs"]:
    if run["scheduler"] != "h3" or run["sampler"] != "euler":
        continue
    n = run["steps"] + 1
    sv, sa = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    sv.set_timesteps(n)
    sa.set_timesteps(n)
    xv = torch.tensor(case["noise_v"], dtype=torch.float32)
    xa = torch.tensor(case["noise_a"], dtype=torch.float32)
    for tv, ta in zip(sv.timesteps, sa.timesteps):
        vv = torch.tensor(ref.gauss_velocity(xv.double().numpy(), float(tv), mu_v, s_v), dtype=torch.float32)
        va = torch.tensor(ref.gauss_velocity(xa.double().numpy(), float(ta), mu_a, s_a), dtype=torch.float32)
        xv = sv.step(vv, tv, xv, return_dict=False)[0]
        xa = sa.step(va, ta, xa, return_dict=False)[0]
    for got, want in ((xv, run["video"]), (xa, run["audio"])):
        want = np.array(want)
        d = np.abs(got.double().numpy() - want) / np.maximum(np.abs(want), 1.0)
        worst = max(worst, float(d.max()))
record("h3/euler runs vs diffusers' step loop (max rel)", worst, 1e-5)

# ---- layouts -------------------------------------------------------------------------------------------------------
worst_pos, bad_tags, bad_idx, bad_sizes = 0.0, 0, 0, 0
for e in FX["layouts"]:
    L, frames = e["text_len"], e["frames"]
    lt, lh, lw = e["latent"]
    bad_sizes += int(video_latent_num_frames(frames, 17, 5) != lt) + int(audio_latent_num_frames(frames) != e["audio_t"])
    out = build_packed_sequence(torch.ones(L, dtype=torch.long), lt, lh, lw, e["audio_t"], (1, 2, 2), 2, 2, 0)
    pos, tags, vi, ai, ti = out[0], out[1], out[2], out[3], out[4]
    want = np.fromfile(os.path.join(FIX, e["positions"]), dtype="<f8").reshape(-1, 3)
    if pos.shape[0] != want.shape[0]:
        worst_pos = float("inf")
        continue
    worst_pos = max(worst_pos, float(np.abs(pos.double().numpy() - want).max()))
    bad_tags += int((tags.numpy() != np.array(e["tags"])).sum())
    na = 2 * e["audio_t"]
    S = want.shape[0]
    bad_idx += int(not torch.equal(ti.cpu(), torch.arange(L)))
    bad_idx += int(not torch.equal(ai.cpu(), torch.arange(L, L + na)))
    bad_idx += int(not torch.equal(vi.cpu(), torch.arange(L + na, S)))
    # Row timesteps: text and video rows on t_video, audio rows on t_audio, sorted distinct values.
    for tv, ta in ((0.25, 0.5), (0.0, 0.0), (0.9, 0.6)):
        uniq, inv = build_row_timesteps(vi, ai, 0, 0, L, tv, ta, max(tv, 0.999), 1.0)
        u = sorted({np.float32(tv), np.float32(ta)})
        bad_idx += int(uniq.numel() != len(u))
        iv, ia = u.index(np.float32(tv)), u.index(np.float32(ta))
        exp = torch.full((S,), iv, dtype=torch.long)
        exp[L : L + na] = ia
        bad_idx += int(not torch.equal(inv.cpu().long(), exp))
record("layout positions vs diffusers (max abs)", worst_pos, 1e-12)
record("layout tags differing", bad_tags, 0)
record("index arrays / row timesteps differing", bad_idx, 0)
record("latent sizes differing", bad_sizes, 0)

# ---- patchify ------------------------------------------------------------------------------------------------------
p = FX["patchify"]
C, T, H, W = p["shape"]
lat = torch.arange(C * T * H * W, dtype=torch.float64).reshape(1, C, T, H, W)
rows = patchify_video_latents(lat, (1, 2, 2)).reshape(-1).numpy()
record("patchify values differing", int((rows != np.array(p["rows"])).sum()), 0)

# ---- report ----------------------------------------------------------------------------------------------------------
if os.environ.get("OUT"):
    os.makedirs(os.environ["OUT"], exist_ok=True)
    with open(os.path.join(os.environ["OUT"], "compare_sampling_diffusers.json"), "w") as f:
        json.dump(dict(source=SOURCE, results=results), f, indent=1)
print(f"compare_sampling_diffusers against {SOURCE}")
print(f"{'check':52s} {'measured':>12s} {'tolerance':>10s}  result")
for r in results:
    print(f"{r['check']:52s} {r['measured']:12.3g} {r['tolerance']:10.3g}  {'ok' if r['ok'] else 'FAIL'}  {r['detail']}")
sys.exit(0 if all(r["ok"] for r in results) else 1)
