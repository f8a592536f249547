#!/usr/bin/env python3
"""Writes safetensors inputs of any size for the CLI tests (standard library only; zeros, which every stage takes
as it takes real values and at the same speed):

  make_inputs.py latents FILE T H W       video latents 'latents' [1, 24, T, H, W] (h3run decode)
  make_inputs.py audio FILE T             audio latents 'latents' [2, 32, T] (h3run decode)
  make_inputs.py dit FILE NV TEXT_DIM     a packed sequence of NV video rows, 8 audio rows and 4 text rows at one
                                          timestep (h3run dit --inputs)
"""
import json
import struct
import sys


def write(path, tensors):
    """tensors: name -> (dtype, shape, bytes), written in that order."""
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors.values():
            f.write(data)


def i64(values):
    values = list(values)
    return struct.pack("<%dq" % len(values), *values)


def main(argv):
    kind, path, args = argv[1], argv[2], [int(a) for a in argv[3:]]
    if kind == "latents":
        t, h, w = args
        write(path, {"latents": ("F32", [1, 24, t, h, w], bytes(4 * 24 * t * h * w))})
    elif kind == "audio":
        (t,) = args
        write(path, {"latents": ("F32", [2, 32, t], bytes(4 * 2 * 32 * t))})
    elif kind == "dit":
        nv, text_dim = args
        na, nt = 8, 4
        s = nv + na + nt
        write(path, {
            "video": ("F32", [nv, 96], bytes(4 * nv * 96)),
            "audio": ("F32", [na, 32], bytes(4 * na * 32)),
            "text": ("F32", [nt, text_dim], bytes(4 * nt * text_dim)),
            "timesteps": ("F32", [1], struct.pack("<f", 0.5)),
            "timestep_indices": ("I64", [s], i64([0] * s)),
            "token_tags": ("I64", [s], i64([0] * nv + [1] * nt + [2] * na)),
            "position_ids": ("F64", [s, 3], bytes(8 * s * 3)),
            "video_indices": ("I64", [nv], i64(range(nv))),
            "text_indices": ("I64", [nt], i64(range(nv, nv + nt))),
            "audio_indices": ("I64", [na], i64(range(nv + nt, s))),
        })
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
