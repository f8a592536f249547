"""Reads the latents files `h3run generate --latents` writes (safetensors, f32), standard library only, for
tests/cli_refine.sh:

    latents_tool.py same-audio A B        exit 0 when audio_latents of A and B are the same bytes, else 1
    latents_tool.py distance A B          prints the relative L2 distance of B's video_latents from A's, then of
                                          its audio_latents (tests/cli_cache.sh)
    latents_tool.py near-upscaled A B     prints the relative L2 distance of B's video_latents from A's
                                          upscaled to B's size (bilinear, half-pixel centres, per frame: an
                                          implementation of its own, not h3run's)

and, for tests/cli_fl2va.sh, a latents file with keyframes (LAT) and the first DiT call's inputs (DUMP):

    latents_tool.py keyframes LAT DUMP    checks keyframe_rows = patchify(0.999·keyframe_latents + (1 − 0.999)·
                                          keyframe_noise) in float32 (patchify written here: row (i, j) holds
                                          latent[c, 2i + dy, 2j + dx] at column 4c + 2dy + dx); that the DiT's first
                                          call saw them as its leading video rows, at t = 0.999 while the target sat
                                          at t = 0, at rotary times L (first keyframe) and L + 5/3·f (f: its
                                          frame), tagged video, between the text and the audio rows; that the
                                          presentation's vision blocks (tags 0) hold the image tokens; prints a
                                          summary line
"""
import json
import math
import struct
import sys
from array import array


CODES = {"F32": "f", "F64": "d", "I32": "i", "I64": "q", "U8": "B"}


def read(path, any_dtype=False):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if any_dtype:
            out[k] = (v["shape"], array(CODES[v["dtype"]], body[a:b]))
            continue
        assert v["dtype"] == "F32", v["dtype"]
        out[k] = (v["shape"], body[a:b])
    return out


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def keyframes(lat_path, dump_path):
    lat, dmp = read(lat_path, True), read(dump_path, True)
    (ks, clean), (_, noise), (rs, rows) = lat["keyframe_latents"], lat["keyframe_noise"], lat["keyframe_rows"]
    frames = lat["keyframe_frames"][1]
    K, C, _, H, W = ks
    per = (H // 2) * (W // 2)
    assert rs == [K * per, 96], rs
    t, keep = f32(0.999), f32(1.0 - f32(0.999))
    worst = 0.0
    for k in range(K):
        for i in range(H // 2):
            for j in range(W // 2):
                for c in range(C):
                    for dy in range(2):
                        for dx in range(2):
                            src = ((k * C + c) * H + 2 * i + dy) * W + 2 * j + dx
                            want = f32(f32(t * clean[src]) + f32(keep * noise[src]))
                            got = rows[((k * per) + i * (W // 2) + j) * 96 + c * 4 + dy * 2 + dx]
                            worst = max(worst, abs(got - want))
    if worst > 1e-6:
        sys.exit(f"keyframe_rows differ from 0.999*latents + 0.001*noise by {worst}")
    # the DiT's first call
    video, vidx, tags, pos = dmp["video"][1], dmp["video_indices"][1], dmp["token_tags"][1], dmp["position_ids"][1]
    tsteps, tidx, text_idx = dmp["timesteps"][1], dmp["timestep_indices"][1], dmp["text_indices"][1]
    L = len(text_idx)
    if any(video[r] != rows[r] for r in range(K * per * 96)):
        sys.exit("the DiT's first call did not see keyframe_rows as its leading video rows")
    for r in range(K * per):
        row = vidx[r]
        if row != L + r or tags[row] != 0:
            sys.exit(f"keyframe row {r} is sequence row {row} tagged {tags[row]}, not {L + r} tagged 0")
        if tsteps[tidx[row]] != t:
            sys.exit(f"keyframe row {r} at t = {tsteps[tidx[row]]}, not 0.999")
        want_t = L + 5.0 / 3.0 * frames[r // per]
        if abs(pos[3 * row] - want_t) > 1e-9 * max(1.0, want_t):
            sys.exit(f"keyframe row {r} (frame {frames[r // per]}) at rotary time {pos[3 * row]}, not {want_t}")
    target = vidx[K * per]
    if tsteps[tidx[target]] != 0.0:
        sys.exit(f"the target's video rows start at t = {tsteps[tidx[target]]}, not 0")
    # the presentation: vision blocks are tagged video, the rest of the text text
    ttags, ids = lat["text_tags"][1], lat["text_ids"][1]
    if len(ttags) != L or any(tags[r] != ttags[r] for r in range(L)):
        sys.exit("the DiT's text rows are not tagged as the presentation")
    blocks = sum(1 for r in range(L) if ttags[r] == 0 and (r == 0 or ttags[r - 1] != 0))
    if blocks != K:
        sys.exit(f"{blocks} vision blocks in the presentation for {K} keyframes")
    print(f"keyframes: {K}, {K * per} rows within {worst:.1e} of the mix; {L} text rows, "
          f"{sum(1 for x in ttags if x == 0)} in vision blocks")


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
    if cmd == "keyframes":
        keyframes(pa, pb)
        return
    if cmd == "same-inputs":  # two dumps of a DiT call's inputs: every table equal, and the first N video rows
        a, b = read(pa, True), read(pb, True)
        n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        bad = [k for k in b if k not in ("video", "audio") and (k not in a or a[k][0] != b[k][0] or a[k][1] != b[k][1])]
        if a["video"][0] != b["video"][0] or a["audio"][0] != b["audio"][0]:
            bad.append("row shapes")
        if a["video"][1][: n * 96] != b["video"][1][: n * 96]:
            bad.append("the first %d video rows" % n)
        print("differ: " + ", ".join(bad) if bad else "same")
        sys.exit(1 if bad else 0)
    a, b = read(pa, True), read(pb, True)  # the latents (F32) beside keyframe tables of other types
    a = {k: (v[0], v[1].tobytes()) for k, v in a.items() if k in ("video_latents", "audio_latents")}
    b = {k: (v[0], v[1].tobytes()) for k, v in b.items() if k in ("video_latents", "audio_latents")}
    if cmd == "same-audio":
        sys.exit(0 if a["audio_latents"][1] == b["audio_latents"][1] else 1)
    if cmd == "distance":
        out = []
        for name in ("video_latents", "audio_latents"):
            x, y = array("f", a[name][1]), array("f", b[name][1])
            num = sum((p - q) * (p - q) for p, q in zip(x, y))
            den = sum(p * p for p in x)
            out.append("%.6f" % math.sqrt(num / den))
        print(" ".join(out))
        return
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
