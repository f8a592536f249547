"""Training the small model's DiT on the synthetic world (docs/SYNTH.md) with flow matching, on latents of the trained
VAEs' encoders, and proving h3run computes what it learned.

    /usr/bin/python3 tools/train/train_dit.py --data data/vv --template out/h3-tiny --vae out/vv --audio-vae out/av \\
        --out out/dit --steps 300

Everything the DiT sees is what h3run's generate gives it: the text conditioning comes from `h3run encode` on the
template's (or `--init`'s) tokenizer and text encoder (hidden_states[50]; frozen unless `--train-text`, which trains its
embedding and 50 layers with the DiT), the packed layout from
`h3-synth layout` (src/pipeline/layout.c), the video rows in h3_video_patchify's order, the audio rows in
h3_audio_pack's. The DiT is the template's (the release's structure, official layout) run through the project's
reference forward (tools/reference/dit.py). Training pairs: x_t = (1 - sigma)·x0 + sigma·eps with one base time per
example shifted as h3's schedule shifts it (video shift 12, audio 3), target velocity x0 - eps (h3run's convention:
x0 = x_t + sigma·v).

With `--keyframes PACK [PACK ...]` (keyframe_inputs.py: fl2va examples made by `h3run generate --dump-dit-inputs`,
their text states and keyframe rows as generate gives them, or with --reference ref2va examples, a reference image's
rows held the same way) a share of the batches are such examples, each pack's groups drawn by their sizes: their
held rows in front of the noised clip's at a third timestep max(t, 0.999), the loss on the clip's rows only.

At the end the DiT is written in the official layout (export.py) and checked: on one held-out example (and one
held-out keyframe example), `h3run dit` with the exported weights must give the reference forward's velocities
(`--expect`, 1e-4).
"""

import concurrent.futures
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import common  # noqa: E402
import export  # noqa: E402
from dit import forward, load_dit, read_safetensors, write_safetensors  # noqa: E402
import encoders  # noqa: E402
from train_video_vae import frames  # noqa: E402
import qwen3  # noqa: E402

SHIFT_VIDEO, SHIFT_AUDIO = 12.0, 3.0  # src/sample/schedule.h
TEXT_LAYER = 50  # H3 conditions on hidden_states[50]
KEYFRAME_T = 0.999  # keyframe rows' timestep floor (H3_KEYFRAME_T)


def load_text_encoder(folder, dev):
    """A text stack for joint training: canonical weights of the embedding and the layers below TEXT_LAYER
    (float32, trainable; the export keeps the folder's other tensors) and the reference's config."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = qwen3.config_from_json(json.load(f))
    sd = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            sd.update(qwen3.canonical(qwen3.load_safetensors(os.path.join(folder, name))))
    used = {k: v.float().to(dev).clone().requires_grad_(True) for k, v in sd.items()
            if k == "embed_tokens.weight" or int(k.split(".")[1]) < TEXT_LAYER}
    return used, cfg


def shift(sigma, s):
    return s * sigma / (1 + (s - 1) * sigma)


def video_rows(lat):
    """[..., 24, T, H, W] -> [..., T·(H/2)·(W/2), 96]: row (t, i, j), column c·4 + dy·2 + dx (h3_video_patchify)."""
    *b, C, T, H, W = lat.shape
    nb = len(b)
    x = lat.reshape(*b, C, T, H // 2, 2, W // 2, 2)
    x = x.permute(*range(nb), nb + 1, nb + 2, nb + 4, nb, nb + 3, nb + 5)
    return x.reshape(*b, T * (H // 2) * (W // 2), C * 4)


def audio_rows(lat):
    """[..., 2, 32, T_a] -> [..., 2·T_a, 32]: row ch·T_a + k holds lat[ch, :, k] (h3_audio_pack)."""
    x = lat.transpose(-1, -2)
    return x.reshape(*x.shape[:-3], -1, x.shape[-1])


def dit_inputs(lay, L, video, audio, text, tv, ta, n_cond=0):
    """`h3run dit`'s input tensors for one example: its rows, the first L text rows, the video and audio timesteps,
    and the packed layout (lay: `h3-synth layout`'s, or a keyframe group's from keyframe_inputs.py). With n_cond
    keyframe rows (the first n_cond video rows) those rows take a third timestep, max(tv, 0.999), as generate holds
    them (src/pipeline/layout.h)."""
    tags = lay["token_tags"].long()
    tidx = torch.where(tags == 2, 1, 0)
    ts = [tv, ta]
    if n_cond:
        tidx = tidx.index_fill(0, lay["video_indices"][:n_cond].long(), 2)
        ts.append(torch.clamp(tv, min=KEYFRAME_T))
    return {"video": video, "audio": audio, "text": text[:L], "timesteps": torch.stack(ts),
            "timestep_indices": tidx.to(torch.int32), "token_tags": lay["token_tags"],
            "position_ids": lay["position_ids"], "video_indices": lay["video_indices"],
            "audio_indices": lay["audio_indices"], "text_indices": lay["text_indices"]}


def batched_forward(w, cfg, lay, L, n_cond=0):
    """The reference forward over a batch of examples sharing one layout: f(video, audio, text, tv, ta) with a
    leading batch dimension on each, float32 (video: the n_cond keyframe rows, then the target's)."""
    return common.vmap(lambda v, au, t, tv, ta: forward(w, cfg, dit_inputs(lay, L, v, au, t, tv, ta, n_cond),
                                                         dtype=torch.float32))


def load_keyframes(path, caps, dev):
    """keyframe_inputs.py's pack: one group per keyframe kind and text length, each {text [n, L, 64], cond
    [n, rows, 96], clip [n] (indices into this run's clips), the layout}; its captions must be those clips'."""
    t, meta = read_safetensors(path, with_metadata=True)
    pack_caps = json.loads(meta["captions"])
    groups = []
    for i, gc in enumerate(pack_caps):
        g = {k[len(f"g{i}."):]: v for k, v in t.items() if k.startswith(f"g{i}.")}
        clip = g["clip"].long()
        if int(clip.max()) >= len(caps) or [caps[c] for c in clip.tolist()] != gc:
            raise SystemExit(f"{path}: its clips are not this run's (render the same datasets in the same order)")
        groups.append({"text": g["text"].float().to(dev), "cond": g["cond"].float().to(dev), "clip": clip.to(dev),
                       "L": g["text"].shape[1], "n_cond": g["cond"].shape[1],
                       "lay": {k: g[k].to(dev) for k in ("token_tags", "position_ids", "video_indices",
                                                          "audio_indices", "text_indices")}})
    return groups


def load_examples(a, dev):
    """Every clip of the datasets in --data as the DiT sees it: video and audio rows from the frozen encoders, and
    its caption."""
    venc = aenc = None
    V, A, caps = [], [], []
    for folder in a.data:
        shards = common.shards([folder])
        with open(os.path.join(folder, "captions.jsonl")) as f:
            by = {(c["shard"], c["index"]): c["caption"] for c in map(json.loads, f)}
        for si, p in enumerate(shards):
            t = read_safetensors(p)
            vid, snd = t["video"], t["audio"].float()
            if venc is None:
                F, H, W = vid.shape[1], vid.shape[2], vid.shape[3]
                if a.audio_vae:  # the VAE scripts' outputs
                    venc = encoders.load_video_encoder(os.path.join(a.vae, "video_encoder.safetensors")).to(dev)
                    aenc = encoders.load_audio_encoder(os.path.join(a.audio_vae, "audio_encoder.safetensors")).to(dev)
                elif all(os.path.isdir(os.path.join(a.vae, d)) for d in ("video_vae", "audio_vae")):  # a model folder
                    venc, aenc = (e.to(dev) for e in encoders.load_model_encoders(a.vae))
                else:
                    raise SystemExit("--vae is neither a model folder (video_vae/, audio_vae/) nor, with "
                                     "--audio-vae, train_video_vae.py's output")
            elif vid.shape[1:4] != (F, H, W):
                raise SystemExit(f"{p}: clips of another length or size than the first shard's")
            with torch.no_grad():
                for i0 in range(0, vid.shape[0], 32):
                    V.append(video_rows(venc(frames(vid[i0: i0 + 32].to(dev)))))
                    A.append(audio_rows(aenc(snd[i0: i0 + 32].to(dev))))
            caps += [by[(si, i)] for i in range(vid.shape[0])]
    return torch.cat(V), torch.cat(A), caps, (F, H, W)


def text_root(a):
    """The model folder whose tokenizer and text encoder condition the DiT: --init's when it holds a trained text
    encoder (an earlier --train-text run), else the template's."""
    if a.init and os.path.isdir(os.path.join(a.init, "text_encoder")) and os.path.isdir(os.path.join(a.init,
                                                                                                        "tokenizer")):
        return a.init
    return a.template


def encode_captions(a, caps, cache):
    """hidden_states[50] and token ids of every distinct caption from `h3run encode` (the template's tokenizer and
    text encoder), run in parallel: {caption: (hidden [L, 64], ids [L])}. Each is cached as text-<sha1 of the
    caption>.safetensors in cache; a caption found there is not encoded again (a cache made elsewhere, with the same
    text encoder, spares the machine the text encoder)."""
    h3run = common.program("h3run")
    uniq = sorted(set(caps))

    def one(c):
        path = os.path.join(cache, f"text-{hashlib.sha1(c.encode()).hexdigest()}.safetensors")
        if not os.path.exists(path):
            common.run([h3run, "encode", "--model", text_root(a), "--prompt", c, "--out", path + ".tmp"])
            os.replace(path + ".tmp", path)
        t = read_safetensors(path)
        return t["hidden"].float(), t["input_ids"].long()

    with concurrent.futures.ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as ex:
        hidden = list(ex.map(one, uniq))
    return dict(zip(uniq, hidden))


def main():
    ap = common.parser(__doc__, steps=300, batch=4, lr=3e-4)
    ap.add_argument("--vae", required=True, help="train_video_vae.py's output folder (video_encoder.safetensors), or "
                    "without --audio-vae a model folder (its video_vae/ and audio_vae/ encoders)")
    ap.add_argument("--audio-vae", help="train_audio_vae.py's output folder (audio_encoder.safetensors)")
    ap.add_argument("--pan-weight", type=float, default=0.0, help="extra loss on the difference of the two audio "
                    "channels' velocities (the stereo pan, a small part of the audio latents)")
    ap.add_argument("--train-text", action="store_true", help="train the text encoder's embedding and first 50 "
                    "layers with the DiT (default: frozen, its h3run encode outputs cached)")
    ap.add_argument("--text-lr", type=float, default=0.3, help="the text encoder's learning rate, as a fraction of "
                    "--lr")
    ap.add_argument("--ema", type=float, default=0.999, help="decay of the exported moving average of the weights")
    ap.add_argument("--keyframes", nargs="+", help="keyframe_inputs.py's packs for these --data folders: fl2va "
                    "examples (the clip's first frame, last frame or both given as keyframes) or ref2va ones (its "
                    "--reference packs: a reference image), mixed with the text-only ones")
    ap.add_argument("--keyframe-share", type=float, default=0.5, help="with --keyframes: the share of batches of "
                    "keyframe examples")
    a = ap.parse_args()
    out = common.setup(a)
    dev = a.device
    cache = os.path.join(out, "cache")
    os.makedirs(cache, exist_ok=True)
    h3synth = common.program("h3-synth")

    V, A, caps, (F, H, W) = load_examples(a, dev)
    kf = [g for p in a.keyframes for g in load_keyframes(p, caps, dev)] if a.keyframes else []
    if a.train_text and kf:
        raise SystemExit("--keyframes trains the DiT with the text encoder frozen (its states come from the pack)")
    enc = encode_captions(a, caps, cache)
    texts = {c: h.to(dev) for c, (h, _) in enc.items()}
    # the examples by prompt length: one batch shares one layout (h3-synth layout, src/pipeline/layout.c)
    buckets, layouts = {}, {}
    for i, c in enumerate(caps):
        buckets.setdefault(texts[c].shape[0], []).append(i)
    for L in buckets:
        path = os.path.join(cache, f"layout-{L}.safetensors")
        common.run([h3synth, "layout", path, "--text-tokens", str(L), "--frames", str(F), "--size", f"{W}x{H}"])
        layouts[L] = {k: v.to(dev) for k, v in read_safetensors(path).items()}
    # h3run's audio latents: floor(seconds x 40) frames per channel (the encoder covers the last partial frame too)
    n_ta = layouts[next(iter(layouts))]["audio_indices"].shape[0] // 2
    A = A.reshape(A.shape[0], 2, -1, A.shape[-1])[:, :, :n_ta].reshape(A.shape[0], 2 * n_ta, A.shape[-1])
    held = len(caps) - 1  # the last example is kept for the check of the export
    if kf:  # so is the last keyframe example (the last of the last group: a group trains on its first n_train), and
        # its clip
        for g in kf:
            g["n_train"] = g["clip"].shape[0] - (g is kf[-1])
        kf_held = (kf[-1], kf[-1]["n_train"])
        held_clips = {held, int(kf[-1]["clip"][-1])}
        kf_weights = torch.tensor([float(g["n_train"]) for g in kf])
        print(f"keyframes: {int(kf_weights.sum())} training examples in {len(kf)} groups (kind, text length); "
              f"{a.keyframe_share:.0%} of the batches", flush=True)
    else:
        held_clips = {held}
    # the text-only examples trained on (the held-out clips left out), and each prompt length's
    train_ex = [i for i in range(len(caps)) if i not in held_clips]
    pools = {L: torch.tensor([i for i in b if i not in held_clips], device=dev) for L, b in buckets.items()}
    example_len = torch.tensor([texts[c].shape[0] for c in caps])
    cap_index = {c: k for k, c in enumerate(texts)}
    T = torch.nn.utils.rnn.pad_sequence([texts[c] for c in texts], batch_first=True)  # [captions, Lmax, 64]
    ex_cap = torch.tensor([cap_index[c] for c in caps], device=dev)
    IDS = torch.nn.utils.rnn.pad_sequence([enc[c][1] for c in texts], batch_first=True).to(dev)  # [captions, Lmax]
    if a.train_text:
        tw, tcfg = load_text_encoder(os.path.join(text_root(a), "text_encoder"), dev)
        text_of = common.vmap(lambda ids: qwen3.hidden_states(tw, tcfg, ids, TEXT_LAYER, torch.float32)[-1])
        # the reference text stack is what h3run encode computes (in full float32, as h3run computes it)
        with torch.no_grad(), common.full_float32():
            c0 = next(iter(texts))
            ref = text_of(IDS[:1, : texts[c0].shape[0]])[0]
            d = (ref - texts[c0]).abs().max().item() / texts[c0].abs().max().item()
            if d > 1e-3:
                raise SystemExit(f"the reference text encoder differs from h3run encode by {d:.1e} (relative)")
            print(f"text encoder: trained with the DiT (embedding and layers 0-{TEXT_LAYER - 1}); the reference "
                  f"matches h3run encode to {d:.1e}", flush=True)

    w32, cfg = load_dit(os.path.join(a.init or a.template, "transformer"), dtype=torch.float32)
    w = {k: v.to(dev).clone().requires_grad_(k != "rope.inv_freq") for k, v in w32.items()}
    trained = [v for v in w.values() if v.requires_grad]
    groups = [{"params": trained, "scale": 1.0}]
    if a.train_text:
        groups.append({"params": list(tw.values()), "scale": a.text_lr})
        trained = trained + list(tw.values())
    opt = torch.optim.AdamW(groups, lr=a.lr, weight_decay=0.0)
    ema = common.Ema(w, a.ema)
    ema_text = common.Ema(tw, a.ema) if a.train_text else None
    print(f"DiT: {sum(v.numel() for v in w.values()):,} parameters; {held} training examples ({F} frames at {W}x{H}: "
          f"{V.shape[1]} video and {A.shape[1]} audio rows), {len(texts)} distinct captions, {len(buckets)} prompt "
          f"lengths; batch {a.batch} on {dev}", flush=True)


    # the batched forward is the reference forward: one batch against the same examples one at a time (in full
    # float32: TF32's rounding of a trained DiT's products alone reaches the tolerance)
    with torch.no_grad(), common.full_float32():
        L = max(buckets, key=lambda n: len(buckets[n]))  # a batch of two (one example twice when none has two)
        idx = (buckets[L] * 2)[:2]
        tv, ta = torch.tensor([0.3, 0.8]), torch.tensor([0.6, 0.9])
        bv, ba = batched_forward(w, cfg, layouts[L], L)(V[idx], A[idx], T[ex_cap[idx]], tv, ta)
        for j, i in enumerate(idx):
            ov, oa = forward(w, cfg, dit_inputs(layouts[L], L, V[i], A[i], texts[caps[i]], tv[j], ta[j]),
                             dtype=torch.float32)
            d = max((bv[j] - ov).abs().max().item(), (ba[j] - oa).abs().max().item())
            if d > 1e-3 * max(ov.abs().max().item(), 1.0):
                raise SystemExit(f"the batched forward differs from the reference forward by {d:.2e}")

    clock = common.Clock(a)
    warm, kf_loss = 200, None
    while clock.step():
        step = clock.n
        frac = clock.elapsed() / (a.minutes * 60) if a.minutes else step / a.steps
        lr = a.lr * min(1.0, step / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr * g["scale"]
        g = None
        if kf and torch.rand(()).item() < a.keyframe_share:
            g = kf[torch.multinomial(kf_weights, 1).item()]
            j = torch.randint(0, g["n_train"], (a.batch,), device=dev)
            idx, L, lay, n_cond = g["clip"][j], g["L"], g["lay"], g["n_cond"]
            text = g["text"][j]
        else:
            L = int(example_len[train_ex[torch.randint(0, len(train_ex), ()).item()]])
            pool = pools[L]
            idx = pool[torch.randint(0, len(pool), (a.batch,), device=dev)]
            lay, n_cond = layouts[L], 0
            text = text_of(IDS[ex_cap[idx], :L]) if a.train_text else T[ex_cap[idx]]
        x0v, x0a = V[idx], A[idx]
        u = torch.rand(a.batch) * 0.998 + 0.001
        sv, sa = shift(u, SHIFT_VIDEO), shift(u, SHIFT_AUDIO)
        ev, ea = torch.randn_like(x0v), torch.randn_like(x0a)
        xv = (1 - sv[:, None, None]) * x0v + sv[:, None, None] * ev
        xa = (1 - sa[:, None, None]) * x0a + sa[:, None, None] * ea
        if n_cond:
            xv = torch.cat([g["cond"][j], xv], 1)
        vv, va = batched_forward(w, cfg, lay, L, n_cond)(xv, xa, text, 1 - sv, 1 - sa)
        vv = vv[:, n_cond:]
        lv, la = ((vv - (x0v - ev)) ** 2).mean(), ((va - (x0a - ea)) ** 2).mean()
        loss = lv + la
        if a.pan_weight:
            da, dt = va.reshape(a.batch, 2, n_ta, -1), (x0a - ea).reshape(a.batch, 2, n_ta, -1)
            lp = (((da[:, 0] - da[:, 1]) - (dt[:, 0] - dt[:, 1])) ** 2).mean()
            loss = loss + a.pan_weight * lp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        ema.update(w, step)
        if ema_text:
            ema_text.update(tw, step)
        if n_cond:
            kf_loss = lv.item()
        if step % 100 == 0 or step == 1:
            print(f"step {step}: velocity MSE video {lv.item():.4f} audio {la.item():.4f}"
                  f"{f' (last keyframe batch: video {kf_loss:.4f})' if kf_loss is not None else ''}"
                  f"{f' (channel difference {lp.item():.4f})' if a.pan_weight else ''}, lr {lr:.1e}, "
                  f"{clock.elapsed():.0f} s", flush=True)

    # the exports and their checks on the CPU (the checks in full precision: what h3run computes)
    if dev != "cpu":
        torch.set_default_device("cpu")
    final = {k: v.detach() for k, v in ema.w.items()}
    export.export_dit({k: v.cpu().double() for k, v in final.items()}, os.path.join(a.template, "transformer"),
                      os.path.join(out, "transformer"))
    text_check = None
    if a.train_text:
        # the text encoder in the official layout (the template's other tensors kept), the tokenizer beside it, and
        # the check: h3run encode with the export against the reference on the stored (bf16) weights
        export.export_text_encoder({k: v.detach().cpu().double() for k, v in ema_text.w.items()},
                                   os.path.join(text_root(a), "text_encoder"), os.path.join(out, "text_encoder"))
        shutil.copytree(os.path.join(text_root(a), "tokenizer"), os.path.join(out, "tokenizer"), dirs_exist_ok=True)
        path = os.path.join(out, "check_text.safetensors")
        common.run([common.program("h3run"), "encode", "--model", out, "--prompt", caps[held], "--out", path])
        got = read_safetensors(path)
        stored, _ = load_text_encoder(os.path.join(out, "text_encoder"), "cpu")
        with torch.no_grad():
            ref = qwen3.hidden_states({k: v.detach() for k, v in stored.items()}, tcfg, got["input_ids"].long(),
                                      TEXT_LAYER)[-1]
        text_check = (got["hidden"].double() - ref).abs().max().item() / ref.abs().max().item()
        ok_t = text_check <= 1e-4
        print(f"{'ok  ' if ok_t else 'FAIL'} h3run encode with the exported text encoder against the reference: "
              f"max |diff| / max |ref| {text_check:.1e} (at most 1e-04)", flush=True)
        texts[caps[held]] = got["hidden"].float()
    # the check: h3run dit with the exported weights against the reference forward on the same stored weights (the
    # export rounds to the template's dtypes: bf16 with the release's f32 islands), on the held-out example (and the
    # held-out keyframe example)
    stored, _ = load_dit(os.path.join(out, "transformer"))
    g = torch.Generator().manual_seed(7)

    def half_noised(x):
        return x.cpu().double() * 0.5 + 0.5 * torch.randn(x.shape, generator=g, dtype=torch.float64)

    L = int(example_len[held])
    checks = [("", {k: v.cpu() for k, v in layouts[L].items()}, L, texts[caps[held]], held, None)]
    if kf:
        kg, kj = kf_held
        checks.append(("keyframes ", {k: v.cpu() for k, v in kg["lay"].items()}, kg["L"], kg["text"][kj],
                       int(kg["clip"][kj]), kg["cond"][kj]))
    ok = text_check is None or text_check <= 1e-4
    for what, lay, L, text, ex, cond in checks:
        video = half_noised(V[ex])
        if cond is not None:
            video = torch.cat([cond.cpu().double(), video])
        with torch.no_grad():
            inp = dit_inputs(lay, L, video, half_noised(A[ex]), text.cpu().double(), torch.tensor(0.5),
                             torch.tensor(0.7), 0 if cond is None else cond.shape[0])
            inp = {k: (v.float() if v.dtype == torch.float64 and k != "position_ids" else v) for k, v in inp.items()}
            vv, va = forward(stored, cfg, inp, dtype=torch.float64)
        stem = os.path.join(out, "check_" + ("keyframes_" if cond is not None else ""))
        ip, ep, op = (f"{stem}{n}.safetensors" for n in ("inputs", "expected", "h3run"))
        write_safetensors(ip, {k: common.cpu(v) for k, v in inp.items()})
        write_safetensors(ep, {"video_velocity": common.cpu(vv.float()), "audio_velocity": common.cpu(va.float())})
        # h3run's own comparison (--expect): max |diff| relative to the largest velocity, at most 1e-4
        r = subprocess.run([common.program("h3run"), "dit", "--model", os.path.join(out, "transformer"), "--inputs",
                            ip, "-o", op, "--expect", ep, "--tol", "1e-4"], capture_output=True, text=True)
        ok = ok and r.returncode == 0
        last = (r.stdout + r.stderr).strip().splitlines()
        print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} h3run dit with the exported DiT against the reference "
              f"forward, {what}example: {last[-1] if last else ''}", flush=True)
    with open(os.path.join(out, "dit_train.json"), "w") as f:
        json.dump({"steps": clock.n, "seconds": round(clock.elapsed()), "examples": held, "batch": a.batch,
                   "final_loss_video": lv.item() if clock.n else None, "final_loss_audio": la.item() if clock.n else None,
                   "text_trained": a.train_text, "keyframe_examples": int(kf_weights.sum()) if kf else 0,
                   "text_check": text_check, "h3run_matches": ok}, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
