"""Checks of the release-structure encoders (encoders.py) that need no weights: the latent frames each produces for
the lengths h3run uses, the video encoder's causality, the parameter names and counts of the release's state dicts at
these sizes, and that a saved encoder reloads as what it was. Exit status 0 when all hold."""

import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import encoders  # noqa: E402
import export  # noqa: E402
from dit import write_safetensors  # noqa: E402

fails = []


def check(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        fails.append(what)


torch.manual_seed(0)
v = encoders.VideoEncoder([0.5] * 24, [2.0] * 24)
with torch.no_grad():
    for frames, want in ((5, 2), (22, 7)):
        z = v(torch.rand(3, frames, 32, 48))
        check(tuple(z.shape) == (24, want, 2, 3), f"video: {frames} frames at 48x32 -> {tuple(z.shape)}, want "
              f"(24, {want}, 2, 3)")
    x = torch.rand(1, 3, 22, 32, 32)
    y = x.clone()
    y[:, :, 1:] = torch.rand_like(y[:, :, 1:])
    check(torch.equal(v(x)[:, :, 0], v(y)[:, :, 0]), "video: the first latent frame sees the first frame only")
    y = x.clone()
    y[:, :, 9:] = torch.rand_like(y[:, :, 9:])
    check(torch.equal(v(x)[:, :, :3], v(y)[:, :, :3]), "video: latent frames 0-2 see frames 0-8 only")
params = {k: p for k, p in v.named_parameters()}
check(len(params) == 52 and sum(p.numel() for p in params.values()) == 1980544,
      f"video: {len(params)} parameter tensors, {sum(p.numel() for p in params.values()):,} values (the release's "
      f"52 and 1,980,544 at these sizes)")
check("encoder.down_blocks.3.resnets.0.conv_shortcut.weight" in params and
      tuple(params["encoder.conv_out.weight"].shape) == (48, 128, 3, 3, 3), "video: the release's names and shapes")

names = export.video_encoder_names(v.state_dict())
want = {"encoder.conv_in.weight", "encoder.down.0.block.0.conv1.weight", "encoder.down.1.block.0.nin_shortcut.weight",
        "encoder.down.0.downsample.conv.weight", "encoder.norm_out.bias", "encoder.conv_out.weight",
        "quant_conv.weight"}
check(want <= set(names) and len(names) == 52 and not any("down_blocks" in k or k.startswith(("latents", "pixel"))
                                                          for k in names),
      "video: exported under the release's source names (encoder.down.I.block.J, nin_shortcut, downsample)")

a = encoders.AudioEncoder([0.0] * 32, [1.0] * 32)
with torch.no_grad():
    for samples in (800, 801, 29333):
        z = a(torch.randn(2, samples) * 0.1)
        want = -(-samples // 800)
        check(tuple(z.shape) == (2, 32, want), f"audio: {samples} samples -> {tuple(z.shape)}, want (2, 32, {want})")
keys = [k for k in a.state_dict() if not k.startswith("latents_")]
check(len(keys) == 173 and "encoder.block.5.block.4.weight_v" in keys and "pre_block.attn.zero_k_bias" in keys,
      f"audio: {len(keys)} keys with the release's names (weight-normalized convolutions, the attention projection)")

with tempfile.TemporaryDirectory() as d:
    for enc, load, name in ((v, encoders.load_video_encoder, "video"), (a, encoders.load_audio_encoder, "audio")):
        path = os.path.join(d, name + ".safetensors")
        write_safetensors(path, {k: t.detach().contiguous() for k, t in enc.state_dict().items()},
                          {"encoder": enc.kind, "frames": "22", "latent_frames": "7"})
        back = load(path)
        same = type(back) is type(enc) and all(torch.equal(back.state_dict()[k], t) for k, t in
                                                enc.state_dict().items())
        check(same, f"{name}: a saved encoder reloads as the same module")
sys.exit(1 if fails else 0)
