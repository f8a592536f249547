"""Reads the latents files `h3run generate --latents` writes (safetensors, f32), standard library only, for
tests/cli_refine.sh:

    latents_tool.py same-audio A B        exit 0 when audio_latents of A and B are the same bytes, else 1
    latents_tool.py near-upscaled A B     prints the relative L2 distance of B's video_latents from A's
                                          upscaled to B's size (bilinear, half-pixel centres, per frame: an
                                          implementation of its own, not h3run's)
"""
import json
import math
import struct
import sys
from array import array


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32", v["dtype"]
        out[k] = (v["shape"], body[a:b])
    return out


def axis(n_in, n_out):
    """For each output index: the two input indices and the weight of the second (tent weights)."""
    r = []
    for j in range(n_out):
        p = max(0.0, (j + 0.5) * n_in / n_out - 0.5)
        i0 = min(int(math.floor(p)), n_in - 1)
        r.append((i0, min(i0 + 1, n_in - 1), p - i0))
    return r


def main():
    cmd, pa, pb = sys.argv[1:4]
    a, b = read(pa), read(pb)
    if cmd == "same-audio":
        sys.exit(0 if a["audio_latents"][1] == b["audio_latents"][1] else 1)
    (sa, da), (sb, db) = a["video_latents"], b["video_latents"]
    _, C, T, H, W = sa
    _, C2, T2, H2, W2 = sb
    assert (C, T) == (C2, T2), (sa, sb)
    x, y = array("f", da), array("f", db)
    ay, ax = axis(H, H2), axis(W, W2)
    num = den = 0.0
    for f in range(C * T):
        base = f * H * W
        for i, (y0, y1, wy) in enumerate(ay):
            for j, (x0, x1, wx) in enumerate(ax):
                v = ((1 - wy) * ((1 - wx) * x[base + y0 * W + x0] + wx * x[base + y0 * W + x1])
                     + wy * ((1 - wx) * x[base + y1 * W + x0] + wx * x[base + y1 * W + x1]))
                d = y[f * H2 * W2 + i * W2 + j] - v
                num += d * d
                den += v * v
    print("%.6f" % math.sqrt(num / den))


main()
