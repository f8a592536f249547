"""Training the small model's video VAE on the synthetic world (docs/SYNTH.md), and proving h3run decodes what it
learned.

    build/h3-synth dataset data/vv --clips 512 --frames 22 --size 64x64
    /usr/bin/python3 tools/train/train_video_vae.py --data data/vv --template out/h3-tiny --out out/vv --steps 300

The decoder is the release's ViT decoder at the template's width (h3-tinymodel: hidden 128, 2 heads of 64, 2 blocks),
trained through the project's reference decode (tools/reference/video_vae.py `decode`: temporal chunks, token drop,
tiles; what h3run computes), so the pixels it is trained on are the pixels h3run will produce. The encoder here is a
stand-in (patchify 16x16, per-frame MLP, a learned map from 17n+5 frames to 5n+2 latent frames): h3run never runs an
encoder; the release's causal CNN encoder is for later. Latents are kept near unit scale (the DiT's working range) by
a penalty on their mean square.

At the end: the decoder written in the official layout over a copy of the template's video_vae/ (export.py), the
encoder's weights beside it, and a check on clips the training did not see: the clip encoded here, decoded by h3run
(`h3run decode --tensors-out`), compared with the reference decode (must agree to float32 rounding) and with the
original frames (PSNR, against the PSNR of predicting every frame as the clip's mean frame).
"""

import glob
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import common  # noqa: E402
import export  # noqa: E402
from dit import read_safetensors, write_safetensors  # noqa: E402
from video_vae import IMAGENET_MEAN, IMAGENET_STD, decode, load_video_vae  # noqa: E402


def load_clips(folder):
    """All clips of an h3-synth dataset: float [n, 3, T, H, W] in [0, 1]."""
    vids = []
    for p in sorted(glob.glob(os.path.join(folder, "shard-*.safetensors"))):
        v = read_safetensors(p)["video"]  # U8 [m, T, H, W, 3]
        vids.append(v.permute(0, 4, 1, 2, 3).float() / 255.0)
    if not vids:
        raise SystemExit(f"no shard-*.safetensors in {folder} (make them with h3-synth dataset)")
    return torch.cat(vids, 0)


class Encoder(torch.nn.Module):
    """frames [3, F, H, W] (F = 17n+5) -> normalized latents [24, 5n+2, H/16, W/16]."""

    def __init__(self, frames, latents, channels=24, patch=16, width=256):
        super().__init__()
        self.patch = patch
        self.inp = torch.nn.Linear(3 * patch * patch, width)
        self.time = torch.nn.Linear(frames, latents)
        self.mid = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, channels)

    def forward(self, x):
        C, F, H, W = x.shape
        p = self.patch
        t = x.reshape(C, F, H // p, p, W // p, p).permute(1, 2, 4, 0, 3, 5).reshape(F, H // p, W // p, C * p * p)
        t = torch.nn.functional.gelu(self.inp(t))               # [F, h, w, width]
        t = self.time(t.permute(1, 2, 3, 0)).permute(3, 0, 1, 2)  # [L, h, w, width]
        t = torch.nn.functional.gelu(self.mid(t))
        return self.out(t).permute(3, 0, 1, 2)                  # [24, L, h, w]


def imagenet(x):
    m = torch.tensor(IMAGENET_MEAN, dtype=x.dtype).reshape(3, 1, 1, 1)
    s = torch.tensor(IMAGENET_STD, dtype=x.dtype).reshape(3, 1, 1, 1)
    return (x - m) / s


def unit(y):
    m = torch.tensor(IMAGENET_MEAN, dtype=y.dtype).reshape(3, 1, 1, 1)
    s = torch.tensor(IMAGENET_STD, dtype=y.dtype).reshape(3, 1, 1, 1)
    return (y * s + m).clamp(0, 1)


def psnr(a, b):
    mse = ((a - b) ** 2).mean().item()
    return 10 * math.log10(1.0 / max(mse, 1e-12))


def main():
    ap = common.parser(__doc__, steps=300, batch=4, lr=2e-3)
    ap.add_argument("--holdout", type=int, default=8, help="clips kept out of training for the check")
    a = ap.parse_args()
    out = common.setup(a)
    clips = load_clips(a.data)
    n, _, F, H, W = clips.shape
    if (F - 5) % 17 or H % 16 or W % 16:
        raise SystemExit(f"clips of {F} frames at {W}x{H}: need 17n+5 frames and multiples of 16")
    L = (F - 5) // 17 * 5 + 2
    train, held = clips[: n - a.holdout], clips[n - a.holdout:]
    w64, cfg = load_video_vae(os.path.join(a.template, "video_vae"))
    w = {k: v.float().clone().requires_grad_(True) for k, v in w64.items()}
    enc = Encoder(F, L)
    params = list(w.values()) + list(enc.parameters())
    opt = torch.optim.Adam(params, lr=a.lr)
    print(f"video VAE: {sum(v.numel() for v in w.values()):,} decoder and {sum(p.numel() for p in enc.parameters()):,} "
          f"encoder parameters; {len(train)} training clips of {F} frames at {W}x{H} -> latents [24, {L}, {H // 16}, "
          f"{W // 16}]", flush=True)
    t0 = time.time()
    for step in range(1, a.steps + 1):
        idx = torch.randint(0, len(train), (a.batch,))
        loss_r, loss_z = 0.0, 0.0
        for i in idx:
            x = train[i]
            z = enc(x)
            y = decode(w, cfg, z)
            loss_r = loss_r + ((y - imagenet(x)) ** 2).mean() / a.batch
            loss_z = loss_z + (z ** 2).mean() / a.batch
        loss = loss_r + 1e-3 * loss_z
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == 1:
            print(f"step {step}: reconstruction {loss_r.item():.4f}, latent mean square {loss_z.item():.3f}, "
                  f"{time.time() - t0:.0f} s", flush=True)
    # write: the decoder in the official layout, the encoder beside it
    export.export_video_vae({k: v.detach() for k, v in w.items()}, cfg, os.path.join(a.template, "video_vae"),
                            os.path.join(out, "video_vae"))
    write_safetensors(os.path.join(out, "video_encoder.safetensors"),
                      {k: v.detach().contiguous() for k, v in enc.state_dict().items()},
                      {"frames": str(F), "latent_frames": str(L)})
    # the check on held-out clips
    h3run = common.program("h3run")
    res = {"steps": a.steps, "clips": len(train), "frames": F, "size": [W, H], "held_out": []}
    with torch.no_grad():
        for k, x in enumerate(held):
            z = enc(x)
            y_ref = unit(decode({kk: v.detach() for kk, v in w.items()}, cfg, z))
            lat = os.path.join(out, f"heldout-{k}-latents.safetensors")
            write_safetensors(lat, {"latents": z[None].contiguous()})
            dec = os.path.join(out, f"heldout-{k}-decoded.safetensors")
            common.run([h3run, "decode", "--model", os.path.join(out, "video_vae"), "--latents", lat, "--tensors-out",
                        dec, "-q"])
            y_h3 = unit(read_safetensors(dec)["frames"][0].float())
            agree = (y_h3 - y_ref).abs().max().item()
            base = x.mean(1, keepdim=True).expand_as(x)
            row = {"h3run_vs_reference_max_abs": agree, "psnr": psnr(y_h3, x), "psnr_mean_frame": psnr(base, x)}
            res["held_out"].append(row)
            print(f"held-out clip {k}: h3run vs reference decode max |diff| {agree:.2e}; PSNR {row['psnr']:.2f} dB "
                  f"(mean frame {row['psnr_mean_frame']:.2f} dB)", flush=True)
    with open(os.path.join(out, "video_vae_train.json"), "w") as f:
        json.dump(res, f, indent=1)
    return common.verdict("decoding the exported video VAE", max(h["h3run_vs_reference_max_abs"] for h in
                                                              res["held_out"]), 1e-5)


if __name__ == "__main__":
    sys.exit(main())
