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
import common  # noqa: E402
import encoders  # noqa: E402
import export  # noqa: E402
from dit import read_safetensors, write_safetensors  # noqa: E402
from train_video_vae import frames as clip_frames  # noqa: E402

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

# A model folder's own encoders (load_model_encoders: the release's names in video_vae/ and audio_vae/, the configs'
# latent statistics) compute what h3run vae-encode computes, normalized as the DiT sees it: the small model's, on a
# clip of the synthetic world (needs h3run and h3-synth: H3RUN, H3SYNTH or build/).
model = os.path.join(HERE, "..", "..", "models", "h3-small")
h3run, h3synth = common.program("h3run"), common.program("h3-synth")
if os.path.isdir(model) and os.path.exists(h3run) and os.path.exists(h3synth):
    with tempfile.TemporaryDirectory() as d:
        common.run([h3synth, "dataset", os.path.join(d, "ds"), "--clips", "1", "--frames", "22", "--size", "64x64",
                    "--seed", "9"])
        t = read_safetensors(os.path.join(d, "ds", "shard-0000.safetensors"))
        venc, aenc = encoders.load_model_encoders(model)
        write_safetensors(os.path.join(d, "px.safetensors"), {"pixels": t["video"].permute(0, 4, 1, 2, 3).contiguous()})
        write_safetensors(os.path.join(d, "wav.safetensors"), {"waveform": t["audio"][0].reshape(2, 1, -1).contiguous()})
        for name, inp, enc, ref in (("video", "px", venc, lambda: venc(clip_frames(t["video"]))[0]),
                                    ("audio", "wav", aenc, lambda: aenc(t["audio"].float())[0])):
            common.run([h3run, "vae-encode", "--model", os.path.join(model, name + "_vae"), "--input",
                        os.path.join(d, inp + ".safetensors"), "--out", os.path.join(d, name + ".safetensors"), "-q"])
            got = read_safetensors(os.path.join(d, name + ".safetensors"))["latents"].float()
            got = got[0] if name == "video" else got  # [24, T, H, W] / [channels, 32, T]
            with torch.no_grad():
                want = ref()
            norm = (got - enc.latents_mean) / enc.latents_std
            err = (norm - want).abs().max().item() / want.abs().max().item()
            check(norm.shape == want.shape and err < 1e-5, f"{name}: the small model's encoder read by "
                  f"load_model_encoders against h3run vae-encode: {err:.1e} of the largest latent (1e-5)")
else:
    print("skip the small model's encoders against h3run vae-encode (no models/h3-small or no build/h3run, h3-synth)")
sys.exit(1 if fails else 0)
