"""The VAE fixtures (tests/fixtures/video_vae, tests/fixtures/audio_vae) against diffusers' AutoencoderKLMiniMaxH3 and
AutoencoderKLMiniMaxH3Audio.

The fixture outputs come from the project's own reference (tools/reference/*_vae.py, float64). This script builds
the diffusers models with the fixtures' reduced configs, loads the fixture weights (official and ComfyUI files go
through diffusers' own conversion script when it is importable), decodes the fixture latents the way the diffusers
pipeline does (latents · std + mean, then `decode`, tiling on with the checkpoint's geometry) and compares.

    DIFFUSERS_SRC=/path/to/diffusers python tests/gpu/compare_vae_diffusers.py      # the folder holding src/diffusers

Skips (exit 0) when DIFFUSERS_SRC is unset or diffusers does not import. Exit status 1 when a float32 decode differs
from a fixture by more than 1e-4 relative L2 error (float32 arithmetic over these shallow reduced models lands
near 1e-6; 1e-4 is the project's bar for h3run itself). The float16-autocast decode (diffusers' pipeline recipe on
CUDA) is measured and reported, not judged. Details go to $OUT/compare_vae_diffusers.json when OUT is set.
"""

import importlib.util
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
VDIR = os.path.join(ROOT, "tests", "fixtures", "video_vae")
ADIR = os.path.join(ROOT, "tests", "fixtures", "audio_vae")
TOL = 1e-4


def skip(msg):
    print(f"compare_vae_diffusers: SKIP: {msg}")
    sys.exit(0)


src = os.environ.get("DIFFUSERS_SRC")
if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")):
    skip("set DIFFUSERS_SRC to the diffusers source folder (the one containing src/diffusers)")
sys.path.insert(0, os.path.join(src, "src"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
try:
    import torch
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
except Exception as e:  # noqa: BLE001 - any import failure means this machine cannot run the comparison
    skip(f"diffusers does not import from {src}: {e}")

import make_vae_fixtures  # noqa: E402  (the splitmix64 weight generator of the audio fixtures)
import video_vae  # noqa: E402  (safetensors reading and the released latents mean/std)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def load_conversion():
    """diffusers' own official -> diffusers key conversion for the video VAE, when the script is there."""
    path = os.path.join(src, "scripts", "convert_minimax_h3_to_diffusers.py")
    try:
        spec = importlib.util.spec_from_file_location("convert_minimax_h3", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.convert_video_vae_key, "diffusers' convert_video_vae_key"
    except Exception as e:  # noqa: BLE001
        print(f"note: {path} not usable ({e}); converting official keys with this script's own rules")

    def own(key, t, cfg):
        if key == "decoder.mask_token":
            return []
        if ".attn.to_qkv." in key:
            H, D = cfg["decoder_num_attention_heads"], cfg["decoder_attention_head_dim"]
            g = t.reshape(H, 3 * D, *t.shape[1:])
            q, k, v = g.split(D, 1)
            pre, suf = key.split(".attn.to_qkv.")
            return [(f"{pre}.attn.to_{n}.{suf}", x.reshape(H * D, *t.shape[1:])) for n, x in zip("qkv", (q, k, v))]
        nk = key.replace("decoder.x_embedder.", "decoder.proj_in.").replace(".attn.to_out.", ".attn.to_out.0.")
        nk = nk.replace(".ff.w1.", ".ff.net.0.proj.").replace(".ff.w2.", ".ff.net.2.")
        if ".ff.w1." in key:
            gate, up = t.chunk(2, 0)
            t = torch.cat([up, gate], 0)
        return [(nk, t)]
    return own, "this script's own key rules"


def rel_err(a, ref):
    return float((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def psnr_unit(frames, ref):
    """PSNR over pixels after ImageNet de-normalization and clamping to [0, 1]."""
    m = torch.tensor(video_vae.IMAGENET_MEAN, dtype=torch.float64).reshape(1, 3, 1, 1, 1)
    s = torch.tensor(video_vae.IMAGENET_STD, dtype=torch.float64).reshape(1, 3, 1, 1, 1)
    a = (frames.double().cpu() * s + m).clamp(0, 1)
    b = (ref.double().cpu() * s + m).clamp(0, 1)
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


def video_rows(convert, how):
    with open(os.path.join(VDIR, "diffusers", "config.json")) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    with open(os.path.join(VDIR, "official", "config.json")) as f:
        wrap = json.load(f)
    model = AutoencoderKLMiniMaxH3(**cfg).eval()
    states = {"diffusers": video_vae.read_safetensors(os.path.join(VDIR, "diffusers",
                                                                   "diffusion_pytorch_model.safetensors"))}
    for name, path in (("official", os.path.join(VDIR, "official", "source", "model.safetensors")),
                       ("comfy.safetensors", os.path.join(VDIR, "comfy.safetensors"))):
        sd = {}
        for k, t in video_vae.read_safetensors(path).items():
            for nk, nt in convert(k, t.float(), cfg):
                sd[nk] = nt
        states[name] = sd
    norms = {"official": (wrap["latents_mean"], wrap["latents_std"]),
             "diffusers": (cfg["latents_mean"], cfg["latents_std"]),
             "comfy.safetensors": (video_vae.DEFAULT_LATENTS_MEAN, video_vae.DEFAULT_LATENTS_STD)}
    with open(os.path.join(VDIR, "cases.json")) as f:
        cases = json.load(f)
    rows = []
    for case in cases:
        if case["latent_shape"][0] <= 2:
            rows.append({"case": "video " + case["name"], "skipped": "diffusers cannot decode fewer than 3 "
                         "latent frames (no temporal chunk); h3run follows ComfyUI there"})
            continue
        missing, unexpected = model.load_state_dict(states[case["model"]], strict=False)
        bad = [k for k in missing if k.startswith("decoder.") or k.startswith("post_quant_conv")]
        if bad or unexpected:
            raise SystemExit(f"video {case['name']}: weights do not fit diffusers' model: missing {bad[:4]}, "
                             f"unexpected {list(unexpected)[:4]}")
        if case["model"] == "official":
            model.enable_tiling(tile_sample_min_height=wrap["vae_tile_size"],
                                tile_sample_min_width=wrap["vae_tile_size"],
                                tile_sample_min_overlap_height=wrap["vae_tile_overlap_min"],
                                tile_sample_min_overlap_width=wrap["vae_tile_overlap_min"])
        else:
            model.enable_tiling(256, 256, 64, 64)
        fx = video_vae.read_safetensors(os.path.join(VDIR, "case_" + case["name"] + ".safetensors"))
        mean, std = (torch.tensor(v, dtype=torch.float32).reshape(1, -1, 1, 1, 1) for v in norms[case["model"]])
        z = (fx["latents"] * std + mean).to(DEV)
        m = model.to(DEV)
        with torch.no_grad():
            out = m.decode(z, return_dict=False)[0].float().cpu()
            row = {"case": "video " + case["name"], "shape": list(out.shape), "weights": how}
            if out.shape != fx["frames"].shape:
                row.update(error=f"shape {list(out.shape)} vs fixture {list(fx['frames'].shape)}")
            else:
                row.update(rel=rel_err(out, fx["frames"]), max_abs=float((out - fx["frames"]).abs().max()),
                           psnr=psnr_unit(out, fx["frames"]))
                if DEV == "cuda":
                    with torch.autocast("cuda", dtype=torch.float16):
                        h = m.decode(z, return_dict=False)[0].float().cpu()
                    row.update(fp16_rel=rel_err(h, fx["frames"]), fp16_psnr=psnr_unit(h, fx["frames"]))
        rows.append(row)
    return rows


def audio_rows():
    with open(os.path.join(ADIR, "diffusers", "config.json")) as f:
        cfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    model = AutoencoderKLMiniMaxH3Audio(**cfg).eval()
    with open(os.path.join(ADIR, "manifest_official.json")) as f:
        official = make_vae_fixtures.manifest_state(json.load(f)["tensors"])
    with open(os.path.join(ADIR, "manifest_comfy.json")) as f:
        comfy = make_vae_fixtures.manifest_state(json.load(f)["tensors"])
    # diffusers keeps weight_norm modules: a folded weight w loads as g = ‖w‖ (per output row) and v = w.
    folded = {}
    for k, t in comfy.items():
        if k in ("latents_mean", "latents_std"):
            continue
        if (k.endswith(".weight") and (k.startswith("decoder.") or k.startswith("encoder.")) and t.ndim == 3
                and ".act." not in k):
            folded[k[:-7] + ".weight_g"] = t.reshape(t.shape[0], -1).norm(dim=1).reshape(-1, 1, 1)
            folded[k[:-7] + ".weight_v"] = t
        else:
            folded[k] = t
    states = {"official": (official, cfg["latents_mean"], cfg["latents_std"]),
              "comfy": (folded, comfy["latents_mean"].tolist(), comfy["latents_std"].tolist())}
    with open(os.path.join(ADIR, "cases.json")) as f:
        cases = json.load(f)
    rows = []
    for case in cases:
        sd, mean, std = states[case["model"]]
        missing, unexpected = model.load_state_dict(sd, strict=False)
        bad = [k for k in missing if k.startswith("decoder.") or k.startswith("dec_in_proj")]
        if bad or unexpected:
            raise SystemExit(f"audio {case['name']}: weights do not fit diffusers' model: missing {bad[:4]}, "
                             f"unexpected {list(unexpected)[:4]}")
        fx = video_vae.read_safetensors(os.path.join(ADIR, "case_" + case["name"] + ".safetensors"))
        m = torch.tensor(mean, dtype=torch.float32).reshape(1, -1, 1)
        s = torch.tensor(std, dtype=torch.float32).reshape(1, -1, 1)
        with torch.no_grad():
            out = model.to(DEV).decode((fx["latents"] * s + m).to(DEV), return_dict=False)[0].float().cpu()
        row = {"case": "audio " + case["name"], "shape": list(out.shape)}
        if out.shape != fx["waveform"].shape:
            row.update(error=f"shape {list(out.shape)} vs fixture {list(fx['waveform'].shape)}")
        else:
            row.update(rel=rel_err(out, fx["waveform"]), max_abs=float((out - fx["waveform"]).abs().max()))
        rows.append(row)
    # the encoder: the fixture waveforms to diffusers' posterior mode (encode(x).latent_dist.mode())
    for name, kind in (("encode", "official"), ("encode_comfy", "comfy")):
        sd = states[kind][0]
        missing, unexpected = model.load_state_dict(sd, strict=False)
        bad = [k for k in missing if k.split(".")[0] in ("encoder", "pre_block", "mean_proj")]
        if bad or unexpected:
            raise SystemExit(f"audio {name}: weights do not fit diffusers' model: missing {bad[:4]}, "
                             f"unexpected {list(unexpected)[:4]}")
        fx = video_vae.read_safetensors(os.path.join(ADIR, "case_" + name + ".safetensors"))
        with torch.no_grad():
            out = model.to(DEV).encode(fx["waveform"].to(DEV)).latent_dist.mode().float().cpu()
        row = {"case": "audio " + name, "shape": list(out.shape)}
        if out.shape != fx["latents"].shape:
            row.update(error=f"shape {list(out.shape)} vs fixture {list(fx['latents'].shape)}")
        else:
            row.update(rel=rel_err(out, fx["latents"]), max_abs=float((out - fx["latents"]).abs().max()))
        rows.append(row)
    return rows


def main():
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    convert, how = load_conversion()
    rows = video_rows(convert, how) + audio_rows()
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare_vae_diffusers.json"), "w") as f:
            json.dump({"device": DEV, "torch": torch.__version__, "official_keys": how, "rows": rows}, f, indent=1)
    fails = 0
    print(f"\ndiffusers vs fixtures ({DEV}, float32; tolerance {TOL:g} relative L2; official keys via {how})")
    print(f"{'case':32} {'rel err':>10} {'max abs':>10} {'PSNR dB':>8} {'fp16 rel':>10} {'fp16 PSNR':>9}  result")
    for r in rows:
        if "skipped" in r:
            print(f"{r['case']:32} {'-':>10} {'-':>10} {'-':>8} {'-':>10} {'-':>9}  skipped: {r['skipped']}")
            continue
        if "error" in r:
            fails += 1
            print(f"{r['case']:32} {'-':>10} {'-':>10} {'-':>8} {'-':>10} {'-':>9}  FAIL: {r['error']}")
            continue
        ok = r["rel"] <= TOL
        fails += not ok
        ps = f"{r['psnr']:8.1f}" if "psnr" in r else f"{'-':>8}"
        f16 = f"{r['fp16_rel']:10.2e}" if "fp16_rel" in r else f"{'-':>10}"
        f16p = f"{r['fp16_psnr']:9.1f}" if "fp16_psnr" in r else f"{'-':>9}"
        print(f"{r['case']:32} {r['rel']:10.2e} {r['max_abs']:10.2e} {ps} {f16} {f16p}  {'ok' if ok else 'FAIL'}")
    print(f"compare_vae_diffusers: {'all agree' if not fails else f'{fails} disagreement(s)'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
