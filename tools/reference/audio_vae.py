"""The MiniMax-H3 audio VAE decoder (BigVGAN), written from docs (H3-FACTS.md §4) as the project's reference.

Decoding in float64 by default over a canonical dict of effective convolution weights (weight norm folded:
w = g · v / ‖v‖, the norm over every dim but the first). `load_audio_vae` reads the official `audio_vae/` folder
and the diffusers `audio_vae/` folder (the same tensor names: weight_g / weight_v and the stored resampling
filters) and ComfyUI's single file (weight norm already folded, latents_mean / latents_std stored as tensors).

The anti-aliased activation is the one BigVGAN inherited from alias-free-torch: upsample ×2 (replicate-pad 5
steps each side, transposed depthwise convolution by a 12-tap Kaiser-windowed sinc at stride 2, times 2, 15 steps
cut from each end), SnakeBeta, then a low-pass by the same kind of filter (replicate-pad 5 left and 6 right,
stride 2). `kaiser_sinc_filter` computes that filter; checkpoints store it too, and the stored one is used.

    weights, cfg = load_audio_vae("audio_vae/")
    wave = decode(weights, cfg, latents)          # latents [channels, 32, T] -> [channels, T·800]
"""

import json
import math
import os

import torch
import torch.nn.functional as F

from video_vae import read_safetensors


def kaiser_sinc_filter(cutoff, half_width, kernel_size, dtype=torch.float64):
    """Kaiser-windowed sinc low-pass of `kernel_size` taps, normalized to sum 1 (Kaiser's β formula for the
    attenuation 2.285·(half−1)·π·4·half_width + 7.95 dB; taps centred between samples for an even size)."""
    half = kernel_size // 2
    att = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if att > 50.0:
        beta = 0.1102 * (att - 8.7)
    elif att >= 21.0:
        beta = 0.5842 * (att - 21) ** 0.4 + 0.07886 * (att - 21.0)
    else:
        beta = 0.0
    n = torch.arange(kernel_size, dtype=dtype)
    # Kaiser window, symmetric: I0(β·sqrt(1 − (2n/(N−1) − 1)²)) / I0(β)
    r = 2.0 * n / (kernel_size - 1) - 1.0
    window = torch.special.i0(beta * torch.sqrt(torch.clamp(1.0 - r * r, min=0.0))) / torch.special.i0(
        torch.tensor(beta, dtype=dtype))
    t = (torch.arange(-half, half, dtype=dtype) + 0.5) if kernel_size % 2 == 0 else n - half
    filt = 2 * cutoff * window * torch.sinc(2 * cutoff * t)
    return filt / filt.sum()


def default_config():
    return {
        "latent_channels": 32, "latent_dim": 2048, "decoder_dim": 1024, "decoder_rates": [5, 5, 2, 2, 2, 2, 2],
        "decoder_kernel_sizes": [9, 9, 4, 4, 4, 4, 4], "resblock_kernel_sizes": [3, 7, 11],
        "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "sample_rate": 32000,
        "latents_mean": None, "latents_std": None,
    }


def load_audio_vae(path):
    """(canonical float64 weights, config) from an official or diffusers folder or a ComfyUI file."""
    cfg = default_config()
    if os.path.isdir(path):
        files = [f for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
        sd = {}
        for f in files:
            sd.update(read_safetensors(os.path.join(path, f)))
        with open(os.path.join(path, "config.json")) as f:
            c = json.load(f)
        if os.path.exists(os.path.join(path, "metadata.json")):  # official
            with open(os.path.join(path, "metadata.json")) as f:
                kw = json.load(f)["metadata"]["kwargs"]
            cfg.update(latent_channels=kw["vae_latent_channels"], latent_dim=kw["latent_dim"],
                       decoder_dim=kw["decoder_dim"], decoder_rates=kw["decoder_rates"],
                       decoder_kernel_sizes=[2 * u - (u % 2) for u in kw["decoder_rates"]],
                       sample_rate=kw["sample_rate"])
        else:  # diffusers
            cfg.update({k: c[k] for k in ("latent_channels", "latent_dim", "decoder_dim", "decoder_rates",
                                          "decoder_kernel_sizes", "resblock_kernel_sizes",
                                          "resblock_dilation_sizes")})
            cfg["sample_rate"] = c["sampling_rate"]
        cfg["latents_mean"], cfg["latents_std"] = c["latents_mean"], c["latents_std"]
    else:
        sd = read_safetensors(path)
        cfg["latents_mean"] = sd["latents_mean"].double().tolist()
        cfg["latents_std"] = sd["latents_std"].double().tolist()
        cfg["latent_dim"], cfg["latent_channels"] = sd["dec_in_proj.weight"].shape[:2]
        cfg["decoder_dim"] = sd["decoder.conv_pre.weight"].shape[0]
        n_up = len({k.split(".")[2] for k in sd if k.startswith("decoder.ups.")})
        ks = [sd[f"decoder.ups.{i}.0.weight"].shape[2] for i in range(n_up)]
        cfg["decoder_kernel_sizes"] = ks
        cfg["decoder_rates"] = [(k + 1) // 2 if k % 2 else k // 2 for k in ks]
        cfg["resblock_kernel_sizes"] = [sd[f"decoder.resblocks.{j}.convs1.0.weight"].shape[2] for j in range(3)]
    return canonical(sd), cfg


def fold(g, v):
    """Weight norm: v · (g / ‖v‖) with the norm over all dims but the first."""
    norm = v.reshape(v.shape[0], -1).norm(dim=1).reshape(-1, *([1] * (v.ndim - 1)))
    return v * (g / norm)


def canonical(sd):
    """Effective float64 weights under the module names, with weight norm folded."""
    w = {}
    for k, t in sd.items():
        if k.endswith(".weight_v"):
            base = k[: -len(".weight_v")]
            w[base + ".weight"] = fold(sd[base + ".weight_g"].double(), t.double())
        elif k.endswith(".weight_g"):
            continue
        elif k.endswith(".parametrizations.weight.original1"):
            base = k[: -len(".parametrizations.weight.original1")]
            g = sd[base + ".parametrizations.weight.original0"].double()
            w[base + ".weight"] = fold(g, t.double())
        elif k.endswith(".parametrizations.weight.original0"):
            continue
        else:
            w[k] = t.double()
    return w


def activation(w, prefix, x):
    """Anti-aliased SnakeBeta on x [C, T] with the module's stored filters and log-scale alpha/beta."""
    C = x.shape[0]
    up = w[prefix + ".upsample.filter"].reshape(1, 1, -1).expand(C, 1, -1)
    down = w[prefix + ".downsample.lowpass.filter"].reshape(1, 1, -1).expand(C, 1, -1)
    K = up.shape[-1]
    pad = K // 2 - 1
    crop_l = pad * 2 + (K - 2) // 2
    crop_r = pad * 2 + (K - 2 + 1) // 2
    y = F.pad(x[None], (pad, pad), mode="replicate")
    y = 2 * F.conv_transpose1d(y, up, stride=2, groups=C)
    y = y[..., crop_l: y.shape[-1] - crop_r]
    a = torch.exp(w[prefix + ".act.alpha"]).reshape(1, C, 1)
    b = torch.exp(w[prefix + ".act.beta"]).reshape(1, C, 1)
    y = y + 1.0 / (b + 1e-9) * torch.sin(a * y) ** 2
    y = F.pad(y, (K // 2 - (1 if K % 2 == 0 else 0), K // 2), mode="replicate")
    return F.conv1d(y, down, stride=2, groups=C)[0]


def conv(w, name, x, dilation=1, padding=0):
    b = w.get(name + ".bias")
    return F.conv1d(x[None], w[name + ".weight"], b, dilation=dilation, padding=padding)[0]


def decode_one(w, cfg, z):
    """z [C, T] de-normalized -> waveform [T·Π rates]."""
    x = conv(w, "dec_in_proj", z)
    x = conv(w, "decoder.conv_pre", x, padding=3)
    nk = len(cfg["resblock_kernel_sizes"])
    for i, (u, k) in enumerate(zip(cfg["decoder_rates"], cfg["decoder_kernel_sizes"])):
        n = f"decoder.ups.{i}.0"
        x = F.conv_transpose1d(x[None], w[n + ".weight"], w[n + ".bias"], stride=u, padding=(k - u) // 2)[0]
        acc = None
        for j, (rk, dils) in enumerate(zip(cfg["resblock_kernel_sizes"], cfg["resblock_dilation_sizes"])):
            r = f"decoder.resblocks.{i * nk + j}"
            h = x
            for di, d in enumerate(dils):
                t = activation(w, f"{r}.activations.{2 * di}", h)
                t = conv(w, f"{r}.convs1.{di}", t, dilation=d, padding=(rk * d - d) // 2)
                t = activation(w, f"{r}.activations.{2 * di + 1}", t)
                t = conv(w, f"{r}.convs2.{di}", t, padding=(rk - 1) // 2)
                h = t + h
            acc = h if acc is None else acc + h
        x = acc / nk
    x = activation(w, "decoder.activation_post", x)
    x = conv(w, "decoder.conv_post", x, padding=3)
    return x.clamp(-1.0, 1.0)[0]


def decode(w, cfg, latents):
    """latents [channels, C, T] normalized as the DiT produces them -> waveform [channels, samples] in [-1, 1]."""
    mean = torch.tensor(cfg["latents_mean"], dtype=latents.dtype).reshape(-1, 1)
    std = torch.tensor(cfg["latents_std"], dtype=latents.dtype).reshape(-1, 1)
    return torch.stack([decode_one(w, cfg, latents[c] * std + mean) for c in range(latents.shape[0])])


# ---- the encoder ------------------------------------------------------------------------------------------------
# The DAC-style encoder and the causal-attention projection in front of the posterior heads (H3-FACTS §4), written
# from their description: Snake x + sin²(αx)/(α + 1e-9) with α stored as is ([1, C, 1]), residual units at
# dilations 1/3/9 (Snake, conv k7 dilated, Snake, conv k1, plus the input), a strided conv (kernel 2s, padding
# ceil(s/2)) doubling the channels per stage, Snake and a k3 conv to latent_dim; then pre_block: proj(norm3(x)) +
# attn(norm1(x)) with causal attention whose heads are averaged and whose head width is average-pooled (adaptive)
# to the latent channels, plus a pre-norm GeGLU MLP; the posterior mean is mean_proj (1×1 conv).

def snake(w, name, x):
    a = w[name + ".alpha"].reshape(-1, 1)
    return x + 1.0 / (a + 1e-9) * torch.sin(a * x) ** 2


def encoder_config(w):
    """Stages (strides from the strided convs' kernels), widths and heads from the tensors."""
    n = 0
    while f"encoder.block.{n + 1}.block.4.weight" in w:
        n += 1
    strides = [w[f"encoder.block.{i}.block.4.weight"].shape[2] // 2 for i in range(1, n + 1)]
    latent_dim = w[f"encoder.block.{n + 2}.weight"].shape[0]
    return {"strides": strides, "latent_dim": latent_dim, "heads": 8,
            "latent_channels": w["mean_proj.weight"].shape[0]}


def adaptive_avg_pool(x, n_out):
    """PyTorch's adaptive average pooling over the last dim: bin i averages [floor(i·L/n), ceil((i+1)·L/n))."""
    L = x.shape[-1]
    out = []
    for i in range(n_out):
        a, b = (i * L) // n_out, -((-(i + 1) * L) // n_out)
        out.append(x[..., a:b].mean(dim=-1))
    return torch.stack(out, dim=-1)


def layer_norm(w, name, x):
    return F.layer_norm(x, (x.shape[-1],), w[name + ".weight"], w[name + ".bias"], 1e-5)


def linear(w, name, x):
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def encode_one(w, ecfg, wave):
    """wave [samples] (a multiple of the hop) -> the posterior mean [latent_channels, samples / hop]."""
    x = conv(w, "encoder.block.0", wave[None], padding=3)
    for i, s in enumerate(ecfg["strides"]):
        b = f"encoder.block.{i + 1}.block"
        for r, d in enumerate((1, 3, 9)):
            u = f"{b}.{r}.block"
            t = snake(w, f"{u}.0", x)
            t = conv(w, f"{u}.1", t, dilation=d, padding=3 * d)
            t = snake(w, f"{u}.2", t)
            x = x + conv(w, f"{u}.3", t)
        x = snake(w, f"{b}.3", x)
        x = F.conv1d(x[None], w[f"{b}.4.weight"], w[f"{b}.4.bias"], stride=s, padding=(s + 1) // 2)[0]
    n = len(ecfg["strides"])
    x = snake(w, f"encoder.block.{n + 1}", x)
    x = conv(w, f"encoder.block.{n + 2}", x, padding=1)
    h = x.t()  # [T, latent_dim]
    D, H, C = h.shape[1], ecfg["heads"], ecfg["latent_channels"]
    a = layer_norm(w, "pre_block.norm1", h)
    bias = torch.cat([w["pre_block.attn.q_bias"], torch.zeros_like(w["pre_block.attn.q_bias"]),
                      w["pre_block.attn.v_bias"]])
    qkv = F.linear(a, w["pre_block.attn.qkv.weight"], bias).reshape(h.shape[0], 3, H, D // H)
    q, k, v = (qkv[:, j].transpose(0, 1) for j in range(3))  # [H, T, Dh]
    scores = q @ k.transpose(1, 2) / math.sqrt(D // H)
    T = h.shape[0]
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    o = torch.softmax(scores, dim=-1) @ v  # [H, T, Dh]
    o = adaptive_avg_pool(o.mean(dim=0), C)  # [T, C]
    h = linear(w, "pre_block.proj", layer_norm(w, "pre_block.norm3", h)) + linear(w, "pre_block.attn.proj", o)
    m = layer_norm(w, "pre_block.mlp.norm", layer_norm(w, "pre_block.norm2", h))
    m = F.gelu(linear(w, "pre_block.mlp.w0", m), approximate="tanh") * linear(w, "pre_block.mlp.w1", m)
    h = h + linear(w, "pre_block.mlp.w2", m)
    return conv(w, "mean_proj", h.t())


def encode(w, waveform):
    """waveform [channels, samples] -> the posterior mean [channels, latent_channels, ceil(samples / hop)],
    before normalization (each channel one item; the samples right-padded with zeros to a multiple of the hop)."""
    ecfg = encoder_config(w)
    hop = math.prod(ecfg["strides"])
    n = -(-waveform.shape[1] // hop) * hop
    x = F.pad(waveform, (0, n - waveform.shape[1]))
    return torch.stack([encode_one(w, ecfg, x[c]) for c in range(x.shape[0])])

