"""Training the small model's video VAE on the synthetic world (docs/SYNTH.md), and proving h3run decodes what it
learned.

    build/h3-synth dataset data/vv --clips 512 --frames 22 --size 64x64
    /usr/bin/python3 tools/train/train_video_vae.py --data data/vv --template out/h3-tiny --out out/vv --steps 300

The decoder is the release's ViT decoder at the template's width (h3-tinymodel: hidden 128, 2 heads of 64, 2 blocks),
trained through the project's reference decode (tools/reference/video_vae.py `decode`: temporal chunks, token drop,
tiles; what h3run computes), so the pixels it is trained on are the pixels h3run will produce. The encoder is the
release's causal 3-D CNN at a small width (encoders.py; `--encoder standin`: the first model's patchify-and-MLP):
h3run never runs an encoder, the training needs it for the DiT's latents. Latents are kept near unit scale (the DiT's
working range) by a penalty on their mean square. `--freeze-encoder` trains the decoder alone on latents computed
once, so a DiT trained on them stays valid; `--color-weight` and `--edge-weight` weight the shape's colour and the
pixels around it (what the adherence check reads).

At the end: the decoder written in the official layout over a copy of the template's video_vae/ (export.py), a release
encoder in the same file under the release's names, the encoder's own file beside it, and a check on clips the training did not see: the clip encoded here, decoded by h3run
(`h3run decode --tensors-out`), compared with the reference decode (must agree to float32 rounding) and with the
original frames (PSNR, against the PSNR of predicting every frame as the clip's mean frame).
"""

import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import common  # noqa: E402
import encoders  # noqa: E402
import export  # noqa: E402
from dit import read_safetensors, write_safetensors  # noqa: E402
from video_vae import IMAGENET_MEAN, IMAGENET_STD, decode, load_video_vae  # noqa: E402


def load_clips(folders):
    """All clips of h3-synth datasets: uint8 [n, T, H, W, 3] (frames are made float a batch at a time)."""
    return torch.cat([read_safetensors(p)["video"] for p in common.shards(folders)], 0)


def frames(u8):
    """uint8 [..., T, H, W, 3] -> float [..., 3, T, H, W] in [0, 1]."""
    nd = u8.ndim
    return u8.permute(*range(nd - 4), nd - 1, nd - 4, nd - 3, nd - 2).float() / 255.0


def _stat(x, values):
    return torch.tensor(values, dtype=x.dtype, device=x.device).reshape(3, 1, 1, 1)


def imagenet(x):
    return (x - _stat(x, IMAGENET_MEAN)) / _stat(x, IMAGENET_STD)


def unit(y):
    return (y * _stat(y, IMAGENET_STD) + _stat(y, IMAGENET_MEAN)).clamp(0, 1)


def psnr(a, b):
    mse = ((a - b) ** 2).mean().item()
    return 10 * math.log10(1.0 / max(mse, 1e-12))


def shape_mask(x):
    """1 where a pixel differs from its frame's border colour (the shape), else 0: [..., 1, F, H, W] for x [..., 3,
    F, H, W]."""
    border = torch.cat([x[..., 0, :], x[..., -1, :], x[..., :, 0], x[..., :, -1]], -1).mean(-1)  # [..., 3, F]
    return ((x - border[..., None, None]).abs().sum(-4, keepdim=True) > 0.15).to(x.dtype)


def shape_weight(x, extra, edge=0.0):
    """Per-pixel loss weight: 1 + extra on the shape (the background is most of every frame, the shape's colour is
    what the adherence check reads), + edge on the 2 pixels around it (a soft edge mixes the background into the
    colour the check reads)."""
    m = shape_mask(x)
    wt = 1 + extra * m
    if edge:
        lead = m.shape[:-3]
        grown = torch.nn.functional.max_pool3d(m.reshape(-1, 1, *m.shape[-3:]), (1, 5, 5), 1, (0, 2, 2))
        wt = wt + edge * (grown.reshape(*lead, *m.shape[-3:]) - m)
    return wt


def color_loss(y, x):
    """Squared error of the shape's mean colour per frame (decoded y in the decoder's normalized space, original x
    in [0, 1]): the quantity the adherence check reads."""
    m = shape_mask(x)
    n = m.sum((-1, -2)).clamp_min(1.0)
    yu = y * _stat(y, IMAGENET_STD) + _stat(y, IMAGENET_MEAN)
    return ((((yu - x) * m).sum((-1, -2)) / n) ** 2).mean()


def main():
    ap = common.parser(__doc__, steps=300, batch=4, lr=2e-3)
    ap.add_argument("--holdout", type=int, default=8, help="clips kept out of training for the check")
    ap.add_argument("--noise", type=float, default=0.05, help="noise added to the latents before decoding (the "
                    "decoder learns to tolerate the DiT's errors)")
    ap.add_argument("--encoder", choices=("release", "standin"), default="release",
                    help="the release's causal 3-D CNN encoder at a small width, or the first stand-in (an MLP)")
    ap.add_argument("--shape-weight", type=float, default=4.0, help="extra loss weight on the shape's pixels")
    ap.add_argument("--color-weight", type=float, default=0.0, help="weight of the shape's mean colour error")
    ap.add_argument("--edge-weight", type=float, default=0.0, help="extra loss weight on the 2 pixels around the shape")
    ap.add_argument("--freeze-encoder", action="store_true", help="train the decoder only (with --init: the latents "
                    "a DiT was trained on stay as they are); every training clip is encoded once, up front")
    a = ap.parse_args()
    out = common.setup(a)
    clips = load_clips(a.data).to(a.device)
    n, F, H, W, _ = clips.shape
    if (F - 5) % 17 or H % 16 or W % 16:
        raise SystemExit(f"clips of {F} frames at {W}x{H}: need 17n+5 frames and multiples of 16")
    L = (F - 5) // 17 * 5 + 2
    ntrain = n - a.holdout
    w64, cfg = load_video_vae(os.path.join(a.init or a.template, "video_vae"))
    w = {k: v.float().to(a.device).clone().requires_grad_(True) for k, v in w64.items()}
    if a.init:
        enc = encoders.load_video_encoder(os.path.join(a.init, "video_encoder.safetensors")).to(a.device)
    else:
        enc = encoders.video_encoder(a.encoder, F, L, cfg["latents_mean"], cfg["latents_std"]).to(a.device)
    enc.requires_grad_(not a.freeze_encoder)
    params = list(w.values()) + ([] if a.freeze_encoder else list(enc.parameters()))
    opt = torch.optim.Adam(params, lr=a.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    dec = common.vmap(lambda z: decode(w, cfg, z))
    print(f"video VAE: {sum(v.numel() for v in w.values()):,} decoder and {sum(p.numel() for p in enc.parameters()):,} "
          f"encoder parameters; {ntrain} training clips of {F} frames at {W}x{H} -> latents [24, {L}, {H // 16}, "
          f"{W // 16}] ({enc.kind} encoder); batch {a.batch} on {a.device}", flush=True)
    zcache = None
    if a.freeze_encoder:  # the encoder is fixed: each training clip's latents once (on a CPU the encoder costs more
        with torch.no_grad():  # than the decoder's step)
            zs = []
            for s0 in range(0, ntrain, 4):
                zs.append(enc(frames(clips[s0:min(s0 + 4, ntrain)])))
                if (s0 // 4) % 10 == 0:
                    print(f"encoding the training clips: {min(s0 + 4, ntrain)} of {ntrain}", flush=True)
            zcache = torch.cat(zs)
    clock = common.Clock(a)
    while clock.step():
        step = clock.n
        pick = torch.randint(0, ntrain, (a.batch,))
        x = frames(clips[pick])
        z = zcache[pick] if zcache is not None else enc(x)
        y = dec(z + a.noise * torch.randn_like(z))
        loss_r = (((y - imagenet(x)) ** 2) * shape_weight(x, a.shape_weight, a.edge_weight)).mean()
        loss_z = torch.relu((z ** 2).mean() - 1.0)  # latents at most unit scale: the DiT's working range
        loss_c = color_loss(y, x) if a.color_weight else torch.zeros(())
        loss = loss_r + (0 if a.freeze_encoder else loss_z) + a.color_weight * loss_c
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == 1:
            print(f"step {step}: reconstruction {loss_r.item():.4f}, shape colour {loss_c.item():.5f}, latent mean "
                  f"square {(z ** 2).mean().item():.3f}, {clock.elapsed():.0f} s", flush=True)
    # write: the decoder in the official layout, the encoder beside it
    export.export_video_vae({k: v.detach() for k, v in w.items()}, cfg, os.path.join(a.template, "video_vae"),
                            os.path.join(out, "video_vae"), enc.state_dict() if enc.kind == "release" else None)
    write_safetensors(os.path.join(out, "video_encoder.safetensors"),
                      {k: common.cpu(v) for k, v in enc.state_dict().items()},
                      {"encoder": enc.kind, "frames": str(F), "latent_frames": str(L)})
    # the check on held-out clips
    res = {"steps": clock.n, "seconds": round(clock.elapsed()), "clips": ntrain, "frames": F, "size": [W, H],
           "held_out": []}
    common.exact()
    with torch.no_grad():
        wd = {kk: v.detach() for kk, v in w.items()}
        for k in range(a.holdout):
            x = frames(clips[ntrain + k])
            z = enc(x)
            y_ref = unit(decode(wd, cfg, z)).cpu()
            got = common.h3run_decode(os.path.join(out, "video_vae"), z[None], os.path.join(out, f"heldout-{k}"))
            y_h3 = unit(got["frames"][0].float())
            x = x.cpu()
            agree = (y_h3 - y_ref).abs().max().item()
            base = x.mean(1, keepdim=True).expand_as(x)
            row = {"h3run_vs_reference_max_abs": agree, "psnr": psnr(y_h3, x), "psnr_mean_frame": psnr(base, x)}
            res["held_out"].append(row)
            print(f"held-out clip {k}: h3run vs reference decode max |diff| {agree:.2e}; PSNR {row['psnr']:.2f} dB "
                  f"(mean frame {row['psnr_mean_frame']:.2f} dB)", flush=True)
    return common.finish(out, "video_vae", res, "decoding the exported video VAE")

if __name__ == "__main__":
    sys.exit(main())
