"""Round trip of the exporters (export.py) on an official-layout model folder (h3-tinymodel's):

    /usr/bin/python3 tools/train/test_export.py MODEL_DIR [OUT_DIR]

Each component is read by the project's reference loader (canonical weights), written back by its exporter into
OUT_DIR, and compared with the original file by file: every tensor the same bytes, except the audio VAE's weight-norm
pairs, whose folded weights must agree to float32 rounding (relative 1e-6). Then h3run itself must read OUT_DIR:
`h3run inspect` names every component (H3RUN, default build/h3run). Exit status 1 on any difference."""

import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import export  # noqa: E402
from audio_vae import load_audio_vae  # noqa: E402
from dit import load_dit, read_safetensors, read_weights  # noqa: E402
from qwen3 import canonical as te_canonical  # noqa: E402
from video_vae import load_video_vae  # noqa: E402

fails = []


def same_files(a_dir, b_dir, what, exceptions=()):
    a, b = read_weights(a_dir), read_weights(b_dir)
    if set(a) != set(b):
        fails.append(f"{what}: names differ: {sorted(set(a) ^ set(b))[:5]}")
        return
    n = 0
    for k in a:
        if any(k.endswith(e) for e in exceptions):
            continue
        ta, tb = a[k], b[k]
        if ta.dtype != tb.dtype or ta.shape != tb.shape:
            fails.append(f"{what}: {k}: {ta.dtype}{tuple(ta.shape)} vs {tb.dtype}{tuple(tb.shape)}")
            continue
        va = ta.view(torch.int16) if ta.dtype == torch.bfloat16 else ta
        vb = tb.view(torch.int16) if tb.dtype == torch.bfloat16 else tb
        if not torch.equal(va, vb):
            fails.append(f"{what}: {k}: the bytes differ")
        n += 1
    print(f"ok   {what}: {n} tensors the same bytes")


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else None
    if not model or not os.path.isdir(os.path.join(model, "transformer")):
        print("usage: test_export.py MODEL_DIR [OUT_DIR] (an official FL2VA/-layout folder, e.g. h3-tinymodel's)")
        return 2
    out = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="h3export-")
    # DiT
    w, cfg = load_dit(os.path.join(model, "transformer"))
    export.export_dit(w, os.path.join(model, "transformer"), os.path.join(out, "transformer"))
    same_files(os.path.join(model, "transformer"), os.path.join(out, "transformer"), "DiT")
    # video VAE
    w, cfg = load_video_vae(os.path.join(model, "video_vae"))
    export.export_video_vae(w, cfg, os.path.join(model, "video_vae"), os.path.join(out, "video_vae"))
    same_files(os.path.join(model, "video_vae", "source"), os.path.join(out, "video_vae", "source"), "video VAE")
    # audio VAE: bytes for everything but the weight-norm pairs; their folded weights to float32 rounding
    w, cfg = load_audio_vae(os.path.join(model, "audio_vae"))
    export.export_audio_vae(w, os.path.join(model, "audio_vae"), os.path.join(out, "audio_vae"))
    same_files(os.path.join(model, "audio_vae"), os.path.join(out, "audio_vae"), "audio VAE",
               exceptions=(".weight_g", ".weight_v"))
    w2, _ = load_audio_vae(os.path.join(out, "audio_vae"))
    worst = max(((w2[k] - w[k]).abs().max() / w[k].abs().max().clamp_min(1e-30)).item() for k in w)
    (print if worst <= 1e-6 else lambda m: fails.append(m))(
        f"{'ok  ' if worst <= 1e-6 else ''} audio VAE: folded weights within {worst:.1e} (relative)")
    # text encoder
    te_dir = os.path.join(model, "text_encoder")
    sd = {}
    for f in sorted(os.listdir(te_dir)):
        if f.endswith(".safetensors"):
            sd.update(read_safetensors(os.path.join(te_dir, f)))
    w = te_canonical(sd)
    export.export_text_encoder(w, te_dir, os.path.join(out, "text_encoder"))
    same_files(te_dir, os.path.join(out, "text_encoder"), "text encoder")
    # the rest of the folder, and h3run reading the result
    for extra in ("tokenizer",):
        src = os.path.join(model, extra)
        if os.path.isdir(src) and not os.path.exists(os.path.join(out, extra)):
            export._copy_tree_without_weights(src, os.path.join(out, extra))
    h3run = os.environ.get("H3RUN", os.path.join(HERE, "..", "..", "build", "h3run"))
    if os.path.exists(h3run):
        r = subprocess.run([h3run, "inspect", out], capture_output=True, text=True)
        text = r.stdout + r.stderr
        for comp in ("DiT", "text encoder", "video VAE", "audio VAE"):
            if comp.lower() not in text.lower():
                fails.append(f"h3run inspect {out} does not name the {comp}: {text[:300]}")
        print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} h3run inspect reads the exported folder")
        if r.returncode != 0:
            fails.append(f"h3run inspect exited {r.returncode}")
        # the same request on both folders: the same latents
        lat = []
        for i, m in enumerate((model, out)):
            p = os.path.join(out, f"latents-{i}.safetensors")
            r = subprocess.run([h3run, "generate", "--model", m, "--prompt", "a red ball bounces", "--frames", "22",
                                "--size", "128x128", "--steps", "4", "--seed", "7", "--device", "cpu", "-q",
                                "-o", os.path.join(out, f"clip-{i}.mp4"), "--latents", p],
                               capture_output=True, text=True)
            if r.returncode != 0:
                fails.append(f"h3run generate on {m} exited {r.returncode}: {r.stderr.strip()[-300:]}")
            lat.append(p)
        if all(os.path.exists(p) for p in lat):
            a, b = read_safetensors(lat[0]), read_safetensors(lat[1])
            same = all(torch.equal(a[k], b[k]) for k in a) and set(a) == set(b)
            print(f"{'ok  ' if same else 'FAIL'} h3run generate: the same latents from the original and the export")
            if not same:
                fails.append("h3run generate gives other latents from the exported folder")
    for f in fails:
        print("FAIL", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
