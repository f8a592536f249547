"""LoRA on the reduced DiT (tests/fixtures/dit): h3run's `dit --lora` against diffusers with the same file loaded
through MiniMaxH3LoraLoaderMixin.

Random factors over every LoRA-able module (fused QKV, out, fc1, fc2, AdaLN projections, the patch / condition /
time / final projections) are written in several formats: ai-toolkit (diffusion_model., lora_A/B, no alpha),
musubi (lora_unet_, lora_down/up, .alpha tensors), DiffSynth (.default. infix, per-head interleaved QKV factors),
diffusers (transformer., split to_q/to_k/to_v, [value; gate] ff.net.0.proj) and a bare official file with a
__metadata__ alpha. For each, at strengths 0.5 and 1.0 and for two files at once:
  - diffusers' MiniMaxH3Transformer3DModel built from the fixture's diffusers weights (made f32), the file loaded by
    MiniMaxH3LoraLoaderMixin.lora_state_dict + load_lora_adapter, set_adapters with the strengths, f32 on the CPU;
  - `h3run dit` on the same weights (diffusers layout, and the official layout with per-head QKV), --device cpu,
    merged and on the side path: within 1e-4 (max |diff| / max |ref|);
  - on a GPU: diffusers in bf16 (fp32 islands kept) against `h3run dit --device cuda`, within 5e-2.

    DIFFUSERS_SRC=/path/to/diffusers H3RUN=build/h3run python tests/gpu/compare_lora_diffusers.py

Runs under tests/gpu/run.sh gpu-compare. Skips (exit 0) without DIFFUSERS_SRC, without diffusers or peft, or
without the h3run binary. Exit 1 on any disagreement; details in $OUT/compare_lora_diffusers.json when OUT is set.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "dit")
TOL_F32, TOL_BF16 = 1e-4, 5e-2
HEAD_DIM = 128


def skip(msg):
    print(f"compare_lora_diffusers: SKIP: {msg}")
    sys.exit(0)


src = os.environ.get("DIFFUSERS_SRC")
if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")):
    skip("set DIFFUSERS_SRC to the diffusers source folder (the one containing src/diffusers)")
sys.path.insert(0, os.path.join(src, "src"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
try:
    import torch
    from safetensors.torch import save_file
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin
    import peft  # noqa: F401  (diffusers' LoRA layers)
except Exception as e:  # noqa: BLE001 - any import failure means this machine cannot run the comparison
    skip(f"diffusers / peft do not import from {src}: {e}")
H3RUN = os.environ.get("H3RUN", os.path.join(ROOT, "build", "h3run"))
if not os.path.isfile(H3RUN):
    skip(f"no h3run binary at {H3RUN} (set H3RUN)")

import dit  # noqa: E402  (the project's reference: safetensors reading)

GPU = torch.cuda.is_available()


def diffusers_config():
    with open(os.path.join(FIX, "diffusers", "config.json")) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def write_f32_dit(layout, dst):
    """The fixture's weights of a layout as f32, with its config, for both implementations."""
    os.makedirs(dst, exist_ok=True)
    sd = {k: v.float().contiguous() for k, v in dit.read_weights(os.path.join(FIX, layout)).items()}
    save_file(sd, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(FIX, layout, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
        g.write(f.read())
    return sd


def modules(cfg):
    """Official module name -> (out, in) of every LoRA-able linear of the reduced DiT."""
    H, inner, F = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["ffn_dim"]
    ted, th = cfg["time_embed_dim"], cfg["time_embed_hidden_dim"]
    m = {}
    for pre, n in (("token_refiner.blocks", cfg["num_refiner_layers"]), ("blocks", cfg["num_layers"])):
        for i in range(n):
            m[f"{pre}.{i}.attn.qkv_proj"] = (3 * inner, H)
            m[f"{pre}.{i}.attn.out_proj"] = (H, inner)
            m[f"{pre}.{i}.mlp.fc1"] = (2 * F, H)
            m[f"{pre}.{i}.mlp.fc2"] = (H, F)
            if pre == "blocks":
                m[f"{pre}.{i}.adaln_proj.linear"] = (18 * H, ted)
    vd = cfg["in_channels"] * 4
    m.update({"video_patch_proj": (H, vd), "audio_patch_proj": (H, cfg["audio_in_channels"]),
              "condition_proj": (H, cfg["text_dim"]), "time_embedder.proj_in": (th, cfg["freq_dim"]),
              "time_embedder.proj_out": (ted, th), "final_layer.adaln_proj.linear": (2 * H, ted),
              "final_layer.video_out": (vd, H), "final_layer.audio_out": (cfg["audio_in_channels"], H)})
    return m


DF_GLOBAL = {"video_patch_proj": "proj_in", "audio_patch_proj": "audio_proj_in", "condition_proj": "context_embedder",
             "time_embedder.proj_in": "time_embedder.linear_1", "time_embedder.proj_out": "time_embedder.linear_2",
             "final_layer.adaln_proj.linear": "norm_out.linear", "final_layer.video_out": "proj_out",
             "final_layer.audio_out": "audio_proj_out"}


def df_name(off):
    if off in DF_GLOBAL:
        return DF_GLOBAL[off]
    off = off.replace("token_refiner.blocks.", "token_refiner.refiner_blocks.")
    if off.startswith("blocks."):
        off = "transformer_blocks." + off[len("blocks."):]
    return off.replace("attn.out_proj", "attn.to_out.0").replace("mlp.fc1", "ff.net.0.proj").replace("mlp.fc2", "ff.net.2")


def random_factors(mods, seed):
    """Logical factors: QKV rows [Q; K; V], fc1 rows [gate; value]; alpha per module."""
    g = torch.Generator().manual_seed(seed)
    f = {}
    for name, (out, inp) in mods.items():
        r = 2 + (hash(name) % 3)
        a = (torch.rand(r, inp, generator=g) - 0.5) * 0.5
        b = (torch.rand(out, r, generator=g) - 0.5) * 0.25
        f[name] = (a, b, float(r * 2))  # alpha = 2·rank
    return f


def per_head(b, heads):
    """[Q; K; V] rows -> [h: q k v]."""
    inner = b.shape[0] // 3
    q, k, v = b[:inner], b[inner:2 * inner], b[2 * inner:]
    parts = [t.reshape(heads, HEAD_DIM, -1) for t in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(3 * inner, -1)


def write_lora(fmt, factors, heads, path):
    sd, meta = {}, None
    for name, (a, b, alpha) in factors.items():
        r = a.shape[0]
        if fmt == "ai-toolkit":  # no alpha: fold alpha / rank into B
            sd[f"diffusion_model.{name}.lora_A.weight"] = a
            sd[f"diffusion_model.{name}.lora_B.weight"] = b * (alpha / r)
        elif fmt == "musubi":
            flat = "lora_unet_" + name.replace(".", "_")
            sd[f"{flat}.lora_down.weight"] = a
            sd[f"{flat}.lora_up.weight"] = b
            sd[f"{flat}.alpha"] = torch.tensor(alpha)
        elif fmt == "DiffSynth":
            bb = per_head(b, heads) if name.endswith("qkv_proj") else b
            sd[f"{name}.lora_A.default.weight"] = a
            sd[f"{name}.lora_B.default.weight"] = bb * (alpha / r)
        elif fmt == "metadata alpha":  # one network alpha of 8 for every module
            sd[f"{name}.lora_A.weight"] = a
            sd[f"{name}.lora_B.weight"] = b * (alpha / 8.0)
            meta = {"alpha": "8"}
        elif fmt == "diffusers":
            n = df_name(name)
            bb = b * (alpha / r)
            if name.endswith("mlp.fc1"):
                half = bb.shape[0] // 2
                bb = torch.cat([bb[half:], bb[:half]])
            if name.endswith("qkv_proj"):
                inner = bb.shape[0] // 3
                for j, p in enumerate(("to_q", "to_k", "to_v")):
                    nn = n.replace("attn.qkv_proj", f"attn.{p}")
                    sd[f"transformer.{nn}.lora_A.weight"] = a
                    sd[f"transformer.{nn}.lora_B.weight"] = bb[j * inner:(j + 1) * inner]
                continue
            sd[f"transformer.{n}.lora_A.weight"] = a
            sd[f"transformer.{n}.lora_B.weight"] = bb
    # own copies: the split q/k/v factors share one A, and safetensors refuses tensors that share memory
    save_file({k: v.detach().clone().contiguous() for k, v in sd.items()}, path, metadata=meta)


def read_inputs():
    return dit.read_safetensors(os.path.join(FIX, "inputs.safetensors"))


def diffusers_run(cfg, sd, loras, inp, dtype, dev):
    model = MiniMaxH3Transformer3DModel(**cfg).eval()
    model.float()
    model.load_state_dict(sd, strict=True)
    names, weights = [], []
    for i, (path, strength) in enumerate(loras):
        # what MiniMaxH3LoraLoaderMixin.load_lora_weights does for the `transformer` partition
        state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(path, return_lora_metadata=True)
        model.load_lora_adapter(state, prefix="transformer", adapter_name=f"l{i}", metadata=metadata)
        names.append(f"l{i}")
        weights.append(strength)
    model.set_adapters(names, weights=weights)
    if dtype == torch.bfloat16:
        inv_freq = model.rope.inv_freq.clone()
        model.to(torch.bfloat16)
        for name, module in model.named_modules():
            if name and any(k in name for k in model._keep_in_fp32_modules):
                module.float()
        model.rope.inv_freq = inv_freq
    model.to(dev)
    args = {
        "hidden_states": inp["video"][None].to(dev), "audio_hidden_states": inp["audio"][None].to(dev),
        "encoder_hidden_states": inp["text"][None].to(dev), "timestep": inp["timesteps"].to(dev),
        "timestep_indices": inp["timestep_indices"].long().to(dev), "token_tags": inp["token_tags"].long().to(dev),
        "position_ids": inp["position_ids"].to(dev), "video_indices": inp["video_indices"].long().to(dev),
        "audio_indices": inp["audio_indices"].long().to(dev), "text_indices": inp["text_indices"].long().to(dev),
    }
    with torch.no_grad():
        v, a = model(**args, return_dict=False)
    return v[0].double().cpu(), a[0].double().cpu()


def h3run(model_dir, loras, mode, device, tmp):
    out = os.path.join(tmp, "velocity.safetensors")
    cmd = [H3RUN, "dit", "-q", "-m", model_dir, "-i", os.path.join(FIX, "inputs.safetensors"), "-o", out,
           "--lora-mode", mode, "--device", device]
    for path, strength in loras:
        cmd += ["--lora", f"{path}:{strength}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    o = dit.read_safetensors(out)
    return o["video_velocity"].double(), o["audio_velocity"].double()


def max_rel(got, ref):
    return float((got - ref).abs().max() / ref.abs().max())


def main():
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = diffusers_config()
    heads = cfg["num_attention_heads"]
    inp = read_inputs()
    rows, fails = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {lay: os.path.join(tmp, lay) for lay in ("diffusers", "official")}
        sd_df = write_f32_dit("diffusers", dirs["diffusers"])
        write_f32_dit("official", dirs["official"])
        mods = modules(cfg)
        fa, fb = random_factors(mods, 1), random_factors(mods, 2)
        files = {}
        for fmt in ("ai-toolkit", "musubi", "DiffSynth", "metadata alpha", "diffusers"):
            files[fmt] = os.path.join(tmp, f"lora_{fmt.replace(' ', '_')}.safetensors")
            write_lora(fmt, fa, heads, files[fmt])
        second = os.path.join(tmp, "lora_second.safetensors")
        write_lora("musubi", fb, heads, second)
        cases = [(f"{fmt} at {s}", [(files[fmt], s)]) for fmt in files for s in (0.5, 1.0)]
        cases.append(("two LoRAs: ai-toolkit at 0.5 + musubi at 1.0", [(files["ai-toolkit"], 0.5), (second, 1.0)]))
        for label, loras in cases:
            ref_v, ref_a = diffusers_run(cfg, sd_df, loras, inp, torch.float32, "cpu")
            for lay in ("diffusers", "official"):
                for mode in ("merge", "side"):
                    v, a = h3run(dirs[lay], loras, mode, "cpu", tmp)
                    ev, ea = max_rel(v, ref_v), max_rel(a, ref_a)
                    ok = ev <= TOL_F32 and ea <= TOL_F32
                    fails += not ok
                    rows.append({"what": f"{label}: h3run cpu {lay} {mode} vs diffusers f32 cpu", "video": ev,
                                 "audio": ea, "tolerance": TOL_F32, "ok": ok})
            if GPU:
                gv, ga = diffusers_run(cfg, sd_df, loras, inp, torch.bfloat16, "cuda")
                # the fixture's own official files: bf16 blocks with the f32 islands, as released (the GPU runs
                # blocks from bf16 or quantized weights and refuses the f32 upcast the CPU comparisons use)
                for mode in ("auto", "side"):
                    v, a = h3run(os.path.join(FIX, "official"), loras, mode, "cuda", tmp)
                    ev, ea = max_rel(v, gv), max_rel(a, ga)
                    ok = ev <= TOL_BF16 and ea <= TOL_BF16
                    fails += not ok
                    rows.append({"what": f"{label}: h3run cuda official {mode} vs diffusers bf16 cuda", "video": ev,
                                 "audio": ea, "tolerance": TOL_BF16, "ok": ok})
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare_lora_diffusers.json"), "w") as f:
            json.dump({"gpu": GPU, "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"\nLoRA: h3run dit --lora vs diffusers' loader (max |diff| / max |ref|; f32 {TOL_F32:g}, bf16 {TOL_BF16:g})")
    for r in rows:
        print(f"{r['what']:86} {r['video']:10.2e} {r['audio']:10.2e}  {'ok' if r['ok'] else 'FAIL'}")
    if not GPU:
        print("note: no GPU: the bf16 device comparison did not run")
    print(f"compare_lora_diffusers: {'all agree' if not fails else f'{fails} disagreement(s)'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
