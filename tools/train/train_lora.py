"""LoRAs for the small model (models/h3-small), trained on the synthetic world, and the proof that h3run applies them
as they were trained.

    # a LoRA that makes every shape bounce, the captions unchanged (DATA: h3-synth dataset --motion bounce)
    /usr/bin/python3 tools/train/train_lora.py --model models/h3-small --data DATA... --out out/bounce --rank 16 \\
        --name h3-small_bounce
    # a step-distilled ("turbo") LoRA for 4 steps: the base model's 48-step trajectories distilled into 4
    /usr/bin/python3 tools/train/train_lora.py --model models/h3-small --data DATA... --out out/turbo --rank 32 \\
        --turbo 4 --name h3-small_turbo_4step

The base DiT (the model's transformer/, frozen) gets low-rank factors on every block's fused QKV, out projection, fc1
and fc2: W' = W + B·A (rank r, alpha = r, so strength 1 is B·A itself; B starts at zero). The text conditioning, the
packed layout, the rows and the forward are train_dit.py's (h3run encode, h3-synth layout, tools/reference/dit.py).

- Plain (the default): flow matching on --data's clips, encoded by the model's own VAE encoders (video_vae/ and
  audio_vae/, read as h3run reads them), as train_dit.py trains the DiT.
- --turbo N: no clips are used, only --data's captions. For each caption and a random noise the base model's
  trajectory is integrated with Euler on h3run's h3 schedule (video shift 12, audio 3) at --teacher-steps calls (a
  multiple of N: the N-step grid is part of it), and its states at the N-step grid are kept. The student (base +
  LoRA) learns, at grid point k, the velocity that takes the teacher's state k to its state k + 1 in one Euler step:
  v = (x_{k+1} - x_k) / (sigma_k - sigma_{k+1}), per modality. With the LoRA, h3run's Euler at N steps then follows
  the teacher's trajectory. Name the file with "turbo_4step" (or "turbo_8step") and h3run takes the matching preset
  (src/pipeline/turbo.h: N steps, shifts 12 / 3, the small model's own).

The LoRA is written as NAME.safetensors in the official naming (`blocks.N.attn.qkv_proj.lora_A.weight`, `[Q; K; V]`
rows, bf16, no alpha: alpha = rank) and checked: `h3run dit --lora` on the stored model must give the reference
forward with the merged factors (1e-4 of the largest velocity).
"""

import json
import math
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import common  # noqa: E402
import encoders  # noqa: E402
from dit import forward, load_dit, read_safetensors, write_safetensors  # noqa: E402
from train_dit import (SHIFT_AUDIO, SHIFT_VIDEO, audio_rows, batched_forward, dit_inputs,  # noqa: E402
                       encode_captions, shift, video_rows)
from train_video_vae import frames  # noqa: E402

TARGETS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")


def load_clips(a, dev, want_clips):
    """--data's captions and (when want_clips) their clips as the DiT sees them: the rows of the model's encoders."""
    V, A, caps, size = [], [], [], None
    venc = aenc = None
    for folder in a.data:
        with open(os.path.join(folder, "captions.jsonl")) as f:
            rows = [json.loads(x) for x in f]
        by = {(c["shard"], c["index"]): c["caption"] for c in rows}
        for si, p in enumerate(common.shards([folder])):
            t = read_safetensors(p)
            vid = t["video"]
            if size is None:
                size = tuple(vid.shape[1:4])
            elif tuple(vid.shape[1:4]) != size:
                raise SystemExit(f"{p}: clips of another length or size than the first shard's")
            caps += [by[(si, i)] for i in range(vid.shape[0])]
            if not want_clips:
                continue
            if venc is None:
                venc, aenc = (e.to(dev) for e in encoders.load_model_encoders(a.model))
            with torch.no_grad():
                for i0 in range(0, vid.shape[0], 32):
                    V.append(video_rows(venc(frames(vid[i0: i0 + 32].to(dev)))))
                    A.append(audio_rows(aenc(t["audio"][i0: i0 + 32].float().to(dev))))
    return (torch.cat(V) if V else None), (torch.cat(A) if A else None), caps, size


def lora_weights(w, factors):
    """The DiT's weights with every factor pair merged: W + B·A."""
    out = dict(w)
    for name, (fa, fb) in factors.items():
        out[name + ".weight"] = w[name + ".weight"] + fb @ fa
    return out


def main():
    ap = common.parser(__doc__, steps=1000, batch=32, lr=1e-3, template=False)
    ap.add_argument("--model", required=True, help="the model folder the LoRA is for (official layout)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--name", required=True, help="the LoRA file's name, without .safetensors")
    ap.add_argument("--turbo", type=int, default=0, help="distil the base model's trajectories into this many steps")
    ap.add_argument("--teacher-steps", type=int, default=48, help="the teacher's Euler calls (a multiple of --turbo)")
    ap.add_argument("--trajectories", type=int, default=4096, help="--turbo: teacher trajectories to learn from")
    a = ap.parse_args()
    a.init = a.template = a.model  # train_dit's text_root(): the model's tokenizer and text encoder
    out = common.setup(a)
    dev = a.device
    cache = os.path.join(out, "cache")
    os.makedirs(cache, exist_ok=True)
    if a.turbo and (a.teacher_steps % a.turbo or a.turbo < 1):
        raise SystemExit(f"--teacher-steps {a.teacher_steps} is not a multiple of --turbo {a.turbo}")

    V, A, caps, (F, H, W) = load_clips(a, dev, not a.turbo)
    enc = encode_captions(a, caps, cache)
    texts = {c: h.to(dev) for c, (h, _) in enc.items()}
    buckets, layouts = {}, {}
    for i, c in enumerate(caps):
        buckets.setdefault(texts[c].shape[0], []).append(i)
    for L in buckets:
        path = os.path.join(cache, f"layout-{L}.safetensors")
        common.run([common.program("h3-synth"), "layout", path, "--text-tokens", str(L), "--frames", str(F), "--size",
                    f"{W}x{H}"])
        layouts[L] = {k: v.to(dev) for k, v in read_safetensors(path).items()}
    lay0 = layouts[next(iter(layouts))]
    n_ta = lay0["audio_indices"].shape[0] // 2
    n_v = lay0["video_indices"].shape[0]
    if A is not None:
        A = A.reshape(A.shape[0], 2, -1, A.shape[-1])[:, :, :n_ta].reshape(A.shape[0], 2 * n_ta, A.shape[-1])
    cap_index = {c: k for k, c in enumerate(texts)}
    T = torch.nn.utils.rnn.pad_sequence([texts[c] for c in texts], batch_first=True)
    ex_cap = torch.tensor([cap_index[c] for c in caps], device=dev)
    example_len = torch.tensor([texts[c].shape[0] for c in caps])

    w32, cfg = load_dit(os.path.join(a.model, "transformer"), dtype=torch.float32)
    w = {k: v.to(dev) for k, v in w32.items()}
    factors = {}
    for i in range(cfg["num_layers"]):
        for t in TARGETS:
            name = f"blocks.{i}.{t}"
            out_f, in_f = w[name + ".weight"].shape
            fa = (torch.rand(a.rank, in_f) * 2 - 1) / math.sqrt(in_f)  # peft's kaiming-uniform bound, B = 0
            factors[name] = (fa.to(dev).requires_grad_(True), torch.zeros(out_f, a.rank, device=dev,
                                                                             requires_grad=True))
    params = [p for pair in factors.values() for p in pair]
    print(f"LoRA rank {a.rank} on {len(factors)} weights: {sum(p.numel() for p in params):,} parameters; "
          f"{len(caps)} captions ({len(texts)} distinct), {F} frames at {W}x{H}", flush=True)


    def model(weights, lay, L):
        return batched_forward(weights, cfg, lay, L)

    # --turbo: the teacher's trajectories at the N-step grid (states 0..N, state N the teacher's x0)
    if a.turbo:
        N, M = a.turbo, a.teacher_steps
        base = torch.linspace(1, 0, M + 1, dtype=torch.float64)
        sv_all = shift(base, SHIFT_VIDEO).float().to(dev)
        sa_all = shift(base, SHIFT_AUDIO).float().to(dev)
        grid = list(range(0, M + 1, M // N))
        G_sv, G_sa = sv_all[grid], sa_all[grid]
        picks = torch.randint(0, len(caps), (a.trajectories,))
        XV = torch.empty(a.trajectories, N + 1, n_v, 96, device=dev)
        XA = torch.empty(a.trajectories, N + 1, 2 * n_ta, 32, device=dev)
        traj_cap = torch.empty(a.trajectories, dtype=torch.long, device=dev)
        traj_len = torch.empty(a.trajectories, dtype=torch.long)
        order = sorted(range(a.trajectories), key=lambda j: int(example_len[picks[j]]))
        clock0 = common.Clock(a)
        with torch.no_grad():
            for j0 in range(0, a.trajectories, 256):
                js = order[j0: j0 + 256]
                by_len = {}
                for j in js:
                    by_len.setdefault(int(example_len[picks[j]]), []).append(j)
                for L, jl in by_len.items():
                    idx = torch.tensor(jl, device=dev)
                    ci = ex_cap[picks[jl]]
                    xv = torch.randn(len(jl), n_v, 96, device=dev)
                    xa = torch.randn(len(jl), 2 * n_ta, 32, device=dev)
                    f = model(w, layouts[L], L)
                    XV[idx, 0], XA[idx, 0] = xv, xa
                    for s in range(M):
                        one = torch.ones(len(jl), device=dev)
                        vv, va = f(xv, xa, T[ci], one * (1 - sv_all[s]), one * (1 - sa_all[s]))
                        xv = xv + (sv_all[s] - sv_all[s + 1]) * vv
                        xa = xa + (sa_all[s] - sa_all[s + 1]) * va
                        if (s + 1) in grid:
                            k = grid.index(s + 1)
                            XV[idx, k], XA[idx, k] = xv, xa
                    traj_cap[idx] = ci
                    traj_len[jl] = L
        print(f"teacher: {a.trajectories} trajectories of {M} Euler calls in {clock0.elapsed():.0f} s; the grid's "
              f"sigmas video {[round(x, 4) for x in G_sv.tolist()]}, audio {[round(x, 4) for x in G_sa.tolist()]}",
              flush=True)
        tbuckets = {}
        for j in range(a.trajectories):
            tbuckets.setdefault(int(traj_len[j]), []).append(j)

    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    ema = common.Ema({k + s: p for k, (fa, fb) in factors.items() for s, p in ((".A", fa), (".B", fb))}, 0.995)
    clock = common.Clock(a)
    warm = 100
    lv = la = torch.tensor(0.0)
    while clock.step():
        step = clock.n
        frac = clock.elapsed() / (a.minutes * 60) if a.minutes else step / a.steps
        lr = a.lr * min(1.0, step / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        weff = lora_weights(w, factors)
        if a.turbo:
            L = int(traj_len[torch.randint(0, a.trajectories, ()).item()])
            pool = torch.tensor(tbuckets[L], device=dev)
            j = pool[torch.randint(0, len(pool), (a.batch,), device=dev)]
            k = torch.randint(0, a.turbo, (a.batch,), device=dev)
            xv, xa = XV[j, k], XA[j, k]
            sv0, sv1, sa0, sa1 = G_sv[k], G_sv[k + 1], G_sa[k], G_sa[k + 1]
            tv_ = (XV[j, k + 1] - xv) / (sv0 - sv1)[:, None, None]
            ta_ = (XA[j, k + 1] - xa) / (sa0 - sa1)[:, None, None]
            vv, va = model(weff, layouts[L], L)(xv, xa, T[traj_cap[j]], 1 - sv0, 1 - sa0)
        else:
            L = int(example_len[torch.randint(0, len(caps), ()).item()])
            pool = torch.tensor(buckets[L], device=dev)
            idx = pool[torch.randint(0, len(pool), (a.batch,), device=dev)]
            x0v, x0a = V[idx], A[idx]
            u = torch.rand(a.batch) * 0.998 + 0.001
            sv, sa = shift(u, SHIFT_VIDEO).to(dev), shift(u, SHIFT_AUDIO).to(dev)
            ev, ea = torch.randn_like(x0v), torch.randn_like(x0a)
            xv = (1 - sv[:, None, None]) * x0v + sv[:, None, None] * ev
            xa = (1 - sa[:, None, None]) * x0a + sa[:, None, None] * ea
            tv_, ta_ = x0v - ev, x0a - ea
            vv, va = model(weff, layouts[L], L)(xv, xa, T[ex_cap[idx]], 1 - sv, 1 - sa)
        lv, la = ((vv - tv_) ** 2).mean(), ((va - ta_) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        (lv + la).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema.update({k + s: p for k, (fa, fb) in factors.items() for s, p in ((".A", fa), (".B", fb))}, step)
        if step % 100 == 0 or step == 1:
            print(f"step {step}: velocity MSE video {lv.item():.4f} audio {la.item():.4f}, lr {lr:.1e}, "
                  f"{clock.elapsed():.0f} s", flush=True)

    # the export (bf16, official names) and its check on the CPU in full precision
    if dev != "cpu":
        torch.set_default_device("cpu")
    lora = {}
    for name in factors:
        lora[name + ".lora_A.weight"] = ema.w[name + ".A"].detach().cpu().to(torch.bfloat16).contiguous()
        lora[name + ".lora_B.weight"] = ema.w[name + ".B"].detach().cpu().to(torch.bfloat16).contiguous()
    lpath = os.path.join(out, a.name + ".safetensors")
    write_safetensors(lpath, lora)
    stored, _ = load_dit(os.path.join(a.model, "transformer"))
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        c = caps[-1]
        L = texts[c].shape[0]
        lay = {k: v.cpu() for k, v in layouts[L].items()}
        inp = dit_inputs(lay, L, torch.randn(n_v, 96, generator=g, dtype=torch.float64),
                     torch.randn(2 * n_ta, 32, generator=g, dtype=torch.float64), texts[c].cpu().double(),
                     torch.tensor(0.5), torch.tensor(0.7))
        inp = {k: (v.float() if v.dtype == torch.float64 and k != "position_ids" else v) for k, v in inp.items()}
        bv, _ = forward(stored, cfg, inp, dtype=torch.float64)
    ip = os.path.join(out, "check_inputs.safetensors")
    write_safetensors(ip, {k: common.cpu(v) for k, v in inp.items()})

    def check(path, factors_bf16, what):
        """h3run dit --lora PATH (the side path: f32 on the CPU, so no bf16 rounding of merged weights) against the
        reference forward with the factors merged into the stored weights, in float64."""
        merged = dict(stored)
        for name in factors:
            merged[name + ".weight"] = stored[name + ".weight"] + (factors_bf16[name + ".lora_B.weight"].double()
                                                                  @ factors_bf16[name + ".lora_A.weight"].double())
        with torch.no_grad():
            vv, va = forward(merged, cfg, inp, dtype=torch.float64)
        change = ((vv - bv).norm() / bv.norm()).item()
        ep, op = path + ".expected", path + ".h3run"
        write_safetensors(ep, {"video_velocity": common.cpu(vv.float()), "audio_velocity": common.cpu(va.float())})
        r = subprocess.run([common.program("h3run"), "dit", "--model", os.path.join(a.model, "transformer"), "--inputs",
                            ip, "-o", op, "--expect", ep, "--tol", "1e-4", "--lora", path, "--lora-mode", "side"],
                           capture_output=True, text=True)
        last = (r.stdout + r.stderr).strip().splitlines()
        print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} h3run dit --lora {what} against the reference forward with "
              f"the factors merged (they change the video velocity by {change:.3f} relative): "
              f"{last[-1] if last else ''}", flush=True)
        return r.returncode == 0, change

    # the trained factors, and random ones of the same names and shapes (a check that holds however little the
    # training moved the factors: the names and the [Q; K; V] rows are what h3run reads)
    ok, change = check(lpath, lora, os.path.basename(lpath))
    g = torch.Generator().manual_seed(11)
    rnd = {k: (torch.randn(v.shape, generator=g) * (0.05 if ".lora_B." in k else 1 / math.sqrt(v.shape[1])))
           .to(torch.bfloat16) for k, v in lora.items()}
    rpath = os.path.join(out, "check_random_lora.safetensors")
    write_safetensors(rpath, rnd)
    ok_r, _ = check(rpath, rnd, "with random factors of the same names")
    ok = ok and ok_r
    with open(os.path.join(out, a.name + "_train.json"), "w") as f:
        json.dump({"steps": clock.n, "seconds": round(clock.elapsed()), "rank": a.rank, "turbo": a.turbo,
                   "teacher_steps": a.teacher_steps if a.turbo else None, "batch": a.batch, "captions": len(caps),
                   "final_loss_video": lv.item(), "final_loss_audio": la.item(), "velocity_change": change,
                   "h3run_matches": ok}, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
