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

and, for tests/cli_ref2va.sh, the first DiT call's inputs of a ref2va run (DUMP) against the blocks the test expects
(BLOCKS: kind:lt:lh:lw:audio_t,... in order; kind image, video or audio) and the target's frames, width and height:

    latents_tool.py ref2va DUMP BLOCKS FRAMES WIDTH HEIGHT
                                          rebuilds diffusers' build_ref2va_packed_sequence here (the shared clock:
                                          an image advances it by 1, a sound by its latents, a video by max(its
                                          sound's latents, its frames' spans); sounds pinned to the target's width
                                          grid, a video's soundtrack to its own) and checks the dump's positions
                                          (exactly), tags, index sets and row timesteps (reference video rows at
                                          0.999, reference audio rows at 1, the target at t_video / t_audio)

    latents_tool.py frame-means LAT NAME  prints the mean of each frame of a u8 [F, h, w, 3] tensor (refK_pixels), one
                                          integer (rounded) per line
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


def grid(d, area):
    ratio = d / math.sqrt(area)
    left = (1.0 - ratio) / 2.0
    n = d // 2
    step = ((left + ratio) - left) / n
    return [(i * step + left) * 32.0 for i in range(n)]


def ref2va(dump_path, blocks, frames, width, height):
    d = read(dump_path, True)
    pos, tags = d["position_ids"][1], d["token_tags"][1]
    vi, ai, ti = list(d["video_indices"][1]), list(d["audio_indices"][1]), list(d["text_indices"][1])
    tidx, uniq = d["timestep_indices"][1], list(d["timesteps"][1])
    L = len(ti)
    lt, lh, lw = 5 * (frames - 5) // 17 + 2, height // 16, width // 16
    ta = round(frames / 24 * 40)
    tg_h, tg_w = grid(lh, lh * lw), grid(lw, lh * lw)
    want, wv, wa, clock = [], [], [], float(L)  # want: (row, t, h, w, tag)
    row = L
    spans = [5.0 / 3.0 * (1, 4, 4, 4, 4)[g % 5] for g in range(4096)]
    for b in blocks:
        kind, blt, blh, blw, bat = b
        if kind != "image" and bat:
            wl, wr = (tg_w[0], tg_w[-1]) if kind == "audio" else (grid(blw, blh * blw)[0], grid(blw, blh * blw)[-1])
            for c in range(2):
                for k in range(bat):
                    want.append((row, clock + k, 0.0, wl if c == 0 else wr, 2)); wa.append(row); row += 1
        span = 0.0
        if kind != "audio":
            hg, wg = grid(blh, blh * blw), grid(blw, blh * blw)
            for f in range(blt):
                for i in range(blh // 2):
                    for j in range(blw // 2):
                        want.append((row, clock + span, hg[i], wg[j], 0)); wv.append(row); row += 1
                span += spans[f]
        clock += 1.0 if kind == "image" else bat if kind == "audio" else max(float(bat), span)
    nrv, nra = len(wv), len(wa)
    for c in range(2):
        for k in range(ta):
            want.append((row, clock + k, 0.0, tg_w[0] if c == 0 else tg_w[-1], 2)); wa.append(row); row += 1
    cum = 0.0
    for f in range(lt):
        for i in range(lh // 2):
            for j in range(lw // 2):
                want.append((row, clock + cum, tg_h[i], tg_w[j], 0)); wv.append(row); row += 1
        cum += spans[f]
    bad = []
    if row != len(tags):
        bad.append(f"{len(tags)} rows, want {row}")
    if vi != wv or ai != wa or ti != list(range(L)):
        bad.append("index sets")
    for r, t, h, w, tag in want[: len(tags)]:
        if (pos[3 * r], pos[3 * r + 1], pos[3 * r + 2]) != (t, h, w) or tags[r] != tag:
            bad.append(f"row {r}: {pos[3 * r]},{pos[3 * r + 1]},{pos[3 * r + 2]} tag {tags[r]}, want {t},{h},{w} "
                       f"tag {tag}")
            break
    t_of = lambda r: uniq[tidx[r]]
    if any(t_of(r) != f32(0.999) for r in wv[:nrv]) or any(t_of(r) != 1.0 for r in wa[:nra]):
        bad.append("reference rows' timesteps")
    if any(t_of(r) != t_of(wv[-1]) for r in wv[nrv:]) or any(t_of(r) == 1.0 for r in wa[nra:]):
        bad.append("target rows' timesteps")
    if bad:
        print("ref2va: " + "; ".join(bad))
        sys.exit(1)
    print(f"ref2va: {len(blocks)} references, {nrv} video and {nra} audio reference rows, clock {clock} at the "
          f"target; {row} rows as diffusers' layout")


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
    if cmd == "frame-means":
        shape, a = read(pa, True)[pb]
        per = shape[1] * shape[2] * shape[3]
        for f in range(shape[0]):
            print(round(sum(a[f * per:(f + 1) * per]) / per))
        return
    if cmd == "ref2va":
        blocks = [(k, int(a), int(b), int(c), int(e)) for k, a, b, c, e in (x.split(":") for x in pb.split(","))]
        ref2va(pa, blocks, *map(int, sys.argv[4:7]))
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
