"""What the DiT is given for keyframes (fl2va), for training the small model with them: for chosen clips of the
training datasets, their first frame, last frame or both as keyframes, run through `h3run generate --dump-dit-inputs`
with the model that will be trained (its text encoder with the vision tower, its video VAE's encoder), so the text
states (the presentation with the images' vision rows) and the keyframe rows are exactly what generate gives the DiT.

    /usr/bin/python3 tools/train/keyframe_inputs.py --data WORK/data-200-* --model MODEL --per-dataset 90 --out PACK

PACK (one safetensors file) holds one group per keyframe kind and text length (examples of a group share one packed
layout): g<i>.text [n, L, 64] (bf16), g<i>.cond [n, K·rows, 96] (bf16: the keyframe rows as generate mixed them, to t =
0.999), g<i>.clip [n] (the clip's index among the --data folders' clips, in the order train_dit.py loads them), and the
layout: g<i>.token_tags, g<i>.position_ids, g<i>.video_indices, g<i>.audio_indices, g<i>.text_indices. The metadata's "captions" lists each example's caption (train_dit.py checks it against its
own clips). Clip i of a dataset gets kind first, last, both by i mod 3.

With --reference the examples are ref2va instead (kind 4): the clip's middle frame as a reference image
(`--ref-image`, at the clip's short edge: 128 for the small model) and the clip's reference caption (captions.jsonl's "reference_caption": the
shape "from <Picture 1>", its colour and pitch unsaid), so the colour and the tone must come from the picture; the
cond rows are the reference image's rows (held at 0.999 as keyframe rows are, in front of the clip's). The pack's
"captions" are still the clips' own captions (what train_dit.py checks its clips by). --start S takes each dataset's
clips from index S.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import common  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

KINDS = {1: ["--first-frame"], 2: ["--last-frame"], 3: ["--first-frame", "--last-frame"],
         4: ["--ref-image"]}
FRAME_OF = {"--first-frame": "-first.ppm", "--last-frame": "-last.ppm", "--ref-image": "-mid.ppm"}
LAYOUT = ("token_tags", "position_ids", "video_indices", "audio_indices", "text_indices")


def write_ppm(path, frame):
    """frame: uint8 [H, W, 3]."""
    h, w, _ = frame.shape
    with open(path, "wb") as f:
        f.write(b"P6\n%d %d\n255\n" % (w, h) + frame.contiguous().numpy().tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", required=True, help="h3-synth dataset folders, in train_dit.py's order")
    ap.add_argument("--model", required=True, help="the model folder (text encoder with a vision tower)")
    ap.add_argument("--per-dataset", type=int, default=90, help="clips taken from the start of each dataset")
    ap.add_argument("--start", type=int, default=0, help="each dataset's clips from this index")
    ap.add_argument("--reference", action="store_true", help="ref2va examples (the middle frame as a reference "
                    "image, the reference caption) instead of keyframes")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="h3kf-")
    try:
        make(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make(a, tmp):
    """The frames into tmp, generate's dumps, the pack."""
    h3run = common.program("h3run")
    jobs, base = [], 0
    for folder in a.data:
        with open(os.path.join(folder, "captions.jsonl")) as f:
            lines = list(map(json.loads, f))
        caps = {(c["shard"], c["index"]): c["caption"] for c in lines}
        rcaps = {(c["shard"], c["index"]): c.get("reference_caption") for c in lines}
        taken = seen = 0
        for si, p in enumerate(common.shards([folder])):
            vid = read_safetensors(p)["video"]
            T, H, W = vid.shape[1:4]
            for i in range(vid.shape[0]):
                seen += 1
                if seen > a.start and taken < a.per_dataset:
                    stem = os.path.join(tmp, f"c{base + i}")
                    if a.reference:
                        if not rcaps[(si, i)]:
                            raise SystemExit(f"{folder}: no reference_caption (render it with this h3-synth)")
                        write_ppm(stem + "-mid.ppm", vid[i, T // 2])
                        jobs.append((base + i, caps[(si, i)], 4, stem, rcaps[(si, i)]))
                    else:
                        write_ppm(stem + "-first.ppm", vid[i, 0])
                        write_ppm(stem + "-last.ppm", vid[i, T - 1])
                        jobs.append((base + i, caps[(si, i)], 1 + taken % 3, stem, caps[(si, i)]))
                    taken += 1
            base += vid.shape[0]

    def one(job):
        clip, cap, kind, stem, prompt = job
        imgs = []
        for opt in KINDS[kind]:
            imgs += [opt, stem + FRAME_OF[opt]]
        if kind == 4:  # the picture at the clip's own short edge (the small model's canvas), as generate's default model
            imgs += ["--ref-image-size", str(min(W, H))]
        common.run([h3run, "generate", "--model", a.model, "--prompt", prompt, *imgs, "--frames", str(T), "--size",
                    f"{W}x{H}", "--steps", "1", "--seed", str(clip), "-t", "1", "--progress", "none", "-q",
                    "-o", stem + ".mp4", "--dump-dit-inputs", stem + ".safetensors"])
        t = read_safetensors(stem + ".safetensors")
        for ext in (".mp4", ".safetensors", *FRAME_OF.values()):
            if os.path.exists(stem + ext):
                os.remove(stem + ext)
        return clip, cap, kind, t

    groups = {}
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
        for n, (clip, cap, kind, t) in enumerate(ex.map(one, jobs), 1):
            # the keyframe (or reference image) rows: the video rows held at the keyframes' time (0.999 in this
            # first call, the clip's rows at 0), which generate puts first
            row_t = t["timesteps"][t["timestep_indices"].long()[t["video_indices"].long()]]
            held = row_t == row_t.max()
            ncond = int(held.sum())
            if not bool(held[:ncond].all()):
                raise SystemExit(f"clip {clip}: the keyframe rows are not the first video rows")
            # train_dit.dit_inputs gives every row the clip's time (text and video tv, audio ta) but the held rows,
            # max(tv, 0.999): in this first call (tv = ta = 0) every other row of the dump must be at 0
            times = t["timesteps"][t["timestep_indices"].long()]
            other = torch.ones_like(times, dtype=torch.bool)
            other[t["video_indices"].long()[:ncond]] = False
            if not bool((times[other] == 0).all()):
                raise SystemExit(f"clip {clip}: rows other than the held ones are not at the clip's time")
            key = (kind, t["text"].shape[0])
            g = groups.setdefault(key, {"text": [], "cond": [], "clip": [], "caps": [],
                                        **{k: t[k] for k in LAYOUT}})
            for k in LAYOUT:  # one layout per group: the same kind and text length give the same packed sequence
                if not torch.equal(g[k], t[k]):
                    raise SystemExit(f"clip {clip}: {k} differs from its group's")
            g["text"].append(t["text"].to(torch.bfloat16))
            g["cond"].append(t["video"][:ncond].to(torch.bfloat16))
            g["clip"].append(clip)
            g["caps"].append(cap)
            if n % 50 == 0:
                print(f"{n} of {len(jobs)} examples", flush=True)
    out, captions = {}, []
    for i, (_, g) in enumerate(sorted(groups.items())):
        out[f"g{i}.text"] = torch.stack(g["text"])
        out[f"g{i}.cond"] = torch.stack(g["cond"])
        out[f"g{i}.clip"] = torch.tensor(g["clip"], dtype=torch.int64)
        for k in LAYOUT:
            out[f"g{i}.{k}"] = g[k]
        captions.append(g["caps"])
    write_safetensors(a.out, out, {"captions": json.dumps(captions), "frames": str(T), "size": f"{W}x{H}"})
    print(f"wrote {a.out}: {len(jobs)} examples in {len(groups)} groups (kind, text length)")


if __name__ == "__main__":
    main()
