"""The MiniMax-H3 DiT, written from docs (H3-FACTS.md §1) as the project's reference.

One forward over one packed sequence, in float64 by default, over a canonical state dict:
official key names, fused QKV rows contiguous [Q; K; V], fc1 rows [gate; value]. `load_dit` reads any of the
three layouts h3run accepts (official shards with per-head interleaved QKV, diffusers, ComfyUI's pruned single
file) and converts to that form. Needs numpy and torch only (safetensors is read and written here).

    weights, cfg = load_dit("tests/fixtures/dit/official")
    video_v, audio_v = forward(weights, cfg, read_safetensors("tests/fixtures/dit/inputs.safetensors"))
"""

import json
import math
import os

import torch

from safetensors_io import read_safetensors, write_safetensors  # noqa: F401  (re-exported: one reader for all)


def read_weights(path):
    """A .safetensors file, a *.safetensors.index.json, or a folder holding either."""
    if os.path.isdir(path):
        idx = [f for f in os.listdir(path) if f.endswith(".safetensors.index.json")]
        files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
        if idx:
            return read_weights(os.path.join(path, idx[0]))
        out = {}
        for f in files:
            out.update(read_safetensors(f))
        return out
    if path.endswith(".index.json"):
        with open(path) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        out = {}
        for s in shards:
            out.update(read_safetensors(os.path.join(os.path.dirname(path), s)))
        return out
    return read_safetensors(path)


# ---- config and layouts ------------------------------------------------------------------------------------

def infer_config(sd):
    """Widths from the canonical tensors' shapes; eps 1e-5, theta 10000 (the released values)."""
    hidden, video_dim = sd["video_patch_proj.weight"].shape
    head_dim = sd["blocks.0.attn.q_norm.weight"].shape[0]
    cfg = {
        "hidden_size": hidden, "video_dim": video_dim, "audio_dim": sd["audio_patch_proj.weight"].shape[1],
        "head_dim": head_dim, "heads": sd["blocks.0.attn.qkv_proj.weight"].shape[0] // (3 * head_dim),
        "num_layers": _count(sd, "blocks."), "refiner_layers": _count(sd, "token_refiner.blocks."),
        "rope_freq_dim": sd["rope.inv_freq"].shape[0] if "rope.inv_freq" in sd else 16,
        "rope_theta": 10000.0, "eps": 1e-5, "qk_eps": 1e-5, "final_eps": 1e-5,
        "pruned": "adaln_t_table" in sd,
    }
    if not cfg["pruned"]:
        cfg["freq_dim"] = sd["time_embedder.proj_in.weight"].shape[1]
    return cfg


def _count(sd, prefix):
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in sd):
        n += 1
    return n


def _diffusers_to_official(sd):
    """diffusers names -> official names; q/k/v are fused contiguously, fc1's swapped halves put back."""
    ren = [("proj_in.", "video_patch_proj."), ("audio_proj_in.", "audio_patch_proj."),
           ("context_embedder.", "condition_proj."), ("time_embedder.linear_1.", "time_embedder.proj_in."),
           ("time_embedder.linear_2.", "time_embedder.proj_out."), ("norm_out.norm.", "final_layer.norm."),
           ("norm_out.linear.", "final_layer.adaln_proj.linear."), ("proj_out.", "final_layer.video_out."),
           ("audio_proj_out.", "final_layer.audio_out."), ("token_refiner.refiner_blocks.", "token_refiner.blocks."),
           ("transformer_blocks.", "blocks.")]
    out = {}
    for k, v in sd.items():
        for a, b in ren:
            if k.startswith(a):
                k = b + k[len(a):]
                break
        k = k.replace(".attn.norm_q.", ".attn.q_norm.").replace(".attn.norm_k.", ".attn.k_norm.")
        k = k.replace(".attn.to_out.0.", ".attn.out_proj.").replace(".ff.net.2.", ".mlp.fc2.")
        if k.endswith(".ff.net.0.proj.weight"):
            value, gate = v.chunk(2, dim=0)
            k, v = k.replace(".ff.net.0.proj.", ".mlp.fc1."), torch.cat([gate, value])
        out[k] = v
    for k in [k for k in out if k.endswith(".attn.to_q.weight")]:
        p = k[: -len("to_q.weight")]
        out[p + "qkv_proj.weight"] = torch.cat([out.pop(p + "to_q.weight"), out.pop(p + "to_k.weight"),
                                                 out.pop(p + "to_v.weight")])
    return out


def interleave_qkv(w, head_dim):
    """[Q; K; V] rows -> the official shards' per-head [h0: q k v, h1: q k v, ...] (also the video VAE's to_qkv);
    w is [3·H·D, ...] (a weight or a bias)."""
    heads = w.shape[0] // (3 * head_dim)
    rest = w.shape[1:]
    return w.reshape(3, heads, head_dim, *rest).transpose(0, 1).reshape(3 * heads * head_dim, *rest).contiguous()


def deinterleave_qkv(w, head_dim):
    """Official shards: rows [h0: q k v, h1: q k v, ...] -> [Q; K; V]."""
    heads = w.shape[0] // (3 * head_dim)
    q, k, v = w.reshape(heads, 3, head_dim, -1).unbind(1)
    return torch.cat([q.reshape(heads * head_dim, -1), k.reshape(heads * head_dim, -1),
                      v.reshape(heads * head_dim, -1)])


def canonical(sd):
    """Any layout -> (canonical state dict, layout name)."""
    if "transformer_blocks.0.attn.to_q.weight" in sd:
        return _diffusers_to_official(sd), "diffusers"
    if "adaln_t_table" in sd:
        return dict(sd), "comfy-pruned"  # ComfyUI stores the in-memory [Q; K; V] order
    out = dict(sd)
    hd = sd["blocks.0.attn.q_norm.weight"].shape[0]
    for k in out:
        if k.endswith(".attn.qkv_proj.weight"):
            out[k] = deinterleave_qkv(out[k], hd)
    return out, "official"


def load_dit(path, dtype=torch.float64):
    sd, layout = canonical(read_weights(path))
    cfg = infer_config(sd)
    cfg["layout"] = layout
    return {k: v.to(dtype) for k, v in sd.items()}, cfg


# ---- the model -----------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def linear(x, sd, name):
    y = x @ sd[name + ".weight"].T
    return y + sd[name + ".bias"] if name + ".bias" in sd else y


def timestep_sinusoid(t, dim):
    """cos first, frequencies exp(-ln(10000)·j/(dim/2)), t in [0, 1] unscaled."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=t.dtype) / half)
    a = t[:, None] * freqs[None]
    return torch.cat([torch.cos(a), torch.sin(a)], dim=-1)


def adaln_input(sd, cfg, t):
    """What every AdaLN projection multiplies, per distinct timestep: silu(temb), or the curve-table lerp."""
    if cfg["pruned"]:
        table = sd["adaln_t_table"]
        g = table.shape[0]
        pos = t.clamp(0, 1) * (g - 1)
        i0 = pos.floor().long().clamp(max=g - 2)
        frac = (pos - i0.to(pos.dtype))[:, None]
        return table[i0] + frac * (table[i0 + 1] - table[i0])
    e = timestep_sinusoid(t, cfg["freq_dim"])
    temb = linear(torch.nn.functional.silu(linear(e, sd, "time_embedder.proj_in")), sd, "time_embedder.proj_out")
    return torch.nn.functional.silu(temb)


def modulation(sd, cfg, t):
    """Per block a [T*3, 6*hidden] table (rows t0:video, t0:text, t0:audio, t1:video, ...; columns shift_msa,
    scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp), and the final layer's [T, 2*hidden] (shift, scale)."""
    a = adaln_input(sd, cfg, t)
    h = cfg["hidden_size"]
    blocks = [linear(a, sd, f"blocks.{i}.adaln_proj.linear").reshape(-1, 6 * h) for i in range(cfg["num_layers"])]
    return blocks, linear(a, sd, "final_layer.adaln_proj.linear")


def rope_tables(pos, inv_freq):
    """pos [S, 3] (t, h, w) -> cos, sin [S, 6F]: angles [t(F) | h(F) | w(F)] written twice."""
    ang = (pos[:, :, None] * inv_freq[None, None, :]).reshape(pos.shape[0], -1)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """Rotate-half on the first R = cos.shape[-1] channels of every head; the rest pass through. x [S, H, D]."""
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * cos[:, None] + rotated * sin[:, None], xp], dim=-1)


def attention(x, sd, p, cfg, rope):
    s, heads, hd = x.shape[0], cfg["heads"], cfg["head_dim"]
    q, k, v = (x @ sd[p + "attn.qkv_proj.weight"].T).reshape(s, 3, heads, hd).unbind(1)
    q = rms_norm(q, sd[p + "attn.q_norm.weight"], cfg["qk_eps"])
    k = rms_norm(k, sd[p + "attn.k_norm.weight"], cfg["qk_eps"])
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    scores = torch.einsum("shd,thd->hst", q, k) / math.sqrt(hd)
    o = torch.einsum("hst,thd->shd", scores.softmax(-1), v)
    return o.reshape(s, heads * hd) @ sd[p + "attn.out_proj.weight"].T


def mlp(x, sd, p):
    gate, value = (x @ sd[p + "mlp.fc1.weight"].T).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * value) @ sd[p + "mlp.fc2.weight"].T


def refine_text(sd, cfg, text):
    x = linear(text, sd, "condition_proj")
    for i in range(cfg["refiner_layers"]):
        p = f"token_refiner.blocks.{i}."
        x = x + attention(rms_norm(x, sd[p + "norm1.weight"], cfg["eps"]), sd, p, cfg, None)
        x = x + mlp(rms_norm(x, sd[p + "norm2.weight"], cfg["eps"]), sd, p)
    return rms_norm(x, sd["token_refiner.final_norm.weight"], cfg["final_eps"])


def inv_freq(cfg, dtype):
    """1/theta^(2j/(2F)), j < F: one set of F frequencies shared by the t, h and w axes. (The official files also
    ship it as rope.inv_freq in f32; the value computed here is what that f32 rounds.)"""
    f = cfg["rope_freq_dim"]
    return 1.0 / cfg["rope_theta"] ** (torch.arange(0, 2 * f, 2, dtype=dtype) / (2 * f))


def forward(sd, cfg, inp, dtype=torch.float64, trace=None):
    """inp: the `h3run dit` input tensors (video, audio, text, timesteps, timestep_indices, token_tags,
    position_ids, video_indices, audio_indices, text_indices). Returns (video velocity, audio velocity) in the
    row order of video_indices / audio_indices. trace (a dict) receives intermediate tensors."""
    h = cfg["hidden_size"]
    tags, tidx = inp["token_tags"].long(), inp["timestep_indices"].long()
    vi, ai, ti = inp["video_indices"].long(), inp["audio_indices"].long(), inp["text_indices"].long()
    s = tags.shape[0]
    rope = rope_tables(inp["position_ids"].to(dtype), inv_freq(cfg, dtype))
    mods, final_mod = modulation(sd, cfg, inp["timesteps"].to(dtype))

    text = refine_text(sd, cfg, inp["text"].to(dtype))
    # the rows in sequence order, gathered (not assigned in place, so the forward also runs under vmap)
    src = torch.empty(s, dtype=torch.long)
    src[ti] = torch.arange(ti.shape[0])
    src[vi] = ti.shape[0] + torch.arange(vi.shape[0])
    src[ai] = ti.shape[0] + vi.shape[0] + torch.arange(ai.shape[0])
    x = torch.cat([text, linear(inp["video"].to(dtype), sd, "video_patch_proj"),
                   linear(inp["audio"].to(dtype), sd, "audio_patch_proj")], 0)[src]

    rows = tidx * 3 + tags  # each row's (timestep, modality) modulation row
    for i in range(cfg["num_layers"]):
        p = f"blocks.{i}."
        shift1, scale1, gate1, shift2, scale2, gate2 = mods[i][rows].chunk(6, dim=-1)
        y = rms_norm(x, sd[p + "norm1.weight"], cfg["eps"]) * (1 + scale1) + shift1
        x = x + gate1 * attention(y, sd, p, cfg, rope)
        y = rms_norm(x, sd[p + "norm2.weight"], cfg["eps"]) * (1 + scale2) + shift2
        x = x + gate2 * mlp(y, sd, p)

    shift, scale = final_mod[tidx].chunk(2, dim=-1)  # per timestep, not per modality
    y = rms_norm(x, sd["final_layer.norm.weight"], cfg["final_eps"]) * (1 + scale) + shift
    if trace is not None:
        trace.update({"text_refined": text, "modulation_final": final_mod, "hidden_final": x})
        trace.update({f"modulation_block{i}": m for i, m in enumerate(mods)})
    return linear(y[vi], sd, "final_layer.video_out"), linear(y[ai], sd, "final_layer.audio_out")
