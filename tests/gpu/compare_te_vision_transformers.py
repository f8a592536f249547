#!/usr/bin/env python3
"""Qwen3-VL's image processor and vision tower: transformers against `h3run encode --vision/--image`, on the GPU machine.

    H3RUN=.devbundle/bin/h3run python3 tests/gpu/compare_te_vision_transformers.py   # OUT=/dir keeps the details

1. processor: 12 images of varied sizes and formats (PNG RGB/RGBA/grey/palette, JPEG, BMP, WebP lossless and lossy,
   tiny, very wide, large, odd sizes) through transformers' Qwen2VLImageProcessor with Qwen3-VL's settings (patch 16,
   merge 2, temporal patch 2, min/max pixels 65536/16777216, mean = std = 0.5; the PIL path, use_fast=False) and
   through `h3run encode --image IMG --vision-out F`. image_grid_thw must be equal and pixel_values equal within 1e-6
   for every file PIL and libav decode to the same pixels (lossless formats); for lossy files (JPEG, lossy WebP) the
   decoders differ, so the PIL-decoded pixels are saved as PNG and that must match within 1e-6, while the original's
   difference is reported (not a failure). The fast processor (torchvision), when present, is reported against the
   slow one.
2. hidden states: a reduced Qwen3VLForConditionalGeneration (4 text layers of 64, head_dim 16, mrope [2, 3, 3]; a
   4-block vision tower of 32 with 2 heads, the release's 48x48 position table, deepstack after blocks 0 and 2),
   random weights saved with save_pretrained, run in float32 on the CPU with eager attention, against
   `h3run encode --text-encoder DIR --token-ids IDS --vision F --layer N` at N = 2 (middle) and N = 3 (the layer
   before the last), for one image and for three images of different sizes. Relative L2 <= 1e-4.
Exit status 1 when a comparison fails; 0 with a message when transformers or h3run is missing (nothing compared).
"""

import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TOL = 1e-4
PIX_TOL = 1e-6
IMG, VS, VE, VID = 250, 251, 252, 253
rows = []
notes = []


def record(case, what, err, tol, ok=None):
    rows.append(dict(case=case, what=what, err=err, tol=tol, ok=bool(err <= tol) if ok is None else ok))
    print("%-4s %-28s %-60s %.3e (tol %.0e)" % ("ok" if rows[-1]["ok"] else "FAIL", case, what, err, tol))


def find_h3run():
    for p in (os.environ.get("H3RUN"), os.path.join(ROOT, ".devbundle", "bin", "h3run"),
              os.path.join(ROOT, "build", "h3run")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd[:3]), r.returncode, r.stderr.strip()))
    return r.stdout


def make_images(d):
    """12 images of varied sizes and formats; returns [(path, lossless)]."""
    from PIL import Image
    import numpy as np
    rng = np.random.default_rng(7)

    def picture(w, h):
        y, x = np.mgrid[0:h, 0:w]
        a = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256], -1)
        a = (a + rng.integers(0, 40, a.shape)) % 256
        return a.astype(np.uint8)

    out = []
    specs = [("rgb.png", 640, 480, "RGB", {}, True), ("rgba.png", 500, 700, "RGBA", {}, True),
             ("grey.png", 300, 200, "L", {}, True), ("palette.png", 256, 256, "P", {}, True),
             ("photo.jpg", 1024, 768, "RGB", dict(quality=92), False), ("bitmap.bmp", 333, 517, "RGB", {}, True),
             ("lossless.webp", 400, 300, "RGB", dict(lossless=True), True),
             ("lossy.webp", 720, 1280, "RGB", dict(quality=80), False), ("tiny.png", 20, 30, "RGB", {}, True),
             ("wide.png", 1000, 90, "RGB", {}, True), ("large.png", 2000, 1500, "RGB", {}, True),
             ("odd.jpg", 99, 1001, "RGB", dict(quality=95), False)]
    for name, w, h, mode, kw, lossless in specs:
        im = Image.fromarray(picture(w, h), "RGB")
        if mode == "RGBA":
            im.putalpha(Image.fromarray((picture(w, h)[:, :, 0] // 2 + 64).astype(np.uint8), "L"))
        elif mode == "L":
            im = im.convert("L")
        elif mode == "P":
            im = im.convert("P", palette=Image.ADAPTIVE, colors=64)
        p = os.path.join(d, name)
        im.save(p, **kw)
        out.append((p, lossless))
    return out


def processor(fast=False):
    from transformers import Qwen2VLImageProcessor
    kw = dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
              size={"shortest_edge": 65536, "longest_edge": 16777216})
    if fast:
        from transformers import Qwen2VLImageProcessorFast
        return Qwen2VLImageProcessorFast(**kw)
    return Qwen2VLImageProcessor(**kw)


def hf_process(proc, paths):
    from PIL import Image
    ims = [Image.open(p) for p in paths]
    r = proc(images=ims, return_tensors="pt")
    return r["pixel_values"].float(), r["image_grid_thw"].long()


def h3_process(h3run, paths, out):
    run([h3run, "encode", "-q", "--image", ",".join(paths), "--vision-out", out])
    from safetensors.torch import load_file
    t = load_file(out)
    return t["pixel_values"].float(), t["image_grid_thw"].long()


def case_processor(h3run, tmp):
    import torch
    from PIL import Image
    imgs = make_images(tmp)
    slow = processor()
    try:
        fast = processor(fast=True)
    except Exception as e:  # noqa: BLE001 - torchvision missing: report only
        fast = None
        notes.append("fast image processor not available (%s)" % e.__class__.__name__)
    for p, lossless in imgs:
        name = os.path.basename(p)
        pv, g = hf_process(slow, [p])
        hv, hg = h3_process(h3run, [p], os.path.join(tmp, name + ".st"))
        record("processor", "%s grid %s" % (name, g.tolist()[0]), 0.0 if torch.equal(g, hg) else math.inf, 0)
        if pv.shape != hv.shape:
            record("processor", "%s pixel_values shape %s vs %s" % (name, list(pv.shape), list(hv.shape)), math.inf, 0)
            continue
        diff = float((pv - hv).abs().max())
        if lossless:
            record("processor", "%s pixel_values max |diff|" % name, float((pv - hv).abs().max()), PIX_TOL)
        else:
            notes.append("%s: libav's and PIL's decoders differ: pixel_values max |diff| %.4f (%d of %d values)" %
                         (name, diff, int(((pv - hv).abs() > PIX_TOL).sum()), pv.numel()))
            png = os.path.join(tmp, name + ".decoded.png")
            Image.open(p).convert("RGB").save(png)
            pv2, _ = hf_process(slow, [png])
            hv2, _ = h3_process(h3run, [png], png + ".st")
            record("processor", "%s (PIL-decoded pixels) max |diff|" % name, float((pv2 - hv2).abs().max()), PIX_TOL)
        if fast is not None:
            fv, fg = hf_process(fast, [p])
            if fv.shape == pv.shape:
                notes.append("%s: fast processor vs slow: max |diff| %.4f" % (name, float((fv - pv).abs().max())))
    # several images in one call: rows concatenated in order
    several = [imgs[0][0], imgs[2][0], imgs[8][0]]
    pv, g = hf_process(slow, several)
    hv, hg = h3_process(h3run, several, os.path.join(tmp, "several.st"))
    ok = torch.equal(g, hg) and pv.shape == hv.shape
    record("processor", "3 images in one call", float((pv - hv).abs().max()) if ok else math.inf, PIX_TOL)


def build_model(d):
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    text = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=96, vocab_size=256, rms_norm_eps=1e-6, hidden_act="silu", rope_theta=5e6,
                max_position_embeddings=4096, attention_bias=False, tie_word_embeddings=False,
                rope_scaling=dict(rope_type="default", mrope_section=[2, 3, 3], mrope_interleaved=True),
                rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=[2, 3, 3],
                                     mrope_interleaved=True))  # transformers 4.x reads the first, 5 the second
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=2304,
                  deepstack_visual_indexes=[0, 2], hidden_act="gelu_pytorch_tanh")
    cfg = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=IMG, video_token_id=VID,
                        vision_start_token_id=VS, vision_end_token_id=VE, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = Qwen3VLForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or "layernorm" in n or n.endswith("norm1.weight") or n.endswith("norm2.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p[0].numel()))
    model.save_pretrained(d, safe_serialization=True)
    model.config._attn_implementation = "eager"
    for m in model.modules():
        if hasattr(m, "config") and hasattr(m.config, "_attn_implementation"):
            m.config._attn_implementation = "eager"
    return model


def prompt_ids(grids):
    ids = [10, 11, 12]
    for g in grids:
        ids += [VS] + [IMG] * (int(g[0]) * int(g[1]) * int(g[2]) // 4) + [VE, 20, 21]
    return ids + [30, 31]


def case_hidden(h3run, tmp):
    import torch
    from safetensors.torch import save_file, load_file
    mdir = os.path.join(tmp, "model")
    model = build_model(mdir)
    idir = os.path.join(tmp, "img")
    os.makedirs(idir, exist_ok=True)
    imgs = make_images(idir)
    slow = processor()
    sets = {"one image": [imgs[2][0]], "three images": [imgs[2][0], imgs[8][0], imgs[5][0]]}
    for name, paths in sets.items():
        pv, g = hf_process(slow, paths)
        ids = prompt_ids(g.tolist())
        x = torch.tensor([ids])
        kw = dict(input_ids=x, attention_mask=torch.ones_like(x), pixel_values=pv, image_grid_thw=g, use_cache=False,
                  output_hidden_states=True)
        if "mm_token_type_ids" in inspect.signature(model.model.forward).parameters:
            kw["mm_token_type_ids"] = (x == IMG).long()  # transformers 5 finds the image rows by type (1: image)
        with torch.no_grad():
            out = model.model(**kw)
        f = os.path.join(tmp, "vision_%d.safetensors" % len(paths))
        save_file({"pixel_values": pv.contiguous(), "image_grid_thw": g.contiguous()}, f)
        for layer in (2, 3):
            o = os.path.join(tmp, "h3_%d_%d.safetensors" % (len(paths), layer))
            run([h3run, "encode", "-q", "--text-encoder", mdir, "--token-ids", ",".join(map(str, ids)), "--vision", f,
                 "--layer", str(layer), "-o", o])
            h = load_file(o)["hidden"].double()
            ref = out.hidden_states[layer][0].double()
            err = float((h - ref).norm() / ref.norm())
            record("hidden", "%s (%d tokens) hidden_states[%d]" % (name, len(ids), layer), err, TOL)


def main():
    h3run = find_h3run()
    try:
        import torch  # noqa: F401
        import transformers
        from transformers import Qwen3VLForConditionalGeneration  # noqa: F401
        from PIL import Image  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print("skipped: transformers with Qwen3-VL, torch and PIL are needed (%s)" % e)
        return 0
    if not h3run:
        print("skipped: no h3run binary (set H3RUN)")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    notes.append("transformers %s, torch %s, h3run %s" % (transformers.__version__, torch.__version__, h3run))
    tmp = tempfile.mkdtemp(prefix="h3vis")
    try:
        case_processor(h3run, tmp)
        case_hidden(h3run, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for n in notes:
        print("note:", n)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare_te_vision_transformers.json"), "w") as f:
            json.dump(dict(tolerance=TOL, notes=notes, rows=rows), f, indent=1)
    bad = [r for r in rows if not r["ok"]]
    print("%d comparisons, %d failed" % (len(rows), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
