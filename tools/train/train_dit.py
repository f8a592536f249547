"""Training the small model's DiT on the synthetic world (docs/SYNTH.md) with flow matching, on latents of the trained
VAEs' encoders, and proving h3run computes what it learned.

    /usr/bin/python3 tools/train/train_dit.py --data data/vv --template out/h3-tiny --vae out/vv --audio-vae out/av \\
        --out out/dit --steps 300

Everything the DiT sees is what h3run's generate gives it: the text conditioning comes from `h3run encode` on the
template's tokenizer and text encoder (hidden_states[50]; the text model is frozen here), the packed layout from
`h3-synth layout` (src/pipeline/layout.c), the video rows in h3_video_patchify's order, the audio rows in
h3_audio_pack's. The DiT is the template's (the release's structure, official layout) run through the project's
reference forward (tools/reference/dit.py). Training pairs: x_t = (1 - sigma)·x0 + sigma·eps with one base time per
example shifted as h3's schedule shifts it (video shift 12, audio 3), target velocity x0 - eps (h3run's convention:
x0 = x_t + sigma·v).

At the end the DiT is written in the official layout (export.py) and checked: on one held-out example, `h3run dit`
with the exported weights must give the reference forward's velocities (`--expect`, 1e-4).
"""

import glob
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import common  # noqa: E402
import export  # noqa: E402
from dit import forward, load_dit, read_safetensors, write_safetensors  # noqa: E402
from train_audio_vae import Encoder as AudioEncoder  # noqa: E402
from train_video_vae import Encoder as VideoEncoder  # noqa: E402

SHIFT_VIDEO, SHIFT_AUDIO = 12.0, 3.0  # src/sample/schedule.h


def shift(sigma, s):
    return s * sigma / (1 + (s - 1) * sigma)


def video_rows(lat):
    """[24, T, H, W] -> [T·(H/2)·(W/2), 96]: row (t, i, j), column c·4 + dy·2 + dx (h3_video_patchify)."""
    C, T, H, W = lat.shape
    return lat.reshape(C, T, H // 2, 2, W // 2, 2).permute(1, 2, 4, 0, 3, 5).reshape(T * (H // 2) * (W // 2), C * 4)


def audio_rows(lat):
    """[2, 32, T_a] -> [2·T_a, 32]: row ch·T_a + k holds lat[ch, :, k] (h3_audio_pack)."""
    return lat.permute(0, 2, 1).reshape(-1, lat.shape[1])


def main():
    ap = common.parser(__doc__, steps=300, batch=4, lr=3e-4)
    ap.add_argument("--vae", required=True, help="train_video_vae.py's output folder (video_encoder.safetensors)")
    ap.add_argument("--audio-vae", required=True, help="train_audio_vae.py's output folder (audio_encoder.safetensors)")
    a = ap.parse_args()
    out = common.setup(a)
    h3run, h3synth = common.program("h3run"), common.program("h3-synth")
    cache = os.path.join(out, "cache")
    os.makedirs(cache, exist_ok=True)

    # data: clips, captions, and the latents of the frozen encoders
    shards = sorted(glob.glob(os.path.join(a.data, "shard-*.safetensors")))
    with open(os.path.join(a.data, "captions.jsonl")) as f:
        caps = [json.loads(line) for line in f]
    venc_sd = read_safetensors(os.path.join(a.vae, "video_encoder.safetensors"))
    F = read_safetensors(shards[0])["video"].shape[1]
    Lv = (F - 5) // 17 * 5 + 2
    venc = VideoEncoder(F, Lv)
    venc.load_state_dict({k: v.float() for k, v in venc_sd.items()})
    aenc = AudioEncoder()
    aenc.load_state_dict({k: v.float() for k, v in read_safetensors(os.path.join(a.audio_vae,
                                                                                  "audio_encoder.safetensors")).items()})
    examples = []
    with torch.no_grad():
        for si, p in enumerate(shards):
            t = read_safetensors(p)
            vid = t["video"].permute(0, 4, 1, 2, 3).float() / 255.0
            for i in range(vid.shape[0]):
                c = next(x for x in caps if x["shard"] == si and x["index"] == i)
                v = video_rows(venc(vid[i])).double()
                au = audio_rows(torch.stack([aenc(t["audio"][i, ch].float()) for ch in range(2)])).double()
                examples.append({"caption": c["caption"], "video": v, "audio": au})
    H, W = vid.shape[3], vid.shape[4]
    # text conditioning from h3run encode, and the layout of each prompt length from h3-synth layout
    texts, layouts = {}, {}
    for e in examples:
        cap = e["caption"]
        if cap not in texts:
            path = os.path.join(cache, f"text-{len(texts)}.safetensors")
            common.run([h3run, "encode", "--model", a.template, "--prompt", cap, "--out", path])
            texts[cap] = read_safetensors(path)["hidden"].double()
        L = texts[cap].shape[0]
        if L not in layouts:
            path = os.path.join(cache, f"layout-{L}.safetensors")
            common.run([h3synth, "layout", path, "--text-tokens", str(L), "--frames", str(F), "--size", f"{W}x{H}"])
            layouts[L] = read_safetensors(path)
    held = examples[-1]
    train = examples[:-1]

    w64, cfg = load_dit(os.path.join(a.template, "transformer"))
    # float64: the reference computes its timestep embedding in float64; the model is small
    w = {k: v.double().clone().requires_grad_(k not in ("rope.inv_freq",)) for k, v in w64.items()}
    opt = torch.optim.Adam([v for v in w.values() if v.requires_grad], lr=a.lr)
    print(f"DiT: {sum(v.numel() for v in w.values()):,} parameters; {len(train)} training examples, {len(texts)} "
          f"distinct captions, {len(layouts)} prompt lengths", flush=True)

    def inputs(e, u, eps_v, eps_a):
        sv, sa = shift(u, SHIFT_VIDEO), shift(u, SHIFT_AUDIO)
        tv, ta = 1.0 - sv, 1.0 - sa
        lay = layouts[texts[e["caption"]].shape[0]]
        tags = lay["token_tags"].long()
        uniq = sorted({tv, ta})
        tid = torch.where(tags == 2, uniq.index(ta), uniq.index(tv)).to(torch.int32)
        inp = {"video": (1 - sv) * e["video"] + sv * eps_v, "audio": (1 - sa) * e["audio"] + sa * eps_a,
               "text": texts[e["caption"]], "timesteps": torch.tensor(uniq, dtype=torch.float32),
               "timestep_indices": tid, "token_tags": lay["token_tags"], "position_ids": lay["position_ids"],
               "video_indices": lay["video_indices"], "audio_indices": lay["audio_indices"],
               "text_indices": lay["text_indices"]}
        return inp

    t0 = time.time()
    for step in range(1, a.steps + 1):
        loss = 0.0
        for _ in range(a.batch):
            e = train[torch.randint(0, len(train), (1,)).item()]
            u = torch.rand(()).item() * 0.98 + 0.01
            ev, ea = torch.randn_like(e["video"]), torch.randn_like(e["audio"])
            vv, va = forward(w, cfg, inputs(e, u, ev, ea), dtype=torch.float64)
            loss = loss + (((vv - (e["video"] - ev)) ** 2).mean() + ((va - (e["audio"] - ea)) ** 2).mean()) / a.batch
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == 1:
            print(f"step {step}: velocity MSE {loss.item():.4f}, {time.time() - t0:.0f} s", flush=True)

    export.export_dit({k: v.detach() for k, v in w.items()}, os.path.join(a.template, "transformer"),
                      os.path.join(out, "transformer"))
    # the check: h3run dit with the exported weights against the reference forward on the same stored weights (the
    # export rounds to the template's dtypes: bf16 with the release's f32 islands), on a held-out example
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        inp = inputs(held, 0.5, torch.randn(held["video"].shape, generator=g, dtype=torch.float64),
                     torch.randn(held["audio"].shape, generator=g, dtype=torch.float64))
        inp = {k: (v.float() if v.dtype == torch.float64 and k != "position_ids" else v) for k, v in inp.items()}
        stored, _ = load_dit(os.path.join(out, "transformer"))
        vv, va = forward(stored, cfg, inp, dtype=torch.float64)
    ip, ep, op = (os.path.join(out, n) for n in ("check_inputs.safetensors", "check_expected.safetensors",
                                                  "check_h3run.safetensors"))
    write_safetensors(ip, {k: v.contiguous() for k, v in inp.items()})
    write_safetensors(ep, {"video_velocity": vv.float().contiguous(), "audio_velocity": va.float().contiguous()})
    # h3run's own comparison (--expect): max |diff| relative to the largest velocity, at most 1e-4
    r = subprocess.run([h3run, "dit", "--model", os.path.join(out, "transformer"), "--inputs", ip, "-o", op,
                        "--expect", ep, "--tol", "1e-4"], capture_output=True, text=True)
    ok = r.returncode == 0
    last = (r.stdout + r.stderr).strip().splitlines()
    print(f"{'ok  ' if ok else 'FAIL'} h3run dit with the exported DiT against the reference forward: "
          f"{last[-1] if last else ''}", flush=True)
    with open(os.path.join(out, "dit_train.json"), "w") as f:
        json.dump({"steps": a.steps, "examples": len(train), "final_loss": float(loss), "h3run_matches": ok}, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
