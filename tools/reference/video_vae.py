"""The MiniMax-H3 video VAE decoder, written from docs (H3-FACTS.md §3) as the project's reference.

Decoding in float64 by default over a canonical weight dict (official key names, fused QKV rows contiguous
[Q; K; V], ff.w1 rows [gate; up]). `load_video_vae` reads the three layouts h3run accepts (official `video_vae/`
folder, diffusers `vae/` folder, ComfyUI's single fp16 file) and converts them to that form. The decode is written
whole-tensor, the plain way: every tile of every temporal chunk decoded, then cut and blended with concatenations,
which is a different formulation from h3run's streaming one. Needs numpy and torch only.

    weights, cfg = load_video_vae("tests/fixtures/video_vae/official")
    frames = decode(weights, cfg, latents)        # latents [C, T, H, W] normalized as the DiT produces them
"""

import json
import math
import os

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# video_vae/config.json of the release (the values ComfyUI builds in for its single-file repack).
DEFAULT_LATENTS_MEAN = [
    0.858090341091156, -0.9606591463088989, 1.0661640167236328, -0.5090325474739075, -0.2727581858634949,
    -1.3675414323806763, -0.2553254961967468, -0.26907554268836975, -0.5376840829849243, -0.0464097298681736,
    0.6657370328903198, 0.19690127670764923, -0.5460608005523682, -0.4035342037677765, -0.23683024942874908,
    0.25928452610969543, -0.30133944749832153, 0.211341992020607, -1.1206848621368408, 0.3581933379173279,
    -0.04225143790245056, 0.2604829967021942, 0.22864092886447906, 0.7056031823158264,
]
DEFAULT_LATENTS_STD = [
    1.2223774194717407, 1.2767263650894165, 1.68317747116088865, 1.7549455165863037, 1.5636216402053833,
    2.194143533706665, 0.96531379222869875, 1.05698859691619875, 0.841948926448822, 0.7729952931404114,
    1.8955937623977661, 0.946841835975647, 0.7996809482574463, 0.44988900423049925, 0.7197399735450745,
    0.69362932443618775, 2.961095094680786, 2.7694199085235595, 3.0496184825897215, 2.1088054180145265,
    3.276226282119751, 3.1627357006073, 2.28168129920959475, 2.6127843856811525,
]

from safetensors_io import read_safetensors, write_safetensors  # noqa: F401  (re-exported: one reader for all)


# ---- configuration -------------------------------------------------------------------------------------------

def default_config():
    """The released decoder (H3-FACTS §3): what ComfyUI's file implies, since it carries no config."""
    return {
        "latent_channels": 24, "out_channels": 3, "patch_size": 16, "patch_size_t": 4, "num_layers": 36,
        "heads": 32, "head_dim": 64, "num_register_tokens": 4, "ffn_mult": 4, "rope_theta": 100.0,
        "rope_dim_ratio": 0.75, "norm_eps": 1e-5, "clip_length": 17, "token_drop": 3, "tile_size": 256,
        "tile_overlap_min": 64, "latents_mean": list(DEFAULT_LATENTS_MEAN), "latents_std": list(DEFAULT_LATENTS_STD),
    }


def _prod(xs):
    p = 1
    for x in xs:
        p *= int(x)
    return p


def load_video_vae(path, heads=None):
    """(canonical float64 weights, config) from an official folder, a diffusers folder or a ComfyUI file."""
    cfg = default_config()
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "source", "config.json")):
        with open(os.path.join(path, "config.json")) as f:
            wrap = json.load(f)
        with open(os.path.join(path, "source", "config.json")) as f:
            src = json.load(f)
        vit = src["vit_decoder_kwargs"]
        cfg.update(latent_channels=src["z_channels"], out_channels=src["out_ch"],
                   patch_size=src.get("vae_ratio", _prod(src["space_down"])),
                   patch_size_t=src.get("vae_ratio_t", _prod(src["time_down"])), num_layers=vit["num_layers"],
                   heads=vit["heads"], head_dim=vit["dim_head"], rope_theta=vit["rope_theta"],
                   rope_dim_ratio=vit["rope_dim_ratio"], clip_length=wrap["vae_clip_length"],
                   token_drop=wrap["vae_token_drop"], tile_size=wrap["vae_tile_size"],
                   tile_overlap_min=wrap["vae_tile_overlap_min"], latents_mean=wrap["latents_mean"],
                   latents_std=wrap["latents_std"])
        sd = read_safetensors(os.path.join(path, wrap["source_path"], wrap["source_safetensors_path"]))
        layout = "official"
    elif os.path.isdir(path):
        with open(os.path.join(path, "config.json")) as f:
            dc = json.load(f)
        cfg.update(latent_channels=dc["latent_channels"], out_channels=dc["out_channels"],
                   patch_size=_prod(dc["spatial_downsample_factors"]),
                   patch_size_t=_prod(dc["temporal_downsample_factors"]), num_layers=dc["decoder_num_layers"],
                   heads=dc["decoder_num_attention_heads"], head_dim=dc["decoder_attention_head_dim"],
                   num_register_tokens=dc["decoder_num_register_tokens"], ffn_mult=dc["decoder_ffn_mult"],
                   rope_theta=dc["decoder_rope_theta"], rope_dim_ratio=dc["decoder_rope_dim_ratio"],
                   norm_eps=dc["decoder_norm_eps"], clip_length=dc["clip_length"], token_drop=dc["token_drop"],
                   latents_mean=dc["latents_mean"], latents_std=dc["latents_std"])
        sd = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                sd.update(read_safetensors(os.path.join(path, name)))
        layout = "diffusers"
    else:
        sd = read_safetensors(path)
        layout = "comfy"
        dim = sd["decoder.x_embedder.weight"].shape[0]
        cfg["latent_channels"] = sd["post_quant_conv.weight"].shape[0]
        cfg["num_layers"] = len({k.split(".")[2] for k in sd if k.startswith("decoder.transformer_blocks.")})
        cfg["num_register_tokens"] = sd["decoder.register_tokens"].shape[1]
        cfg["heads"] = heads or dim // cfg["head_dim"]
        cfg["head_dim"] = dim // cfg["heads"]
        cfg["ffn_mult"] = sd["decoder.transformer_blocks.0.ff.w1.weight"].shape[0] // (2 * dim)
        p2 = sd["decoder.proj_out.weight"].shape[0] // (cfg["out_channels"] * cfg["patch_size_t"])
        cfg["patch_size"] = int(round(math.sqrt(p2)))
    return canonical(sd, layout, cfg), cfg


def canonical(sd, layout, cfg):
    """Official names, float64; QKV de-interleaved to [Q; K; V]; ff.w1 as [gate; up]."""
    H, D = cfg["heads"], cfg["head_dim"]
    w = {}
    g = lambda k: sd[k].double()
    pre = "decoder."
    w["post_quant_conv.weight"] = g("post_quant_conv.weight").reshape(cfg["latent_channels"], -1)
    w["post_quant_conv.bias"] = g("post_quant_conv.bias")
    inname = "decoder.x_embedder." if layout != "diffusers" else "decoder.proj_in."
    w["x_embedder.weight"], w["x_embedder.bias"] = g(inname + "weight"), g(inname + "bias")
    w["register_tokens"] = g(pre + "register_tokens").reshape(-1, w["x_embedder.weight"].shape[0])
    for k in ("norm_out.weight", "norm_out.bias", "proj_out.weight", "proj_out.bias"):
        w[k] = g(pre + k)
    for i in range(cfg["num_layers"]):
        p = f"decoder.transformer_blocks.{i}."
        b = f"blocks.{i}."
        for k in ("norm1.weight", "norm2.weight", "scale1", "scale2"):
            w[b + k] = g(p + k)
        for s in ("weight", "bias"):
            if layout == "diffusers":
                w[b + "qkv." + s] = torch.cat([g(p + f"attn.to_{x}.{s}") for x in "qkv"], 0)
                w[b + "out." + s] = g(p + "attn.to_out.0." + s)
                up, gate = g(p + "ff.net.0.proj." + s).chunk(2, 0)
                w[b + "w1." + s] = torch.cat([gate, up], 0)
                w[b + "w2." + s] = g(p + "ff.net.2." + s)
            else:
                t = g(p + "attn.to_qkv." + s)
                t = t.reshape(H, 3, D, *t.shape[1:]).transpose(0, 1).reshape(3 * H * D, *t.shape[1:])
                w[b + "qkv." + s] = t
                w[b + "out." + s] = g(p + "attn.to_out." + s)
                w[b + "w1." + s] = g(p + "ff.w1." + s)
                w[b + "w2." + s] = g(p + "ff.w2." + s)
    return w


# ---- the ViT decoder on one tile ----------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


def rotary_tables(cfg, T, H, W, dtype):
    """cos, sin [S, R]: per axis, coordinates (i + 0.5)/n mapped to [-1, 1), angles 2π·coord·θ^(-6k/R) for
    k < R/6, concatenated [t | h | w] and repeated twice. The register and zero tokens sit at the origin."""
    R = int(cfg["head_dim"] * cfg["rope_dim_ratio"])
    nf = R // 6
    inv = torch.tensor([cfg["rope_theta"] ** (-(6.0 * k) / R) for k in range(nf)], dtype=dtype)
    axes = [2.0 * (torch.arange(n, dtype=dtype) + 0.5) / n - 1.0 for n in (T, H, W)]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    suffix = torch.zeros(cfg["num_register_tokens"] + 1, 3, dtype=dtype)
    pos = torch.cat([grid, suffix], 0)
    ang = (2.0 * math.pi * pos[:, :, None] * inv[None, None, :]).reshape(pos.shape[0], 3 * nf)
    ang = torch.cat([ang, ang], -1)
    return torch.cos(ang), torch.sin(ang)


def apply_rotary(x, cos, sin):
    """x [S, H, D]: rotate-half on the first R channels."""
    R = cos.shape[-1]
    xr, xp = x[..., :R], x[..., R:]
    a, b = xr[..., : R // 2], xr[..., R // 2:]
    rot = torch.cat([-b, a], -1)
    return torch.cat([xr * cos[:, None, :] + rot * sin[:, None, :], xp], -1)


def vit_decode_tile(w, cfg, z):
    """z [C, T, H, W] de-normalized latents -> pixels [out_channels, T·pt, H·p, W·p] (ImageNet-normalized)."""
    C, T, H, W = z.shape
    Hh, D, eps = cfg["heads"], cfg["head_dim"], cfg["norm_eps"]
    tok = z.permute(1, 2, 3, 0).reshape(-1, C)
    tok = tok @ w["post_quant_conv.weight"].T + w["post_quant_conv.bias"]
    x = tok @ w["x_embedder.weight"].T + w["x_embedder.bias"]
    N = x.shape[0]
    x = torch.cat([x, w["register_tokens"], torch.zeros(1, x.shape[1], dtype=x.dtype)], 0)
    S = x.shape[0]
    cos, sin = rotary_tables(cfg, T, H, W, x.dtype)
    for i in range(cfg["num_layers"]):
        b = f"blocks.{i}."
        h = rms_norm(x, w[b + "norm1.weight"], eps)
        qkv = h @ w[b + "qkv.weight"].T + w[b + "qkv.bias"]
        q, k, v = (t.reshape(S, Hh, D) for t in qkv.chunk(3, -1))
        q = apply_rotary(rms_norm(q, None, eps), cos, sin)
        k = apply_rotary(rms_norm(k, None, eps), cos, sin)
        att = torch.einsum("shd,thd->hst", q, k) / math.sqrt(D)
        o = torch.einsum("hst,thd->shd", torch.softmax(att, -1), v).reshape(S, Hh * D)
        x = x + (o @ w[b + "out.weight"].T + w[b + "out.bias"]) * w[b + "scale1"]
        h = rms_norm(x, w[b + "norm2.weight"], eps)
        f = h @ w[b + "w1.weight"].T + w[b + "w1.bias"]
        gate, up = f.chunk(2, -1)
        f = (torch.nn.functional.silu(gate) * up) @ w[b + "w2.weight"].T + w[b + "w2.bias"]
        x = x + f * w[b + "scale2"]
    x = torch.nn.functional.layer_norm(x, (x.shape[1],), w["norm_out.weight"], w["norm_out.bias"], eps)
    y = (x @ w["proj_out.weight"].T + w["proj_out.bias"])[:N]
    oc, pt, p = cfg["out_channels"], cfg["patch_size_t"], cfg["patch_size"]
    y = y.reshape(T, H, W, oc, pt, p, p).permute(3, 0, 4, 1, 5, 2, 6)
    return y.reshape(oc, T * pt, H * p, W * p)


# ---- tiles and chunks ---------------------------------------------------------------------------------------

def split_tiles(length, tile, min_overlap, ratio):
    """Tile starts and overlaps (pixels) covering `length`: the fewest tiles that keep every overlap >= min_overlap,
    the slack then spread over the overlaps round-robin in steps of `ratio` (one latent)."""
    if tile >= length:
        return [0], [length], []
    n = math.ceil(length / tile)
    while tile * n - min_overlap * (n - 1) < length:
        n += 1
    ov = [min_overlap] * (n - 1)
    slack = tile * n - sum(ov) - length
    for i in range(slack // ratio):
        ov[i % (n - 1)] += ratio
    starts = [0]
    for i in range(n - 1):
        starts.append(starts[-1] + tile - ov[i])
    return starts, [tile] * n, ov


def blend(a, b, extent, dim):
    """The last `extent` entries of a fade into the first of b along dim (weights k/extent for b)."""
    e = min(a.shape[dim], b.shape[dim], extent)
    wb = torch.arange(e, dtype=b.dtype) / e
    shape = [1] * a.ndim
    shape[dim] = e
    wb = wb.reshape(shape)
    mixed = a.narrow(dim, a.shape[dim] - e, e) * (1 - wb) + b.narrow(dim, 0, e) * wb
    return torch.cat([mixed, b.narrow(dim, e, b.shape[dim] - e)], dim)


def decode_clip(w, cfg, z, tiling=True):
    """One temporal clip [C, t, H, W] -> [oc, t·pt, H·p, W·p], spatially tiled and blended."""
    p = cfg["patch_size"]
    if not tiling:
        return vit_decode_tile(w, cfg, z)
    Hp, Wp = z.shape[2] * p, z.shape[3] * p
    ys, yl, yo = split_tiles(Hp, cfg["tile_size"], cfg["tile_overlap_min"], p)
    xs, xl, xo = split_tiles(Wp, cfg["tile_size"], cfg["tile_overlap_min"], p)
    raw = [[vit_decode_tile(w, cfg, z[:, :, y // p:(y + h) // p, x // p:(x + l) // p]) for x, l in zip(xs, xl)]
           for y, h in zip(ys, yl)]
    rows = []
    for i, row in enumerate(raw):
        out = []
        for j, t in enumerate(row):
            if i > 0:
                t = blend(raw[i - 1][j], t, yo[i - 1], 2)
            if j > 0:
                t = blend(row[j - 1], t, xo[j - 1], 3)
            if i < len(raw) - 1:
                t = t[:, :, : t.shape[2] - yo[i]]
            if j < len(row) - 1:
                t = t[:, :, :, : t.shape[3] - xo[j]]
            out.append(t)
        rows.append(torch.cat(out, 3))
    return torch.cat(rows, 2)


def temporal_plan(cfg, T):
    """(pad_tokens, chunks) for T latent frames. T <= 2 gets one extra padded chunk (what ComfyUI does; the
    diffusers port has no chunk to decode there)."""
    cs = math.ceil(cfg["clip_length"] / cfg["patch_size_t"])
    td = cfg["token_drop"]
    pad = (-(T + td)) % cs
    chunks = (T + td + pad) // cs - (1 if td > 0 else 0)
    if chunks < 1:
        pad += cs
        chunks += 1
    return pad, chunks


def decode(w, cfg, latents, tiling=True):
    """latents [C, T, H, W] normalized as the DiT produces them -> frames [oc, F, H·p, W·p] in the value range of
    diffusers' AutoencoderKLMiniMaxH3.decode (ImageNet-normalized)."""
    C, T = latents.shape[0], latents.shape[1]
    mean = torch.tensor(cfg["latents_mean"], dtype=latents.dtype).reshape(C, 1, 1, 1)
    std = torch.tensor(cfg["latents_std"], dtype=latents.dtype).reshape(C, 1, 1, 1)
    z = latents * std + mean
    pt = cfg["patch_size_t"]
    if T == 1:  # a single image: the last of the four frames its latent decodes to (ComfyUI's behaviour)
        return decode_clip(w, cfg, z, tiling)[:, -1:]
    cs = math.ceil(cfg["clip_length"] / pt)
    td = cfg["token_drop"]
    pre = (-cfg["clip_length"]) % pt
    tov = (-td) % cs
    fov = max(tov * pt - pre, 0)
    pad, chunks = temporal_plan(cfg, T)
    if pad:
        z = torch.cat([z, z[:, -1:].repeat(1, pad, 1, 1)], 1)
    parts, overlap = [], None
    for i in range(chunks):
        clip = decode_clip(w, cfg, z[:, i * cs: i * cs + cs + tov], tiling)
        for j in range((1 if td > 0 else 0) + 1):
            seg = clip[:, j * cs * pt:(j + 1) * cs * pt][:, pre:]
            if j == 0:
                if overlap is not None:
                    seg = blend(overlap, seg, fov, 1)
                parts.append(seg)
            else:
                overlap = seg
    if overlap is not None:
        parts.append(overlap)
    out = torch.cat(parts, 1)
    if pad:
        tail = cfg["clip_length"] % pt
        drop = sum(tail if tail and (T + k) % cs == 0 else pt for k in range(pad))
        out = out[:, : out.shape[1] - drop]
    return out


def to_unit_range(frames):
    """ImageNet de-normalization and clamping to [0, 1], as the pipeline applies after decode."""
    m = torch.tensor(IMAGENET_MEAN, dtype=frames.dtype).reshape(3, 1, 1, 1)
    s = torch.tensor(IMAGENET_STD, dtype=frames.dtype).reshape(3, 1, 1, 1)
    return (frames * s + m).clamp(0, 1)
