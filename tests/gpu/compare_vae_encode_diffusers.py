"""`h3run vae-encode` against diffusers' AutoencoderKLMiniMaxH3.encode(...).latent_dist.mean.

Builds diffusers' video VAE with random weights twice: a reduced config (2 levels of 32 and 64 channels, one ResNet
block each, both downsampling space and time by 2, GroupNorm(8), 4 latent channels: 17n+5 frames still give 5n+2) and the release's encoder structure (6 levels [128, 256, 256, 512, 512,
1024] of 2 blocks, GroupNorm(32), 24 latent channels; the ViT decoder cut to one block to keep the file small, which
the encoder never reads). Each is saved with save_pretrained as a diffusers vae/ folder, which h3run reads. Then for
each case random uint8 pixels [1, 3, F, H, W] go to both:

    diffusers  x = (pixels / 255 - ImageNet mean) / ImageNet std; vae.encode(x).latent_dist.mean (float32, tiling on:
               its default, the release's)
    h3run      h3run vae-encode --model DIR --input pixels.safetensors --out latents.safetensors [--device cuda]

and compares: the CPU run within 1e-4 (max |difference| / max(1, max |diffusers|)), the GPU run (when a GPU is there)
within bf16 rounding (relative L2 <= 2^-8) of diffusers' float32 encode. Cases cover an image (the keyframe path,
tiled 2 x 2 where the canvas exceeds 256 px), 22 frames (2 chunks, 3 latent frames dropped) and 39 frames across two
tiles.

    DIFFUSERS_SRC=/path/to/diffusers H3RUN=build/h3run python3 tests/gpu/compare_vae_encode_diffusers.py

(tests/gpu/run.sh gpu-compare runs it with the bundle's h3run.) Skips (exit 0) when DIFFUSERS_SRC is unset, diffusers
does not import or no h3run binary is found. Exit 1 when a comparison fails. Details to $OUT/compare_vae_encode.json
when OUT is set.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TOL_F32, TOL_BF16 = 1e-4, 2.0**-8


def skip(msg):
    print(f"compare_vae_encode_diffusers: SKIP: {msg}")
    sys.exit(0)


src = os.environ.get("DIFFUSERS_SRC")
if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")):
    skip("set DIFFUSERS_SRC to the diffusers source folder (the one containing src/diffusers)")
sys.path.insert(0, os.path.join(src, "src"))
try:
    import torch
    from diffusers import AutoencoderKLMiniMaxH3
except Exception as e:  # noqa: BLE001 - any import failure means this machine cannot run the comparison
    skip(f"diffusers does not import from {src}: {e}")


def find_h3run():
    for p in (os.environ.get("H3RUN"), os.path.join(ROOT, ".devbundle", "bin", "h3run"),
              os.path.join(ROOT, "build", "h3run")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


H3RUN = find_h3run()
if not H3RUN:
    skip("no h3run binary (set H3RUN)")
HAVE_GPU = torch.cuda.is_available()


def write_pixels(path, px):
    """A safetensors file with one uint8 tensor 'pixels' (no dependency on the safetensors package)."""
    data = px.contiguous().numpy().tobytes()
    hdr = json.dumps({"pixels": {"dtype": "U8", "shape": list(px.shape), "data_offsets": [0, len(data)]}}).encode()
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)


def read_f32(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        e = hdr[name]
        assert e["dtype"] == "F32", e
        a, b = e["data_offsets"]
        f.seek(8 + n + a)
        buf = f.read(b - a)
    return torch.frombuffer(bytearray(buf), dtype=torch.float32).reshape(e["shape"])


def build(kind, tmp):
    torch.manual_seed(7 if kind == "reduced" else 8)
    if kind == "reduced":
        cfg = dict(latent_channels=4, block_out_channels=(32, 64), layers_per_block=1, spatial_downsample_factors=(2, 2),
                   temporal_downsample_factors=(2, 2), norm_num_groups=8, decoder_num_layers=1,
                   decoder_num_attention_heads=2, decoder_attention_head_dim=64,
                   latents_mean=(0.1, -0.2, 0.3, 0.0), latents_std=(1.0, 1.5, 0.5, 2.0))
    else:  # the release's encoder; a one-block decoder (the encoder does not read it)
        cfg = dict(decoder_num_layers=1, decoder_num_attention_heads=2, decoder_attention_head_dim=64,
                   latents_mean=tuple(0.01 * i for i in range(24)), latents_std=tuple(1.0 + 0.02 * i for i in range(24)))
    vae = AutoencoderKLMiniMaxH3(**cfg).eval()
    with torch.no_grad():  # GroupNorm affines and biases away from their 1/0 initialisation
        for n, p in vae.named_parameters():
            if n.startswith("encoder.") and ("norm" in n or n.endswith(".bias")):
                p.add_(torch.empty_like(p).uniform_(-0.2, 0.2))
    d = os.path.join(tmp, kind)
    vae.save_pretrained(d, safe_serialization=True)
    return vae, d


def diffusers_mean(vae, px, device):
    mean = torch.tensor((0.485, 0.456, 0.406), device=device).view(1, 3, 1, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225), device=device).view(1, 3, 1, 1, 1)
    x = (px.to(device).to(torch.float32).div(255.0) - mean) / std
    with torch.no_grad():
        return vae.to(device).encode(x).latent_dist.mean.float().cpu()


def h3run_encode(model, pix_path, out_path, device):
    cmd = [H3RUN, "vae-encode", "--model", model, "--input", pix_path, "--out", out_path, "--device", device, "-q"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return read_f32(out_path, "latents")


CASES = [  # (model, frames, H, W)
    ("reduced", 1, 288, 320),   # an image, 2 x 2 tiles
    ("reduced", 22, 64, 96),    # 2 chunks, 3 latent frames dropped
    ("reduced", 39, 32, 288),   # 3 chunks, 2 tiles across
    ("release", 1, 256, 320),   # the release's structure: an image, 1 x 2 tiles
    ("release", 22, 64, 64),
]


def main():
    results, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for kind, F, H, W in CASES:
            if kind not in models:
                models[kind] = build(kind, tmp)
            vae, d = models[kind]
            g = torch.Generator().manual_seed(F * 1000 + H + W)
            px = torch.randint(0, 256, (1, 3, F, H, W), generator=g, dtype=torch.uint8)
            pix = os.path.join(tmp, f"px_{kind}_{F}_{H}_{W}.safetensors")
            write_pixels(pix, px)
            ref = diffusers_mean(vae, px, "cpu")
            runs = [("cpu", TOL_F32)] + ([("cuda", TOL_BF16)] if HAVE_GPU else [])
            for dev, tol in runs:
                what = f"{kind} {F} frames {W}x{H} --device {dev}"
                try:
                    got = h3run_encode(d, pix, os.path.join(tmp, f"out_{dev}.safetensors"), dev)
                except RuntimeError as e:
                    print(f"FAIL {what}: {e}")
                    results.append({"case": what, "error": str(e)})
                    ok = False
                    continue
                if tuple(got.shape) != tuple(ref.shape):
                    print(f"FAIL {what}: shape {tuple(got.shape)}, diffusers {tuple(ref.shape)}")
                    ok = False
                    continue
                d_max = (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())
                rel_l2 = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                err = d_max if dev == "cpu" else rel_l2
                good = err <= tol
                ok &= good
                print(f"{'ok  ' if good else 'FAIL'} {what}: max|diff|/max(1,max|ref|) {d_max:.2e}, rel L2 {rel_l2:.2e}"
                      f" (bound {tol:.1e} on the {'first' if dev == 'cpu' else 'second'})")
                results.append({"case": what, "max_rel": d_max, "rel_l2": rel_l2, "tol": tol, "ok": good})
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "compare_vae_encode.json"), "w") as f:
            json.dump(results, f, indent=1)
    print("compare_vae_encode_diffusers:", "all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
