"""Qwen3-VL's text decoder (H3-Encoder), written from the model facts (H3-FACTS.md §2, H3-FILE-FORMATS.md §3) as
the project's reference for src/models/text_encoder.c.

It computes hidden_states[0..layers]: index 0 is the token embedding, index i the un-normalized residual stream
after decoder layer i-1 (H3 conditions on index 50). The final norm, the LM head and the vision tower are never
used. Float64 by default over weights given in canonical names ("embed_tokens.weight", "layers.N.self_attn.q_proj
.weight", ...): `canonical` strips the official ("model.language_model.") or ComfyUI ("model.") prefix.

One decoder layer:
    h = rmsnorm(x) * input_layernorm
    q, k, v = h Wq^T, h Wk^T, h Wv^T          split into heads of head_dim D (q: H heads, k and v: Hk heads)
    q, k = rmsnorm over D of each head * q_norm / k_norm, then the rotary embedding
    x = x + softmax(q k^T / sqrt(D) + causal mask) v Wo^T      query head i reads key/value head i // (H / Hk)
    x = x + down(silu(gate(h2)) * up(h2)),  h2 = rmsnorm(x) * post_attention_layernorm
RMSNorm: x / sqrt(mean(x^2) + eps) * w with eps 1e-6. No biases anywhere.

Rotary embedding: interleaved mRoPE. Frequencies f_j = theta^(-2j/D), j < D/2. Each j reads one of three position
axes (t, h, w): with mrope_section [s_t, s_h, s_w], j = 1, 4, 7, ... < 3 s_h reads h, j = 2, 5, 8, ... < 3 s_w reads
w, every other j reads t. angle_j = pos[axis(j)] * f_j; cos/sin over cat(angles, angles); rotate-half:
    y = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[D/2:], x[:D/2]).
A text-only prompt has pos[t] = pos[h] = pos[w] = 0..L-1, so the axis choice does not matter and this is ordinary
1-D RoPE (`mrope_angles` with three equal rows equals `rope_angles`; `check_text_only_mrope` asserts it).

Needs numpy and torch only.
"""


import torch

# ---- safetensors ----------------------------------------------------------------------------------------------

from safetensors_io import read_safetensors as load_safetensors  # noqa: E402,F401  (one reader and writer for all)
from safetensors_io import write_safetensors as save_safetensors  # noqa: E402,F401


# ---- weights --------------------------------------------------------------------------------------------------

PREFIXES = ("model.language_model.", "model.")


def canonical(state_dict):
    """Text-decoder weights under canonical names, from official or ComfyUI names; other tensors are dropped."""
    out = {}
    for name, t in state_dict.items():
        for p in PREFIXES:
            if name.startswith(p) and (name.startswith(p + "layers.") or name == p + "embed_tokens.weight"):
                out[name[len(p):]] = t
                break
    return out


# ---- the model ------------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def inv_freq(cfg, dtype=torch.float64):
    d = cfg["head_dim"]
    return 1.0 / cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d).to(dtype)


def rope_angles(cfg, n, dtype=torch.float64):
    """[n, D/2]: position p times f_j."""
    return torch.arange(n, dtype=dtype)[:, None] * inv_freq(cfg, dtype)[None, :]


def mrope_axis(cfg):
    """[D/2]: the position axis (0 t, 1 h, 2 w) each frequency reads in interleaved mRoPE."""
    half = cfg["head_dim"] // 2
    sec = cfg["mrope_section"]
    axis = torch.zeros(half, dtype=torch.long)
    axis[1:3 * sec[1]:3] = 1
    axis[2:3 * sec[2]:3] = 2
    return axis


def mrope_angles(cfg, pos3, dtype=torch.float64):
    """[n, D/2] from positions [3, n] (t, h, w rows)."""
    f = inv_freq(cfg, dtype)
    per_axis = pos3.to(dtype)[:, :, None] * f[None, None, :]  # [3, n, D/2]
    axis = mrope_axis(cfg)
    return per_axis.gather(0, axis[None, None, :].expand(1, pos3.shape[1], -1))[0]


def check_text_only_mrope(cfg, n=64):
    """Text-only prompts: the three axes carry the same positions, so mRoPE is 1-D RoPE."""
    pos = torch.arange(n)
    a = mrope_angles(cfg, torch.stack([pos, pos, pos]))
    b = rope_angles(cfg, n)
    assert torch.equal(a, b), "interleaved mRoPE with equal axes must equal 1-D RoPE"
    # and it is not vacuous: distinct axes change the angles of the h and w frequencies
    c = mrope_angles(cfg, torch.stack([pos, pos * 0, pos * 0]))
    assert not torch.equal(a, c)


def rotate(x, ang):
    """x [n, heads, D], ang [n, D/2]."""
    emb = torch.cat([ang, ang], dim=-1)[:, None, :]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * emb.cos() + rot * emb.sin()


def decoder_layer(x, w, cfg, ang):
    n = x.shape[0]
    H, Hk, D, eps = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["rms_eps"]
    h = rms_norm(x, w["input_layernorm.weight"], eps)
    q = (h @ w["self_attn.q_proj.weight"].T).view(n, H, D)
    k = (h @ w["self_attn.k_proj.weight"].T).view(n, Hk, D)
    v = (h @ w["self_attn.v_proj.weight"].T).view(n, Hk, D)
    q = rotate(rms_norm(q, w["self_attn.q_norm.weight"], eps), ang)
    k = rotate(rms_norm(k, w["self_attn.k_norm.weight"], eps), ang)
    group = H // Hk
    k = k.repeat_interleave(group, dim=1)  # query head i -> key head i // group
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / D ** 0.5
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    o = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).reshape(n, H * D)
    x = x + o @ w["self_attn.o_proj.weight"].T
    h2 = rms_norm(x, w["post_attention_layernorm.weight"], eps)
    g = h2 @ w["mlp.gate_proj.weight"].T
    u = h2 @ w["mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(g) * u) @ w["mlp.down_proj.weight"].T


def hidden_states(weights, cfg, ids, layers, dtype=torch.float64):
    """[hidden_states[0], ..., hidden_states[layers]] for token ids (a list or 1-D tensor), in dtype.

    weights: canonical names (see `canonical`), any float dtype (converted to dtype here)."""
    w = {k: v.to(dtype) for k, v in weights.items()}
    ids = torch.as_tensor(ids, dtype=torch.long)
    x = w["embed_tokens.weight"][ids]
    ang = rope_angles(cfg, ids.shape[0], dtype)
    out = [x]
    for i in range(layers):
        p = "layers.%d." % i
        lw = {k[len(p):]: v for k, v in w.items() if k.startswith(p)}
        x = decoder_layer(x, lw, cfg, ang)
        out.append(x)
    return out


def config_from_json(j):
    """The fields used here, from a transformers Qwen3VLConfig (its text_config) or a Qwen3 text config."""
    t = j.get("text_config", j)
    rp = t.get("rope_parameters") or {}
    rs = t.get("rope_scaling") or {}
    return dict(hidden=t["hidden_size"], layers=t["num_hidden_layers"], heads=t["num_attention_heads"],
                kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"], intermediate=t["intermediate_size"],
                vocab=t["vocab_size"], rms_eps=t.get("rms_norm_eps", 1e-6),
                rope_theta=rp.get("rope_theta", t.get("rope_theta", 5e6)),
                mrope_section=rp.get("mrope_section", rs.get("mrope_section", [24, 20, 20])))
