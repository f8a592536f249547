"""Training the small model's audio VAE on the synthetic world's sound (docs/SYNTH.md), and proving h3run decodes what
it learned.

    build/h3-synth dataset data/av --clips 256 --frames 22 --size 32x32
    /usr/bin/python3 tools/train/train_audio_vae.py --data data/av --template out/h3-tiny --out out/av --steps 300

The decoder is the release's BigVGAN decoder at the template's width (h3-tinymodel: 128 initial channels, the
release's rates 5·5·2·2·2·2·2 = 800 samples per latent frame, anti-aliased SnakeBeta), trained through the project's
reference decode (tools/reference/audio_vae.py, what h3run computes); each stereo channel is decoded on its own, as
the release does. The encoder is the release's DAC-style one at a small width (encoders.py; `--encoder standin`: the
first model's MLP over 800-sample frames). Loss: waveform MSE (`--wave-weight`) plus a multi-resolution spectral loss
(the pitch lives there); latents are kept near unit scale by a penalty on their mean square. Trained from scratch the
DAC-style encoder settles on a silent output, so `--teacher ENC` has a fresh encoder learn an earlier encoder's
latents (their MSE, `--teacher-weight`) while the earlier decoder (`--init`) fine-tunes.

At the end: the decoder in the official layout over a copy of the template's audio_vae/ (export.py), a release
encoder in the same file under the release's names, the encoder's own file beside it, and a check on clips the training did not see: h3run's decode (`h3run decode --tensors-out`) against the
reference decode (float32 rounding), the log-spectrum distance and level against the original sound, and whether the
loudest palette pitch (the adherence check's pitch) survives.
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
from audio_vae import decode, decode_one, load_audio_vae  # noqa: E402
from dit import read_safetensors, write_safetensors  # noqa: E402

HOP = 800


def load_sound(folders):
    """All clips' sound of h3-synth datasets: float [n, 2, samples]."""
    return torch.cat([read_safetensors(p)["audio"].float() for p in common.shards(folders)], 0)


def stft_mag(x, n):
    w = torch.hann_window(n, dtype=x.dtype, device=x.device)
    return torch.stft(x, n, n // 4, window=w, return_complex=True).abs()


def spec_l1(y, x, n=1024):
    """Log-magnitude L1 of one resolution (the held-out report)."""
    return (torch.log(stft_mag(y, n) + 1e-5) - torch.log(stft_mag(x, n) + 1e-5)).abs().mean()


def spec_loss(y, x):
    """Multi-resolution STFT loss: spectral convergence plus log-magnitude L1 at 512, 1024 and 2048 points (the
    floor 1e-3 keeps near-silent bins from dominating). y, x [..., samples]."""
    total = 0.0
    for n in (512, 1024, 2048):
        Y, X = stft_mag(y.reshape(-1, y.shape[-1]), n), stft_mag(x.reshape(-1, x.shape[-1]), n)
        total = total + (Y - X).norm() / X.norm().clamp_min(1e-6)
        total = total + (torch.log(Y + 1e-3) - torch.log(X + 1e-3)).abs().mean()
    return total / 3


PALETTE_HZ = (220.00, 277.18, 329.63, 392.00, 493.88, 587.33)  # src/synth/world.c


def loudest_pitch(x, sr=32000):
    """Index of the palette pitch with the most energy in x (what the adherence check measures)."""
    x = x.double().cpu()
    t = torch.arange(x.shape[-1], dtype=torch.float64, device="cpu") / sr
    e = [((x * torch.cos(2 * math.pi * f * t)).sum() ** 2 + (x * torch.sin(2 * math.pi * f * t)).sum()
          ** 2).item() for f in PALETTE_HZ]
    return max(range(len(e)), key=lambda i: e[i])


def main():
    ap = common.parser(__doc__, steps=300, batch=16, lr=1e-3)
    ap.add_argument("--holdout", type=int, default=4)
    ap.add_argument("--crop", type=int, default=24, help="latent frames (x 800 samples) per training crop")
    ap.add_argument("--noise", type=float, default=0.05, help="noise added to the latents before decoding")
    ap.add_argument("--teacher", help="an earlier encoder (audio_encoder.safetensors) whose latents a fresh --encoder "
                    "learns to reproduce (its decoder comes from --init): the trained decoder, and a DiT trained on "
                    "those latents, stay valid")
    ap.add_argument("--teacher-weight", type=float, default=10.0, help="weight of the latent MSE against --teacher")
    ap.add_argument("--wave-weight", type=float, default=100.0, help="weight of the waveform MSE beside the spectral loss")
    ap.add_argument("--encoder", choices=("release", "standin"), default="release",
                    help="the release's DAC-style encoder with its attention projection at a small width, or the "
                    "first stand-in (an MLP)")
    a = ap.parse_args()
    out = common.setup(a)
    sound = load_sound(a.data).to(a.device)
    n, C, S = sound.shape
    ntrain = n - a.holdout
    w64, cfg = load_audio_vae(os.path.join(a.init or a.template, "audio_vae"))
    w = {k: v.float().to(a.device).clone().requires_grad_(not k.endswith(".filter")) for k, v in w64.items()}
    teacher = None
    if a.teacher:
        teacher = encoders.load_audio_encoder(a.teacher).to(a.device).requires_grad_(False)
    if a.init and not a.teacher:
        enc = encoders.load_audio_encoder(os.path.join(a.init, "audio_encoder.safetensors")).to(a.device)
    else:
        enc = encoders.audio_encoder(a.encoder, cfg["latents_mean"], cfg["latents_std"]).to(a.device)
    params = [v for v in w.values() if v.requires_grad] + list(enc.parameters())
    opt = torch.optim.Adam(params, lr=a.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    mean = torch.tensor(cfg["latents_mean"], dtype=torch.float32, device=a.device).reshape(-1, 1)
    std = torch.tensor(cfg["latents_std"], dtype=torch.float32, device=a.device).reshape(-1, 1)
    dec = common.vmap(lambda z: decode_one(w, cfg, z * std + mean))  # one stereo channel per row, as decode does
    crop = min(a.crop * HOP, S // HOP * HOP)
    print(f"audio VAE: {sum(v.numel() for v in w.values()):,} decoder and {sum(p.numel() for p in enc.parameters()):,} "
          f"encoder parameters; {ntrain} training clips of {S} samples x {C} channels; batch {a.batch} crops of "
          f"{crop} samples on {a.device}", flush=True)
    clock = common.Clock(a)
    while clock.step():
        step = clock.n
        clip = torch.randint(0, ntrain, (a.batch,))
        ch = torch.randint(0, C, (a.batch,))
        start = torch.randint(0, (S - crop) // HOP + 1, (a.batch,)) * HOP
        x = torch.stack([sound[i, c, s0: s0 + crop] for i, c, s0 in zip(clip.tolist(), ch.tolist(), start.tolist())])
        z = enc(x)
        y = dec(z + a.noise * torch.randn_like(z))[:, :crop]
        lw = ((y - x) ** 2).mean()
        ls = spec_loss(y, x)
        lz = torch.relu((z ** 2).mean() - 1.0)
        lt = ((z - teacher(x)) ** 2).mean() if teacher is not None else torch.zeros(())
        loss = lw * a.wave_weight + ls + lz + a.teacher_weight * lt
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == 1:
            rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
            print(f"step {step}: waveform MSE {lw.item():.5f}, spectral {ls.item():.3f}, rms {rms(y):.3f} (original "
                  f"{rms(x):.3f}), teacher MSE {lt.item():.4f}, latent mean square {(z ** 2).mean().item():.3f}, "
                  f"{clock.elapsed():.0f} s", flush=True)
    export.export_audio_vae({k: v.detach() for k, v in w.items()}, os.path.join(a.template, "audio_vae"),
                            os.path.join(out, "audio_vae"), enc.state_dict() if enc.kind == "release" else None)
    write_safetensors(os.path.join(out, "audio_encoder.safetensors"),
                      {k: common.cpu(v) for k, v in enc.state_dict().items()}, {"encoder": enc.kind, "hop": str(HOP)})
    res = {"steps": clock.n, "seconds": round(clock.elapsed()), "clips": ntrain, "samples": S, "held_out": []}
    common.exact()
    with torch.no_grad():
        wd = {k: v.detach() for k, v in w.items()}
        for k in range(a.holdout):
            x = sound[ntrain + k]
            z = enc(x)
            y_ref = decode(wd, cfg, z).cpu()
            got = common.h3run_decode(os.path.join(out, "audio_vae"), z, os.path.join(out, f"heldout-{k}"))
            y_h3 = got["waveform"][:, 0].float()
            agree = (y_h3[:, : y_ref.shape[1]] - y_ref[:, : y_h3.shape[1]]).abs().max().item()
            y, x = y_h3[:, :S], x.cpu()
            row = {"h3run_vs_reference_max_abs": agree, "log_spectrum_l1": float(sum(spec_l1(y[c], x[c]) for c in
                                                                                     range(C)) / C),
                   "rms": y.pow(2).mean().sqrt().item(), "rms_original": x.pow(2).mean().sqrt().item(),
                   "pitch_right": loudest_pitch(y.mean(0)) == loudest_pitch(x.mean(0))}
            res["held_out"].append(row)
            print(f"held-out clip {k}: h3run vs reference decode max |diff| {agree:.2e}; log-spectrum L1 "
                  f"{row['log_spectrum_l1']:.3f}; rms {row['rms']:.3f} (original {row['rms_original']:.3f}); loudest "
                  f"palette pitch {'right' if row['pitch_right'] else 'wrong'}", flush=True)
    return common.finish(out, "audio_vae", res, "decoding the exported audio VAE")

if __name__ == "__main__":
    sys.exit(main())
