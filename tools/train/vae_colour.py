"""Does the video VAE alone keep the shape's colour? Clips of an h3-synth dataset encoded and decoded (the reference
decode: what h3run computes), each read by the adherence check's colour rule (src/synth/world.c h3_synth_measure:
the mean colour of the pixels farther than 0.25 from the border's mean colour, the nearest palette colour), before
and after the round trip.

    /usr/bin/python3 tools/train/vae_colour.py VV_FOLDER DATASET [--colors red orange yellow] [--clips 10]

VV_FOLDER: train_video_vae.py's output (video_vae/ and video_encoder.safetensors). Prints one line per clip and
"round trip right R/N (original O/N)"; exits 1 when the original frames read wrong (the rule and the palette here
no longer match world.c's).
"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import encoders  # noqa: E402
from train_video_vae import frames, load_clips, unit  # noqa: E402
from video_vae import decode, load_video_vae  # noqa: E402

NAMES = ("red", "orange", "yellow", "green", "blue", "purple")  # world.c g_colors, g_rgb
PALETTE = torch.tensor([[0.90, 0.10, 0.10], [0.95, 0.55, 0.05], [0.95, 0.90, 0.10], [0.10, 0.75, 0.20],
                        [0.15, 0.35, 0.90], [0.60, 0.20, 0.80]])


def read_colour(x):
    """x [3, T, H, W] in [0, 1] -> (palette name, mean colour) as the adherence check reads it."""
    bg = torch.cat([x[:, :, 0, :], x[:, :, -1, :], x[:, :, 1:-1, 0], x[:, :, 1:-1, -1]], -1).mean((1, 2))
    far = ((x - bg[:, None, None, None]) ** 2).sum(0) >= 0.25 ** 2
    mc = (x * far).sum((1, 2, 3)) / far.sum().clamp_min(1)
    return NAMES[int(((PALETTE - mc) ** 2).sum(1).argmin())], mc


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("vv")
    ap.add_argument("data")
    ap.add_argument("--colors", nargs="+", default=list(NAMES))
    ap.add_argument("--clips", type=int, default=10)
    a = ap.parse_args()
    clips = load_clips([a.data])
    caps = [json.loads(line) for line in open(os.path.join(a.data, "captions.jsonl"))]
    enc = encoders.load_video_encoder(os.path.join(a.vv, "video_encoder.safetensors"))
    w, cfg = load_video_vae(os.path.join(a.vv, "video_vae"))
    w = {k: v.float() for k, v in w.items()}
    n = right = orig = 0
    for i, c in enumerate(caps):
        if c["color"] not in a.colors:
            continue
        x = frames(clips[i])
        with torch.no_grad():
            y = unit(decode(w, cfg, enc(x[None])[0]))
        o, _ = read_colour(x)
        r, mc = read_colour(y.float())
        n, right, orig = n + 1, right + (r == c["color"]), orig + (o == c["color"])
        print(f"{c['color']} {c['shape']} on {c['background']}: the original reads {o}, the round trip {r} "
              f"(mean colour {', '.join(f'{v:.2f}' for v in mc.tolist())})", flush=True)
        if n >= a.clips:
            break
    print(f"round trip right {right}/{n} (original {orig}/{n})")
    return 0 if orig == n else 1


if __name__ == "__main__":
    sys.exit(main())
