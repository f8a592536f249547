"""Writes tests/fixtures/video_vae/ and tests/fixtures/audio_vae/: reduced-size VAE decoders with random weights in
the layouts users have, latents, and the outputs of the project's reference decoders (video_vae.py, audio_vae.py)
computed in float64 and stored as float32.

    /usr/bin/python3 tools/reference/make_vae_fixtures.py            # from the repository root

Video: a ViT decoder 2 blocks wide 32 (2 heads of 16), 2× spatial and 4× temporal patches (the released temporal
geometry: 17-frame clips, 3 dropped tokens), 16 px tiles with at least 4 px of overlap in the official config;
weights in the official layout (f32), the diffusers layout (f32) and ComfyUI's (f16, no config).

Audio: a BigVGAN with the released rates (5,5,2,2,2,2,2), kernels, AMP blocks and resampling filters but 128
initial channels and a 64-wide latent projection. Its 0.85 M weights would weigh 3.4 MB, so they are not stored:
`manifest_*.json` lists every tensor (name, shape) with a splitmix64 seed that generates its values, and the C tests
write the safetensors files from it (tests/test_audio_vae.c --write-model). Value i (from 0) of a tensor is the
float32 rounding of offset + scale·(2u − 1), u = (splitmix64_mix(seed + (i+1)·0x9E3779B97F4A7C15 mod 2^64) >> 40)
/ 2^24 (see `generate`); the resampling filters are listed by value.
"""

import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import audio_vae  # noqa: E402
import video_vae  # noqa: E402
from dit import interleave_qkv  # noqa: E402
from video_vae import read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VDIR = os.path.join(ROOT, "tests", "fixtures", "video_vae")
ADIR = os.path.join(ROOT, "tests", "fixtures", "audio_vae")

# ---- video ------------------------------------------------------------------------------------------------------

VCFG = {
    "latent_channels": 24, "out_channels": 3, "patch_size": 2, "patch_size_t": 4, "num_layers": 2, "heads": 2,
    "head_dim": 16, "num_register_tokens": 4, "ffn_mult": 4, "rope_theta": 100.0, "rope_dim_ratio": 0.75,
    "norm_eps": 1e-5, "clip_length": 17, "token_drop": 3, "tile_size": 16, "tile_overlap_min": 4,
}


def video_weights(g):
    """Canonical float32 weights: official names, QKV [Q; K; V], w1 [gate; up]."""
    C, dim = VCFG["latent_channels"], VCFG["heads"] * VCFG["head_dim"]
    inner = dim * VCFG["ffn_mult"]
    P = VCFG["out_channels"] * VCFG["patch_size_t"] * VCFG["patch_size"] ** 2
    r = lambda *s, std=1.0: (torch.randn(*s, generator=g, dtype=torch.float64) * std).float()
    w = {
        "post_quant_conv.weight": r(C, C, std=C ** -0.5), "post_quant_conv.bias": r(C, std=0.1),
        "x_embedder.weight": r(dim, C, std=C ** -0.5), "x_embedder.bias": r(dim, std=0.1),
        "register_tokens": r(VCFG["num_register_tokens"], dim),
        "norm_out.weight": 1 + r(dim, std=0.1), "norm_out.bias": r(dim, std=0.1),
        "proj_out.weight": r(P, dim, std=dim ** -0.5), "proj_out.bias": r(P, std=0.1),
    }
    for i in range(VCFG["num_layers"]):
        b = f"blocks.{i}."
        w[b + "norm1.weight"] = 1 + r(dim, std=0.1)
        w[b + "norm2.weight"] = 1 + r(dim, std=0.1)
        w[b + "qkv.weight"] = r(3 * dim, dim, std=dim ** -0.5)
        w[b + "qkv.bias"] = r(3 * dim, std=0.1)
        w[b + "out.weight"] = r(dim, dim, std=dim ** -0.5)
        w[b + "out.bias"] = r(dim, std=0.1)
        w[b + "w1.weight"] = r(2 * inner, dim, std=dim ** -0.5)
        w[b + "w1.bias"] = r(2 * inner, std=0.1)
        w[b + "w2.weight"] = r(dim, inner, std=inner ** -0.5)
        w[b + "w2.bias"] = r(dim, std=0.1)
        w[b + "scale1"] = 0.5 + r(dim, std=0.2)
        w[b + "scale2"] = 0.5 + r(dim, std=0.2)
    return w


def official_state(w, dtype=torch.float32):
    H, D = VCFG["heads"], VCFG["head_dim"]
    dim = H * D
    sd = {
        "post_quant_conv.weight": w["post_quant_conv.weight"].reshape(*w["post_quant_conv.weight"].shape, 1, 1, 1),
        "post_quant_conv.bias": w["post_quant_conv.bias"],
        "decoder.x_embedder.weight": w["x_embedder.weight"], "decoder.x_embedder.bias": w["x_embedder.bias"],
        "decoder.register_tokens": w["register_tokens"].reshape(1, -1, dim),
        "decoder.mask_token": torch.zeros(1, 1, dim),
    }
    for k in ("norm_out.weight", "norm_out.bias", "proj_out.weight", "proj_out.bias"):
        sd["decoder." + k] = w[k]
    for i in range(VCFG["num_layers"]):
        b, p = f"blocks.{i}.", f"decoder.transformer_blocks.{i}."
        for k in ("norm1.weight", "norm2.weight", "scale1", "scale2"):
            sd[p + k] = w[b + k]
        for s in ("weight", "bias"):
            sd[p + "attn.to_qkv." + s] = interleave_qkv(w[b + "qkv." + s], D)
            sd[p + "attn.to_out." + s] = w[b + "out." + s]
            sd[p + "ff.w1." + s] = w[b + "w1." + s]
            sd[p + "ff.w2." + s] = w[b + "w2." + s]
    return {k: v.to(dtype).contiguous() for k, v in sd.items()}


def diffusers_state(w):
    dim = VCFG["heads"] * VCFG["head_dim"]
    sd = {
        "post_quant_conv.weight": w["post_quant_conv.weight"].reshape(*w["post_quant_conv.weight"].shape, 1, 1, 1),
        "post_quant_conv.bias": w["post_quant_conv.bias"],
        "decoder.proj_in.weight": w["x_embedder.weight"], "decoder.proj_in.bias": w["x_embedder.bias"],
        "decoder.register_tokens": w["register_tokens"].reshape(1, -1, dim),
    }
    for k in ("norm_out.weight", "norm_out.bias", "proj_out.weight", "proj_out.bias"):
        sd["decoder." + k] = w[k]
    for i in range(VCFG["num_layers"]):
        b, p = f"blocks.{i}.", f"decoder.transformer_blocks.{i}."
        for k in ("norm1.weight", "norm2.weight", "scale1", "scale2"):
            sd[p + k] = w[b + k]
        for s in ("weight", "bias"):
            q, k_, v = w[b + "qkv." + s].chunk(3, 0)
            sd[p + "attn.to_q." + s], sd[p + "attn.to_k." + s], sd[p + "attn.to_v." + s] = q, k_, v
            sd[p + "attn.to_out.0." + s] = w[b + "out." + s]
            gate, up = w[b + "w1." + s].chunk(2, 0)
            sd[p + "ff.net.0.proj." + s] = torch.cat([up, gate], 0)
            sd[p + "ff.net.2." + s] = w[b + "w2." + s]
    return {k: v.contiguous() for k, v in sd.items()}


def write_video_models(w, g):
    C = VCFG["latent_channels"]
    mean = (torch.randn(C, generator=g, dtype=torch.float64) * 0.5).tolist()
    std = (0.5 + torch.rand(C, generator=g, dtype=torch.float64)).tolist()
    mean = [float(np.float32(x)) for x in mean]
    std = [float(np.float32(x)) for x in std]
    vit = {"num_layers": VCFG["num_layers"], "heads": VCFG["heads"], "dim_head": VCFG["head_dim"],
           "ffn_activation_fn": "silu", "ffn_use_gated": True, "norm_type": "rms_norm", "norm_affine": True,
           "qk_norm_type": "rms_norm", "qk_norm_affine": False, "rope_theta": VCFG["rope_theta"],
           "rope_dim_ratio": VCFG["rope_dim_ratio"]}

    d = os.path.join(VDIR, "official")
    os.makedirs(os.path.join(d, "source"), exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"_class_name": "MiniMaxH3VideoVAE", "source_path": "source",
                   "source_safetensors_path": "model.safetensors", "latent_channels": C, "latents_mean": mean,
                   "latents_std": std, "vae_clip_length": VCFG["clip_length"], "vae_token_drop": VCFG["token_drop"],
                   "vae_tile_size": VCFG["tile_size"], "vae_tile_overlap_min": VCFG["tile_overlap_min"]}, f, indent=1)
    with open(os.path.join(d, "source", "config.json"), "w") as f:
        json.dump({"_class_name": "AutoencoderKLLegacy", "in_channels": 3, "out_ch": VCFG["out_channels"],
                   "ch": 8, "ch_mult": [1, 1], "num_res_blocks": 1, "embed_dim": C, "z_channels": C,
                   "space_down": [2, 1], "time_down": [2, 2], "vae_ratio": VCFG["patch_size"],
                   "vae_ratio_t": VCFG["patch_size_t"], "causal_encoder": True, "causal_decoder": False,
                   "use_vit_decoder": True, "vit_decoder_kwargs": vit, "padding_mode": "reflect",
                   "pixel_norm_type": "imagenet", "scaling_factor": 1.0, "shift_factor": 0.0}, f, indent=1)
    write_safetensors(os.path.join(d, "source", "model.safetensors"), official_state(w), {"format": "pt"})

    d = os.path.join(VDIR, "diffusers")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"_class_name": "AutoencoderKLMiniMaxH3", "in_channels": 3, "out_channels": VCFG["out_channels"],
                   "latent_channels": C, "block_out_channels": [8, 8], "layers_per_block": 1,
                   "spatial_downsample_factors": [2, 1], "temporal_downsample_factors": [2, 2],
                   "norm_num_groups": 4, "norm_eps": 1e-6, "spatial_padding_mode": "reflect",
                   "decoder_num_layers": VCFG["num_layers"], "decoder_num_attention_heads": VCFG["heads"],
                   "decoder_attention_head_dim": VCFG["head_dim"],
                   "decoder_num_register_tokens": VCFG["num_register_tokens"], "decoder_ffn_mult": VCFG["ffn_mult"],
                   "decoder_rope_theta": VCFG["rope_theta"], "decoder_rope_dim_ratio": VCFG["rope_dim_ratio"],
                   "decoder_norm_eps": VCFG["norm_eps"], "clip_length": VCFG["clip_length"],
                   "token_drop": VCFG["token_drop"], "latents_mean": mean, "latents_std": std}, f, indent=1)
    write_safetensors(os.path.join(d, "diffusion_pytorch_model.safetensors"), diffusers_state(w), {"format": "pt"})

    write_safetensors(os.path.join(VDIR, "comfy.safetensors"), official_state(w, torch.float16))


VIDEO_CASES = [
    # name, model, (T, H, W), heads override, note
    ("official_tiles", "official", (7, 10, 16), None, "one chunk, 2 x 3 tiles"),
    ("official_chunks", "official", (12, 4, 16), None, "two chunks cross-faded, 1 x 3 tiles"),
    ("diffusers_pad", "diffusers", (9, 4, 6), None, "two chunks, latent frames padded, untiled (256 px tiles)"),
    ("comfy_fp16", "comfy.safetensors", (12, 4, 4), 2, "fp16 weights, built-in latents mean/std"),
    ("comfy_two_frames", "comfy.safetensors", (2, 4, 4), 2, "2 latent frames: one padded chunk"),
    ("comfy_image", "comfy.safetensors", (1, 4, 4), 2, "1 latent frame: the last of its 4 frames"),
]


def write_video_cases(g):
    index = []
    for name, model, (T, H, W), heads, note in VIDEO_CASES:
        lat = torch.randn(1, VCFG["latent_channels"], T, H, W, generator=g, dtype=torch.float64).float()
        weights, cfg = video_vae.load_video_vae(os.path.join(VDIR, model), heads=heads)
        frames = video_vae.decode(weights, cfg, lat[0].double())
        write_safetensors(os.path.join(VDIR, "case_" + name + ".safetensors"),
                          {"latents": lat, "frames": frames.float()[None].contiguous()})
        index.append({"name": name, "model": model, "heads": heads or 0, "latent_shape": [T, H, W],
                      "frames": frames.shape[1], "note": note})
        print(f"video {name}: latents {list(lat.shape)} -> frames {list(frames.shape)}, "
              f"range [{frames.min():.3f}, {frames.max():.3f}]")
    with open(os.path.join(VDIR, "cases.json"), "w") as f:
        json.dump(index, f, indent=1)


# ---- audio ------------------------------------------------------------------------------------------------------

ACFG = {"latent_channels": 32, "latent_dim": 64, "decoder_dim": 128, "decoder_rates": [5, 5, 2, 2, 2, 2, 2],
        "decoder_kernel_sizes": [9, 9, 4, 4, 4, 4, 4], "resblock_kernel_sizes": [3, 7, 11],
        "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "sample_rate": 32000}

# the encoder of the same reduced model: the release's rates (hop 800), 4 channels doubling to 128, then latent_dim
AENC = {"encoder_dim": 4, "encoder_rates": [2, 4, 4, 5, 5]}

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def generate(seed, n, scale, offset):
    """float32 values offset + scale·(2u − 1), u = top 24 bits of splitmix64 over seed + (i+1)·golden."""
    with np.errstate(over="ignore"):
        s = (np.uint64(seed) + (np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GOLDEN)))
        z = s.copy()
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    return (offset + scale * (2.0 * u - 1.0)).astype(np.float32)


def audio_manifest(folded):
    """Every decoder tensor (official/diffusers names, or ComfyUI's folded ones) with its generator."""
    out, seed = [], [1000 if folded else 1]

    def gen(name, shape, scale, offset=0.0):
        out.append({"name": name, "shape": list(shape), "seed": seed[0], "scale": scale, "offset": offset})
        seed[0] += 1

    def conv(name, cout, cin, k, bias=True, transposed=False, gain=1.0):
        shape = (cin, cout, k) if transposed else (cout, cin, k)
        fan = (cout if transposed else cin) * k
        if folded:
            gen(name + ".weight", shape, gain * (3.0 / fan) ** 0.5)
        else:
            gen(name + ".weight_g", (shape[0], 1, 1), 0.25 * gain, gain)
            gen(name + ".weight_v", shape, 1.0)
        if bias:
            gen(name + ".bias", (shape[1] if transposed else cout,), 0.05)

    def act(prefix, ch):
        gen(prefix + ".act.alpha", (ch,), 0.5)
        gen(prefix + ".act.beta", (ch,), 0.5)
        out.append({"name": prefix + ".upsample.filter", "shape": [1, 1, 12], "values": "kaiser12"})
        out.append({"name": prefix + ".downsample.lowpass.filter", "shape": [1, 1, 12], "values": "kaiser12"})

    C, L, D = ACFG["latent_channels"], ACFG["latent_dim"], ACFG["decoder_dim"]
    gen("dec_in_proj.weight", (L, C, 1), (3.0 / C) ** 0.5)
    gen("dec_in_proj.bias", (L,), 0.05)
    conv("decoder.conv_pre", D, L, 7)
    ch = D
    nk = len(ACFG["resblock_kernel_sizes"])
    for i, (u, k) in enumerate(zip(ACFG["decoder_rates"], ACFG["decoder_kernel_sizes"])):
        conv(f"decoder.ups.{i}.0", ch // 2, ch, k, transposed=True)
        ch //= 2
        for j, (rk, dils) in enumerate(zip(ACFG["resblock_kernel_sizes"], ACFG["resblock_dilation_sizes"])):
            r = f"decoder.resblocks.{i * nk + j}"
            for di in range(len(dils)):
                conv(f"{r}.convs1.{di}", ch, ch, rk, gain=0.5)
                conv(f"{r}.convs2.{di}", ch, ch, rk, gain=0.5)
            for a in range(2 * len(dils)):
                act(f"{r}.activations.{a}", ch)
    act("decoder.activation_post", ch)
    conv("decoder.conv_post", 1, ch, 7, bias=False, gain=0.4)
    if folded:
        gen("latents_mean", (C,), 0.5)
        gen("latents_std", (C,), 0.5, 1.0)

    # The encoder, its attention projection and the posterior heads, after the decoder (whose seeds stay as they
    # were): DAC stages at AENC's width and rates, pre_block at latent_dim with 8 heads.
    d0, rates = AENC["encoder_dim"], AENC["encoder_rates"]
    conv("encoder.block.0", d0, 1, 7)
    for i, st in enumerate(rates):
        dim = d0 * 2 ** (i + 1)
        h = dim // 2
        for r in range(3):
            u = f"encoder.block.{i + 1}.block.{r}.block"
            gen(f"{u}.0.alpha", (1, h, 1), 0.5, 1.0)
            conv(f"{u}.1", h, h, 7, gain=0.5)
            gen(f"{u}.2.alpha", (1, h, 1), 0.5, 1.0)
            conv(f"{u}.3", h, h, 1, gain=0.5)
        gen(f"encoder.block.{i + 1}.block.3.alpha", (1, h, 1), 0.5, 1.0)
        conv(f"encoder.block.{i + 1}.block.4", dim, h, 2 * st)
    top, n = d0 * 2 ** len(rates), len(rates)
    gen(f"encoder.block.{n + 1}.alpha", (1, top, 1), 0.5, 1.0)
    conv(f"encoder.block.{n + 2}", L, top, 3)

    def norm(name, ch):
        gen(name + ".weight", (ch,), 0.1, 1.0)
        gen(name + ".bias", (ch,), 0.05)

    def linear(name, cout, cin, bias=True):
        gen(name + ".weight", (cout, cin), (3.0 / cin) ** 0.5)
        if bias:
            gen(name + ".bias", (cout,), 0.05)

    norm("pre_block.norm1", L)
    linear("pre_block.attn.qkv", 3 * L, L, bias=False)
    gen("pre_block.attn.q_bias", (L,), 0.05)
    gen("pre_block.attn.v_bias", (L,), 0.05)
    out.append({"name": "pre_block.attn.zero_k_bias", "shape": [L], "values": f"zeros{L}"})
    linear("pre_block.attn.proj", C, C)
    linear("pre_block.proj", C, L)
    norm("pre_block.norm3", L)
    norm("pre_block.norm2", C)
    norm("pre_block.mlp.norm", C)
    linear("pre_block.mlp.w0", 2 * C, C)
    linear("pre_block.mlp.w1", 2 * C, C)
    linear("pre_block.mlp.w2", C, 2 * C)
    for head in ("mean_proj", "logs_proj"):
        gen(head + ".weight", (C, C, 1), (3.0 / C) ** 0.5)
        gen(head + ".bias", (C,), 0.05)
    return out


def kaiser12():
    """The resampling filter every anti-aliased activation stores: cutoff 0.25, half width 0.3, 12 taps."""
    return [float(x) for x in audio_vae.kaiser_sinc_filter(0.25, 0.3, 12).float().tolist()]


def manifest_values():
    return {"kaiser12": kaiser12(), f"zeros{ACFG['latent_dim']}": [0.0] * ACFG["latent_dim"]}


def manifest_state(man):
    sd = {}
    vals = manifest_values()
    for e in man:
        n = int(np.prod(e["shape"]))
        if "values" in e:
            a = np.array(vals[e["values"]], dtype=np.float32)
        else:
            a = generate(e["seed"], n, e["scale"], e["offset"])
        sd[e["name"]] = torch.from_numpy(a.reshape(e["shape"]))
    return sd


def write_audio():
    os.makedirs(ADIR, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    C = ACFG["latent_channels"]
    mean = [float(np.float32(x)) for x in (torch.randn(C, generator=g, dtype=torch.float64) * 0.5).tolist()]
    std = [float(np.float32(x)) for x in (0.5 + torch.rand(C, generator=g, dtype=torch.float64)).tolist()]
    man_off, man_comfy = audio_manifest(False), audio_manifest(True)
    for name, man in (("manifest_official.json", man_off), ("manifest_comfy.json", man_comfy)):
        with open(os.path.join(ADIR, name), "w") as f:
            json.dump({"generator": "splitmix64 (see tools/reference/make_vae_fixtures.py generate)",
                       "values": manifest_values(), "tensors": man}, f, separators=(",", ":"))
    d = os.path.join(ADIR, "official")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"_class_name": "MiniMaxH3AudioVAE", "output_channel": 2, "sample_rate": ACFG["sample_rate"],
                   "source_config_path": "config.yaml", "source_metadata_path": "metadata.json",
                   "source_safetensors_path": "model.safetensors", "latent_channels": C, "latents_mean": mean,
                   "latents_std": std}, f, indent=1)
    with open(os.path.join(d, "metadata.json"), "w") as f:
        json.dump({"metadata": {"kwargs": {"attn_proj": True, "decoder_dim": ACFG["decoder_dim"],
                                           "decoder_rates": ACFG["decoder_rates"], "decoder_type": "bigvgan",
                                           "encoder_dim": 4, "encoder_rates": [2, 4, 4, 5, 5],
                                           "latent_dim": ACFG["latent_dim"], "sample_rate": ACFG["sample_rate"],
                                           "vae_latent_channels": C}}}, f, indent=1)
    d = os.path.join(ADIR, "diffusers")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"_class_name": "AutoencoderKLMiniMaxH3Audio", "encoder_dim": 4, "encoder_rates": [2, 4, 4, 5, 5],
                   "latent_dim": ACFG["latent_dim"], "latent_channels": C, "num_attention_heads": 8,
                   "decoder_dim": ACFG["decoder_dim"], "decoder_rates": ACFG["decoder_rates"],
                   "decoder_kernel_sizes": ACFG["decoder_kernel_sizes"],
                   "resblock_kernel_sizes": ACFG["resblock_kernel_sizes"],
                   "resblock_dilation_sizes": ACFG["resblock_dilation_sizes"], "sampling_rate": ACFG["sample_rate"],
                   "latents_mean": mean, "latents_std": std}, f, indent=1)

    # The reference reads the same files the C tests will write: build them in a scratch folder.
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        off = os.path.join(tmp, "official")
        os.makedirs(off)
        for fn in ("config.json", "metadata.json"):
            with open(os.path.join(ADIR, "official", fn)) as src, open(os.path.join(off, fn), "w") as dst:
                dst.write(src.read())
        write_safetensors(os.path.join(off, "model.safetensors"), manifest_state(man_off))
        comfy = os.path.join(tmp, "comfy.safetensors")
        write_safetensors(comfy, manifest_state(man_comfy))
        models = {"official": audio_vae.load_audio_vae(off), "comfy": audio_vae.load_audio_vae(comfy)}
        cases = [("stereo", "official", 2, 6), ("mono", "official", 1, 3), ("comfy_stereo", "comfy", 2, 5)]
        index = []
        for name, model, ch, T in cases:
            lat = torch.randn(ch, C, T, generator=g, dtype=torch.float64).float()
            w, cfg = models[model]
            wave = audio_vae.decode(w, cfg, lat.double())
            clipped = float((wave.abs() >= 1.0).double().mean())
            write_safetensors(os.path.join(ADIR, "case_" + name + ".safetensors"),
                              {"latents": lat, "waveform": wave.float()[:, None].contiguous()})
            index.append({"name": name, "model": model, "latent_shape": [ch, C, T], "samples": wave.shape[1]})
            print(f"audio {name}: latents {list(lat.shape)} -> waveform {list(wave.shape)}, rms "
                  f"{float(wave.pow(2).mean().sqrt()):.3f}, clipped {100 * clipped:.1f}%")
        with open(os.path.join(ADIR, "cases.json"), "w") as f:
            json.dump(index, f, indent=1)
        # The encoder: a stereo waveform whose length is not a multiple of the hop (800), to the posterior mean
        # before normalization (what AutoencoderKLMiniMaxH3Audio.encode(...).latent_dist.mode() gives).
        for name, model in (("encode", "official"), ("encode_comfy", "comfy")):
            n = 2400 - 123
            t = torch.arange(n, dtype=torch.float64) / ACFG["sample_rate"]
            wave = torch.stack([0.5 * torch.sin(2 * math.pi * 440 * t) + 0.2 * torch.randn(n, generator=g, dtype=torch.float64),
                                0.4 * torch.sin(2 * math.pi * 97 * t + 1.0) + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)])
            wave = wave.clamp(-1, 1).float()
            w, cfg = models[model]
            lat = audio_vae.encode(w, wave.double())
            write_safetensors(os.path.join(ADIR, "case_" + name + ".safetensors"),
                              {"waveform": wave[:, None].contiguous(), "latents": lat.float().contiguous()})
            print(f"audio {name}: waveform {list(wave.shape)} -> latents {list(lat.shape)}, rms "
                  f"{float(lat.pow(2).mean().sqrt()):.3f}")


def main():
    torch.set_num_threads(2)
    os.makedirs(VDIR, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    w = video_weights(g)
    write_video_models(w, g)
    write_video_cases(g)
    write_audio()


if __name__ == "__main__":
    main()
