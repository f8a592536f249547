"""fl2va: what h3run's DiT receives for keyframes, and what it samples from them, against diffusers' fl2va blocks.

On the reduced random model of h3-tinymodel (official layout, with its vision tower and video VAE encoder), h3run
generates with --first-frame and --last-frame, saving the keyframes' rows (--latents) and the first DiT call's
inputs (--dump-dit-inputs). This script then checks, with diffusers' own code where it can be called alone:
  - the canvas without --size: MiniMaxH3's resolve_canvas_size of the first keyframe's size;
  - the keyframes on the canvas: MiniMaxH3ResizeStep (the first stretched by VaeImageProcessor.resize, the second
    cover-cropped), byte for byte, at a small canvas and at the one from the aspect ratio;
  - the presentation: the token ids and tags of MiniMaxH3FL2VATextEncoderStep's loop (transcribed: the step also runs
    the text encoder) with transformers' Qwen2-VL image processor at Qwen3-VL's settings and the model's tokenizer;
  - the layout: MiniMaxH3PrepareLayoutStep.build_packed_sequence (positions to the bit, tags, index sets) and
    MiniMaxH3SetTimestepsStep.build_row_timesteps for the first call;
  - the keyframe rows: scheduler.scale_noise(latents, 0.999, noise) and patchify_video_latents of h3run's own
    conditioning latents and noise (h3run draws its noise from its own generator, documented);
  - the sampling: diffusers' loop (MiniMaxH3Transformer3DModel from the tiny DiT through diffusers' converter, the two
    MiniMaxH3Schedulers stepping only the generated rows) from the same initial noise, keyframe rows and text states
    (those of the dump) against h3run's final latents: f32 on the CPU here vs f32 there within 1e-4 (max |diff| /
    max |ref|), and h3run's GPU run (bf16 DiT) within 5e-2 relative L2.

    DIFFUSERS_SRC=/path/to/diffusers H3RUN=build/h3run python tests/gpu/compare_fl2va_diffusers.py

Skips (exit 0) when DIFFUSERS_SRC is unset or diffusers does not import. Exit status 1 when a check fails. Details go
to $OUT/compare_fl2va_diffusers.json when OUT is set.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def skip(msg):
    print(f"compare_fl2va_diffusers: SKIP: {msg}")
    sys.exit(0)


src = os.environ.get("DIFFUSERS_SRC")
if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")):
    skip("set DIFFUSERS_SRC to the diffusers source folder (the one containing src/diffusers)")
sys.path.insert(0, os.path.join(src, "src"))
try:
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.torch import load_file
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.schedulers.scheduling_minimax_h3 import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.modular_pipeline import PipelineState
    from diffusers.modular_pipelines.minimax_h3 import before_denoise as bd
    from diffusers.modular_pipelines.minimax_h3 import before_encoder as be
    from diffusers.modular_pipelines.minimax_h3 import modular_pipeline as mp
except Exception as e:  # noqa: BLE001 - any import failure means this machine cannot run the comparison
    skip(f"diffusers does not import from {src}: {e}")

BUILD = os.environ.get("H3_BUILD_DIR") or os.path.join(ROOT, "build")
H3RUN = os.environ.get("H3RUN") or os.path.join(BUILD, "h3run")
TINY = os.path.join(os.path.dirname(H3RUN), "h3-tinymodel")
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
PROMPT = "A red ball rolls across a wooden table and stops by a blue cup. A soft knock, then silence."
STEPS, FRAMES, SEED = 4, 22, 5
results = []


def check(name, ok, detail):
    results.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        print(p.stderr)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p


def images(work):
    """Two keyframes of different aspect ratios: smooth colour fields with a disc and a bar, as PNG (lossless: libav and
    PIL decode the same pixels; JPEG decoders differ in their IDCT and upsampling, see compare_te_vision_transformers).
    """
    out = []
    for i, (w, h, name) in enumerate(((320, 180, "a.png"), (200, 300, "b.png"))):
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        rgb = np.stack([128 + 100 * np.sin(x / (17 + 5 * i)), 128 + 100 * np.cos(y / 23), 64 + 0.5 * (x + y) % 128], -1)
        rgb[(x - w * 0.3) ** 2 + (y - h * 0.6) ** 2 < (min(w, h) * 0.2) ** 2] = (230, 30, 40)
        rgb[int(h * 0.2):int(h * 0.3), int(w * 0.5):int(w * 0.9)] = (20, 40, 220)
        path = os.path.join(work, name)
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(path)
        out.append(path)
    return out


def meta(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)).get("__metadata__", {})


def resize_step(imgs, width, height):
    """MiniMaxH3ResizeStep on the two keyframes, with its components made here."""
    step = be.MiniMaxH3ResizeStep()
    comps = types.SimpleNamespace(image_processor=VaeImageProcessor(vae_scale_factor=16), canvas_multiple=32,
                                  config=types.SimpleNamespace(canvas_short_edge=768, canvas_max_pixels=768 * 1344))
    state = PipelineState()
    state.set("image", imgs[0])
    state.set("last_image", imgs[1])
    state.set("height", height)
    state.set("width", width)
    _, state = step(comps, state)
    return [np.asarray(k.convert("RGB")) for k in state.get("keyframes")], state.get("keyframe_anchors")


def presentation(model_dir, keyframes):
    """MiniMaxH3FL2VATextEncoderStep's ids and tags (its loop, transcribed), with transformers' processor."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer", "tokenizer.json"))
    proc = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                 image_std=[0.5] * 3, size={"shortest_edge": 65536, "longest_edge": 16777216})
    grid = proc(images=[Image.fromarray(k) for k in keyframes], return_tensors="pt")["image_grid_thw"]
    ids, tags = [], []
    for i in range(len(keyframes)):
        n = int(grid[i].prod()) // 4
        label = tok(f"<Picture {i + 1}>: ", add_special_tokens=False)["input_ids"]
        vis = ([tok.convert_tokens_to_ids("<|vision_start|>")] + [tok.convert_tokens_to_ids("<|image_pad|>")] * n
               + [tok.convert_tokens_to_ids("<|vision_end|>")])
        ids += label + vis
        tags += [1] * len(label) + [0] * len(vis)
    prompt = tok(PROMPT, add_special_tokens=False)["input_ids"]
    return ids + prompt, tags + [1] * len(prompt)


def transformer(model_dir):
    """The tiny DiT in diffusers' model, through diffusers' own converter (as compare_dit_diffusers.py does)."""
    spec = importlib.util.spec_from_file_location("conv", os.path.join(src, "scripts", "convert_minimax_h3_to_diffusers.py"))
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    with open(os.path.join(model_dir, "transformer", "config.json")) as f:
        oc = json.load(f)
    names = {"num_attention_heads": "num_attention_heads", "attention_head_dim": "attention_head_dim",
             "hidden_size": "hidden_size", "num_layers": "num_layers", "token_refiner_num_layers": "num_refiner_layers",
             "ffn_hidden_size": "ffn_dim", "latents_dim": "in_channels", "audio_latents_dim": "audio_in_channels",
             "patch_size": "patch_size", "text_dim": "text_dim", "timestep_input_dim": "freq_dim",
             "time_embed_hidden_size": "time_embed_hidden_dim", "time_embed_dim": "time_embed_dim",
             "rope_inv_freq_len": "rope_freq_dim", "norm_eps": "norm_eps", "qk_norm_eps": "qk_norm_eps",
             "final_norm_eps": "final_norm_eps"}
    cfg = dict(conv.MINIMAX_H3_TRANSFORMER_CONFIG)
    cfg.update({names[k]: v for k, v in oc.items() if k in names})
    raw = {}
    tdir = os.path.join(model_dir, "transformer")
    for fn in sorted(os.listdir(tdir)):
        if fn.endswith(".safetensors"):
            raw.update(load_file(os.path.join(tdir, fn)))
    sd = {}
    for k, t in raw.items():
        t = t.float()
        if k.endswith(".attn.qkv_proj.weight"):
            t = conv.reorder_interleaved_qkv(t, cfg["num_attention_heads"], cfg["attention_head_dim"])
        for nk, nt in conv.convert_transformer_key(k, t, cfg):
            sd[nk] = nt
    model = MiniMaxH3Transformer3DModel(**cfg).float().eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not m.endswith("inv_freq")]
    if missing or unexpected:
        raise SystemExit(f"diffusers' DiT: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(DEV)


def sample(model, dump, ncond, lt, lh, lw, na):
    """diffusers' fl2va loop from the dump's rows: the denoiser, then each scheduler on the generated rows."""
    L = dump["text"].shape[0]
    tags = dump["token_tags"].long()
    pos, tg, vi, ai, ti, nc, _ = bd.MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        tags[:L], lt, lh, lw, na, (1, 2, 2), 2, 2, 0, ("first", "last"))
    sv, sa = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    sv.set_timesteps(STEPS + 1, device=DEV)
    sa.set_timesteps(STEPS + 1, device=DEV)
    x = dump["video"].float().to(DEV).clone()
    a = dump["audio"].float().to(DEV).clone()
    text = dump["text"].float().to(DEV)[None]
    lay = {"token_tags": tg.to(DEV), "position_ids": pos.to(DEV), "video_indices": vi.to(DEV),
           "audio_indices": ai.to(DEV), "text_indices": ti.to(DEV)}
    first = None
    for i, (t, ta) in enumerate(zip(sv.timesteps, sa.timesteps)):
        u, idx = bd.MiniMaxH3SetTimestepsStep.build_row_timesteps(vi, ai, nc, 0, L, float(t), float(ta),
                                                                   max(float(t), 0.999), 1.0)
        if first is None:
            first = (u, idx)
        with torch.no_grad():
            v, va = model(hidden_states=x[None], audio_hidden_states=a[None], encoder_hidden_states=text,
                          timestep=u.to(DEV), timestep_indices=idx.to(DEV), return_dict=False, **lay)
        x[nc:] = sv.step(v[0, nc:].float(), t, x[nc:], return_dict=False)[0]
        a[:] = sa.step(va[0].float(), sa.timesteps[i], a, return_dict=False)[0]
    return x[nc:].cpu(), a.cpu(), (pos, tg, vi, ai, ti, nc), first


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max()), float((a - b).norm() / b.norm())


def main():
    if not os.path.exists(H3RUN) or not os.path.exists(TINY):
        raise SystemExit(f"need {H3RUN} and {TINY} (set H3RUN)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    work = tempfile.mkdtemp(prefix="fl2va-")
    model_dir = os.path.join(work, "m")
    run([TINY, model_dir])
    a_png, b_png = images(work)
    base = [H3RUN, "generate", "--model", model_dir, "--prompt", PROMPT, "--seed", str(SEED), "-q",
            "--first-frame", a_png, "--last-frame", b_png]
    la, da = os.path.join(work, "la.safetensors"), os.path.join(work, "da.safetensors")
    run(base + ["--frames", str(FRAMES), "--steps", str(STEPS), "--size", "256x128", "--device", "cpu",
                "--latents", la, "--dump-dit-inputs", da, "-o", os.path.join(work, "a.mp4")])
    lc = os.path.join(work, "lc.safetensors")
    run(base + ["--frames", "5", "--steps", "1", "--device", DEV, "--latents", lc, "-o", os.path.join(work, "c.mp4")])
    LA, DA, LC = load_file(la), load_file(da), load_file(lc)
    imgs = [Image.open(a_png).convert("RGB"), Image.open(b_png).convert("RGB")]

    # 1. the canvas of the first keyframe's aspect ratio
    h, w = mp.resolve_canvas_size(*imgs[0].size, 32, 768, 768 * 1344)
    check("canvas", meta(lc).get("size") == f"{w}x{h}", f"h3run {meta(lc).get('size')}, diffusers {w}x{h}")

    # 2. the keyframes on the canvas
    for name, L_, (W, H) in (("256x128", LA, (256, 128)), (f"{w}x{h} (from the aspect)", LC, (w, h))):
        kfs, anchors = resize_step(imgs, W, H)
        ours = L_["keyframe_pixels"].numpy()
        diff = [int((ours[k].astype(int) != kfs[k].astype(int)).sum()) for k in range(2)]
        check(f"keyframes on the {name} canvas", anchors == ("first", "last") and diff == [0, 0],
              f"bytes differing from MiniMaxH3ResizeStep's: {diff}, anchors {anchors}")

    # 3. the presentation
    kfs, _ = resize_step(imgs, 256, 128)
    ids, tags = presentation(model_dir, kfs)
    ours_ids, ours_tags = LA["text_ids"].tolist(), LA["text_tags"].tolist()
    check("presentation", ids == ours_ids and tags == ours_tags,
          f"{len(ours_ids)} ids (diffusers' loop: {len(ids)}), {sum(t == 0 for t in ours_tags)} rows tagged video")

    # 4. the keyframe rows from h3run's conditioning latents and noise
    sch = MiniMaxH3Scheduler(shift=12.0)
    cond = torch.cat([bd.patchify_video_latents(sch.scale_noise(LA["keyframe_latents"][k:k + 1], 0.999,
                                                                LA["keyframe_noise"][k:k + 1]), (1, 2, 2))
                      for k in range(2)])
    d = float((cond - LA["keyframe_rows"]).abs().max())
    check("keyframe rows", d <= 1e-6 and torch.equal(DA["video"][:cond.shape[0]], LA["keyframe_rows"]),
          f"scale_noise + patchify vs h3run's: max |diff| {d:.2e}; the DiT's first call saw them first")

    # 5. the layout and the first call's timesteps; 6. the sampling
    vl = LA["video_latents"]
    _, _, lt, lh, lw = vl.shape
    na = LA["audio_latents"].shape[2]
    model = transformer(model_dir)
    xv, xa, (pos, tg, vi, ai, ti, nc), (u, idx) = sample(model, DA, cond.shape[0], lt, lh, lw, na)
    same = (torch.equal(pos, DA["position_ids"].double()) and torch.equal(tg, DA["token_tags"].long())
            and torch.equal(vi, DA["video_indices"].long()) and torch.equal(ai, DA["audio_indices"].long())
            and torch.equal(ti, DA["text_indices"].long()))
    dpos = float((pos - DA["position_ids"].double()).abs().max())
    check("layout", same, f"build_packed_sequence vs h3run's: positions max |diff| {dpos:.1e}, tags and indices "
                          f"{'equal' if same else 'differ'} ({pos.shape[0]} rows, {nc} keyframe rows)")
    ts_ok = torch.equal(u.float(), DA["timesteps"].float()) and torch.equal(idx.long(), DA["timestep_indices"].long())
    check("first call's timesteps", ts_ok, f"build_row_timesteps {u.tolist()} vs h3run's {DA['timesteps'].tolist()}")
    ref_v = bd.patchify_video_latents(vl, (1, 2, 2))
    ref_a = LA["audio_latents"].permute(0, 2, 1).reshape(-1, 32)
    (mv, lv), (ma, lav) = rel(xv, ref_v), rel(xa, ref_a)
    check("sampling, f32", mv <= 1e-4 and ma <= 1e-4,
          f"diffusers' loop ({DEV}) vs h3run (CPU) after {STEPS} calls: video {mv:.2e} (rel L2 {lv:.2e}), audio "
          f"{ma:.2e} (rel L2 {lav:.2e})")

    # 7. h3run on the GPU: the same request
    if CUDA:
        lb = os.path.join(work, "lb.safetensors")
        run(base + ["--frames", str(FRAMES), "--steps", str(STEPS), "--size", "256x128", "--device", "cuda",
                    "--latents", lb, "-o", os.path.join(work, "b.mp4")])
        LB = load_file(lb)
        _, kr = rel(LB["keyframe_rows"], LA["keyframe_rows"])
        _, gv = rel(LB["video_latents"], LA["video_latents"])
        _, ga = rel(LB["audio_latents"], LA["audio_latents"])
        check("GPU run", kr <= 1e-4 and gv <= 5e-2 and ga <= 5e-2,
              f"vs the CPU's: keyframe rows rel L2 {kr:.2e} (f32 encoder), final video {gv:.2e}, audio {ga:.2e} "
              f"(bf16 DiT)")

    fails = sum(not r["ok"] for r in results)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare_fl2va_diffusers.json"), "w") as f:
            json.dump({"device": DEV, "torch": torch.__version__, "results": results}, f, indent=1)
    print(f"compare_fl2va_diffusers: {'all agree' if not fails else f'{fails} disagreement(s)'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
