#!/usr/bin/python3
"""The project's reference for sampling and the packed layout: every formula of docs/SAMPLING.md written out in
numpy / torch, independently of the C code, to produce the numbers the C tests compare against.

    /usr/bin/python3 tools/reference/sampling_reference.py --write tests/fixtures/sample

writes the fixtures (a few hundred KB). Needs numpy, torch (float32 arithmetic as torch evaluates it on the CPU) and
mpmath (the Beta inverse CDF). Run without arguments it prints a short self-check.

What is written out here (sources in docs/SAMPLING.md):
  - Philox4x32-10 and the Box-Muller normals of src/sample/rng.h;
  - H3's schedule (diffusers MiniMaxH3Scheduler): linspace(1, 0, N) in float32, sigma = s*b/(1+(s-1)*b), repeats
    collapsed, video shift 12, audio shift 3; its Euler step x0 = x + (1 - t)*v, x = r*x + (1 - r)*x0 in float32;
  - ComfyUI's table (ModelSamplingDiscreteFlow, shift 12) and its schedulers simple, sgm_uniform, normal, beta;
  - ComfyUI's samplers euler, res_multistep (eta 0), dpmpp_2m on the video sigma with the audio carried as
    y = (sigma_v/sigma_a)*x_audio (ComfyUI comfy/ldm/minimax/model.py), in float64;
  - the t2va packed layout: tags, positions, index arrays, patchify of video and audio latents.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

SHIFT_V = 12.0
SHIFT_A = 3.0

# ---------------------------------------------------------------------------------------------------------------
# Philox4x32-10 (Salmon et al. 2011) and the normals built from it.

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c = list(ctr)
    k0, k1 = key
    for rnd in range(10):
        if rnd:
            k0 = (k0 + W0) & MASK
            k1 = (k1 + W1) & MASK
        p0 = M0 * c[0]
        p1 = M1 * c[2]
        hi0, lo0 = p0 >> 32, p0 & MASK
        hi1, lo1 = p1 >> 32, p1 & MASK
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return c


def normals(seed, stream, pos, n):
    """Values pos .. pos+n-1 of (seed, stream): block b gives four normals from two Box-Muller pairs."""
    out = []
    key = (seed & MASK, (seed >> 32) & MASK)
    b0 = pos // 4
    b1 = (pos + n - 1) // 4
    for b in range(b0, b1 + 1):
        w = philox4x32_10((b & MASK, (b >> 32) & MASK, stream, 0), key)
        u = [(x + 0.5) / 4294967296.0 for x in w]
        zs = []
        for k in range(2):
            r = math.sqrt(-2.0 * math.log(u[2 * k]))
            th = 2.0 * math.pi * u[2 * k + 1]
            zs += [r * math.cos(th), r * math.sin(th)]
        for lane in range(4):
            i = 4 * b + lane
            if pos <= i < pos + n:
                out.append(float(np.float32(zs[lane])))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Schedules. f32() rounds like a float32 tensor op does.

def f32(x):
    return np.float32(x)


def shift_f32(sigma, s):
    """s*sigma / (1 + (s-1)*sigma), each operation rounded to float32 (torch on float32 tensors)."""
    sigma = torch.as_tensor(sigma, dtype=torch.float32)
    return (s * sigma) / (1 + (s - 1) * sigma)


def h3_schedule(steps, shift_v=SHIFT_V, shift_a=SHIFT_A):
    """diffusers' MiniMaxH3Scheduler grid: steps + 1 points, terminal 0 included, one per stream."""
    base = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float32)
    sv = torch.unique_consecutive(shift_f32(base, shift_v))
    sa = torch.unique_consecutive(shift_f32(base, shift_a))
    assert sv.numel() == sa.numel() == steps + 1
    return sv.numpy().astype(np.float32), sa.numpy().astype(np.float32)


def comfy_table(shift=SHIFT_V):
    """ModelSamplingDiscreteFlow(shift, timesteps=1000, multiplier=1000).sigmas: shift((k+1)/1000), float32."""
    t = torch.arange(1, 1001, 1) / 1000
    ts = t * 1000
    return shift_f32(ts / 1000, shift)


def time_shift_sigma_f32(sigma, from_shift, to_shift):
    """Audio sigma from video sigma (ComfyUI model.py time_shift_sigma) on float32 tensors."""
    sigma = torch.as_tensor(sigma, dtype=torch.float32)
    base = sigma / (from_shift + sigma * (1.0 - from_shift))
    return to_shift * base / (1.0 + (to_shift - 1.0) * base)


def beta_ppf(p, a=0.6, b=0.6):
    """Inverse regularized incomplete beta by bisection on mpmath's betainc (30 digits)."""
    import mpmath as mp

    mp.mp.dps = 30
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lo, hi = mp.mpf(0), mp.mpf(1)
    for _ in range(110):
        mid = (lo + hi) / 2
        if mp.betainc(a, b, 0, mid, regularized=True) < p:
            lo = mid
        else:
            hi = mid
    return float((lo + hi) / 2)


def comfy_schedule(kind, steps, shift_v=SHIFT_V, shift_a=SHIFT_A):
    tab = comfy_table(shift_v)
    sig = []
    if kind == "simple":
        ss = len(tab) / steps
        sig = [float(tab[-(1 + int(x * ss))]) for x in range(steps)]
    elif kind in ("sgm_uniform", "normal"):
        start = tab[-1] * 1000
        end = tab[0] * 1000
        if kind == "sgm_uniform":
            ts = torch.linspace(float(start), float(end), steps + 1, dtype=torch.float32)[:-1]
        else:
            ts = torch.linspace(float(start), float(end), steps, dtype=torch.float32)
        sig = [float(shift_f32(t / 1000, shift_v)) for t in ts]
    elif kind == "beta":
        ps = 1 - np.linspace(0, 1, steps, endpoint=False)
        idx = np.rint(np.array([beta_ppf(float(p)) for p in ps]) * (len(tab) - 1))
        last = -1
        for t in idx:
            if t != last:
                sig.append(float(tab[int(t)]))
            last = t
    else:
        raise ValueError(kind)
    sig.append(0.0)
    sv = np.array(sig, dtype=np.float32)
    sa = time_shift_sigma_f32(torch.from_numpy(sv), shift_v, shift_a).numpy().astype(np.float32)
    return sv, sa


def schedule(kind, steps):
    return h3_schedule(steps) if kind == "h3" else comfy_schedule(kind, steps)


# ---------------------------------------------------------------------------------------------------------------
# Samplers with the analytic Gaussian model.

def gauss_velocity(x, t, mu, s):
    """Data-ward velocity of x0 ~ N(mu, s^2) on the path x = (1 - sigma)*x0 + sigma*eps, sigma = 1 - t."""
    sigma = 1.0 - float(t)
    a = 1.0 - sigma
    ex0 = mu + a * s * s / (a * a * s * s + sigma * sigma) * (x - a * mu)
    return (ex0 - x) / sigma


def h3_euler_f32(sv, sa, nv, na, model):
    """diffusers' loop in float32: per stream x0 = x + (1 - t)*v, x = r*x + (1 - r)*x0."""
    xv = torch.tensor(nv, dtype=torch.float32)
    xa = torch.tensor(na, dtype=torch.float32)
    svt, sat = torch.from_numpy(sv), torch.from_numpy(sa)
    for i in range(len(sv) - 1):
        tv, ta = 1 - svt[i], 1 - sat[i]
        vv, va = model(xv.double().numpy(), xa.double().numpy(), float(tv), float(ta))
        vv = torch.tensor(vv, dtype=torch.float32)
        va = torch.tensor(va, dtype=torch.float32)
        for x, v, t, s, grid in ((xv, vv, tv, svt[i], svt), (xa, va, ta, sat[i], sat)):
            x0 = x + (1 - t) * v
            r = grid[i + 1] / grid[i]
            x.copy_(r * x + (1 - r) * x0)
    return xv.numpy(), xa.numpy()


def k_sample(sampler, sv, sa, nv, na, model, shift_v=SHIFT_V, shift_a=SHIFT_A):
    """ComfyUI's samplers on (x_video, y) in float64; y = (sigma_v/sigma_a)*x_audio runs straight to scale*x0."""
    scale = shift_v / shift_a
    n_v = len(nv)
    x = np.concatenate([np.asarray(nv, np.float64), np.asarray(na, np.float64)]) * float(sv[0])
    old = None
    for i in range(len(sv) - 1):
        s, sn = float(sv[i]), float(sv[i + 1])
        s_a = float(sa[i])
        tv = float(f32(1.0) - f32(sv[i]))
        ta = float(f32(1.0) - f32(sa[i]))
        xa = x[n_v:] * (s_a / s)
        vv, va = model(x[:n_v], xa, tv, ta)
        den = np.concatenate([x[:n_v] + s * vv, scale * (xa + s_a * va)])
        if sampler == "euler" or old is None or sn == 0.0:
            d = (x - den) / s
            x = x + d * (sn - s)
        else:
            sp = float(sv[i - 1])
            tf = lambda q: -math.log(q)
            t, t_next, t_prev = tf(s), tf(s), tf(sp)
            t_next = tf(sn)
            h = t_next - t
            if sampler == "dpmpp_2m":
                h_last = t - t_prev
                r = h_last / h
                dd = (1 + 1 / (2 * r)) * den - (1 / (2 * r)) * old
                x = (math.exp(-t_next) / math.exp(-t)) * x - math.expm1(-h) * dd
            elif sampler == "res_multistep":
                t_old = t  # the previous step's sigma_down is this step's sigma when eta = 0
                c2 = (t_prev - t_old) / h
                phi1 = math.expm1(-h) / (-h)
                phi2 = (phi1 - 1.0) / (-h)
                b1 = phi1 - phi2 / c2
                b2 = phi2 / c2
                x = math.exp(-h) * x + h * (b1 * den + b2 * old)
            else:
                raise ValueError(sampler)
        old = den
    return x[:n_v], x[n_v:] / scale


# ---------------------------------------------------------------------------------------------------------------
# The packed t2va layout (H3-FACTS 1.3/1.4).

def latent_frames(frames):
    assert frames >= 5 and (frames - 5) % 17 == 0
    return (frames - 5) // 17 * 5 + 2


def audio_latents(frames):
    return int(round(frames / 24 * 40))


def axis(dim, sqrt_area):
    ratio = dim / sqrt_area
    left = (1.0 - ratio) / 2.0
    return np.linspace(left, left + ratio, dim // 2, endpoint=False) * 32


def t2va_layout(text_len, frames, width, height):
    lt, lh, lw = latent_frames(frames), height // 16, width // 16
    ta = audio_latents(frames)
    sqrt_area = np.sqrt(lh * lw)
    hg, wg = axis(lh, sqrt_area), axis(lw, sqrt_area)
    ph, pw = lh // 2, lw // 2
    rows = []
    tags = []
    for k in range(text_len):
        rows.append((float(k), 0.0, 0.0))
        tags.append(1)
    L = float(text_len)
    for c in range(2):
        for k in range(ta):
            rows.append((L + k, 0.0, float(wg[0] if c == 0 else wg[-1])))
            tags.append(2)
    spans = torch.tensor([5.0 / 3.0 * (1, 4, 4, 4, 4)[g % 5] for g in range(lt)], dtype=torch.float64)
    times = L + torch.cat([torch.zeros(1, dtype=torch.float64), spans[:-1].cumsum(0)])
    for f in range(lt):
        for i in range(ph):
            for j in range(pw):
                rows.append((float(times[f]), float(hg[i]), float(wg[j])))
                tags.append(0)
    return dict(latent=(lt, lh, lw), audio_t=ta, pos=np.array(rows, dtype=np.float64), tags=tags)


def patchify_video(lat):
    """[C, T, H, W] -> [T*(H/2)*(W/2), C*4]: rows frame-major then row-major, columns (c, dy, dx)."""
    c, t, h, w = lat.shape
    x = lat.reshape(c, t, h // 2, 2, w // 2, 2).permute(1, 2, 4, 0, 3, 5)
    return x.reshape(t * (h // 2) * (w // 2), c * 4)


def pack_audio(lat):
    """[2, 32, T] -> [2*T, 32], channel-major rows."""
    return lat.permute(0, 2, 1).reshape(-1, lat.shape[1])


# ---------------------------------------------------------------------------------------------------------------
# Fixtures.

LAYOUT_CASES = [  # (name, text_len, frames, width, height): two canvases x two lengths
    ("wide_short", 7, 22, 256, 160),
    ("wide_long", 300, 124, 256, 160),
    ("tall_short", 7, 22, 128, 448),
    ("tall_long", 300, 124, 128, 448),
]
SAMPLER_STEPS = (3, 10)
SAMPLER_CASES = [(sch, smp) for sch in ("h3", "simple", "beta", "sgm_uniform", "normal")
                 for smp in ("euler", "res_multistep", "dpmpp_2m")]
SCHEDULE_STEPS = (1, 2, 3, 4, 8, 10, 20, 25, 49, 50, 100)


def write_fixtures(out):
    os.makedirs(out, exist_ok=True)
    fx = {}

    # RNG: Philox known answers, then normals at a few (seed, stream, pos) points.
    kat_in = [((0, 0, 0, 0), (0, 0)),
              ((MASK, MASK, MASK, MASK), (MASK, MASK)),
              ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0))]
    fx["philox"] = [dict(ctr=list(c), key=list(k), out=philox4x32_10(c, k)) for c, k in kat_in]
    fx["normals"] = [dict(seed=hex(s), stream=st, pos=p, values=normals(s, st, p, n))
                     for s, st, p, n in ((0, 0, 0, 16), (42, 0, 3, 13), (42, 1, 0, 9),
                                         (0xDEADBEEFCAFEF00D, 1, (1 << 33) + 1, 7))]

    # Schedules.
    fx["schedules"] = []
    for kind in ("h3", "simple", "sgm_uniform", "normal", "beta"):
        for steps in SCHEDULE_STEPS:
            sv, sa = schedule(kind, steps)
            fx["schedules"].append(dict(kind=kind, steps=steps, sigma_v=[float(v) for v in sv],
                                        sigma_a=[float(v) for v in sa]))

    # Samplers on the analytic Gaussian model, 12 video and 6 audio values.
    rng = np.random.default_rng(20250707)
    nv, na = 12, 6
    case = dict(mu_v=rng.normal(size=nv).tolist(), s_v=rng.uniform(0.2, 1.5, nv).tolist(),
                mu_a=rng.normal(size=na).tolist(), s_a=rng.uniform(0.2, 1.5, na).tolist(),
                noise_v=[float(np.float32(v)) for v in rng.normal(size=nv)],
                noise_a=[float(np.float32(v)) for v in rng.normal(size=na)])
    mu_v, s_v = np.array(case["mu_v"]), np.array(case["s_v"])
    mu_a, s_a = np.array(case["mu_a"]), np.array(case["s_a"])

    def model(xv, xa, tv, ta):
        return gauss_velocity(np.asarray(xv), tv, mu_v, s_v), gauss_velocity(np.asarray(xa), ta, mu_a, s_a)

    runs = []
    for sch, smp in SAMPLER_CASES:
        for steps in SAMPLER_STEPS:
            sv, sa = schedule(sch, steps)
            if sch == "h3" and smp == "euler":
                ov, oa = h3_euler_f32(sv, sa, case["noise_v"], case["noise_a"], model)
            else:
                ov, oa = k_sample(smp, sv, sa, case["noise_v"], case["noise_a"], model)
            runs.append(dict(scheduler=sch, sampler=smp, steps=steps, video=[float(v) for v in ov],
                             audio=[float(v) for v in oa]))
    case["runs"] = runs
    fx["sampler"] = case

    # Patchify: a small latent holding its own flat index.
    C, T, H, W = 24, 2, 4, 6
    lat = torch.arange(C * T * H * W, dtype=torch.float64).reshape(C, T, H, W)
    fx["patchify"] = dict(shape=[C, T, H, W], rows=patchify_video(lat).reshape(-1).tolist())
    Ta = 5
    alat = torch.arange(2 * 32 * Ta, dtype=torch.float64).reshape(2, 32, Ta)
    fx["audio_pack"] = dict(T_a=Ta, rows=pack_audio(alat).reshape(-1).tolist())

    # Layouts: summary in JSON, positions as raw little-endian float64 [S, 3].
    fx["layouts"] = []
    for name, L, frames, w, h in LAYOUT_CASES:
        lay = t2va_layout(L, frames, w, h)
        path = os.path.join(out, f"layout_{name}.f64")
        with open(path, "wb") as f:
            f.write(lay["pos"].astype("<f8").tobytes())
        fx["layouts"].append(dict(name=name, text_len=L, frames=frames, width=w, height=h,
                                  latent=list(lay["latent"]), audio_t=lay["audio_t"], seq_len=len(lay["tags"]),
                                  positions=os.path.basename(path), tags=lay["tags"]))

    with open(os.path.join(out, "sampling.json"), "w") as f:
        json.dump(fx, f, separators=(",", ":"))
    print(f"wrote {out}/sampling.json and {len(LAYOUT_CASES)} layout position files")


def self_check():
    # Philox: the three published Random123 answers for Philox4x32-10.
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox4x32_10((MASK,) * 4, (MASK, MASK)) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    # The Gaussian flow: samplers converge to the exact x0 = mu + s*eps.
    mu, s, eps = np.array([0.3, -1.0]), np.array([0.5, 1.2]), np.array([0.7, -0.4])
    model = lambda xv, xa, tv, ta: (gauss_velocity(xv, tv, mu, s), gauss_velocity(xa, ta, mu, s))
    exact = mu + s * eps
    for smp in ("euler", "res_multistep", "dpmpp_2m"):
        errs = []
        for steps in (8, 16, 32, 64):
            sv, sa = schedule("simple", steps)
            ov, oa = k_sample(smp, sv, sa, eps, eps, model)
            errs.append(max(abs(ov - exact).max(), abs(oa - exact).max()))
        print(f"{smp:14s} max error at 8/16/32/64 steps: " + " ".join(f"{e:.2e}" for e in errs))
    sv, sa = schedule("h3", 49)
    ov, oa = h3_euler_f32(sv, sa, eps, eps, model)
    print(f"h3 euler 49 steps: video error {abs(ov - exact).max():.2e}, audio {abs(oa - exact).max():.2e}")
    print("self-check passed")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", metavar="DIR", help="write the fixtures into DIR")
    args = ap.parse_args()
    self_check()
    if args.write:
        write_fixtures(args.write)
