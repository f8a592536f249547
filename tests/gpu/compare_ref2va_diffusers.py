"""ref2va: what h3run's DiT receives for references, and what it samples from them, against diffusers' ref2va blocks.

On the reduced random model of h3-tinymodel (official layout: a vision tower, the VAEs' encoders), h3run generates
with an image, a video with sound and a sound as references (at reference sizes of 64 and 96, as the tiny model's
canvas), saving what the references became (--latents) and the first DiT call's inputs (--dump-dit-inputs). This
script then checks, with diffusers' own code where it can be called alone:
  1. the normalization: MiniMaxH3Ref2VASetupStep run on h3run's decoded media (the image, the video's frames at the
     rate the file says, the 32 kHz sounds; libav decodes for both, so decoding and resampling are not compared) with
     its components made here at the tiny sizes: the image's and the video's pixels byte for byte, the sounds' lengths;
  2. the presentation: MiniMaxH3Ref2VATextEncoderStep._gather_vision_features (transformers' Qwen2-VL image processor
     and Qwen3-VL video processor at Qwen3-VL's settings) and _build_presentation with the model's tokenizer: token
     ids and tags equal, grids equal, pixel values within 1e-6;
  3. the text states of a presentation with an image block and a video's frame-pair blocks: a reduced Qwen3-VL in
     transformers (pixel_values and pixel_values_videos, one video of two pairs) against `h3run encode` given the
     same blocks as its vision input (each pair an image of t = 1, <|video_pad|> rows): relative L2 <= 1e-4;
  4. the reference rows: scheduler.scale_noise(latents, 0.999, noise) and patchify_video_latents of h3run's own
     conditioning latents and noise per reference; the sounds' rows against `h3run vae-encode` of the same 32 kHz
     waveforms (the encoder diffusers' AutoencoderKLMiniMaxH3Audio.encode matches: compare_vae_encode_diffusers)
     normalized here with the audio VAE's latents_mean/std and packed channel-major;
  5. the layout: MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence (positions to the bit, tags, index
     sets) and MiniMaxH3SetTimestepsStep.build_row_timesteps for the first call;
  6. the sampling: diffusers' loop (MiniMaxH3Transformer3DModel from the tiny DiT through diffusers' converter, the two
     schedulers stepping only the generated rows) from the dump's rows and text states against h3run's final
     latents: f32 on the CPU here vs f32 there within 1e-4 (max |diff| / max |ref|); and h3run's GPU run (bf16 DiT)
     within 5e-2 relative L2.

    DIFFUSERS_SRC=/path/to/diffusers H3RUN=build/h3run python tests/gpu/compare_ref2va_diffusers.py

Skips (exit 0) when DIFFUSERS_SRC is unset or diffusers does not import. Exit status 1 when a check fails. Details go
to $OUT/compare_ref2va_diffusers.json when OUT is set.
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import types
import wave

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)


def skip(msg):
    print(f"compare_ref2va_diffusers: SKIP: {msg}")
    sys.exit(0)


src = os.environ.get("DIFFUSERS_SRC")
if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")):
    skip("set DIFFUSERS_SRC to the diffusers source folder (the one containing src/diffusers)")
sys.path.insert(0, os.path.join(src, "src"))
try:
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.torch import load_file, save_file
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.schedulers.scheduling_minimax_h3 import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.modular_pipeline import PipelineState
    from diffusers.modular_pipelines.minimax_h3 import before_denoise as bd
    from diffusers.modular_pipelines.minimax_h3 import before_encoder as be
    from diffusers.modular_pipelines.minimax_h3 import encoders as enc
    from diffusers.modular_pipelines.minimax_h3 import references as refs
    import compare_fl2va_diffusers as fl  # its DiT loader
    import compare_te_vision_transformers as tv  # its reduced Qwen3-VL
except Exception as e:  # noqa: BLE001 - any import failure means this machine cannot run the comparison
    skip(f"diffusers does not import from {src}: {e}")

BUILD = os.environ.get("H3_BUILD_DIR") or os.path.join(ROOT, "build")
H3RUN = os.environ.get("H3RUN") or os.path.join(BUILD, "h3run")
TINY = os.path.join(os.path.dirname(H3RUN), "h3-tinymodel")
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
PROMPT = "A red ball rolls across a wooden table and stops by a blue cup. A soft knock, then silence."
STEPS, FRAMES, SEED, W, H = 4, 39, 5, 128, 64
IMAGE_SHORT, VIDEO_SHORT = 64, 96
# fl2va's comparison's helpers: its checks list (results) and printer, the subprocess runner, safetensors metadata,
# (max, L2) relative distance
results, check, run, meta, rel = fl.results, fl.check, fl.run, fl.meta, fl.rel


def media(work):
    """A PNG image, a 30 fps video with sound (h3run's own MP4 writer cannot make 30 fps: ffmpeg when present, else
    h3run's 24 fps clip of the tiny model) and a 22.05 kHz WAV tone."""
    y, x = np.mgrid[0:180, 0:320].astype(np.float64)
    rgb = np.stack([128 + 100 * np.sin(x / 17), 128 + 100 * np.cos(y / 23), 64 + 0.5 * (x + y) % 128], -1)
    rgb[(x - 96) ** 2 + (y - 108) ** 2 < 36 ** 2] = (230, 30, 40)
    img = os.path.join(work, "a.png")
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(img)
    snd = os.path.join(work, "s.wav")
    with wave.open(snd, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(22050)
        n = int(22050 * 1.4)
        f.writeframes(b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * 523.25 * i / 22050)))
                               for i in range(n)))
    vid = os.path.join(work, "v.mp4")
    try:
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=160x96:rate=30", "-f",
                        "lavfi", "-i", "sine=frequency=440:sample_rate=44100", "-t", "2", "-c:v", "libx264",
                        "-pix_fmt", "yuv420p", "-c:a", "aac", vid], check=True, capture_output=True)
    except Exception:  # noqa: BLE001 - no ffmpeg: a 24 fps clip h3run makes
        run([H3RUN, "generate", "--model", os.path.join(work, "m"), "--prompt", "a blue cup", "--frames", "56",
             "--size", "96x64", "--steps", "2", "--seed", "9", "--device", "cpu", "-q", "-o", vid])
    return img, vid, snd


def setup_step(L):
    """MiniMaxH3Ref2VASetupStep on h3run's decoded media, with its components made here at the tiny sizes."""
    kinds = [meta_kind[k] for k in range(len(meta_kind))]
    references = []
    for k, kind in enumerate(kinds):
        if kind == "image":
            references.append(refs.MiniMaxH3ImageReference(image=Image.fromarray(L[f"ref{k}_source"][0].numpy())))
        elif kind == "video":
            wv = L.get(f"ref{k}_wave")
            references.append(refs.MiniMaxH3VideoReference(frames=L[f"ref{k}_source"].numpy(), fps=float(meta_fps[k]),
                                                           audio=wv, sample_rate=32000 if wv is not None else None))
        else:
            references.append(refs.MiniMaxH3AudioReference(audio=L[f"ref{k}_wave"], sample_rate=32000))
    step = be.MiniMaxH3Ref2VASetupStep()
    area = VIDEO_SHORT * VIDEO_SHORT * 1344 // 768
    comps = types.SimpleNamespace(
        image_processor=VaeImageProcessor(vae_scale_factor=16), canvas_multiple=32, fps=24, audio_sampling_rate=32000,
        vae_frames_per_chunk=17, vae_latents_per_chunk=5, min_duration=0.0, max_duration=15.0,
        config=types.SimpleNamespace(canvas_short_edge=VIDEO_SHORT, canvas_max_pixels=area,
                                     reference_image_short_edge=IMAGE_SHORT))
    state = PipelineState()
    state.set("references", references)
    state.set("height", H)
    state.set("width", W)
    state.set("num_frames", FRAMES)
    _, state = step(comps, state)
    return state.get("normalized_references")


def vision_processor():
    from transformers import Qwen2VLImageProcessor, Qwen3VLVideoProcessor
    ip = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                               image_std=[0.5] * 3, size={"shortest_edge": 65536, "longest_edge": 16777216})
    vp = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                               image_std=[0.5] * 3, size={"shortest_edge": 4096, "longest_edge": 25165824})
    return types.SimpleNamespace(image_processor=ip, video_processor=vp)


def hidden_states(work, normalized, proc):
    """3: a reduced Qwen3-VL in transformers against h3run encode, on an image block and a video's pair blocks."""
    import inspect
    mdir = os.path.join(work, "qwen")
    model = tv.build_model(mdir)
    step = enc.MiniMaxH3Ref2VATextEncoderStep()
    vis, icount, vcount, vtimes = step._gather_vision_features(proc, normalized, 24.0)
    ids = [10, 11]
    for k in range(len(icount)):
        ids += [tv.VS] + [tv.IMG] * icount[k] + [tv.VE, 20]
    for k in range(len(vcount)):
        for _ in vtimes[k]:
            ids += [21, tv.VS] + [tv.VID] * vcount[k] + [tv.VE]
    ids += [30, 31]
    x = torch.tensor([ids])
    kw = dict(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False, output_hidden_states=True, **vis)
    if "mm_token_type_ids" in inspect.signature(model.model.forward).parameters:
        kw["mm_token_type_ids"] = ((x == tv.IMG).long() + 2 * (x == tv.VID).long())
    with torch.no_grad():
        out = model.model(**kw)
    # h3run: every vision block as an image of t = 1 (a video's pairs after its images, as the ids order them)
    pv = torch.cat([vis[k] for k in ("pixel_values", "pixel_values_videos") if k in vis]).float()
    grids = [g.tolist() for g in vis.get("image_grid_thw", [])]
    for g in vis.get("video_grid_thw", []):
        grids += [[1, int(g[1]), int(g[2])]] * int(g[0])
    f = os.path.join(work, "vis.safetensors")
    save_file({"pixel_values": pv.contiguous(), "image_grid_thw": torch.tensor(grids, dtype=torch.int64)}, f)
    errs = []
    for layer in (2, 3):
        o = os.path.join(work, f"h3_{layer}.safetensors")
        run([H3RUN, "encode", "-q", "--text-encoder", mdir, "--token-ids", ",".join(map(str, ids)), "--vision", f,
             "--layer", str(layer), "-o", o])
        h, r = load_file(o)["hidden"].double(), out.hidden_states[layer][0].double()
        errs.append(float((h - r).norm() / r.norm()))
    check("text states with video blocks", max(errs) <= 1e-4,
          f"{len(ids)} tokens ({len(grids)} vision blocks, {sum(len(t) for t in vtimes)} of them a video's pairs): "
          f"hidden_states[2], [3] rel L2 {errs[0]:.2e}, {errs[1]:.2e}")


def sample(model, dump, nrv, nra, lt, lh, lw, na, layout):
    """diffusers' loop from the dump's rows: the denoiser, then each scheduler on the generated rows only."""
    pos, tg, vi, ai, ti = layout
    L = dump["text"].shape[0]
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
        u, idx = bd.MiniMaxH3SetTimestepsStep.build_row_timesteps(vi, ai, nrv, nra, L, float(t), float(ta),
                                                                   max(float(t), 0.999), 1.0)
        if first is None:
            first = (u, idx)
        with torch.no_grad():
            v, va = model(hidden_states=x[None], audio_hidden_states=a[None], encoder_hidden_states=text,
                          timestep=u.to(DEV), timestep_indices=idx.to(DEV), return_dict=False, **lay)
        x[nrv:] = sv.step(v[0, nrv:].float(), t, x[nrv:], return_dict=False)[0]
        a[nra:] = sa.step(va[0, nra:].float(), sa.timesteps[i], a[nra:], return_dict=False)[0]
    return x[nrv:].cpu(), a[nra:].cpu(), first


meta_kind, meta_fps = {}, {}


def main():
    if not os.path.exists(H3RUN) or not os.path.exists(TINY):
        raise SystemExit(f"need {H3RUN} and {TINY} (set H3RUN)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    work = tempfile.mkdtemp(prefix="ref2va-")
    model_dir = os.path.join(work, "m")
    run([TINY, model_dir])
    img, vid, snd = media(work)
    base = [H3RUN, "generate", "--model", model_dir, "--prompt", PROMPT, "--seed", str(SEED), "-q",
            "--frames", str(FRAMES), "--steps", str(STEPS), "--size", f"{W}x{H}", "--ref-image", img, "--ref-video",
            vid, "--ref-audio", snd, "--ref-image-size", str(IMAGE_SHORT), "--ref-video-size", str(VIDEO_SHORT)]
    la, da = os.path.join(work, "la.safetensors"), os.path.join(work, "da.safetensors")
    run(base + ["--device", "cpu", "--latents", la, "--dump-dit-inputs", da, "-o", os.path.join(work, "a.mp4")])
    LA, DA, M = load_file(la), load_file(da), meta(la)
    n_refs = sum(1 for k in M if k.endswith("_kind"))
    for k in range(n_refs):
        meta_kind[k] = M[f"ref{k}_kind"]
        meta_fps[k] = M.get(f"ref{k}_fps", "0")

    # 1. the normalization
    normalized = setup_step(LA)
    bad = []
    for k, r in enumerate(normalized):
        if r.kind == "image":
            ours, theirs = LA[f"ref{k}_pixels"][0].numpy(), np.asarray(r.image.convert("RGB"))
        elif r.kind == "video":
            ours, theirs = LA[f"ref{k}_pixels"].numpy(), np.asarray(r.frames)
        else:
            ours = theirs = None
        if ours is not None and (ours.shape != theirs.shape or (ours != theirs).any()):
            bad.append(f"ref {k} ({r.kind}): {ours.shape} vs {theirs.shape}, "
                       f"{int((ours != theirs).sum()) if ours.shape == theirs.shape else '-'} bytes differ")
        if r.has_audio and not torch.equal(torch.as_tensor(r.audio).float(), LA[f"ref{k}_wave"]):
            bad.append(f"ref {k}: the sound differs ({tuple(r.audio.shape)} vs {tuple(LA[f'ref{k}_wave'].shape)})")
    check("normalization", not bad, "; ".join(bad) or
          f"{n_refs} references: pixels equal to MiniMaxH3Ref2VASetupStep's, sounds cut alike "
          f"(video {meta_fps.get(1)} fps -> {LA['ref1_pixels'].shape[0]} frames at 24)")

    # 2. the presentation
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer", "tokenizer.json"))
    proc = vision_processor()
    step = enc.MiniMaxH3Ref2VATextEncoderStep()
    vis, icount, vcount, vtimes = step._gather_vision_features(proc, normalized, 24.0)
    ids, tags = step._build_presentation(tok, PROMPT, normalized, icount, vcount, vtimes)
    same = ids == LA["text_ids"].tolist() and tags == LA["text_tags"].tolist()
    pv = torch.cat([vis[k] for k in ("pixel_values", "pixel_values_videos") if k in vis]).float()
    grids = [g.tolist() for g in vis.get("image_grid_thw", [])]
    for g in vis.get("video_grid_thw", []):
        grids += [[1, int(g[1]), int(g[2])]] * int(g[0])
    gsame = grids == LA["vision_grid"].tolist()
    dpix = float((pv - LA["vision_pixels"]).abs().max()) if pv.shape == LA["vision_pixels"].shape else math.inf
    gtext = "equal" if gsame else "%s vs %s" % (grids, LA["vision_grid"].tolist())
    check("presentation", same and gsame and dpix <= 1e-6,
          f"{len(LA['text_ids'])} ids (diffusers: {len(ids)}) {'equal' if same else 'differ'}; grids {gtext}; pixel "
          f"values max |diff| {dpix:.1e}; video block times {vtimes}")

    # 3. the text states of image and video blocks
    hidden_states(work, normalized, proc)

    # 4. the reference rows
    sch = MiniMaxH3Scheduler(shift=12.0)
    shapes = []
    for k, r in enumerate(normalized):
        if r.kind == "image":
            shapes.append((1, r.image.size[1] // 16, r.image.size[0] // 16))
        elif r.kind == "video":
            f = r.frames.shape[0]
            f = max(1, (f - 5) // 17) * 17 + 5
            shapes.append((5 * (f - 5) // 17 + 2, r.frames.shape[1] // 16, r.frames.shape[2] // 16))
    rows, at = [], 0
    for (t_, h_, w_) in shapes:
        n = 24 * t_ * h_ * w_
        lat = LA["reference_latents"][at:at + n].reshape(1, 24, t_, h_, w_)
        noi = LA["reference_noise"][at:at + n].reshape(1, 24, t_, h_, w_)
        rows.append(bd.patchify_video_latents(sch.scale_noise(lat, 0.999, noi), (1, 2, 2)))
        at += n
    cond = torch.cat(rows)
    d = float((cond - LA["reference_rows"]).abs().max())
    nrv = cond.shape[0]
    check("reference video rows", d <= 1e-6 and torch.equal(DA["video"][:nrv], LA["reference_rows"]),
          f"scale_noise + patchify vs h3run's: max |diff| {d:.2e} over {nrv} rows; the DiT's first call saw them first")
    with open(os.path.join(model_dir, "audio_vae", "config.json")) as f:
        acfg = json.load(f)
    mean = torch.tensor(acfg["latents_mean"]).view(1, -1, 1)
    std = torch.tensor(acfg["latents_std"]).view(1, -1, 1)
    arows = []
    for k, r in enumerate(normalized):
        if not r.has_audio:
            continue
        wpath, opath = os.path.join(work, f"w{k}.safetensors"), os.path.join(work, f"o{k}.safetensors")
        save_file({"waveform": LA[f"ref{k}_wave"][:, None, :].contiguous()}, wpath)
        run([H3RUN, "vae-encode", "--model", os.path.join(model_dir, "audio_vae"), "--input", wpath, "--out", opath,
             "--device", "cpu", "-q"])
        lat = (load_file(opath)["latents"] - mean) / std  # [2, 32, T]
        arows.append(lat.permute(0, 2, 1).reshape(-1, 32))
    aref = torch.cat(arows)
    nra = aref.shape[0]
    ma, _ = rel(LA["reference_audio_rows"], aref) if LA["reference_audio_rows"].shape == aref.shape else (math.inf, 0)
    check("reference audio rows", ma <= 1e-6 and torch.equal(DA["audio"][:nra], LA["reference_audio_rows"]),
          f"vae-encode + normalize + channel-major packing vs h3run's: max rel {ma:.2e} over {nra} rows")

    # 5. the layout and the first call's timesteps; 6. the sampling
    vl = LA["video_latents"]
    _, _, lt, lh, lw = vl.shape
    na = LA["audio_latents"].shape[2]
    conds = [torch.zeros(1, 24, *s) for s in shapes]
    auds = [torch.zeros(r.shape[0], 32) for r in arows]
    L = DA["text"].shape[0]
    pos, tg, vi, ai, ti, nrv2, nra2 = bd.MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
        DA["token_tags"][:L].long(), normalized, conds, auds, lt, lh, lw, na, (1, 2, 2), 2, 2, 0)
    same = (torch.equal(pos, DA["position_ids"].double()) and torch.equal(tg, DA["token_tags"].long())
            and torch.equal(vi, DA["video_indices"].long()) and torch.equal(ai, DA["audio_indices"].long())
            and torch.equal(ti, DA["text_indices"].long()) and nrv2 == nrv and nra2 == nra)
    dpos = float((pos - DA["position_ids"].double()).abs().max()) if pos.shape == DA["position_ids"].shape else math.inf
    check("layout", same, f"build_ref2va_packed_sequence vs h3run's: positions max |diff| {dpos:.1e}, tags and "
                          f"indices {'equal' if same else 'differ'} ({pos.shape[0]} rows; {nrv2} reference video and "
                          f"{nra2} audio rows)")
    model = fl.transformer(model_dir)
    xv, xa, (u, idx) = sample(model, DA, nrv, nra, lt, lh, lw, na, (pos, tg, vi, ai, ti))
    ts_ok = torch.equal(u.float(), DA["timesteps"].float()) and torch.equal(idx.long(), DA["timestep_indices"].long())
    check("first call's timesteps", ts_ok, f"build_row_timesteps {u.tolist()} vs h3run's {DA['timesteps'].tolist()}")
    ref_v = bd.patchify_video_latents(vl, (1, 2, 2))
    ref_a = LA["audio_latents"].permute(0, 2, 1).reshape(-1, 32)
    (mv, lv), (mam, lav) = rel(xv, ref_v), rel(xa, ref_a)
    check("sampling, f32", mv <= 1e-4 and mam <= 1e-4,
          f"diffusers' loop ({DEV}) vs h3run (CPU) after {STEPS} calls: video {mv:.2e} (rel L2 {lv:.2e}), audio "
          f"{mam:.2e} (rel L2 {lav:.2e})")

    # 7. h3run on the GPU: the same request
    if CUDA:
        lb = os.path.join(work, "lb.safetensors")
        run(base + ["--device", "cuda", "--latents", lb, "-o", os.path.join(work, "b.mp4")])
        LB = load_file(lb)
        _, kr = rel(LB["reference_rows"], LA["reference_rows"])
        _, ar = rel(LB["reference_audio_rows"], LA["reference_audio_rows"])
        _, gv = rel(LB["video_latents"], LA["video_latents"])
        _, ga = rel(LB["audio_latents"], LA["audio_latents"])
        check("GPU run", kr <= 1e-4 and ar <= 1e-6 and gv <= 5e-2 and ga <= 5e-2,
              f"vs the CPU's: reference video rows rel L2 {kr:.2e} (f32 encoder), audio rows {ar:.2e}, final video "
              f"{gv:.2e}, audio {ga:.2e} (bf16 DiT)")

    fails = sum(not r["ok"] for r in results)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare_ref2va_diffusers.json"), "w") as f:
            json.dump({"device": DEV, "torch": torch.__version__, "results": results}, f, indent=1)
    print(f"compare_ref2va_diffusers: {'all agree' if not fails else f'{fails} disagreement(s)'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
