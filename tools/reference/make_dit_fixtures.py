"""Writes tests/fixtures/dit/: a reduced MiniMax-H3 DiT in the three layouts h3run reads, one packed input
sequence, and the outputs tools/reference/dit.py computes for it in float64.

    /usr/bin/python3 tools/reference/make_dit_fixtures.py [OUT_DIR]

The reduced model keeps the real structure: head_dim 128 with RoPE on the first 96 channels (16 frequencies per
axis), 2 heads (inner 256 > hidden 32), 2 blocks and 2 refiner blocks, the real 96-wide video patch rows, 32-wide
audio rows and 256-wide timestep sinusoid, fp32 islands where the release has them, bf16 elsewhere.
The official and diffusers files hold the same weights (so they share expected outputs); the ComfyUI pruned file
holds the same core weights with the AdaLN replaced by a rank-8 fit of the full model's time curve.
The sequence has three distinct timesteps (target video, target audio, a keyframe at 0.999), a vision token inside
the text, and the real position rules (media clock at L, 5/3 frame spacing, aspect-normalised h/w, stereo audio
pinned to the grid's left and right edges).
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dit  # noqa: E402

CFG = dict(hidden=32, heads=2, head_dim=128, ffn=64, layers=2, refiner=2, in_channels=24, audio=32, text_dim=24,
           freq_dim=256, time_hidden=32, time_embed_dim=16, rope_freq_dim=16, rope_theta=10000.0, rank=8, grid=1025)
SEED = 20261130

g = torch.Generator().manual_seed(SEED)


def randn(*shape, std=1.0):
    return torch.randn(*shape, generator=g, dtype=torch.float64) * std


def lin(n_out, n_in, gain=1.0):
    return randn(n_out, n_in, std=gain / math.sqrt(n_in))


def canonical_weights():
    """Official names, QKV rows [Q; K; V], fc1 [gate; value]; float64 values already rounded to the stored dtype."""
    c = CFG
    hd, inner, hid = c["head_dim"], c["heads"] * c["head_dim"], c["hidden"]
    vdim = c["in_channels"] * 4
    w = {}
    f32 = {}  # name -> True for the fp32 islands

    def put(name, t, fp32=False):
        w[name] = t.to(torch.float32 if fp32 else torch.bfloat16).to(torch.float64)
        f32[name] = fp32

    put("video_patch_proj.weight", lin(hid, vdim), True)
    put("video_patch_proj.bias", randn(hid, std=0.1), True)
    put("audio_patch_proj.weight", lin(hid, c["audio"]), True)
    put("audio_patch_proj.bias", randn(hid, std=0.1), True)
    put("condition_proj.weight", lin(hid, c["text_dim"]))
    put("condition_proj.bias", randn(hid, std=0.1))
    put("time_embedder.proj_in.weight", lin(c["time_hidden"], c["freq_dim"], 2.0), True)
    put("time_embedder.proj_in.bias", randn(c["time_hidden"], std=0.3), True)
    put("time_embedder.proj_out.weight", lin(c["time_embed_dim"], c["time_hidden"], 2.0), True)
    put("time_embedder.proj_out.bias", randn(c["time_embed_dim"], std=0.3), True)
    f = c["rope_freq_dim"]
    put("rope.inv_freq", 1.0 / c["rope_theta"] ** (torch.arange(0, 2 * f, 2, dtype=torch.float64) / (2 * f)), True)

    def block(p, adaln):
        put(p + "norm1.weight", 1 + randn(hid, std=0.2))
        put(p + "norm2.weight", 1 + randn(hid, std=0.2))
        put(p + "attn.qkv_proj.weight", lin(3 * inner, hid))
        put(p + "attn.q_norm.weight", 1 + randn(hd, std=0.2))
        put(p + "attn.k_norm.weight", 1 + randn(hd, std=0.2))
        put(p + "attn.out_proj.weight", lin(hid, inner))
        put(p + "mlp.fc1.weight", lin(2 * c["ffn"], hid))
        put(p + "mlp.fc2.weight", lin(hid, c["ffn"]))
        if adaln:
            put(p + "adaln_proj.linear.weight", lin(18 * hid, c["time_embed_dim"], 0.6))
            put(p + "adaln_proj.linear.bias", randn(18 * hid, std=0.3))

    for i in range(c["refiner"]):
        block(f"token_refiner.blocks.{i}.", False)
    put("token_refiner.final_norm.weight", 1 + randn(hid, std=0.2))
    for i in range(c["layers"]):
        block(f"blocks.{i}.", True)
    put("final_layer.norm.weight", 1 + randn(hid, std=0.2))
    put("final_layer.adaln_proj.linear.weight", lin(2 * hid, c["time_embed_dim"], 0.6))
    put("final_layer.adaln_proj.linear.bias", randn(2 * hid, std=0.3))
    put("final_layer.video_out.weight", lin(vdim, hid), True)
    put("final_layer.video_out.bias", randn(vdim, std=0.1), True)
    put("final_layer.audio_out.weight", lin(c["audio"], hid), True)
    put("final_layer.audio_out.bias", randn(c["audio"], std=0.1), True)
    return w, f32


def stored(w, f32):
    return {k: v.to(torch.float32 if f32[k] else torch.bfloat16) for k, v in w.items()}


def official_files(w, f32, out):
    c = CFG
    d = os.path.join(out, "official")
    os.makedirs(d, exist_ok=True)
    t = stored(w, f32)
    for k in t:
        if k.endswith(".attn.qkv_proj.weight"):
            t[k] = dit.interleave_qkv(t[k], c["head_dim"])
    shard1 = {k: v for k, v in t.items() if not k.startswith("blocks.")}
    shard2 = {k: v for k, v in t.items() if k.startswith("blocks.")}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    dit.write_safetensors(os.path.join(d, names[0]), shard1, {"format": "pt"})
    dit.write_safetensors(os.path.join(d, names[1]), shard2, {"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in t.values())
    wm = {k: names[0] for k in shard1} | {k: names[1] for k in shard2}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, fh, indent=2)
    hid = c["hidden"]
    cfg = {"hidden_size": hid, "num_layers": c["layers"], "token_refiner_num_layers": c["refiner"],
           "num_attention_heads": c["heads"], "attention_head_dim": c["head_dim"], "ffn_hidden_size": c["ffn"],
           "latents_dim": c["in_channels"], "audio_latents_dim": c["audio"], "patch_size": [1, 2, 2],
           "text_dim": c["text_dim"], "timestep_input_dim": c["freq_dim"], "time_embed_hidden_size": c["time_hidden"],
           "time_embed_dim": c["time_embed_dim"], "adaln_out_features": 18 * hid, "final_adaln_out_features": 2 * hid,
           "rope_inv_freq_len": c["rope_freq_dim"], "norm_eps": 1e-05, "qk_norm_eps": 1e-05, "final_norm_eps": 1e-05}
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return d


def diffusers_files(w, f32, out):
    c = CFG
    d = os.path.join(out, "diffusers")
    os.makedirs(d, exist_ok=True)
    t = stored(w, f32)
    inner = c["heads"] * c["head_dim"]
    ren = [("video_patch_proj.", "proj_in."), ("audio_patch_proj.", "audio_proj_in."),
           ("condition_proj.", "context_embedder."), ("time_embedder.proj_in.", "time_embedder.linear_1."),
           ("time_embedder.proj_out.", "time_embedder.linear_2."), ("final_layer.norm.", "norm_out.norm."),
           ("final_layer.adaln_proj.linear.", "norm_out.linear."), ("final_layer.video_out.", "proj_out."),
           ("final_layer.audio_out.", "audio_proj_out."), ("token_refiner.blocks.", "token_refiner.refiner_blocks."),
           ("blocks.", "transformer_blocks.")]
    o = {}
    for k, v in t.items():
        if k == "rope.inv_freq":
            continue  # diffusers recomputes it
        for a, b in ren:
            if k.startswith(a):
                k = b + k[len(a):]
                break
        k = k.replace(".attn.q_norm.", ".attn.norm_q.").replace(".attn.k_norm.", ".attn.norm_k.")
        k = k.replace(".attn.out_proj.", ".attn.to_out.0.").replace(".mlp.fc2.", ".ff.net.2.")
        if k.endswith(".attn.qkv_proj.weight"):
            p = k[: -len("qkv_proj.weight")]
            for j, n in enumerate("qkv"):
                o[f"{p}to_{n}.weight"] = v[j * inner:(j + 1) * inner].clone()
            continue
        if k.endswith(".mlp.fc1.weight"):
            gate, value = v.chunk(2, dim=0)
            k, v = k.replace(".mlp.fc1.", ".ff.net.0.proj."), torch.cat([value, gate])
        o[k] = v
    dit.write_safetensors(os.path.join(d, "diffusion_pytorch_model.safetensors"), o, {"format": "pt"})
    cfg = {"_class_name": "MiniMaxH3Transformer3DModel", "_diffusers_version": "0.37.0.dev0",
           "num_attention_heads": c["heads"], "attention_head_dim": c["head_dim"], "hidden_size": c["hidden"],
           "num_layers": c["layers"], "num_refiner_layers": c["refiner"], "ffn_dim": c["ffn"],
           "in_channels": c["in_channels"], "audio_in_channels": c["audio"], "patch_size": [1, 2, 2],
           "text_dim": c["text_dim"], "freq_dim": c["freq_dim"], "time_embed_hidden_dim": c["time_hidden"],
           "time_embed_dim": c["time_embed_dim"], "rope_freq_dim": c["rope_freq_dim"], "rope_theta": c["rope_theta"],
           "norm_eps": 1e-05, "qk_norm_eps": 1e-05, "final_norm_eps": 1e-05}
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return d


def pruned_file(w, f32, out):
    """ComfyUI's curve form: adaln_t_table [grid, rank] f32 holds centred coordinates of silu(temb(t)) on
    t = i/(grid-1) in a rank-8 basis; each AdaLN matrix becomes W·V (f16) and its bias b + W·mean (f16)."""
    c = CFG
    t = stored(w, f32)
    grid = torch.arange(c["grid"], dtype=torch.float64) / (c["grid"] - 1)
    cfg = {"pruned": False, "freq_dim": c["freq_dim"]}
    e = dit.adaln_input(w, cfg, grid)  # [grid, time_embed_dim], float64
    mean = e.mean(0)
    _, _, vt = torch.linalg.svd(e - mean, full_matrices=False)
    basis = vt[: c["rank"]].T  # [time_embed_dim, rank]
    for k in [k for k in t if k.startswith("time_embedder.")]:
        del t[k]
    t["adaln_t_table"] = ((e - mean) @ basis).to(torch.float32)
    for k in [k for k in w if k.endswith("adaln_proj.linear.weight")]:
        b = k[: -len("weight")] + "bias"
        t[k] = (w[k] @ basis).to(torch.float16)
        t[b] = (w[b] + w[k] @ mean).to(torch.float16)
    p = os.path.join(out, "comfy_pruned.safetensors")
    dit.write_safetensors(p, t)
    return p


def inputs():
    """[text 5 | keyframe rows 6 | audio 2x3 | video 2 frames x 6], latent grid 4 x 6 (patches 2 x 3)."""
    c = CFG
    n_text, lat_h, lat_w, frames, audio_t = 5, 4, 6, 2, 3
    ph, pw = lat_h // 2, lat_w // 2
    per_frame = ph * pw
    sigma_v = 0.38
    base = sigma_v / (12.0 + sigma_v * (1.0 - 12.0))  # video shift 12 -> audio shift 3
    sigma_a = 3.0 * base / (1.0 + 2.0 * base)
    timesteps = torch.tensor([1.0 - sigma_v, 1.0 - sigma_a, 0.999], dtype=torch.float32)

    def axis(dim):
        ratio = dim / math.sqrt(lat_h * lat_w)
        n = dim // 2
        return (torch.arange(n, dtype=torch.float64) * (ratio / n) + (1.0 - ratio) / 2.0) * 32.0

    hh, ww = torch.meshgrid(axis(lat_h), axis(lat_w), indexing="ij")
    frame_hw = torch.stack([hh.reshape(-1), ww.reshape(-1)], dim=-1)
    w_grid = axis(lat_w)
    L = float(n_text)
    pos, tags, tidx = [], [], []
    for k in range(n_text):  # text: t = k; one vision token inside the text (tag 0)
        pos.append([float(k), 0.0, 0.0])
        tags.append(0 if k == 2 else 1)
        tidx.append(0)
    for r in range(per_frame):  # first keyframe at the media origin, pinned timestep 0.999
        pos.append([L, *frame_hw[r].tolist()])
        tags.append(0)
        tidx.append(2)
    for ch, wpos in ((0, w_grid[0].item()), (1, w_grid[-1].item())):  # stereo, channel-major
        for k in range(audio_t):
            pos.append([L + k, 0.0, wpos])
            tags.append(2)
            tidx.append(1)
    spans = [5.0 / 3.0 * s for s in (1, 4, 4, 4, 4)]
    tf = L
    for f in range(frames):
        for r in range(per_frame):
            pos.append([tf, *frame_hw[r].tolist()])
            tags.append(0)
            tidx.append(0)
        tf += spans[f % 5]
    s = len(pos)
    n_cond = per_frame
    text_idx = torch.arange(0, n_text)
    audio_idx = torch.arange(n_text + n_cond, n_text + n_cond + 2 * audio_t)
    video_idx = torch.cat([torch.arange(n_text, n_text + n_cond), torch.arange(n_text + n_cond + 2 * audio_t, s)])
    return {
        "video": randn(len(video_idx), c["in_channels"] * 4).to(torch.float32),
        "audio": randn(len(audio_idx), c["audio"]).to(torch.float32),
        "text": randn(n_text, c["text_dim"]).to(torch.float32),
        "timesteps": timesteps,
        "timestep_indices": torch.tensor(tidx, dtype=torch.int64),
        "token_tags": torch.tensor(tags, dtype=torch.int64),
        "position_ids": torch.tensor(pos, dtype=torch.float64),
        "video_indices": video_idx.to(torch.int64),
        "audio_indices": audio_idx.to(torch.int64),
        "text_indices": text_idx.to(torch.int64),
    }


def expected(model_path, inp):
    sd, cfg = dit.load_dit(model_path)
    trace = {}
    v, a = dit.forward(sd, cfg, inp, trace=trace)
    out = {"video_velocity": v, "audio_velocity": a, "text_refined": trace["text_refined"],
           "modulation.final": trace["modulation_final"]}
    for i in range(cfg["num_layers"]):
        out[f"modulation.blocks.{i}"] = trace[f"modulation_block{i}"]
    return {k: t.to(torch.float32) for k, t in out.items()}, cfg["layout"]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../tests/fixtures/dit")
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    w, f32 = canonical_weights()
    off = official_files(w, f32, out)
    dif = diffusers_files(w, f32, out)
    pru = pruned_file(w, f32, out)
    inp = inputs()
    dit.write_safetensors(os.path.join(out, "inputs.safetensors"), inp)
    inp = dit.read_safetensors(os.path.join(out, "inputs.safetensors"))

    full, lay = expected(off, inp)
    assert lay == "official", lay
    full_d, lay = expected(dif, inp)
    assert lay == "diffusers", lay
    for k in full:  # the two layouts hold the same weights: the reference must give the same numbers
        assert torch.equal(full[k], full_d[k]), k
    pruned, lay = expected(pru, inp)
    assert lay == "comfy-pruned", lay
    dit.write_safetensors(os.path.join(out, "expected_full.safetensors"), full)
    dit.write_safetensors(os.path.join(out, "expected_pruned.safetensors"), pruned)

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    print(f"wrote {out}")
    print(f"  video velocity {tuple(full['video_velocity'].shape)}, max |v| {full['video_velocity'].abs().max():.3f}")
    print(f"  audio velocity {tuple(full['audio_velocity'].shape)}, max |v| {full['audio_velocity'].abs().max():.3f}")
    print(f"  pruned (rank-8 fit of a 16-wide curve) vs full: video {rel(pruned['video_velocity'], full['video_velocity']):.3g}"
          f", audio {rel(pruned['audio_velocity'], full['audio_velocity']):.3g} (max-relative)")
    total = 0
    for root, _, files in os.walk(out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"  {total / 1e6:.2f} MB in all")


if __name__ == "__main__":
    main()
