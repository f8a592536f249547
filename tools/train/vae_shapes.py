"""Whether a video VAE keeps the synthetic world's shapes: clips of an h3-synth dataset through `h3run vae-encode` and
`h3run decode`, each frame's shape measured as h3_synth_measure measures it (src/synth/world.c: the pixels farther
than 0.25 from the border's mean, their bounding box from rows and columns with two or more of them, its fill and
the share of pixels in its lower half), the median over frames printed for the clip as drawn and after the round
trip. A square fills its box (1.0), a circle pi/4, a triangle 1/2 with 3/4 of its pixels in the lower half.

    build/h3-synth dataset DATA --clips 12 --frames 56 --size 128x128 --seed 5
    /usr/bin/python3 tools/train/vae_shapes.py models/h3-small/video_vae DATA
"""

import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import common  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1, 1)


def shape_of(frames):
    """frames [3, F, H, W] in [0, 1] -> (median fill, median lower-half share) over the frames with a shape."""
    fills, lows = [], []
    for f in range(frames.shape[1]):
        x = frames[:, f]
        bg = torch.cat([x[:, 0, :], x[:, -1, :], x[:, :, 0], x[:, :, -1]], 1).mean(1)
        m = ((x - bg[:, None, None]) ** 2).sum(0) >= 0.0625
        rows, cols = m.sum(1).double(), m.sum(0)
        ys, xs = (rows >= 2).nonzero(), (cols >= 2).nonzero()
        if len(ys) == 0 or len(xs) == 0:
            continue
        y0, y1, x0, x1 = ys.min().item(), ys.max().item(), xs.min().item(), xs.max().item()
        inside = rows[y0: y1 + 1].sum().item()
        mid = 0.5 * (y0 + y1 + 1)
        yy = torch.arange(len(rows), dtype=torch.float64) + 0.5
        low = (rows * ((yy > mid).double() + 0.5 * (yy == mid).double()))[y0: y1 + 1].sum().item()
        fills.append(inside / ((y1 - y0 + 1) * (x1 - x0 + 1)))
        lows.append(low / inside)
    fills.sort()
    lows.sort()
    return (fills[len(fills) // 2], lows[len(lows) // 2]) if fills else (float("nan"), float("nan"))


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: vae_shapes.py VIDEO_VAE DATASET")
    vae, data = sys.argv[1:]
    with open(os.path.join(vae, "config.json")) as f:
        cfg = json.load(f)
    mean = torch.tensor(cfg["latents_mean"]).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg["latents_std"]).view(1, -1, 1, 1, 1)
    with open(os.path.join(data, "captions.jsonl")) as f:
        caps = [json.loads(x) for x in f]
    h3run = common.program("h3run")
    with tempfile.TemporaryDirectory() as d:
        for si, shard in enumerate(common.shards([data])):
            video = read_safetensors(shard)["video"]
            for i in range(video.shape[0]):
                c = next(x for x in caps if x["shard"] == si and x["index"] == i)
                px = video[i: i + 1].permute(0, 4, 1, 2, 3).contiguous()  # [1, 3, F, H, W] uint8
                write_safetensors(os.path.join(d, "px.safetensors"), {"pixels": px})
                common.run([h3run, "vae-encode", "--model", vae, "--input", os.path.join(d, "px.safetensors"),
                            "--out", os.path.join(d, "lat.safetensors"), "-q"])
                lat = read_safetensors(os.path.join(d, "lat.safetensors"))["latents"].float()
                write_safetensors(os.path.join(d, "norm.safetensors"), {"latents": ((lat - mean) / std).contiguous()})
                out = os.path.join(d, f"frames-{si}-{i}")
                common.run([h3run, "decode", "--model", vae, "--latents", os.path.join(d, "norm.safetensors"), "--out",
                            out, "--tensors-out", os.path.join(d, "dec.safetensors"), "-q"])
                dec = read_safetensors(os.path.join(d, "dec.safetensors"))["frames"][0].float()
                dec = (dec * IMAGENET_STD + IMAGENET_MEAN).clamp(0, 1)
                f0, l0 = shape_of(px[0].float() / 255)
                f1, l1 = shape_of(dec)
                print(f"{c['shape']:9s} drawn: fill {f0:.3f}, lower half {l0:.3f}; through the VAE: fill {f1:.3f}, "
                      f"lower half {l1:.3f}", flush=True)


if __name__ == "__main__":
    main()
