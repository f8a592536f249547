"""The DiT fixtures (tests/fixtures/dit) against diffusers' MiniMaxH3Transformer3DModel.

The fixture outputs come from the project's own reference (tools/reference/dit.py, float64). This script builds
diffusers' model with the fixture's reduced config, loads the fixture weights, runs the fixture's packed sequence
(with the batch axis diffusers expects) and compares:
  - diffusers layout, float32: with the fixture's expected outputs and with the reference run here;
  - official layout (per-head interleaved QKV, fc1 [gate; value]) converted by diffusers' own conversion script
    (reorder_interleaved_qkv + convert_transformer_key), float32: this checks the layout conventions the fixtures,
    the reference and h3run share against diffusers' reading of the official shards;
  - diffusers layout in bfloat16 with the fp32 islands (_keep_in_fp32_modules), as the release runs.
ComfyUI's pruned (curve-table) form has no diffusers counterpart and is not compared here.

    DIFFUSERS_SRC=/path/to/diffusers python tests/gpu/compare_dit_diffusers.py   # the folder holding src/diffusers

Skips (exit 0) when DIFFUSERS_SRC is unset or diffusers does not import. Exit status 1 when a float32 run differs
from the fixture by more than 1e-4 (max |diff| / max |ref|, the bar h3run meets on the CPU; float32 arithmetic over
this 4-block model lands near 1e-6, TF32 is turned off) or a bfloat16 run by more than 5e-2 (bf16 keeps 8 bits:
each of the ~20 roundings in sequence per block adds up to 2^-9 relative, and the residual stream carries them
through 4 blocks; measured runs land near 1e-2). Details go to $OUT/compare_dit_diffusers.json when OUT is set.
H3_DIT_COMPARE_SELFTEST=1 runs everything with a stand-in for diffusers' model built from the reference, to check
this script itself where diffusers cannot run.
"""

import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "dit")
TOL_F32, TOL_BF16 = 1e-4, 5e-2
SELFTEST = os.environ.get("H3_DIT_COMPARE_SELFTEST") == "1"


def skip(msg):
    print(f"compare_dit_diffusers: SKIP: {msg}")
    sys.exit(0)


sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
src = os.environ.get("DIFFUSERS_SRC")
if not SELFTEST:
    if not src or not os.path.isdir(os.path.join(src, "src", "diffusers")):
        skip("set DIFFUSERS_SRC to the diffusers source folder (the one containing src/diffusers)")
    sys.path.insert(0, os.path.join(src, "src"))
    try:
        import torch
        from diffusers import MiniMaxH3Transformer3DModel
    except Exception as e:  # noqa: BLE001 - any import failure means this machine cannot run the comparison
        skip(f"diffusers does not import from {src}: {e}")
else:
    import torch

import dit  # noqa: E402  (the project's reference: safetensors reading, forward)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


class StandIn(torch.nn.Module):
    """For H3_DIT_COMPARE_SELFTEST: diffusers' forward signature over the reference (diffusers-layout weights)."""

    def __init__(self, **cfg):
        super().__init__()
        self.cfg = cfg
        self.sd = {}
        self.dtype = torch.float32

    def load_state_dict(self, sd, strict=True):
        self.sd = dict(sd)

    def to(self, *args, **kw):
        for a in list(args) + list(kw.values()):
            if isinstance(a, torch.dtype):
                self.dtype = a
        return self

    def forward(self, hidden_states, audio_hidden_states, encoder_hidden_states, timestep, timestep_indices,
                token_tags, position_ids, video_indices, audio_indices, text_indices, return_dict=False):
        sd, _ = dit.canonical(self.sd)
        cfg = dit.infer_config(sd)
        sd = {k: v.to(self.dtype) for k, v in sd.items()}
        inp = {"video": hidden_states[0], "audio": audio_hidden_states[0], "text": encoder_hidden_states[0],
               "timesteps": timestep, "timestep_indices": timestep_indices, "token_tags": token_tags,
               "position_ids": position_ids, "video_indices": video_indices, "audio_indices": audio_indices,
               "text_indices": text_indices}
        v, a = dit.forward(sd, cfg, inp, dtype=self.dtype)
        return v[None], a[None]


def model_class():
    return StandIn if SELFTEST else MiniMaxH3Transformer3DModel


def conversion():
    """diffusers' official -> diffusers key conversion (needs its scripts/ folder)."""
    if SELFTEST:
        return None, "not available in the self-test"
    path = os.path.join(src, "scripts", "convert_minimax_h3_to_diffusers.py")
    try:
        spec = importlib.util.spec_from_file_location("convert_minimax_h3", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod, "diffusers' convert_minimax_h3_to_diffusers.py"
    except Exception as e:  # noqa: BLE001
        return None, f"{path} not usable: {e}"


def diffusers_config():
    with open(os.path.join(FIX, "diffusers", "config.json")) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def build(cfg, sd, dtype):
    """diffusers' model with the given weights; bfloat16 keeps the release's fp32 islands."""
    model = model_class()(**cfg).eval()
    if dtype == torch.bfloat16 and not SELFTEST:
        inv_freq = model.rope.inv_freq.clone()
        model.to(torch.bfloat16)
        for name, module in model.named_modules():
            if name and any(k in name for k in model._keep_in_fp32_modules):
                module.float()
        model.rope.inv_freq = inv_freq  # computed in f32 at construction; the cast above rounded it
    elif not SELFTEST:
        model.float()
    else:
        model.to(dtype)
    model.load_state_dict(sd, strict=True)
    return model.to(DEV)


def run(model, inp):
    args = {
        "hidden_states": inp["video"][None].to(DEV), "audio_hidden_states": inp["audio"][None].to(DEV),
        "encoder_hidden_states": inp["text"][None].to(DEV), "timestep": inp["timesteps"].to(DEV),
        "timestep_indices": inp["timestep_indices"].long().to(DEV), "token_tags": inp["token_tags"].long().to(DEV),
        "position_ids": inp["position_ids"].to(DEV), "video_indices": inp["video_indices"].long().to(DEV),
        "audio_indices": inp["audio_indices"].long().to(DEV), "text_indices": inp["text_indices"].long().to(DEV),
    }
    with torch.no_grad():
        v, a = model(**args, return_dict=False)
    return v[0].double().cpu(), a[0].double().cpu()


def errs(got, ref):
    d = (got - ref.double()).abs()
    return {"max_abs": float(d.max()), "max_rel": float(d.max() / ref.double().abs().max()),
            "rel_l2": float((got - ref.double()).norm() / ref.double().norm())}


def main():
    torch.manual_seed(0)
    if DEV == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    inp = dit.read_safetensors(os.path.join(FIX, "inputs.safetensors"))
    exp = dit.read_safetensors(os.path.join(FIX, "expected_full.safetensors"))
    cfg = diffusers_config()
    rows = []

    # The reference itself, run here in float64 from the diffusers-layout file: must reproduce the fixture.
    sd_ref, rcfg = dit.load_dit(os.path.join(FIX, "diffusers"))
    ref_v, ref_a = dit.forward(sd_ref, rcfg, inp)
    rows.append(("reference f64 (here) vs fixture", "f64", TOL_F32, ref_v, ref_a, exp))

    sd_dif = dit.read_weights(os.path.join(FIX, "diffusers"))
    for dtype, tol in ((torch.float32, TOL_F32), (torch.bfloat16, TOL_BF16)):
        name = "f32" if dtype == torch.float32 else "bf16"
        v, a = run(build(cfg, sd_dif, dtype), inp)
        rows.append((f"diffusers {name}, diffusers layout vs fixture", name, tol, v, a, exp))
        rows.append((f"diffusers {name}, diffusers layout vs reference", name, tol, v, a,
                     {"video_velocity": ref_v, "audio_velocity": ref_a}))

    conv, how = conversion()
    if conv is not None:
        raw = dit.read_weights(os.path.join(FIX, "official"))
        ccfg = dict(conv.MINIMAX_H3_TRANSFORMER_CONFIG)
        ccfg.update({k: cfg[k] for k in cfg if k in ccfg})
        sd = {}
        for k, t in raw.items():
            if k.endswith(".attn.qkv_proj.weight"):
                t = conv.reorder_interleaved_qkv(t, ccfg["num_attention_heads"], ccfg["attention_head_dim"])
            for nk, nt in conv.convert_transformer_key(k, t, ccfg):
                sd[nk] = nt
        v, a = run(build(cfg, sd, torch.float32), inp)
        rows.append(("diffusers f32, official layout via its converter vs fixture", "f32", TOL_F32, v, a, exp))
    else:
        print(f"note: official layout not compared ({how})")

    table = []
    fails = 0
    for label, prec, tol, v, a, ref in rows:
        ev, ea = errs(v, ref["video_velocity"]), errs(a, ref["audio_velocity"])
        ok = ev["max_rel"] <= tol and ea["max_rel"] <= tol
        fails += not ok
        table.append({"what": label, "precision": prec, "tolerance": tol, "video": ev, "audio": ea, "ok": ok})
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare_dit_diffusers.json"), "w") as f:
            json.dump({"device": DEV, "torch": torch.__version__, "selftest": SELFTEST, "official_keys": how,
                       "rows": table}, f, indent=1)
    print(f"\nDiT: diffusers vs the reference's fixtures ({DEV}{', SELF-TEST with a stand-in model' if SELFTEST else ''};"
          f" max |diff| / max |ref|; tolerance f32 {TOL_F32:g}, bf16 {TOL_BF16:g})")
    print(f"{'comparison':62} {'video rel':>10} {'video abs':>10} {'audio rel':>10} {'audio abs':>10}  result")
    for r in table:
        print(f"{r['what']:62} {r['video']['max_rel']:10.2e} {r['video']['max_abs']:10.2e} "
              f"{r['audio']['max_rel']:10.2e} {r['audio']['max_abs']:10.2e}  {'ok' if r['ok'] else 'FAIL'}")
    print(f"compare_dit_diffusers: {'all agree' if not fails else f'{fails} disagreement(s)'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
