"""The VAE encoders of the small model with the release's structure, at a small width (text-to-video-with-audio only
decodes; the training needs them to make the latents the DiT learns; h3run's own video encoder, for keyframes and
`h3run vae-encode`, is src/models/video_vae_enc.h).

    VideoEncoder   H3-VisualVAE's causal 3-D CNN encoder: CausalConv3d (reflect-padded in space, two zero frames
                   before in time), levels of ResNet blocks with GroupNorm(32) computed per frame and SiLU, strided
                   downsamplers (space 2 with one reflected pixel right and bottom; time 1 or 2), GroupNorm, SiLU,
                   conv_out to mean and log-variance, quant_conv; the posterior mean is used. Names follow diffusers'
                   AutoencoderKLMiniMaxH3 (encoder.conv_in, encoder.down_blocks.N.resnets.M..., quant_conv). A video
                   of 17n+5 frames is padded with copies of its last frame to whole 17-frame clips, each clip encoded
                   alone (5 latent frames), and the last 3 latent frames of the whole dropped: 5n+2. Frames are
                   ImageNet-normalized first. No spatial tiling: canvases up to the release's 256-pixel tile only.
    AudioEncoder   H3-AudioVAE's DAC-style encoder: a weight-normalized Conv1d, strided encoder blocks of residual
                   units (dilations 1, 3, 9) with Snake activations, a final Snake and Conv1d to latent_dim, then
                   the attention projection (`pre_block`: causal attention whose heads are averaged and pooled to 32
                   channels, a GeGLU MLP) and the posterior mean head (`mean_proj`). Parameter names follow the
                   release's state dict (encoder.block.N..., pre_block..., mean_proj, logs_proj). One channel per
                   batch item (stereo is two items); 800 samples per latent frame (2·4·4·5·5), the input zero-padded
                   to a multiple of 800: ceil(S / 800) frames.

StandInVideoEncoder and StandInAudioEncoder are the first, simpler encoders (MLPs over patches and 800-sample frames;
the shipped model's latents come from them). Every encoder returns normalized latents (the decoder de-normalizes with
the template's latents_mean/latents_std); the training scripts choose with --encoder and record the choice in the
encoder's file (metadata "encoder"), from which `load_video_encoder` / `load_audio_encoder` rebuild it.
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.utils import weight_norm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from video_vae import read_safetensors  # noqa: E402


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class _CausalConv3d(torch.nn.Conv3d):
    def __init__(self, cin, cout, k=3, stride=1, spatial_pad=1, temporal_pad=2):
        super().__init__(cin, cout, k, stride=stride)
        self.sp, self.tp = spatial_pad, temporal_pad

    def forward(self, x):
        if self.sp:
            x = F.pad(x, (self.sp, self.sp, self.sp, self.sp, 0, 0), mode="reflect")
        if self.tp:
            x = F.pad(x, (0, 0, 0, 0, self.tp, 0))
        return F.conv3d(x, self.weight, self.bias, self.stride)


class _FrameGroupNorm(torch.nn.GroupNorm):
    """GroupNorm(32) whose statistics never mix frames: each (item, frame) is normalized on its own."""

    def __init__(self, channels):
        super().__init__(32, channels, eps=1e-6)

    def forward(self, x):
        B, C, T, H, W = x.shape
        y = x.transpose(1, 2).reshape(B * T, C, H, W)
        y = F.group_norm(y, self.num_groups, self.weight, self.bias, self.eps)
        return y.reshape(B, T, C, H, W).transpose(1, 2)


class _Resnet3d(torch.nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm1, self.conv1 = _FrameGroupNorm(cin), _CausalConv3d(cin, cout)
        self.norm2, self.conv2 = _FrameGroupNorm(cout), _CausalConv3d(cout, cout)
        self.conv_shortcut = _CausalConv3d(cin, cout, 1, spatial_pad=0, temporal_pad=0) if cin != cout else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.conv_shortcut(x) if self.conv_shortcut is not None else x) + h


class _Downsample3d(torch.nn.Module):
    def __init__(self, c, t_stride, s_stride):
        super().__init__()
        self.s = s_stride
        self.conv = _CausalConv3d(c, c, 3, stride=(t_stride, s_stride, s_stride), spatial_pad=0)

    def forward(self, x):
        if self.s == 2:
            x = F.pad(x, (0, 1, 0, 1, 0, 0), mode="reflect")
        return self.conv(x)


class _DownBlock3d(torch.nn.Module):
    def __init__(self, cin, cout, layers, t_stride, s_stride):
        super().__init__()
        self.resnets = torch.nn.ModuleList(_Resnet3d(cin if j == 0 else cout, cout) for j in range(layers))
        self.downsamplers = torch.nn.ModuleList([_Downsample3d(cout, t_stride, s_stride)]) \
            if t_stride * s_stride > 1 else None

    def forward(self, x):
        for r in self.resnets:
            x = r(x)
        return self.downsamplers[0](x) if self.downsamplers is not None else x


class _VideoEncoder3d(torch.nn.Module):
    def __init__(self, channels, layers, time_down, space_down, z):
        super().__init__()
        self.conv_in = _CausalConv3d(3, channels[0])
        cin = [channels[0]] + list(channels[:-1])
        self.down_blocks = torch.nn.ModuleList(_DownBlock3d(cin[i], channels[i], layers, time_down[i], space_down[i])
                                               for i in range(len(channels)))
        self.norm_out = _FrameGroupNorm(channels[-1])
        self.conv_out = _CausalConv3d(channels[-1], 2 * z)

    def forward(self, x):
        x = self.conv_in(x)
        for b in self.down_blocks:
            x = b(x)
        return self.conv_out(F.silu(self.norm_out(x)))


class VideoEncoder(torch.nn.Module):
    """frames [..., 3, F, H, W] in [0, 1] (F = 17n+5) -> normalized latents [..., z, 5n+2, H/16, W/16]."""

    kind = "release"
    CLIP, DROP = 17, 3

    def __init__(self, mean, std, z=24, ch=32, ch_mult=(1, 2, 2, 4), layers=1, space_down=(2, 2, 2, 2),
                 time_down=(1, 2, 2, 1)):
        super().__init__()
        self.z = z
        self.encoder = _VideoEncoder3d([ch * m for m in ch_mult], layers, time_down, space_down, z)
        self.quant_conv = torch.nn.Conv3d(2 * z, 2 * z, 1)
        self.register_buffer("latents_mean", torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1, 1, 1))
        self.register_buffer("latents_std", torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1, 1))
        self.register_buffer("pixel_mean", torch.tensor(IMAGENET_MEAN).reshape(3, 1, 1, 1))
        self.register_buffer("pixel_std", torch.tensor(IMAGENET_STD).reshape(3, 1, 1, 1))

    def forward(self, x):
        *lead, C, Fr, H, W = x.shape
        if H > 256 or W > 256:
            raise ValueError(f"{W}x{H}: the encoder here has no spatial tiling (canvases up to 256 pixels)")
        x = ((x - self.pixel_mean) / self.pixel_std).reshape(-1, C, Fr, H, W)
        pad = (-Fr) % self.CLIP
        if pad:
            x = torch.cat([x, x[:, :, -1:].expand(-1, -1, pad, -1, -1)], 2)
        n = x.shape[2] // self.CLIP  # every 17-frame clip on its own, as a batch item
        clips = x.reshape(x.shape[0], C, n, self.CLIP, H, W).transpose(1, 2).reshape(-1, C, self.CLIP, H, W)
        m = self.quant_conv(self.encoder(clips))[:, : self.z]  # the posterior mean
        m = m.reshape(-1, n, *m.shape[1:]).transpose(1, 2)    # [items, z, n, 5, h, w]
        m = m.reshape(m.shape[0], self.z, -1, *m.shape[-2:])[:, :, : -self.DROP]
        z = (m - self.latents_mean) / self.latents_std
        return z.reshape(*lead, *z.shape[1:])


class Snake(torch.nn.Module):
    """x + sin(alpha·x)^2 / (alpha + 1e-9), alpha per channel (raw, not log-scale as the decoder's SnakeBeta)."""

    def __init__(self, channels):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x):
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x) ** 2


def _wn_conv(cin, cout, k, **kw):
    return weight_norm(torch.nn.Conv1d(cin, cout, k, **kw))


class _Residual(torch.nn.Module):
    def __init__(self, c, dilation):
        super().__init__()
        self.block = torch.nn.Sequential(Snake(c), _wn_conv(c, c, 7, dilation=dilation, padding=3 * dilation),
                                         Snake(c), _wn_conv(c, c, 1))

    def forward(self, x):
        return x + self.block(x)


class _EncoderBlock(torch.nn.Module):
    def __init__(self, dim, stride):
        super().__init__()
        c = dim // 2
        self.block = torch.nn.Sequential(_Residual(c, 1), _Residual(c, 3), _Residual(c, 9), Snake(c),
                                         _wn_conv(c, dim, 2 * stride, stride=stride, padding=math.ceil(stride / 2)))

    def forward(self, x):
        return self.block(x)


class _DacEncoder(torch.nn.Module):
    def __init__(self, dim, rates, latent_dim):
        super().__init__()
        layers = [_wn_conv(1, dim, 7, padding=3)]
        for s in rates:
            dim *= 2
            layers.append(_EncoderBlock(dim, s))
        layers += [Snake(dim), _wn_conv(dim, latent_dim, 3, padding=1)]
        self.block = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.block(x)


class _Attention(torch.nn.Module):
    """Causal self-attention over frames; the heads' outputs are averaged, pooled to out_dim features, projected."""

    def __init__(self, in_dim, out_dim, heads):
        super().__init__()
        self.heads, self.out_dim = heads, out_dim
        self.qkv = torch.nn.Linear(in_dim, 3 * in_dim, bias=False)
        self.q_bias = torch.nn.Parameter(torch.zeros(in_dim))
        self.v_bias = torch.nn.Parameter(torch.zeros(in_dim))
        self.register_buffer("zero_k_bias", torch.zeros(in_dim))
        self.proj = torch.nn.Linear(out_dim, out_dim)

    def forward(self, x):  # [B, T, in_dim]
        B, T, C = x.shape
        qkv = F.linear(x, self.qkv.weight, torch.cat([self.q_bias, self.zero_k_bias, self.v_bias]))
        q, k, v = qkv.reshape(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, T, D]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(C // self.heads)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        o = (s.softmax(-1) @ v).mean(1)                        # [B, T, D]: the heads averaged
        return self.proj(F.adaptive_avg_pool1d(o, self.out_dim))


class _GeGLU(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.w0, self.w1 = torch.nn.Linear(dim, 2 * dim), torch.nn.Linear(dim, 2 * dim)
        self.w2 = torch.nn.Linear(2 * dim, dim)

    def forward(self, x):
        h = self.norm(x)
        return self.w2(F.gelu(self.w0(h), approximate="tanh") * self.w1(h))


class _AttnProjection(torch.nn.Module):
    def __init__(self, in_dim, out_dim, heads):
        super().__init__()
        self.norm1, self.norm3, self.norm2 = torch.nn.LayerNorm(in_dim), torch.nn.LayerNorm(in_dim), \
            torch.nn.LayerNorm(out_dim)
        self.attn = _Attention(in_dim, out_dim, heads)
        self.proj = torch.nn.Linear(in_dim, out_dim)
        self.mlp = _GeGLU(out_dim)

    def forward(self, x):  # [B, T, in_dim] -> [B, T, out_dim]
        h = self.proj(self.norm3(x)) + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


class AudioEncoder(torch.nn.Module):
    """waveform [..., samples] -> normalized latents [..., channels, ceil(samples / 800)]."""

    kind = "release"

    def __init__(self, mean, std, channels=32, dim=16, rates=(2, 4, 4, 5, 5), latent_dim=256, heads=8):
        super().__init__()
        self.hop = math.prod(rates)
        self.encoder = _DacEncoder(dim, rates, latent_dim)
        self.pre_block = _AttnProjection(latent_dim, channels, heads)
        self.mean_proj = torch.nn.Conv1d(channels, channels, 1)
        self.logs_proj = torch.nn.Conv1d(channels, channels, 1)  # the posterior's log-std: unused (the mean is used)
        self.register_buffer("latents_mean", torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1))
        self.register_buffer("latents_std", torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1))

    def forward(self, x):
        lead = x.shape[:-1]
        x = x.reshape(-1, 1, x.shape[-1])
        T = math.ceil(x.shape[-1] / self.hop)
        x = F.pad(x, (0, T * self.hop - x.shape[-1]))
        h = self.pre_block(self.encoder(x).transpose(1, 2)).transpose(1, 2)   # [B, channels, T]
        z = (self.mean_proj(h) - self.latents_mean) / self.latents_std
        return z.reshape(*lead, *z.shape[1:])


# ---- the first stand-ins -----------------------------------------------------------------------------------------

class StandInVideoEncoder(torch.nn.Module):
    """The first stand-in (the shipped model's): frames [..., 3, F, H, W] (F = 17n+5) -> normalized latents [..., 24, 5n+2, H/16, W/16]."""

    kind = "standin"

    def __init__(self, frames, latents, channels=24, patch=16, width=256):
        super().__init__()
        self.patch = patch
        self.inp = torch.nn.Linear(3 * patch * patch, width)
        self.time = torch.nn.Linear(frames, latents)
        self.mid = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, channels)

    def forward(self, x):
        *b, C, F, H, W = x.shape
        p, nb, h, w = self.patch, len(b), H // self.patch, W // self.patch
        t = x.reshape(*b, C, F, h, p, w, p)
        t = t.permute(*range(nb), nb + 1, nb + 2, nb + 4, nb, nb + 3, nb + 5).reshape(-1, C * p * p)
        # every Linear on a contiguous 2-D input (PyTorch 1.13's CPU backward of Linear on some strided inputs of
        # more dimensions returns garbage gradients)
        t = torch.nn.functional.gelu(self.inp(t)).reshape(*b, F, h, w, -1)   # [..., F, h, w, width]
        width = t.shape[-1]
        t = self.time(t.movedim(nb, -1).reshape(-1, F))                       # [(... h w width), L]
        t = t.reshape(*b, h, w, width, -1).movedim(-1, nb).reshape(-1, width)  # [(... L h w), width]
        t = self.out(torch.nn.functional.gelu(self.mid(t)))
        return t.reshape(*b, -1, h, w, t.shape[-1]).movedim(-1, nb)           # [..., 24, L, h, w]


class StandInAudioEncoder(torch.nn.Module):
    """The first stand-in (the shipped model's): waveform [..., samples] -> normalized latents [..., 32, ceil(samples/800)]."""

    kind = "standin"

    def __init__(self, channels=32, width=256):
        super().__init__()
        self.inp = torch.nn.Linear(800, width)
        self.mid = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, channels)

    def forward(self, x):
        T = math.ceil(x.shape[-1] / 800)
        x = torch.nn.functional.pad(x, (0, T * 800 - x.shape[-1]))
        t = torch.nn.functional.gelu(self.inp(x.reshape(*x.shape[:-1], T, 800)))
        t = torch.nn.functional.gelu(self.mid(t))
        return self.out(t).transpose(-1, -2)  # [..., 32, T]


# ---- choosing and reloading --------------------------------------------------------------------------------------

def video_encoder(kind, frames, latent_frames, mean, std):
    return VideoEncoder(mean, std) if kind == "release" else StandInVideoEncoder(frames, latent_frames)


def audio_encoder(kind, mean, std):
    return AudioEncoder(mean, std) if kind == "release" else StandInAudioEncoder(len(mean))


def _read(path):
    sd, meta = read_safetensors(path, with_metadata=True)
    return {k: v.float() for k, v in sd.items()}, meta or {}


def load_video_encoder(path):
    """A video encoder saved by train_video_vae.py (no "encoder" metadata: the stand-in)."""
    sd, meta = _read(path)
    if meta.get("encoder", "standin") == "release":
        enc = VideoEncoder(sd["latents_mean"].flatten(), sd["latents_std"].flatten())
    else:
        enc = StandInVideoEncoder(int(meta["frames"]), int(meta["latent_frames"]))
    enc.load_state_dict(sd)
    return enc


def load_audio_encoder(path):
    """An audio encoder saved by train_audio_vae.py (no "encoder" metadata: the stand-in)."""
    sd, meta = _read(path)
    if meta.get("encoder", "standin") == "release":
        enc = AudioEncoder(sd["latents_mean"].flatten(), sd["latents_std"].flatten())
    else:
        enc = StandInAudioEncoder(sd["out.weight"].shape[0])
    enc.load_state_dict(sd)
    return enc


def _release_video_names(sd):
    """The release's source names (export.video_encoder_names) back to this module's (diffusers') names."""
    out = {}
    for k, v in sd.items():
        p = k.split(".")
        if k.startswith("encoder.down."):
            if p[3] == "block":
                tail = ["conv_shortcut" if x == "nin_shortcut" else x for x in p[5:]]
                k = ".".join(["encoder", "down_blocks", p[2], "resnets", p[4]] + tail)
            else:  # encoder.down.I.downsample.conv.*
                k = ".".join(["encoder", "down_blocks", p[2], "downsamplers", "0"] + p[4:])
        out[k] = v
    return out


def load_model_encoders(model):
    """The encoders of a model folder in the official layout (video_vae/ and audio_vae/ as h3run reads them, e.g.
    models/h3-small): (VideoEncoder, AudioEncoder) with the files' weights and the configs' latent statistics."""
    vdir, adir = os.path.join(model, "video_vae"), os.path.join(model, "audio_vae")
    with open(os.path.join(vdir, "config.json")) as f:
        vcfg = json.load(f)
    vsd, _ = _read(os.path.join(vdir, vcfg["source_path"], vcfg["source_safetensors_path"]))
    venc = VideoEncoder(torch.tensor(vcfg["latents_mean"]), torch.tensor(vcfg["latents_std"]))
    want = venc.state_dict()
    got = _release_video_names({k: v for k, v in vsd.items() if k.startswith(("encoder.", "quant_conv."))})
    got.update({k: want[k] for k in want if k not in got and not k.startswith(("encoder.", "quant_conv."))})
    venc.load_state_dict({k: v.reshape(want[k].shape) for k, v in got.items()})
    with open(os.path.join(adir, "config.json")) as f:
        acfg = json.load(f)
    asd, _ = _read(os.path.join(adir, acfg["source_safetensors_path"]))
    aenc = AudioEncoder(torch.tensor(acfg["latents_mean"]), torch.tensor(acfg["latents_std"]))
    want = aenc.state_dict()
    got = {k: asd[k].reshape(want[k].shape) for k in want if k in asd}
    got.update({k: want[k] for k in want if k not in got and k.startswith("latents_")})
    aenc.load_state_dict(got)
    return venc, aenc
