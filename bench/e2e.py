"""bench/e2e.sh's workers: h3run generate on the release-shaped model, diffusers' MiniMax-H3 stages with the same
shapes, and the table that puts them side by side.

    python3 bench/e2e.py h3run --name NAME --out DIR --cap SECONDS [--vae-host] -- h3run generate ARGS...
        runs the command with --progress json, reads its events as they come (stage times, DiT step times), its
        summary and memory report, and its --memory-trace; stops it after --cap seconds (and a video VAE stage on
        the host after E2E_HOST_VAE_GRACE seconds: one release-size tile-chunk takes about a minute on 16 cores);
        writes DIR/h3run_NAME.json. Needs no torch.
    python3 bench/e2e.py diffusers --out DIR --ids FILE --te-config FILE [--frames N] [--size WxH] [--steps N]
                                   [--steps49] [--cap SECONDS]
        diffusers' modules built with random weights in GPU memory (nothing is read from disk), each stage timed
        with CUDA events as the modular pipeline runs it, each module freed before the next; writes
        DIR/diffusers.json. Needs torch, a GPU, DIFFUSERS_SRC (a diffusers checkout) and transformers.
    python3 bench/e2e.py table --out DIR [--json FILE]
        the table of everything found in DIR; writes DIR/e2e.json and DIR/e2e.md.
    python3 bench/e2e.py selftest
        the diffusers worker's timing and freeing harness on stand-in torch modules, on the CPU.

What each diffusers stage runs (diffusers' src/diffusers/modular_pipelines/minimax_h3/):
  text encoder   encoders.py get_qwen3vl_prompt_embeds: Qwen3VLForConditionalGeneration.model over the prompt's ids
                 with output_hidden_states, hidden_states[50] kept. The model is built from the text encoder's
                 config.json with every decoder layer it lists (the release: 64; the pipeline runs them all).
  denoise        denoise.py: per step the transformer over the packed sequence (before_denoise.py's
                 build_packed_sequence and build_row_timesteps) and the two schedulers' steps (shift 12 and 3).
                 "N steps" are N model calls (num_inference_steps N + 1), as h3run's --steps N.
  audio decode   decoders.py MiniMaxH3AudioDecodeStep: latents * std + mean, AutoencoderKLMiniMaxH3Audio.decode,
                 float32 weights.
  video decode   decoders.py MiniMaxH3VideoDecodeStep: latents * std + mean, AutoencoderKLMiniMaxH3.decode under
                 float16 autocast over float32 weights (tiled as released), pixels denormalized and clamped, and
                 postprocess_video to numpy.
Times exclude building the modules (diffusers loads weights once per process); h3run's stage times include
reading its weights from the files, which it does every run.
"""
import argparse
import contextlib
import gc
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

STAGES = ["tokenize", "text_encoder", "dit", "audio_vae", "video_vae", "mux"]


# ---- h3run -----------------------------------------------------------------------------------------------------


def parse_report(text):
    """Lines of h3run's summary and memory report with two GiB figures: label -> (predicted, measured)."""
    peaks = {}
    for line in text.splitlines():
        m = re.match(r"\s*(.+?)\s+([0-9.]+) GiB\s+([0-9.]+) GiB", line)
        if m:
            peaks[m.group(1).strip()] = [float(m.group(2)), float(m.group(3))]
    step = re.search(r"([0-9.]+) s per model call after the first(?: \(predicted ([0-9.]+)\))?", text)
    placement = re.search(r"(\d+) blocks resident, (\d+) streamed from pinned memory, (\d+) from the file", text)
    return dict(peaks=peaks, step_s=float(step.group(1)) if step else None,
                predicted_step_s=float(step.group(2)) if step and step.group(2) else None,
                placement=[int(x) for x in placement.groups()] if placement else None)


def run_h3run(args, cmd):
    """Runs h3run generate, following its JSON progress on stderr; stops it at the caps."""
    t0 = time.monotonic()
    res = dict(name=args.name, command=cmd, stages={}, dit_steps=[], events=0, finished=False, stopped=None,
               log=[])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    out_chunks = []
    reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    state = dict(stage=None, stage_t0=None, chunks=0, chunk_s=None)
    grace = float(os.environ.get("E2E_HOST_VAE_GRACE", "15"))

    def watchdog():
        while proc.poll() is None:
            now = time.monotonic()
            why = None
            if now - t0 > args.cap:
                why = "the run's cap of %.0f s" % args.cap
            elif args.vae_host and state["stage"] == "video_vae" and now - state["stage_t0"] > grace:
                why = "the video VAE runs on the host (stopped after %.0f s of it)" % grace
            if why:
                res["stopped"] = dict(reason=why, stage=state["stage"], after_s=round(now - t0, 1),
                                      stage_s=round(now - state["stage_t0"], 1) if state["stage_t0"] else None)
                proc.send_signal(signal.SIGINT)  # a clean stop at the next poll point
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                return
            time.sleep(0.2)

    dog = threading.Thread(target=watchdog, daemon=True)
    dog.start()
    for line in proc.stderr:
        line = line.rstrip("\n")
        try:
            ev = json.loads(line)
        except ValueError:
            res["log"].append(line)
            continue
        res["events"] += 1
        kind, stage = ev.get("event"), ev.get("stage")
        if kind == "stage_begin":
            state.update(stage=stage, stage_t0=time.monotonic())
        elif kind == "step" and stage == "dit":
            res["dit_steps"].append(ev.get("stage_s"))
            res["dit_step_s"] = ev.get("step_s")
        elif kind == "step" and stage == "video_vae":
            state["chunks"], state["chunk_s"] = ev.get("step", 0), ev.get("stage_s")
            res["video_chunks"] = [ev.get("step"), ev.get("steps"), ev.get("stage_s")]
        elif kind == "stage_end":
            res["stages"][stage] = ev.get("stage_s")
            state.update(stage=None, stage_t0=None)
        elif kind == "done":
            res["elapsed_s"] = ev.get("elapsed_s")
    proc.wait()
    reader.join(timeout=10)
    res["rc"] = proc.returncode
    res["wall_s"] = round(time.monotonic() - t0, 3)
    res["stdout"] = "".join(out_chunks)
    res["finished"] = proc.returncode == 0
    res.update(parse_report(res["stdout"]))
    if args.trace and os.path.exists(args.trace):
        try:
            with open(args.trace) as f:
                tr = json.load(f)
            res["trace"] = dict(budget=tr.get("budget"), predicted_peak=tr.get("predicted_peak"),
                                measured_peak=tr.get("measured_peak"), categories=tr.get("categories"))
        except ValueError as e:
            res["trace"] = dict(error=str(e))
    # The video VAE when it did not finish: its time from the chunks that did, or a lower bound.
    if "video_vae" not in res["stages"] and res.get("stopped") and res["stopped"].get("stage") == "video_vae":
        ch = res.get("video_chunks")
        if ch and ch[0]:
            res["video_vae_estimate_s"] = ch[2] / ch[0] * ch[1]
        res["video_vae_at_least_s"] = res["stopped"].get("stage_s")
    res["log"] = res["log"][-40:]
    return res


def cmd_h3run(args):
    res = run_h3run(args, args.cmd)
    path = os.path.join(args.out, "h3run_%s.json" % args.name)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    st = ", ".join("%s %.2f s" % (k, v) for k, v in res["stages"].items())
    print("h3run %s: rc %s in %.1f s; %s%s" % (args.name, res["rc"], res["wall_s"], st,
                                              "; stopped: " + res["stopped"]["reason"] if res["stopped"] else ""))
    if res["rc"] != 0 and not res["stopped"]:
        print("\n".join(res["log"][-5:]))
    return 0 if res["finished"] or res["stopped"] else 1


# ---- diffusers ---------------------------------------------------------------------------------------------------


class Stage:
    """Times a stage on the device with CUDA events (wall time with synchronization on the CPU) and records its
    peak memory from a reset."""

    def __init__(self, torch, dev, results, name):
        self.torch, self.dev, self.results, self.name = torch, dev, results, name

    def __enter__(self):
        t = self.torch
        if self.dev.type == "cuda":
            t.cuda.synchronize()
            t.cuda.reset_peak_memory_stats()
            self.a, self.b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            self.a.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        t = self.torch
        if exc[0] is not None:
            return False
        if self.dev.type == "cuda":
            self.b.record()
            t.cuda.synchronize()
            dev_s = self.a.elapsed_time(self.b) / 1000
            peak = t.cuda.max_memory_allocated() / 2**30
        else:
            dev_s, peak = None, None
        wall = time.perf_counter() - self.t0
        self.results.setdefault(self.name, []).append(dict(s=dev_s if dev_s is not None else wall, wall_s=wall,
                                                           peak_gib=peak))
        return False


def release(torch):
    """Returns the memory of the modules the caller dropped to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def construct(torch, dev, make):
    """make() with its tensors created on dev (torch >= 2.0), else created and moved."""
    d = torch.device(dev)
    if hasattr(d, "__enter__"):
        with d:
            return make()
    return make().to(d)


def latent_shapes(frames, width, height):
    t = 2 if frames <= 5 else ((frames - 5) // 17) * 5 + 2
    return t, height // 16, width // 16, round(frames / 24 * 40)


def diffusers_modules():
    src = os.environ.get("DIFFUSERS_SRC")
    if src:
        sys.path.insert(0, os.path.join(src, "src"))
    import diffusers  # noqa: F401
    from diffusers import (AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler,
                           MiniMaxH3Transformer3DModel)
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (MiniMaxH3PrepareLayoutStep,
                                                                       MiniMaxH3SetTimestepsStep)
    from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds
    from diffusers.video_processor import VideoProcessor
    return dict(video_vae=AutoencoderKLMiniMaxH3, audio_vae=AutoencoderKLMiniMaxH3Audio,
                scheduler=MiniMaxH3Scheduler, transformer=MiniMaxH3Transformer3DModel,
                layout=MiniMaxH3PrepareLayoutStep.build_packed_sequence,
                row_timesteps=MiniMaxH3SetTimestepsStep.build_row_timesteps,
                prompt_embeds=get_qwen3vl_prompt_embeds,
                video_processor=lambda: VideoProcessor(vae_scale_factor=16, do_normalize=False))


def build_text_encoder(torch, dev, te_config_path):
    """Qwen3VLForConditionalGeneration from the text encoder's config.json, bf16 random weights on the device."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    with open(te_config_path) as f:
        cfg = json.load(f)
    config = Qwen3VLConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    try:
        config._attn_implementation = "sdpa"
    except AttributeError:
        pass
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = construct(torch, dev, lambda: Qwen3VLForConditionalGeneration(config))
    finally:
        torch.set_default_dtype(prev)
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():  # unit-scale random weights (the default init is fine for timing; this keeps it finite)
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.uniform_(-math.sqrt(3.0 / p.shape[-1]), math.sqrt(3.0 / p.shape[-1]))
    return model, config.text_config.num_hidden_layers


def build_transformer(torch, dev, transformer_cls):
    """diffusers' transformer at the release's shapes, random bf16 weights with the fp32 islands (as
    bench/dit_diffusers.py builds it, but allocated in bf16 from the start: 66 GB, not 132 GB of fp32 first)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = transformer_cls()
    finally:
        torch.set_default_dtype(prev)
    model = model.to_empty(device=dev)
    fp32 = ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out")
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            keep = any(name.startswith(f) for f in fp32)
            p.data = p.data.to(torch.float32 if keep else torch.bfloat16)
            p.normal_(0.0, 0.02 if p.dim() > 1 else 0.5)
            n += p.numel()
        for name, b in model.named_buffers():
            if name.endswith("inv_freq"):
                b.copy_(1.0 / (10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float32, device=dev) / 32)))
    return model.eval(), n


def run_diffusers(args, torch, mods, results, info):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    width, height = (int(x) for x in args.size.split("x"))
    T, H, W, Ta = latent_shapes(args.frames, width, height)
    with open(args.ids) as f:
        ids = [int(x) for x in re.sub(r"^ids:\s*", "", f.read().strip().splitlines()[-1]).split(",") if x]
    info.update(frames=args.frames, size=args.size, latent=[24, T, H, W], audio_latents=Ta, text_tokens=len(ids),
                device=str(dev), torch=torch.__version__)
    deadline = time.monotonic() + args.cap

    # 1. text encoder
    t0 = time.perf_counter()
    te, layers = build_text_encoder(torch, dev, args.te_config)
    info["text_encoder"] = dict(layers=layers, built_s=round(time.perf_counter() - t0, 1),
                                params=sum(p.numel() for p in te.parameters()))

    class TextOnlyProcessor:  # what Qwen3VLProcessor answers for a prompt without vision pads
        def create_mm_token_type_ids(self, batch):
            return [[0] * len(x) for x in batch]

    embeds = None
    with torch.no_grad():
        for rep in range(3):  # the first call carries warm-up; the stage time is the median of the others
            with Stage(torch, dev, results, "text_encoder"):
                embeds = mods["prompt_embeds"](te, TextOnlyProcessor(), ids, {}, text_encoder_layer=50, device=dev,
                                               dtype=te.dtype)
    embeds = embeds.detach()
    del te
    release(torch)

    # 2. denoise: the loop of denoise.py over the layout of before_denoise.py
    t0 = time.perf_counter()
    tr, n_params = mods["build_transformer"](torch, dev)
    info["transformer"] = dict(params=n_params, built_s=round(time.perf_counter() - t0, 1))
    L = len(ids)
    pos, tags, vidx, aidx, tidx, ncv, nca = mods["layout"](torch.ones(L, dtype=torch.long), T, H, W, Ta, (1, 2, 2),
                                                            2, 2, 0)
    dev_layout = dict(position_ids=pos.to(dev), token_tags=tags.to(dev), video_indices=vidx.to(dev),
                      audio_indices=aidx.to(dev), text_indices=tidx.to(dev))
    g = torch.Generator(device=dev).manual_seed(0)
    steps = [args.steps] + ([49] if args.steps49 else [])
    for n in steps:
        sch, asch = mods["scheduler"](shift=12.0), mods["scheduler"](shift=3.0)
        sch.set_timesteps(n + 1, device=dev)
        asch.set_timesteps(n + 1, device=dev)
        plan = [tuple(x.to(dev) for x in mods["row_timesteps"](vidx, aidx, ncv, nca, L, float(t), float(ta),
                                                               max(float(t), 0.999), 1.0))
                for t, ta in zip(sch.timesteps, asch.timesteps)]
        lat = torch.randn(vidx.numel(), 96, device=dev, generator=g)
        alat = torch.randn(aidx.numel(), 32, device=dev, generator=g)
        key = "denoise_%d" % n
        with torch.no_grad():
            for i, t in enumerate(sch.timesteps):
                if time.monotonic() > deadline:
                    info.setdefault("notes", []).append("%s stopped at step %d of %d by the cap" % (key, i, n))
                    break
                with Stage(torch, dev, results, key):
                    ut, ti = plan[i]
                    v, va = tr(hidden_states=lat[None], audio_hidden_states=alat[None], encoder_hidden_states=embeds,
                               timestep=ut, timestep_indices=ti, return_dict=False, **dev_layout)
                    lat[ncv:] = sch.step(v[0, ncv:].float(), t, lat[ncv:], return_dict=False)[0]
                    alat[nca:] = asch.step(va[0, nca:].float(), asch.timesteps[i], alat[nca:], return_dict=False)[0]
                    del v, va
    del tr
    release(torch)

    # 3. audio decode (decoders.py MiniMaxH3AudioDecodeStep), float32
    avae = construct(torch, dev, mods["audio_vae"]).eval()
    am = torch.tensor(avae.config.latents_mean or [0.0] * 32, device=dev).view(1, -1, 1)
    asd = torch.tensor(avae.config.latents_std or [1.0] * 32, device=dev).view(1, -1, 1)
    a_lat = torch.randn(2, 32, Ta, device=dev, generator=g)
    with torch.no_grad():
        for rep in range(3):
            with Stage(torch, dev, results, "audio_vae"):
                audio = avae.decode(a_lat * asd + am, return_dict=False)[0]
                audio = audio.float().permute(1, 0, 2)
    info["audio_out"] = list(audio.shape)
    del avae, audio
    release(torch)

    # 4. video decode (decoders.py MiniMaxH3VideoDecodeStep): fp16 autocast over fp32 weights, tiled as released
    vvae = construct(torch, dev, mods["video_vae"]).eval()
    vm = torch.tensor(vvae.config.latents_mean, device=dev).view(1, -1, 1, 1, 1)
    vs = torch.tensor(vvae.config.latents_std, device=dev).view(1, -1, 1, 1, 1)
    pm = torch.tensor((0.485, 0.456, 0.406), device=dev).view(1, -1, 1, 1, 1)
    ps = torch.tensor((0.229, 0.224, 0.225), device=dev).view(1, -1, 1, 1, 1)
    vp = mods["video_processor"]()
    v_lat = torch.randn(1, 24, T, H, W, device=dev, generator=g)
    reps = 2 if time.monotonic() < deadline else 1
    with torch.no_grad():
        for rep in range(reps):
            with Stage(torch, dev, results, "video_vae"):
                amp = torch.autocast("cuda", dtype=torch.float16) if dev.type == "cuda" else contextlib.nullcontext()
                with amp:
                    video = vvae.decode(v_lat * vs + vm, return_dict=False)[0]
                video = (video.float() * ps + pm).clamp(0, 1)
            with Stage(torch, dev, results, "video_postprocess"):
                frames = vp.postprocess_video(video, output_type="np")
    info["video_out"] = list(video.shape)
    del frames, video, vvae
    release(torch)


def summarize(results):
    """Per stage: the time the table uses (median of the calls after the first where there are any), the first
    call, and the peak."""
    out = {}
    for k, v in results.items():
        times = [r["s"] for r in v]
        rest = sorted(times[1:]) if len(times) > 1 else times
        peak = max((r["peak_gib"] or 0) for r in v) if v else None
        out[k] = dict(calls=len(v), first_s=times[0], median_s=rest[len(rest) // 2], total_s=sum(times),
                      peak_gib=peak)
    return out


def cmd_diffusers(args):
    import torch
    results, info = {}, dict(started=time.strftime("%Y-%m-%d %H:%M:%S"))
    path = os.path.join(args.out, "diffusers.json")
    try:
        if not torch.cuda.is_available() and not args.allow_cpu:
            raise RuntimeError("no GPU: diffusers' stages at release size need one")
        mods = diffusers_modules()
        mods["build_transformer"] = lambda t, d: build_transformer(t, d, mods["transformer"])
        run_diffusers(args, torch, mods, results, info)
        info["ok"] = True
    except Exception as e:  # noqa: BLE001 - recorded and reported: the h3run half of the table still stands
        info["ok"] = False
        info["error"] = "%s: %s" % (type(e).__name__, e)
        print("diffusers: %s" % info["error"])
    with open(path, "w") as f:
        json.dump(dict(info=info, raw=results, stages=summarize(results)), f, indent=1)
    for k, v in summarize(results).items():
        print("diffusers %-18s %2d calls  first %8.3f s  median %8.3f s  peak %s" % (
            k, v["calls"], v["first_s"], v["median_s"], "%.2f GiB" % v["peak_gib"] if v["peak_gib"] else "-"))
    return 0 if info["ok"] else 1


# ---- self-test of the harness on the CPU --------------------------------------------------------------------------


def cmd_selftest(args):
    """run_diffusers on stand-in modules with the same call signatures, on the CPU: the stage order, the freeing,
    the timing records and the summary, without diffusers."""
    import tempfile
    import types

    import torch

    calls = []

    class TE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.dtype = torch.float32

    def prompt_embeds(te, proc, ids, vis, text_encoder_layer, device, dtype):
        calls.append("te")
        assert proc.create_mm_token_type_ids([ids]) == [[0] * len(ids)] and text_encoder_layer == 50
        return torch.zeros(1, len(ids), 8, dtype=dtype)

    class Tr(torch.nn.Module):
        def forward(self, hidden_states, audio_hidden_states, encoder_hidden_states, timestep, timestep_indices,
                    return_dict, position_ids, token_tags, video_indices, audio_indices, text_indices):
            calls.append("dit")
            assert hidden_states.shape[1] == video_indices.numel() and timestep_indices.numel() == token_tags.numel()
            return hidden_states * 0.5, audio_hidden_states * 0.5

    class Sch:
        def __init__(self, shift):
            self.shift = shift

        def set_timesteps(self, n, device):
            self.timesteps = torch.linspace(0.0, 1.0, n)[:-1]

        def step(self, v, t, x, return_dict):
            return (x + 0.1 * v,)

    class VAE(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.kind = kind
            self.config = types.SimpleNamespace(latents_mean=[0.0] * (24 if kind == "v" else 32),
                                                latents_std=[1.0] * (24 if kind == "v" else 32))

        def decode(self, z, return_dict):
            calls.append(self.kind + "vae")
            if self.kind == "v":
                b, c, t, h, w = z.shape
                return (torch.zeros(b, 3, 4 * t - 3, 16 * h, 16 * w),)
            return (torch.zeros(z.shape[0], 1, 800 * z.shape[2]),)

    def layout(tags, T, H, W, Ta, patch, ch, at, vt):
        L, nv, na = tags.numel(), T * (H // 2) * (W // 2), 2 * Ta
        idx = torch.arange(L + na + nv)
        return (torch.zeros(L + na + nv, 3), torch.cat([tags, torch.full((na,), 2), torch.zeros(nv, dtype=torch.long)]),
                idx[L + na:], idx[L:L + na], idx[:L], 0, 0)

    def row_timesteps(vidx, aidx, ncv, nca, L, t, ta, ct, ca):
        n = vidx.numel() + aidx.numel() + L
        return torch.tensor([t, ta]), torch.zeros(n, dtype=torch.long)

    class VP:
        def postprocess_video(self, v, output_type):
            return v.permute(0, 2, 3, 4, 1).numpy()

    mods = dict(prompt_embeds=prompt_embeds, build_transformer=lambda t, d: (Tr(), 0), layout=layout,
                row_timesteps=row_timesteps, scheduler=Sch, audio_vae=lambda: VAE("a"), video_vae=lambda: VAE("v"),
                video_processor=VP)
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "ids"), "w") as f:
        f.write("tokens: 3\nids: 1,2,3\n")
    with open(os.path.join(d, "te.json"), "w") as f:
        json.dump({"text_config": {"num_hidden_layers": 2}}, f)
    a = argparse.Namespace(size="64x32", frames=22, ids=os.path.join(d, "ids"), te_config=os.path.join(d, "te.json"),
                           steps=3, steps49=False, cap=60)
    global build_text_encoder
    real = build_text_encoder
    build_text_encoder = lambda t, dev, p: (TE(), 2)  # noqa: E731
    try:
        results, info = {}, {}
        run_diffusers(a, torch, mods, results, info)
    finally:
        build_text_encoder = real
    s = summarize(results)
    want = ["te"] * 3 + ["dit"] * 3 + ["avae"] * 3 + ["vvae"] * 2
    ok = calls == want and s["denoise_3"]["calls"] == 3 and info["latent"] == [24, 7, 2, 4] and \
        info["video_out"] == [1, 3, 25, 32, 64] and info["audio_out"] == [1, 2, 800 * 37]
    print("selftest: calls %s; stages %s; latent %s; video %s; audio %s: %s" % (
        calls, sorted(s), info["latent"], info["video_out"], info["audio_out"], "ok" if ok else "FAILED"))
    return 0 if ok else 1


# ---- the table ----------------------------------------------------------------------------------------------------


def fmt(x, unit=" s"):
    return "-" if x is None else ("%.2f%s" % (x, unit))


def h3_stage(r, stage):
    """A stage's time in an h3run run, or how far it got."""
    if not r:
        return None, "not run"
    if stage in r.get("stages", {}):
        return r["stages"][stage], None
    if stage == "video_vae" and r.get("video_vae_estimate_s"):
        return None, "~%.0f s (from %d of %d chunks)" % (r["video_vae_estimate_s"], r["video_chunks"][0],
                                                         r["video_chunks"][1])
    st = r.get("stopped")
    if st and st.get("stage") == stage:
        return None, "> %.0f s (stopped: %s)" % (st.get("stage_s") or 0, st["reason"])
    if st:
        return None, "not reached"
    return None, "failed" if r.get("rc") else "-"


def cmd_table(args):
    def load(name):
        p = os.path.join(args.out, name)
        if os.path.exists(p):
            with open(p) as f:
                return json.load(f)
        return None

    meta = load("e2e_meta.json") or {}
    runs = [("default", load("h3run_default.json")), ("8GiB", load("h3run_8GiB.json"))]
    dif = load("diffusers.json") or {}
    ds = dif.get("stages", {})
    steps = meta.get("steps", 20)
    rows = []

    def diff_time(key):
        v = ds.get(key)
        return v["median_s"] if v else None

    dn = ds.get("denoise_%d" % steps)
    d_step = dn["median_s"] if dn else None
    d_first = dn["first_s"] if dn else None
    d_den = dn["total_s"] if dn and dn["calls"] == steps else None
    d49 = ds.get("denoise_49")
    d_den49 = d49["total_s"] if d49 and d49["calls"] == 49 else (
        d_first + 48 * d_step if d_first is not None and d_step is not None else None)
    d49_note = "measured" if d49 and d49["calls"] == 49 else "estimated: first step + 48 x median step"
    spec = [("text encoder", "text_encoder", diff_time("text_encoder")),
            ("denoise, %d steps" % steps, "dit", d_den),
            ("  per step (median)", None, d_step),
            ("denoise, 49 steps", "dit49", d_den49),
            ("audio VAE decode", "audio_vae", diff_time("audio_vae")),
            ("video VAE decode", "video_vae", (diff_time("video_vae") or 0) + (diff_time("video_postprocess") or 0)
             if ds.get("video_vae") else None)]
    def h3_step(r):
        """Median seconds between the DiT's step events after the first (this script's own clock), else the
        report's figure."""
        t = (r or {}).get("dit_steps") or []
        d = sorted(b - a for a, b in zip(t[1:], t[2:])) if len(t) > 2 else []
        if d:
            return d[len(d) // 2] if len(d) % 2 else 0.5 * (d[len(d) // 2 - 1] + d[len(d) // 2])
        # the progress events' step (a long clip's step runs the DiT once per window), else the report's per call
        return (r.get("dit_step_s") or r.get("step_s")) if r else None

    h3_cols = []
    for label, key, dval in spec:
        cells = []
        for _, r in runs:
            if key is None:
                v, note = h3_step(r), "-"
            elif key == "dit49":
                s = h3_step(r)
                first = (r.get("dit_steps") or [None])[0] if r else None
                v = first + 48 * s if s is not None and first is not None else None
                note = None if v is not None else "-"
            else:
                v, note = h3_stage(r, key)
            cells.append((v, note))
        h3_cols.append(cells)
        ratio = cells[0][0] / dval if cells[0][0] is not None and dval else None
        rows.append([label] + [fmt(v) if v is not None else note for v, note in cells] +
                    [fmt(dval), "%.2fx" % ratio if ratio else "-"])
    # time to clip: the sum of the stages (tokenize and mux included for h3run; the diffusers sum has no mux)
    tot = []
    for _, r in runs:
        ok = r and all(s in r.get("stages", {}) for s in STAGES)
        tot.append(sum(r["stages"].values()) if ok else None)
    dsum = None
    if all(x is not None for x in (diff_time("text_encoder"), d_den, diff_time("audio_vae"), diff_time("video_vae"))):
        dsum = diff_time("text_encoder") + d_den + diff_time("audio_vae") + diff_time("video_vae") + \
            (diff_time("video_postprocess") or 0)
    rows.append(["time to clip, %d steps (sum of stages)" % steps] + [fmt(x) if x is not None else "incomplete"
                                                                      for x in tot] +
                [fmt(dsum), "%.2fx" % (tot[0] / dsum) if tot[0] and dsum else "-"])
    # the whole process, as a user waits for it: start of h3run to the MP4 closed (loading and exit included)
    rows.append(["time to clip, %d steps (h3run process wall)" % steps] +
                [fmt(r.get("wall_s")) if r and r.get("wall_s") is not None else "-" for _, r in runs] +
                ["-", "%.2fx" % (runs[0][1]["wall_s"] / dsum) if runs and runs[0][1] and
                 runs[0][1].get("wall_s") and dsum else "-"])
    # peaks
    prow = []
    for name, r in runs:
        tr = (r or {}).get("trace") or {}
        pk = (r or {}).get("peaks", {}).get("peak, all together")
        pred = tr.get("predicted_peak") / 2**30 if tr.get("predicted_peak") else (pk[0] if pk else None)
        meas = tr.get("measured_peak") / 2**30 if tr.get("measured_peak") else (pk[1] if pk else None)
        prow.append((name, pred, meas, r))
    lines = ["| stage | h3run, default budget | h3run, 8 GiB | diffusers | ratio (default / diffusers) |",
             "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    lines += ["", "| device peak (h3run report) | predicted | measured | difference |", "|---|---|---|---|"]
    for name, pred, meas, r in prow:
        lines.append("| h3run %s, DiT stage | %s | %s | %s |" % (
            name, fmt(pred, " GiB"), fmt(meas, " GiB"),
            "%+.1f%%" % (100 * (meas - pred) / pred) if pred and meas else "-"))
        for label, (p, m) in sorted(((r or {}).get("peaks") or {}).items()):
            if label != "peak, all together":
                lines.append("| h3run %s: %s | %.3f GiB | %.3f GiB | %s |" % (
                    name, label, p, m, "%+.1f%%" % (100 * (m - p) / p) if p else "-"))
    for k in ("text_encoder", "denoise_%d" % steps, "audio_vae", "video_vae"):
        if ds.get(k) and ds[k].get("peak_gib"):
            lines.append("| diffusers %s | - | %.2f GiB | - |" % (k, ds[k]["peak_gib"]))
    notes = ["49 steps: h3run's first step + 48 x its mean later step; diffusers' %s." % d49_note,
             "h3run's stage times include reading its weights from the files; diffusers' modules were built in GPU "
             "memory before each stage (no loading counted). diffusers' times are CUDA-event medians of the calls "
             "after the first (the first carries warm-up); its text encoder ran %s decoder layers." % (
                 (dif.get("info", {}).get("text_encoder") or {}).get("layers", "?"))]
    for name, r in runs:
        if r and r.get("stopped"):
            notes.append("h3run %s stopped: %s." % (name, r["stopped"]["reason"]))
        if r and r.get("rc") not in (0, None) and not r.get("stopped"):
            notes.append("h3run %s failed (exit %s): %s" % (name, r.get("rc"), (r.get("log") or ["?"])[-1]))
    if dif and not dif.get("info", {}).get("ok", False):
        notes.append("diffusers: %s" % dif.get("info", {}).get("error", "did not run"))
    for n in dif.get("info", {}).get("notes", []):
        notes.append("diffusers: %s" % n)
    if meta:
        notes.append("model: %s" % meta.get("model", "?"))
    # with a LoRA (E2E_LORA): each budget's step against the same budget's without it, and its own resident step
    lruns = [(n, load("h3run_lora_%s.json" % n)) for n, _ in runs]
    if any(r for _, r in lruns):
        base = dict(runs)
        lines += ["", "| with a LoRA (%s) | per step (median) | without the LoRA | ratio | vs the LoRA's default "
                      "budget | LoRA bytes on the device (report) |" % meta.get("lora", "?"), "|---|---|---|---|---|---|"]
        lres = h3_step(lruns[0][1]) if lruns[0][1] else None
        for n, r in lruns:
            s_l, s_0 = h3_step(r) if r else None, h3_step(base.get(n)) if base.get(n) else None
            lb = ((r or {}).get("peaks") or {}).get("LoRA factors")
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                n, fmt(s_l), fmt(s_0), "%.3fx" % (s_l / s_0) if s_l and s_0 else "-",
                "%.3fx" % (s_l / lres) if s_l and lres else "-",
                "%.3f GiB predicted, %.3f measured" % (lb[0], lb[1]) if lb else "-"))
    text = "\n".join(lines + [""] + ["- " + n for n in notes])
    summary = dict(meta=meta, h3run={n: r for n, r in runs}, diffusers=dif, table=rows)
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(args.out, "e2e.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd_name", required=True)
    h = sub.add_parser("h3run")
    h.add_argument("--name", required=True)
    h.add_argument("--out", required=True)
    h.add_argument("--cap", type=float, default=300)
    h.add_argument("--vae-host", action="store_true")
    h.add_argument("--trace")
    h.add_argument("cmd", nargs=argparse.REMAINDER)
    d = sub.add_parser("diffusers")
    d.add_argument("--out", required=True)
    d.add_argument("--ids", required=True)
    d.add_argument("--te-config", required=True)
    d.add_argument("--frames", type=int, default=124)
    d.add_argument("--size", default="960x544")
    d.add_argument("--steps", type=int, default=20)
    d.add_argument("--steps49", action="store_true")
    d.add_argument("--cap", type=float, default=300)
    d.add_argument("--allow-cpu", action="store_true")
    t = sub.add_parser("table")
    t.add_argument("--out", required=True)
    sub.add_parser("selftest")
    args = p.parse_args()
    if args.cmd_name == "h3run":
        if args.cmd and args.cmd[0] == "--":
            args.cmd = args.cmd[1:]
        return cmd_h3run(args)
    if args.cmd_name == "diffusers":
        return cmd_diffusers(args)
    if args.cmd_name == "table":
        return cmd_table(args)
    return cmd_selftest(args)


if __name__ == "__main__":
    sys.exit(main())
